#!/usr/bin/env bash
# Attention's chunked path (fp32 GPT-2; docs/benchmarks.md, "fp32 attention's chunks a warp a
# row") on the GPU machine, after, here:
#   ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data
#   and the commit before's bench in .gpu/old/bench.xz (scripts/gpu-ab.sh)
# there: bash scripts/gpu-chunks.sh tests ab profile
#   tests    the CUDA tests of the staged packages (TESTS)
#   ab       GPT-2 small fp32, batch 16, the old bench and the new alternating (ROUNDS, 2)
#   profile  an eager fp32 step's device time by kernel, old and new (every kind of at least
#            0.3% of the step)
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA}" bash scripts/gpu-attn.sh tests
    ;;
  ab)
    OUT="$out/ab" SPECS=gpt2:16 CONFIGS=fp32 EXTRA="-vocab 50304" ROUNDS="${ROUNDS:-2}" bash scripts/gpu-ab.sh | tail -6
    ;;
  profile)
    [ -x /tmp/old-bench ] || { xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench; }
    for which in old new; do
      bin="bash .gpu/run bin/bench"
      [ $which = old ] && bin=/tmp/old-bench
      timeout 200 $bin -device cuda -specs gpt2:16 -configs fp32 -vocab 50304 -pytorch "" -claims=false \
        -eager=false -steps 3 -warmup 1 -profile -profile-share 0.3 -out "$out/profile-$which" > "$out/profile-$which.log" 2>&1
      echo "profile $which exit: $?"
      grep -E "^profile:" "$out/profile-$which.log" | cut -c1-2500
    done
    ;;
  esac
done
tar czf /tmp/chunks.tgz -C "$out" . && mv /tmp/chunks.tgz "$out/all.tgz"
