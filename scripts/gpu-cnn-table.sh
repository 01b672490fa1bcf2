#!/usr/bin/env bash
# On the GPU machine: the CNN memory issue's thirteen rows on one lease, each beside PyTorch eager
# (cuDNN benchmark on): ResNet-20 at 256 and 1024 and ResNet-18 at 256 in every configuration, then
# ResNet-1202 at 128 with AMP and √n segments. Render them as one report here with
#   go run ./cmd/bench -merge $OUT/table/bench.json,$OUT/deep/bench.json -out <folder>
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
timeout 300 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
  -compile-configs "" -claims=false -steps 15 -warmup 4 -out "$out/table" -commit "${COMMIT:-}" > "$out/table.log" 2>&1
echo "table exit $?"; grep -E "^\| resnet" "$out/table/bench.md" | cut -d'|' -f2-7,11-13
timeout 240 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs amp+checkpoint \
  -compile-configs "" -claims=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
echo "deep exit $?"; grep -E "^\| resnet" "$out/deep/bench.md" | cut -d'|' -f2-7,11-13
