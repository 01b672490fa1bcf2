#!/usr/bin/env bash
# Runs on the GPU machine from the project root after ../shared/gpu/stage:
# probes the machine, runs every CUDA test and the ResNet-20 step benchmark.
# Full logs go to $OUT (or ./gpu-out); the end of the output is a summary.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  ldconfig -p | grep -E 'libcuda.so|nvrtc|cublas|cudnn' | head -20
  ls /usr/local/cuda/lib64 2>/dev/null | grep -E 'nvrtc|cublas' | head
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
bash .gpu/run tests -test.run CUDA -test.v -test.count 1 > "$out/tests.log" 2>&1
echo "tests exit: $?"
grep -E '^(--- FAIL|FAIL|ok|panic)|^\s+\S+\.go:[0-9]+:' "$out/tests.log" | head -80
grep -cE '^--- PASS' "$out/tests.log" | sed 's/^/top-level tests passed: /'
grep -E '^\s+--- FAIL' "$out/tests.log" | head -40
bash .gpu/run tests -test.run XXX -test.bench "${BENCH:-ResNet20}" -test.benchtime "${BENCHTIME:-30x}" > "$out/bench.log" 2>&1
grep -E 'Benchmark|FAIL|panic' "$out/bench.log"
