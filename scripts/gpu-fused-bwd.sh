#!/usr/bin/env bash
# The one-kernel attention backward (flash_bwd: dq's shares added in turn; docs/benchmarks.md, "One
# backward attention kernel") beside main's two kernels.
#   here:  BASE=<commit> bash scripts/gpu-flash.sh prep && bash scripts/gpu-fused-bwd.sh prep
#          the versions' flash.cu files in .gpu/flash, each made by applying its diff in
#          benchmarks/results/2026-12-03-h200-fused-bwd/ to the one before, the first to cadc982's
#   there: bash scripts/gpu-fused-bwd.sh run
#          flash-bench: the base commit's kernels, the tree's and the versions' (VARIANTS adds
#          flash-bench's name=file[@MACRO=VALUE] to them; warp-turns-probes takes FLASH_BWD_PROBE=1 (no
#          turns kept, dq wrong), 2 (no shares added), 4 (no dq product), 8 (key blocks from the first),
#          16 (blocks numbered by a ticket), summed); everything lands in $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu/flash
results=benchmarks/results/2026-12-03-h200-fused-bwd
versions="tile-turns warp-turns-probes loads-first reductions"
case "${1:-}" in
prep)
  mkdir -p "$dir"
  git show cadc982:kernels/cuda/src/flash.cu > "$dir/fused-base.cu"
  prev="$dir/fused-base.cu"
  for v in $versions; do
    patch -s -o "$dir/$v.cu" "$prev" < "$results/flash-$v.diff"
    prev="$dir/$v.cu"
  done
  ;;
run)
  out=${OUT:-gpu-out}
  mkdir -p "$out"
  export PATH="$PATH:/usr/local/cuda/bin"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
  variants=()
  for v in $versions; do variants+=("$v=$dir/$v.cu"); done
  timeout 240 python3 scripts/flash-bench.py --source "$dir/kernels.cu" --json "$out/flash.json" \
    base="$dir/base.cu" tree=kernels/cuda/src/flash.cu "${variants[@]}" ${VARIANTS:-} > "$out/flash.log" 2>&1 || true
  grep -A8 "^| variant" "$out/flash.log"
  ;;
*)
  echo "usage: $0 prep | $0 run" >&2
  exit 2
  ;;
esac
