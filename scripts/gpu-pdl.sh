#!/usr/bin/env bash
# Programmatic dependent launches (docs/benchmarks.md, "Kernels launched as programmatic
# dependents") on the GPU machine, after, here:
#   ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data
#   and the commit before's bench in .gpu/old/bench.xz (scripts/gpu-ab.sh)
# there: bash scripts/gpu-pdl.sh tests gpt cnn
#   tests  the CUDA tests of the staged packages (TESTS)
#   gpt    GPT-2 small bf16, the old bench and the new alternating (ROUNDS, 3)
#   cnn    ResNet-20 and ResNet-18 at 256, fp32 and AMP, the same way (ROUNDS, 2)
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA|WGMMA}" bash scripts/gpu-attn.sh tests
    grep -A2 -E -- "--- (PASS|SKIP|FAIL): .*Programmatic" "$out/tests.log" | head
    grep -E "programmatic launches" "$out/tests.log" | head -2
    ;;
  gpt)
    OUT="$out/gpt" SPECS=gpt2:16 CONFIGS=amp EXTRA="-vocab 50304 -amp-dtype bf16" ROUNDS="${ROUNDS:-3}" \
      bash scripts/gpu-ab.sh | tail -8
    ;;
  cnn)
    OUT="$out/cnn" SPECS="resnet20:256 resnet18:256" CONFIGS=fp32,amp ROUNDS="${ROUNDS:-2}" bash scripts/gpu-ab.sh | tail -12
    ;;
  esac
done
tar czf /tmp/pdl.tgz -C "$out" . && mv /tmp/pdl.tgz "$out/all.tgz"
