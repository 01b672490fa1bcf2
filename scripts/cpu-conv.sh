#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage ./kernels/cpu): ResNet-20's convolutions one by
# one, leangrad's (BenchmarkConvResNet20) beside PyTorch CPU's (benchmarks/pytorch/conv_cpu.py),
# pinned to the same two CPUs, ROUNDS rounds (default 2) that alternate which runs first, since
# the machine's speed drifts within seconds; then where each engine's ResNet-20 step (batch 32, fp32)
# spends its time: PyTorch's profiler and leangrad's bench -profile. CORES as in cpu-bench.sh.
# Everything lands in $OUT/conv.log.
set -uo pipefail
out=${OUT:-cpu-out}/conv.log
mkdir -p "$(dirname "$out")"
cores=${CORES:-$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | tail -2 | cut -d, -f1 | paste -sd,)}
echo "pinned to CPUs $cores" | tee "$out"
for i in $(seq 1 "${ROUNDS:-2}"); do
  echo "round $i" | tee -a "$out"
  leangrad() {
    timeout 120 taskset -c "$cores" bash .gpu/run tests -test.run XXX -test.bench ConvResNet20 -test.benchtime 30x 2>&1 |
      grep Benchmark | awk '{print "leangrad conv", $1, $3, $4, $5, $6}' | tee -a "$out"
  }
  pytorch() { timeout 120 taskset -c "$cores" python3 benchmarks/pytorch/conv_cpu.py --reps 30 2>&1 | tee -a "$out"; }
  if [ $((i % 2)) = 1 ]; then leangrad; pytorch; else pytorch; leangrad; fi
done
timeout 120 taskset -c "$cores" python3 benchmarks/pytorch/conv_cpu.py --reps 3 --profile 2>&1 | grep -v ' conv ' | tee -a "$out"
timeout 120 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out /tmp/conv-bench -specs "resnet20:32" \
  -configs fp32 -pytorch "" -steps 20 -warmup 3 -claims=false -profile 2>&1 | grep -E '^(leangrad|profile:|SGEMM)' | tee -a "$out"
