#!/usr/bin/env bash
# The flash-attention kernels beside PyTorch's SDPA, on the GPU machine
# (scripts/flash-bench.py).
#   here:  BASE=<commit> bash scripts/gpu-flash.sh prep   # .gpu/flash: the kernels' source, the base flash.cu
#   there: bash scripts/gpu-flash.sh run [name=flash.cu ...]  # check and time base, the tree's and the named ones
#          NCU=1 also profiles each variant's three kernels once (Nsight Compute)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu/flash
case "${1:-}" in
prep)
  mkdir -p "$dir"
  go run ./scripts/kernelsrc >"$dir/kernels.cu"
  git show "${BASE:-HEAD}:kernels/cuda/src/flash.cu" >"$dir/base.cu"
  echo "${BASE:-HEAD}" >"$dir/base.commit"
  ;;
run)
  shift
  export PATH="$PATH:/usr/local/cuda/bin"
  out=${OUT:-/tmp/flash-out}
  mkdir -p "$out"
  variants=("base=$dir/base.cu" "tree=kernels/cuda/src/flash.cu" "$@")
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv >"$out/machine.txt" || true
  python3 scripts/flash-bench.py --torch --source "$dir/kernels.cu" --json "$out/flash.json" "${variants[@]}" 2>&1 | tee "$out/flash.log"
  if [ -n "${NCU:-}" ]; then
    for v in "${variants[@]}"; do
      ncu --clock-control none --kernel-name regex:flash_ --launch-count 3 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        python3 scripts/flash-bench.py --iters 1 --source "$dir/kernels.cu" "$v" >"$out/ncu-${v%%=*}.txt" 2>&1 || true
    done
  fi
  ;;
*)
  echo "usage: BASE=<commit> $0 prep | [NCU=1] $0 run [name=flash.cu ...]" >&2
  exit 2
  ;;
esac
