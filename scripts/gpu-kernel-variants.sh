#!/usr/bin/env bash
# On the GPU machine: the layer norm's backward, the bias gradients' column sums and the classifier's
# rows at GPT-2 small's shapes, each in variants (scripts/ln-bench.py, reduce-bench.py, cls-bench.py),
# from the CUDA C that `go run ./scripts/kernelsrc > .gpu/kernels.cu` printed here. LN, REDUCE and
# CLS override the variants (an empty one skips its harness).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
cd scripts
if [ -n "${LN-base=}" ]; then
  timeout 300 python3 ln-bench.py --source ../.gpu/kernels.cu --go ../kernels/cuda/transformer.go ${LN:-base=} > "$out/ln.log" 2>&1
  echo "ln exit $?"; sed -n '/^| variant/,$p' "$out/ln.log"; grep -iE "error|Traceback" "$out/ln.log" | head -5
fi
if [ -n "${REDUCE-auto}" ]; then
  timeout 120 python3 reduce-bench.py --source ../.gpu/kernels.cu ${REDUCE:-auto} > "$out/reduce.log" 2>&1
  echo "reduce exit $?"; tail -30 "$out/reduce.log"
fi
if [ -n "${CLS-cls_rows:1024}" ]; then
  timeout 120 python3 cls-bench.py --source ../.gpu/kernels.cu ${CLS:-cls_rows:1024} > "$out/cls.log" 2>&1
  echo "cls exit $?"; tail -12 "$out/cls.log"
fi
