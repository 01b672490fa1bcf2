#!/usr/bin/env bash
# The attention kernels on the GPU machine, after `../shared/gpu/stage ./kernels/cuda` (and
# ./nn ./train for the GPT tests) and `BASE=<commit> bash scripts/gpu-flash.sh prep` here:
#   flash    flash-bench: the base commit's kernels, the tree's (sm_90a: wgmma) and the tree's
#            mma.sync path (compiled for sm_90), beside PyTorch's SDPA backends; VARIANTS adds
#            more (flash-bench's name=file[@MACRO=VALUE,...][%arch])
#   tests    the CUDA tests of the staged packages (conformance included)
#   step     GPT-2 small, batch 16, vocabulary 50,304: leangrad's bf16 steps alone (CONFIGS, PROFILE=1
#            adds an eager step's device time by kernel, FP16=1 the fp16 step with the GradScaler)
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  flash)
    timeout 240 bash scripts/gpu-flash.sh run tree90=kernels/cuda/src/flash.cu%sm_90 ${VARIANTS:-}
    echo "flash exit: $?"
    ;;
  tests)
    timeout 300 bash .gpu/run tests -test.run "${TESTS:-CUDA|WGMMA}" -test.count 1 -test.v > "$out/tests.log" 2>&1
    echo "tests exit: $?"
    grep -E "^(=== [a-z]|--- FAIL|FAIL|ok|PASS|panic)|_test.go" "$out/tests.log" | tail -30
    echo "passed: $(grep -c -- '--- PASS' "$out/tests.log"), skipped: $(grep -c -- '--- SKIP' "$out/tests.log"), failed: $(grep -c -- '--- FAIL' "$out/tests.log")"
    grep -E -- "--- (PASS|SKIP|FAIL): .*(WGMMA|Attention|Flash|Conformance)" "$out/tests.log" | head -20
    ;;
  step)
    timeout 200 bash .gpu/run bin/bench -device cuda -specs gpt2:16 -configs "${CONFIGS:-amp,amp+checkpoint}" -amp-dtype bf16 \
      -vocab 50304 -pytorch "" -claims=false -eager=false -steps 10 -warmup 3 ${PROFILE:+-profile} -out "$out/step" > "$out/step.log" 2>&1
    echo "step exit: $?"; grep -E "leangrad .*ms|MFU|Device time|rror" "$out/step.log" | cut -c1-1500
    if [ -n "${FP16:-}" ]; then # fp16 with the GradScaler
      timeout 120 bash .gpu/run bin/bench -device cuda -specs gpt2:16 -configs amp -amp-dtype f16 -vocab 50304 -pytorch "" \
        -claims=false -eager=false -steps 10 -warmup 3 -out "$out/step-f16" > "$out/step-f16.log" 2>&1
      echo "step f16 exit: $?"; grep -E "leangrad .*ms|rror" "$out/step-f16.log"
    fi
    ;;
  esac
done
