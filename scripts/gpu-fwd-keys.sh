#!/usr/bin/env bash
# The flash forward's steps of 64 or 128 keys and blocks of one or two warpgroups
# (FLASH_FWD_KEYS, FLASH_FWD_WG), on the GPU machine, after, here:
#   ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data
#   BASE=HEAD bash scripts/gpu-flash.sh prep
#   the commit before's bench in .gpu/old/bench.xz and the candidate's in .gpu/ab/new-bench.xz
#   (scripts/gpu-ab.sh)
# there: bash scripts/gpu-fwd-keys.sh flash tests gpt bench
#   flash  flash-bench: the base's kernels, the tree's, and the tree's with the forward's variants
#          (VARIANTS replaces them; VARIANTS=" " runs none), twice. The default variant is the
#          forward in blocks of one warpgroup; the steps of 128 keys measured on 2026-12-03
#          (FLASH_FWD_KEYS, FLASH_FWD_WARPGROUPS) need that run's fwd-keys.diff applied
#          (benchmarks/results/2026-12-03-h200-fwd-keys/1-variants/)
#   tests  the CUDA tests of the staged packages (TESTS)
#   gpt    GPT-2 small bf16, the old bench and the new alternating (ROUNDS, 2)
#   bench  GPT-2 small beside PyTorch eager and compiled, bf16 with and without checkpointing and
#          fp16 (scripts/gpu-gpt.sh bench; COMMIT names the staged commit)
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
src=kernels/cuda/src/flash.cu
variants=${VARIANTS:-"wg1=$src@FLASH_FWD_WG=1"}
for what in "$@"; do
  case $what in
  flash)
    for r in 1 2; do
      # shellcheck disable=SC2086 # one word a variant
      OUT="$out/flash-$r" timeout 240 bash scripts/gpu-flash.sh run $variants > "$out/flash-$r.txt" 2>&1
      echo "flash $r exit: $?"
      grep -E '^[a-z0-9]+ \{' "$out/flash-$r.txt" | python3 -c '
import json, sys
for line in sys.stdin:
    name, _, js = line.partition(" ")
    r = json.loads(js)
    print("%-8s fwd %.4f ms  bwd %.4f ms  err o %.2e lse %.2e  same bits o %s" % (name, r["ms"]["fwd"], r["ms"]["bwd"],
          r["err"]["o"], r["err"]["lse"], r["same_bits_as_first"]["o"]))'
      grep -vE '^[a-z0-9]+ \{' "$out/flash-$r.txt" | grep -vE "nvrtc .*(bwd|Compiling|0 bytes spill)" | tail -14
    done
    ;;
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA|WGMMA}" bash scripts/gpu-attn.sh tests
    ;;
  bench)
    OUT="$out/bench" CONFIGS=amp,amp+checkpoint VOCAB=50304 PYCOMPILE=1 FP16=1 bash scripts/gpu-gpt.sh bench | tail -30
    ;;
  gpt)
    OUT="$out/gpt" SPECS=gpt2:16 CONFIGS=amp EXTRA="-vocab 50304 -amp-dtype bf16" ROUNDS="${ROUNDS:-2}" \
      bash scripts/gpu-ab.sh | tail -6
    ;;
  esac
done
tar czf /tmp/fwd-keys.tgz -C "$out" . && mv /tmp/fwd-keys.tgz "$out/all.tgz"
