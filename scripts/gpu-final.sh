#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage ./kernels/cuda): the benchmark runs behind the
# README's tables, in one call. COMMIT names the commit the binaries were built from (the
# build here has no VCS stamp). Everything lands in $OUT/final.tar.gz.
#   1. ResNet-20/18 and the MLP at batch 256: leangrad captured and eager, PyTorch eager and
#      torch.compile (fp32, amp), no seed claims (bench -claims runs them);
#   2. ResNet-1202 at batch 128, fp32 and AMP with sqrt(n) checkpointing, beside PyTorch eager;
#   3. the main job, 15 epochs.
# Merge the runs here:  go run ./cmd/bench -merge a/bench.json,b/bench.json -out results
set -uo pipefail
final=${OUT:-gpu-out}
w=$(mktemp -d)/final
mkdir -p "$w" "$final"
trap 'tar -C "$(dirname "$w")" -czf "$final/final.tar.gz" final' EXIT
c=(-commit "${COMMIT:-}")
timeout 400 bash .gpu/run bin/bench -device cuda -out "$w/b256" -specs "resnet20:256 resnet18:256 mlp:256" -steps 20 \
  -compile-configs fp32,amp -claims=false "${c[@]}" > "$w/b256.log" 2>&1
echo "b256 exit: $?"
grep -E '^(leangrad|pytorch)|bench:' "$w/b256.log"
timeout 130 bash .gpu/run bin/bench -device cuda -out "$w/b1202" -specs resnet1202:128 -configs fp32,amp+checkpoint \
  -steps 5 -warmup 3 -compile-configs= -claims=false "${c[@]}" > "$w/b1202.log" 2>&1
echo "b1202 exit: $?"
grep -E '^(leangrad|pytorch)|bench:' "$w/b1202.log"
timeout 70 bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -json "$w/train.json" -memplot "$w/train_mem.png" \
  > "$w/train.log" 2>&1
echo "train exit: $?"
grep -vE 'step [0-9]+/|^\|' "$w/train.log" | tail -14
