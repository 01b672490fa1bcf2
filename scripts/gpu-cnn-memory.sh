#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package; the bench binary is always built):
# issue 23's table, ResNet-20 at 256 and 1024 and ResNet-18 at 256 in every memory configuration
# beside PyTorch eager (and leangrad's eager step), then ResNet-1202 at 128, leangrad alone.
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 420 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
  -compile-configs "" -claims=false -steps 20 -warmup 5 -out "$out/table" -commit "${COMMIT:-}" > "$out/table.log" 2>&1
echo "table exit: $?"; grep -E "^\| (resnet|mlp)" "$out/table/bench.md"
timeout 240 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
  -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
echo "deep exit: $?"; grep -E "^\| resnet" "$out/deep/bench.md"
