#!/usr/bin/env bash
# fp32 GPT-2's attention and products (docs/benchmarks.md, "fp32 attention's chunks a warp a row"
# and after) on the GPU machine, after, here:
#   ../shared/gpu/stage ./kernels/cuda ./autograd ./nn && rm -rf .gpu/data
#   the commit before's bench in .gpu/old/bench.xz (scripts/gpu-ab.sh)
#   and, for kernels, `go run ./scripts/kernelsrc` of the tree in .gpu/kernels.cu (of the commit
#   before in .gpu/kernels-old.cu)
# there: bash scripts/gpu-fp32.sh tests kernels epilogues ab profile
#   tests      the CUDA tests of the staged packages (TESTS)
#   kernels    flash32-bench: the F32 flash kernels of the commit before (old=) and the tree's
#              (base=, and VARIANTS, flash32-bench's name=MACRO=VALUE,...), beside PyTorch's SDPA
#   epilogues  BenchmarkCUDAGemmEpilogues: GPT-2 small's products with epilogues, BF16 and F32,
#              unfused and fused
#   ab         GPT-2 small fp32, batch 16, the old bench and the new alternating (ROUNDS, 2)
#   profile    an eager fp32 step's device time by kernel, old and new (every kind of at least
#              0.3% of the step)
# MATMUL=tf32x3 sets -matmul-f32 for ab and profile, old and new.
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA}" bash scripts/gpu-attn.sh tests
    ;;
  kernels)
    (cd scripts && timeout 300 python3 flash32-bench.py --source ../.gpu/kernels-old.cu old= &&
      timeout 300 python3 flash32-bench.py --source ../.gpu/kernels.cu base= ${VARIANTS:-}) > "$out/flash32-bench.log" 2>&1
    echo "kernels exit: $?"; cat "$out/flash32-bench.log"
    ;;
  epilogues)
    timeout 300 bash .gpu/run tests -test.run '^$' -test.bench 'CUDAGemmEpilogues' -test.benchtime 50x > "$out/epilogues.log" 2>&1
    echo "epilogues exit: $?"; grep -E "µs|FAIL|rror" "$out/epilogues.log" | sed -E 's/BenchmarkCUDAGemmEpilogues\///'
    ;;
  ab)
    OUT="$out/ab" SPECS=gpt2:16 CONFIGS=fp32 EXTRA="-vocab 50304 ${MATMUL:+-matmul-f32 $MATMUL}" ROUNDS="${ROUNDS:-2}" bash scripts/gpu-ab.sh | tail -6
    ;;
  profile)
    [ -x /tmp/old-bench ] || { xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench; }
    for which in old new; do
      bin="bash .gpu/run bin/bench"
      [ $which = old ] && bin=/tmp/old-bench
      timeout 200 $bin ${MATMUL:+-matmul-f32 $MATMUL} -device cuda -specs gpt2:16 -configs fp32 -vocab 50304 -pytorch "" -claims=false \
        -eager=false -steps 3 -warmup 1 -profile -profile-share 0.3 -out "$out/profile-$which" > "$out/profile-$which.log" 2>&1
      echo "profile $which exit: $?"
      grep -E "^profile:" "$out/profile-$which.log" | cut -c1-2500
    done
    ;;
  esac
done
tar czf /tmp/fp32.tgz -C "$out" . && mv /tmp/fp32.tgz "$out/all.tgz"
