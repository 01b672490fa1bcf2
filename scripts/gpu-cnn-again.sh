#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./autograd (with the datasets) and,
# for PART=deep, .gpu/old/bench.xz (see gpu-ab.sh). Everything lands in $OUT.
#   PART=table: the staged packages' CUDA tests, then the CNN memory issue's table beside PyTorch
#               eager (one harness run; each row's peak by kind in table.log).
#   PART=deep:  ResNet-1202 at 128 in every configuration, twice (do its AMP steps repeat?), then
#               the CNN rows' step times, the old binary against the staged one (gpu-ab.sh).
#   PART=final: PART=table, then ResNet-1202 once and the main job (train -model resnet -amp
#               -checkpoint).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
part=${PART:-table}
case "$part" in
table | final)
  timeout 150 bash .gpu/run tests -test.run 'CUDA' > "$out/tests.log" 2>&1
  echo "tests exit $?"; grep -E "^(ok|FAIL|---|panic)" "$out/tests.log" | head -20
  timeout 400 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
    -compile-configs "" -claims=false -steps 15 -warmup 4 -out "$out/table" -commit "${COMMIT:-}" > "$out/table.log" 2>&1
  echo "table exit $?"; grep -E "^\| resnet" "$out/table/bench.md" | cut -d'|' -f2-6,11-13
  [ "$part" = final ] || exit 0
  timeout 150 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
    -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
  echo "deep exit $?"; grep -E "^\| resnet" "$out/deep/bench.md" | cut -d'|' -f2-5,11
  timeout 120 bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -json "$out/main.json" > "$out/main.log" 2>&1
  echo "main job exit $?"; grep -E "test accuracy|throughput|peak allocated|^  (fp32|amp|checkpoint)|at its peak|planned, " "$out/main.log"
  ;;
deep)
  for r in 1 2; do
    timeout 150 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
      -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep-$r" -commit "${COMMIT:-}" > "$out/deep-$r.log" 2>&1
    echo "deep $r exit $?"; grep -E "^\| resnet" "$out/deep-$r/bench.md" | cut -d'|' -f2-5,11
  done
  OUT="$out/ab" ROUNDS=${ROUNDS:-1} timeout 240 bash scripts/gpu-ab.sh > "$out/ab.log" 2>&1
  echo "ab exit $?"; grep -v "^==" "$out/ab.log" | head -4; cat "$out/ab/summary.txt"
  ;;
esac
