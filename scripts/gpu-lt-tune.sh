#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda and an old bench binary in
# .gpu/old/bench.xz (see scripts/gpu-ab.sh): the products' timed algorithms (Note [products'
# algorithms timed]) checked and measured.
#   bash scripts/gpu-lt-tune.sh tests epilogues candidates profile ab
# tests: the CUDA conformance and product tests; epilogues: BenchmarkCUDAGemmEpilogues; candidates: BenchmarkCUDAGemmCandidates (each
# candidate's µs for GPT-2 small's products); profile: an eager GPT-2 small bf16 step, every kind of
# operation above 0.2%; ab: old and new bench alternating on GPT-2 small (ROUNDS, CONFIGS).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
for what in "$@"; do
  case $what in
  tests)
    timeout 300 bash .gpu/run tests -test.run "${TESTS:-CUDAConformance|CUDAGemm|Epilogue}" -test.count 1 -test.v > "$out/tests.log" 2>&1
    echo "tests exit: $?"; grep -E "^(--- FAIL|FAIL|ok|PASS|panic)|kerneltest" "$out/tests.log" | tail -20
    ;;
  candidates)
    timeout 200 bash .gpu/run tests -test.run XXX -test.bench CUDAGemmCandidates -test.benchtime 50x -test.v > "$out/candidates.log" 2>&1
    echo "candidates exit: $?"; grep -E "candidates|µs/product" "$out/candidates.log" | sed -E 's/^ +//' | cut -c1-220
    ;;
  epilogues)
    timeout 200 bash .gpu/run tests -test.run XXX -test.bench CUDAGemmEpilogues -test.benchtime 50x > "$out/epilogues.log" 2>&1
    echo "epilogues exit: $?"; grep -E "µs/product" "$out/epilogues.log" | sed -E 's/^Benchmark//; s/ +[0-9]+ +[0-9]+ ns\/op//'
    ;;
  profile)
    timeout 200 bash .gpu/run bin/bench -device cuda -specs gpt2:16 -configs amp -amp-dtype bf16 -profile -profile-share 0.2 \
      -vocab 50304 -pytorch "" -claims=false -eager=false -steps 3 -warmup 2 -out "$out/profile" > "$out/profile.log" 2>&1
    echo "profile exit: $?"; grep -E "^profile|leangrad .*ms|rror" "$out/profile.log"
    ;;
  ab)
    OUT="$out/ab" SPECS=gpt2:16 CONFIGS="${CONFIGS:-amp}" EXTRA="-vocab 50304 -amp-dtype bf16" ROUNDS="${ROUNDS:-2}" bash scripts/gpu-ab.sh
    ;;
  esac
done
