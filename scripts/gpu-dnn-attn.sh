#!/usr/bin/env bash
# cuDNN's attention (Note [cuDNN's attention], kernels/cuda/sdpa.go) on the GPU machine, after,
# here: ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data, and the commit
# before's bench in .gpu/old/bench.xz (scripts/gpu-ab.sh).
# there: bash scripts/gpu-dnn-attn.sh first tests gpt profile bench
#   first    TestCUDADNNAttention alone, with cuDNN's error log (STOP=1: stop the script if it fails)
#   tests    the CUDA tests of the staged packages
#   gpt      GPT-2 small bf16, the old bench and the new alternating (ROUNDS, 2)
#   profile  an eager GPT-2 small bf16 step's device time by operation
#   bench    GPT-2 small beside PyTorch eager and compiled (scripts/gpu-gpt.sh bench; COMMIT names it)
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
pack() { tar czf /tmp/dnn-attn.tgz -C "$out" --exclude all.tgz . && mv /tmp/dnn-attn.tgz "$out/all.tgz"; }
for what in "$@"; do
  case $what in
  first)
    CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr timeout 240 bash .gpu/run tests -test.run 'TestCUDADNNAttention' -test.v \
      > "$out/first.log" 2>&1
    rc=$?
    grep -E -- "^(--- |ok|FAIL|PASS)|cuda_test.go|refused" "$out/first.log" | head -20
    grep -iE "error|not supported|fail" "$out/first.log" | grep -v -- "--- " | head -30
    if [ $rc -ne 0 ] && [ -n "${STOP:-}" ]; then pack; exit 1; fi
    ;;
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA|WGMMA}" bash scripts/gpu-attn.sh tests
    ;;
  gpt)
    OUT="$out/gpt" SPECS=gpt2:16 CONFIGS=amp EXTRA="-vocab 50304 -amp-dtype bf16" ROUNDS="${ROUNDS:-2}" \
      bash scripts/gpu-ab.sh | tail -6
    ;;
  profile)
    OUT="$out" CONFIGS=amp PROFILE=1 bash scripts/gpu-attn.sh step
    ;;
  bench)
    OUT="$out/bench" CONFIGS=amp,amp+checkpoint VOCAB=50304 PYCOMPILE=1 FP16=1 bash scripts/gpu-gpt.sh bench | tail -30
    ;;
  esac
done
pack
