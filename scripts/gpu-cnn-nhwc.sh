#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./nn (with the datasets): ResNet-1202 at 128 in every
# configuration (captured), the CNN memory issue's table beside PyTorch eager, the main job, and the
# channels-last test. Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 150 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
  -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
echo "deep exit $?"; grep -E "^\| resnet" "$out/deep/bench.md" | cut -d'|' -f2-5,11
timeout 200 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
  -compile-configs "" -claims=false -steps 15 -warmup 4 -out "$out/table" -commit "${COMMIT:-}" > "$out/table.log" 2>&1
echo "table exit $?"; grep -E "^\| resnet" "$out/table/bench.md" | cut -d'|' -f2-7,11-13
timeout 120 bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -json "$out/main.json" > "$out/main.log" 2>&1
echo "main job exit $?"; grep -E "test accuracy|throughput|peak allocated|^  (fp32|amp|checkpoint)" "$out/main.log"
timeout 60 bash .gpu/run tests -test.run CUDAChannelsLast -test.v > "$out/tests.log" 2>&1
echo "tests exit $?"; grep -E "^(--- |FAIL|ok)|autocast" "$out/tests.log"
