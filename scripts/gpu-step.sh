#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage ./kernels/cuda ./train ./optim ./nn): the
# CUDA tests of the staged packages, the step benchmark (captured and eager, with a
# device-time profile), and a short main job. Logs land in $OUT/step.tar.gz; summaries go to stdout.
#   BENCH_SPECS  models and batches for bin/bench   (default resnet20:256 resnet18:256)
#   BENCH_ARGS   more bench flags (e.g. -pytorch "" to skip PyTorch)
#   EPOCHS       epochs of the main job             (default 2)
set -uo pipefail
final=${OUT:-gpu-out}
out=$(mktemp -d)/step
mkdir -p "$out" "$final"
trap 'tar -C "$(dirname "$out")" -czf "$final/step.tar.gz" step' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-300} bash .gpu/run tests -test.run ${TESTS:-CUDA} -test.v -test.count 1 > "$out/tests.log" 2>&1
  echo "tests exit: $?"
  grep -E '^(--- FAIL|FAIL|ok|panic)|^\s+--- FAIL|^\s+\S+_test\.go:[0-9]+:' "$out/tests.log" | head -60
  grep -cE '^--- PASS' "$out/tests.log" | sed 's/^/top-level tests passed: /'
fi
timeout ${BENCH_TIMEOUT:-240} bash .gpu/run bin/bench -device cuda -out "$out/bench" -specs "${BENCH_SPECS:-resnet20:256 resnet18:256}" \
  -steps "${STEPS:-30}" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1
echo "bench exit: $?"
grep -E '^(leangrad|pytorch|profile|claim|  batch)|bench:|panic' "$out/bench.log" | head -60
cat "$out/bench/bench.md" 2>/dev/null | head -30
timeout ${TRAIN_TIMEOUT:-120} bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -epochs "${EPOCHS:-2}" \
  -json "$out/train.json" -memplot "$out/train_mem.png" ${TRAIN_ARGS:-} > "$out/train.log" 2>&1
echo "train exit: $?"
grep -vE 'step [0-9]+/|^\|' "$out/train.log" | head -40
if [ -n "${EXTRA:-}" ]; then
  (export W="$out"; eval "$EXTRA") > "$out/extra.log" 2>&1
  echo "extra exit: $?"
  grep -E '^(leangrad|profile|  batch)|bench:|panic' "$out/extra.log" | head -30
fi
