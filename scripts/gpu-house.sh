#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./tensor ./autograd ./nn ./optim ./train:
# the CUDA tests of those packages, then the harness's leangrad side for the
# ResNet rows that the typed bindings and launches must leave within noise
# (no PyTorch: its figures are in docs/benchmarks.md, from the same step).
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
bash .gpu/run tests -test.run CUDA -test.count 1 > "$out/tests.log" 2>&1
echo "tests exit: $?" | tee -a "$out/tests.log"
grep -E "^(=== |--- FAIL|FAIL|ok|PASS)" "$out/tests.log" | grep -v "^=== RUN" | tail -40
timeout 300 bash .gpu/run bin/bench -device cuda -specs "resnet20:256 resnet18:256" -configs fp32,amp \
  -pytorch "" -claims=false -eager=false -out "$out/bench" -commit "${COMMIT:-}" > "$out/bench.log" 2>&1
echo "bench exit: $?"
grep -E "leangrad .*ms" "$out/bench.log"
