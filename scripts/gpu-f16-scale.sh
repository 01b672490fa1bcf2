#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./nn ./train: the CUDA tests of the
# classifier's loss-scaled gradients and of the GPT steps, then GPT-2 small's bf16 and fp16 steps
# alternating (scripts/gpu-gpt-ratio.sh ratio, ROUNDS rounds).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 150 bash .gpu/run tests -test.run 'CUDAConformance|CUDAGPT|CUDAPlanned|CUDAInf|CUDAStep' -test.count 1 -test.v > "$out/tests.log" 2>&1
echo "tests exit $?"; grep -E "^(--- FAIL|FAIL|ok|panic)|^--- PASS: TestCUDA(Conformance|GPTPlanned|InfSkips)" "$out/tests.log" | head -20
grep -A6 -- "--- FAIL" "$out/tests.log" | head -30
OUT="$out" ROUNDS="${ROUNDS:-1}" bash scripts/gpu-gpt-ratio.sh ratio
