#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./train (.gpu/data removed),
# `go run ./scripts/kernelsrc > .gpu/kernels.cu`, and the same at a commit before the TF32x3 products'
# serial split of K into .gpu/kernels-old.cu:
#   the CUDA tests of the staged packages; the TF32x3 kernels at GPT-2 small's shapes, the weight
#   gradients with K split (added into C in turn, and the old partial sums); the largest fp32 GPT-2
#   small batch under a 24 GiB cap at context 512. Everything lands in $OUT.
set -uo pipefail
out=$(realpath -m "${OUT:-gpu-out}")
mkdir -p "$out"
timeout 300 bash .gpu/run tests -test.run CUDA -test.count 1 -test.v > "$out/tests.log" 2>&1
echo "tests exit: $?"
grep -E "^(--- FAIL|FAIL|ok|panic)" "$out/tests.log" | head -30
echo "passed: $(grep -c -- '^--- PASS' "$out/tests.log"), skipped: $(grep -c -- '^--- SKIP' "$out/tests.log")"
for v in kernels kernels-old; do
  (cd scripts && timeout 120 python3 x3gemm-bench.py --source "../.gpu/$v.cu" "$v=" > "$out/x3gemm-$v.log" 2>&1)
  echo "x3gemm $v exit: $?"; grep -E "dw|rror" "$out/x3gemm-$v.log"
done
timeout 150 bash .gpu/run bin/bench -device cuda -specs gpt2:1 -configs fp32 -largest-batch gpt2:512:24 -amp-dtype f16 \
  -pytorch "" -claims=false -eager=false -steps 1 -warmup 1 -out "$out/largest" > "$out/largest.log" 2>&1
echo "largest exit: $?"; grep -E "^claim|rror" "$out/largest.log"
