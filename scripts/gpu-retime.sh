#!/usr/bin/env bash
# On the GPU machine after ../shared/gpu/stage ./kernels/cuda: the convolution tests (conformance,
# halves, chunks), then ResNet-1202 at 128, fp32 against AMP, ROUNDS separate runs of the staged
# bench (gpu-r1202-amp-vs-fp32.sh). In $OUT.
set -uo pipefail
out=/tmp/rt; mkdir -p $out
timeout 150 bash .gpu/run tests -test.run 'CUDAConformance|CUDAConv' -test.v > $out/tests.log 2>&1
echo "tests exit $?"; grep -E "^(--- |ok|FAIL|PASS)" $out/tests.log | head
bash scripts/gpu-r1202-amp-vs-fp32.sh
tar czf $OUT/tests.tgz -C $out .
