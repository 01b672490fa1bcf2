#!/usr/bin/env bash
# Σ do·o made by flash_bwd_q, the layer-norm backward's sums a block at a time and the variants
# tried beside them (docs/benchmarks.md, "Σ do·o made by flash_bwd_q"), on the GPU machine, after, here:
#   ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data
#   BASE=<commit> bash scripts/gpu-flash.sh prep
#   and the base commit's bench in .gpu/old/bench.xz (scripts/gpu-ab.sh)
# there: bash scripts/gpu-bwd-sums.sh flash tests profile ab
#   flash    flash-bench: base, the tree's kernels (sm_90a and sm_90) and VARIANTS' (flash-bench's name=file)
#   tests    the CUDA tests of the staged packages (TESTS)
#   profile  an eager GPT-2 small bf16 step's device time by kernel; profile-old: the base commit's
#   ab       the base commit's bench and the tree's alternating (ROUNDS, CONFIGS)
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  flash)
    OUT="$out/flash" bash scripts/gpu-attn.sh flash 2>&1 | tail -20
    ;;
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA}" bash scripts/gpu-attn.sh tests
    ;;
  profile)
    OUT="$out" bash scripts/gpu-lt-tune.sh profile | cut -c1-2500
    ;;
  profile-old)
    xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
    timeout 200 /tmp/old-bench -device cuda -specs gpt2:16 -configs amp -amp-dtype bf16 -profile -profile-share 0.2 \
      -vocab 50304 -pytorch "" -claims=false -eager=false -steps 3 -warmup 2 -out "$out/profile-old" > "$out/profile-old.log" 2>&1
    echo "profile-old exit: $?"; grep -E "^profile" "$out/profile-old.log" | cut -c1-2500
    ;;
  ab)
    OUT="$out" CONFIGS="${CONFIGS:-amp}" ROUNDS="${ROUNDS:-2}" bash scripts/gpu-lt-tune.sh ab | tail -8
    ;;
  esac
done
tar czf /tmp/bwd-sums.tgz -C "$out" . && mv /tmp/bwd-sums.tgz "$out/all.tgz"
