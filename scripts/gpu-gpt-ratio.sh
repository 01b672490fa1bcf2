#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package) and scripts/stage-brown.sh:
#   bash scripts/gpu-gpt-ratio.sh text profile ratio fp32
# text: train -model gpt (bf16, captured), leangrad alone; profile: an eager GPT-2 small fp16 step
# (the GradScaler's); ratio: GPT-2 small's bf16 and fp16 steps alternating, ROUNDS rounds (captured,
# vocabulary 50,304); fp32: GPT-2 small in fp32 (TF32 off), leangrad and PyTorch eager.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
source scripts/gpu-brown.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
args=(-device cuda -specs gpt2:16 -vocab 50304 -pytorch "" -claims=false -eager=false)
for what in "$@"; do
  case $what in
  text)
    timeout 240 bash .gpu/run bin/train -model gpt -amp -amp-dtype bf16 -sample 64 -device cuda \
      -json "$out/train-gpt.json" > "$out/train-gpt.log" 2> "$out/train-gpt.err"
    echo "text exit: $?"; grep -E "^(validation|throughput|peak|training)" "$out/train-gpt.log"
    ;;
  profile)
    timeout 200 bash .gpu/run bin/bench "${args[@]}" -configs amp -amp-dtype f16 -profile -profile-share 0.2 \
      -steps 3 -warmup 2 -out "$out/profile-f16" > "$out/profile-f16.log" 2>&1
    echo "profile exit: $?"; grep -E "^profile|leangrad .*ms|rror" "$out/profile-f16.log"
    ;;
  ratio)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      order="bf16 f16"
      [ $((r % 2)) -eq 0 ] && order="f16 bf16"
      for dt in $order; do
        timeout 120 bash .gpu/run bin/bench "${args[@]}" -configs amp -amp-dtype "$dt" -steps 20 -warmup 5 \
          -out "$out/ratio-$dt-$r" > "$out/ratio-$dt-$r.log" 2>&1
        echo "$dt round $r: $(grep -E '^leangrad \(captured\)' "$out/ratio-$dt-$r.log" | sed -E 's/ \(host[^)]*\)//; s/, reserved.*//')"
      done
    done
    ;;
  fp32)
    timeout 200 bash .gpu/run bin/bench "${args[@]}" -configs fp32 -steps 5 -warmup 2 -out "$out/fp32" > "$out/fp32.log" 2>&1
    echo "fp32 exit: $?"; grep -E "^leangrad \(captured\)|MFU" "$out/fp32.log"
    timeout 200 python3 benchmarks/pytorch/gpt.py bench --layers 12 --heads 12 --width 768 --context 1024 --batch 16 \
      --amp none --vocab 50304 --timed 5 > "$out/pytorch-fp32.jsonl" 2> "$out/pytorch-fp32.err"
    echo "pytorch fp32 exit: $?"; python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print('pytorch eager fp32', round(d['median_ms'],2), 'ms', round(d['peak_allocated']/2**30,2), 'GiB')" "$out/pytorch-fp32.jsonl"
    ;;
  esac
done
# Few files come back from a run: everything else in one archive.
tar czf /tmp/all.tgz -C "$out" --exclude all.tgz . && mv /tmp/all.tgz "$out/all.tgz"
