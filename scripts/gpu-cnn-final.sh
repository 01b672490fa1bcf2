#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (with the datasets): the CNN memory issue's table
# beside PyTorch eager, with what each planned step holds at its peak; ResNet-1202 at 128 in every
# configuration; the main job; and GPT-2's bf16 step, checkpointed and not. Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 200 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
  -compile-configs "" -claims=false -steps 15 -warmup 4 -out "$out/table" -commit "${COMMIT:-}" > "$out/table.log" 2>&1
echo "table exit $?"; grep -E "^\| resnet" "$out/table/bench.md" | cut -d'|' -f2-5,11-13
timeout 150 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
  -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
echo "deep exit $?"; grep -E "^\| resnet" "$out/deep/bench.md" | cut -d'|' -f2-5,11
timeout 120 bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -json "$out/main.json" > "$out/main.log" 2>&1
echo "main job exit $?"; grep -E "test accuracy|throughput|peak allocated|^  (fp32|amp|checkpoint)|at its peak|planned, " "$out/main.log"
timeout 150 bash .gpu/run bin/bench -device cuda -specs gpt2:16 -configs amp,amp+checkpoint -amp-dtype bf16 -vocab 50304 -pytorch "" \
  -claims=false -eager=false -steps 10 -warmup 3 -out "$out/gpt" -commit "${COMMIT:-}" > "$out/gpt.log" 2>&1
echo "gpt exit $?"; grep -E "^leangrad .*ms" "$out/gpt.log"; grep -A4 "What leangrad" "$out/gpt/bench.md" | cut -c1-700
