#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage ./kernels/cuda ./kernels/cpu ./kernels/cpu/sgemm):
# every staged package's tests, which for kernels/cuda includes the conformance suite against
# the CPU backend, and the CPU kernels' tests on this machine's CPU. Logs land in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 300 bash .gpu/run tests -test.v > "$out/tests.log" 2>&1
echo "tests exit: $?"
grep -E '^(=== [a-z]|--- FAIL|FAIL|ok|PASS)' "$out/tests.log" | grep -v '^=== RUN' | tail -20
grep -cE '^--- PASS' "$out/tests.log" | sed 's/^/passed: /'
grep -E '^--- SKIP' "$out/tests.log" | head -10
