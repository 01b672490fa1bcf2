#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./autograd ./train ./nn and
# .gpu/old/bench.xz (a bench binary of the commit before, see gpu-ab.sh): the staged CUDA tests
# (conformance with the multi-tensor casts, captured = eager, step memory), then the old binary
# against the staged one on one lease (gpu-ab.sh): ResNet-1202 at 128 in fp32 and AMP, and the
# CNN table's fp32 and AMP rows, whose AMP steps now cast their parameters at once. In $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 240 bash .gpu/run tests -test.run 'CUDA' -test.skip 'FashionMNIST|DataParallel|Sharded' > "$out/tests.log" 2>&1
echo "tests exit $?"; grep -E "^(ok|FAIL|--- FAIL|panic)" "$out/tests.log" | head -20
OUT="$out/deep" SPECS=resnet1202:128 CONFIGS=fp32,amp ROUNDS=${DEEP_ROUNDS:-2} EXTRA="-steps 8 -warmup 3" \
  timeout 300 bash scripts/gpu-ab.sh > "$out/deep.log" 2>&1
echo "deep exit $?"; cat "$out/deep/summary.txt"
OUT="$out/cnn" CONFIGS=fp32,amp ROUNDS=${ROUNDS:-2} timeout 200 bash scripts/gpu-ab.sh > "$out/cnn.log" 2>&1
echo "cnn exit $?"; cat "$out/cnn/summary.txt"
