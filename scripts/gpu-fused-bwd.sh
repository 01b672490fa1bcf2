#!/usr/bin/env bash
# The one-kernel attention backward (flash_bwd: dq's shares added in turn; docs/benchmarks.md, "One
# backward attention kernel") beside main's two kernels, on the GPU machine, after
# `BASE=<commit> bash scripts/gpu-flash.sh prep` here:
#   flash  flash-bench: the base commit's kernels, the tree's, and each flash.cu of
#          benchmarks/results/2026-12-03-h200-fused-bwd/ (VARIANTS, flash-bench's name=file[@MACRO=VALUE]
#          to name others; flash-warp-turns-probes.cu takes FLASH_BWD_PROBE=1 (no turns kept, dq wrong),
#          2 (no shares added), 4 (no dq product), 8 (key blocks from the first), 16 (blocks numbered by
#          a ticket), summed)
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
dir=benchmarks/results/2026-12-03-h200-fused-bwd
variants=${VARIANTS:-"tiles=$dir/flash-tile-turns.cu warps=$dir/flash-warp-turns-probes.cu loads=$dir/flash-loads-first.cu reductions=$dir/flash-reductions.cu"}
timeout 200 python3 scripts/flash-bench.py --source .gpu/flash/kernels.cu --json "$out/flash.json" \
  base=.gpu/flash/base.cu tree=kernels/cuda/src/flash.cu $variants > "$out/flash.log" 2>&1
echo "flash exit: $?"; grep -A8 "^| variant" "$out/flash.log"
