#!/usr/bin/env bash
# Scaling out to 4 and 8 GPUs (nvidia-h200-x4, nvidia-h200-x8), from the project root after
# ../shared/gpu/stage ./dist ./train:
#
#   N=4 bash scripts/gpu-scale.sh tests   # the data-parallel CUDA tests: NCCL, the captured step, the sharded step
#   N=4 bash scripts/gpu-scale.sh bench   # ResNet-18 and ResNet-20 AMP, GPT-2 small bf16, on 1 and N GPUs beside
#                                         # PyTorch (DDP), and GPT-2 with its optimizer state sharded (-shard-optimizer)
#   bash scripts/gpu-scale.sh kill        # 8 ranks: one killed mid-run; the last checkpoint resumed on 4
#
# Logs and JSON go to $OUT (or ./gpu-out), all of them into all.tgz there; COMMIT names the commit
# measured. DEVICE=cpu and TRAIN="..." (the training flags) let `kill` rehearse on a CPU.
# NCCL_NVLS_ENABLE=0 (NVLink multicast off) is the machine's setting and stays.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
commit=${COMMIT:-unknown}
n=${N:-4}
device=${DEVICE:-cuda}
cnn=${SPECS:-"resnet18:256 resnet20:256"}
gpt=(-specs gpt2:16 -configs amp -amp-dtype bf16 -vocab 50304)
common=(-device "$device" -warmup 10 -steps 30 -commit "$commit")

case "${1:-}" in
tests)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$out/machine.txt" 2>&1
  timeout 400 bash .gpu/run tests -test.run 'CUDANCCL|CUDADataParallel|CUDAShardedOptimizer' -test.v -test.count 1 > "$out/tests.log" 2>&1
  echo "tests exit: $?"
  grep -E '^(\s+)?--- |^(FAIL|ok|PASS|panic)|_test\.go:[0-9]+:' "$out/tests.log" | cut -c1-250 | head -60
  ;;
bench)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$out/machine.txt" 2>&1
  # leangrad, captured steps: one GPU, then N ranks (GPT-2 also with the optimizer state sharded).
  bash .gpu/run bin/bench "${common[@]}" -specs "$cnn" -configs amp -pytorch "" -claims=false -eager=false -out "$out/one-cnn" > "$out/one-cnn.log" 2>&1
  echo "leangrad ResNets, 1 GPU, exit $?"; grep -E '^leangrad' "$out/one-cnn.log" | head
  bash .gpu/run bin/bench "${common[@]}" "${gpt[@]}" -pytorch "" -claims=false -eager=false -out "$out/one-gpt" > "$out/one-gpt.log" 2>&1
  echo "leangrad GPT-2, 1 GPU, exit $?"; grep -E '^leangrad' "$out/one-gpt.log" | head
  bash .gpu/run bin/bench -nproc "$n" "${common[@]}" -specs "$cnn" -configs amp -out "$out/ddp-cnn" > "$out/ddp-cnn.log" 2>&1
  echo "leangrad ResNets, $n GPUs, exit $?"; grep -E 'leangrad-ddp|FAIL|panic|rank [0-9]+:' "$out/ddp-cnn.log" | head
  bash .gpu/run bin/bench -nproc "$n" "${common[@]}" "${gpt[@]}" -out "$out/ddp-gpt" > "$out/ddp-gpt.log" 2>&1
  echo "leangrad GPT-2, $n GPUs, exit $?"; grep -E 'leangrad-ddp|FAIL|panic|rank [0-9]+:' "$out/ddp-gpt.log" | head
  bash .gpu/run bin/bench -nproc "$n" "${common[@]}" "${gpt[@]}" -shard-optimizer -out "$out/ddp-gpt-sharded" > "$out/ddp-gpt-sharded.log" 2>&1
  echo "leangrad GPT-2, $n GPUs, sharded, exit $?"; grep -E 'leangrad-ddp|FAIL|panic|rank [0-9]+:' "$out/ddp-gpt-sharded.log" | head
  # PyTorch: the same models, one GPU, then DDP over N.
  for k in 1 "$n"; do
    torchrun --standalone --nproc-per-node "$k" benchmarks/pytorch/ddp.py --specs $cnn --configs amp \
      --warmup 10 --steps 30 --out "$out/pytorch-cnn-$k.json" > "$out/pytorch-cnn-$k.log" 2>&1
    echo "pytorch ResNets, $k GPU(s), exit $?"; grep -E 'img/s|Error' "$out/pytorch-cnn-$k.log" | head
    torchrun --standalone --nproc-per-node "$k" benchmarks/pytorch/gpt.py bench --layers 12 --heads 12 --width 768 \
      --context 1024 --batch 16 --amp bf16 --vocab 50304 --warmup-steps 10 --timed 30 > "$out/pytorch-gpt-$k.json" 2> "$out/pytorch-gpt-$k.log"
    echo "pytorch GPT-2, $k GPU(s), exit $?"; cut -c1-300 "$out/pytorch-gpt-$k.json"; grep -E 'Error' "$out/pytorch-gpt-$k.log" | head -3
  done
  tar czf /tmp/scale-all.tgz -C "$out" . && mv /tmp/scale-all.tgz "$out/all.tgz"
  ;;
kill)
  # 8 ranks train, saving every epoch; once the first checkpoint exists, rank 3 is killed (SIGKILL, no
  # goodbye). Every other rank must end within 10 s with an error naming rank 3; then 4 ranks resume
  # the checkpoint and finish.
  ranks=${KILL_RANKS:-8} resume=${RESUME_RANKS:-4}
  read -r -a flags <<< "${TRAIN:--model resnet -amp -epochs 4}"
  ckpt="$out/kill.ckpt"
  rm -f "$ckpt"
  bash .gpu/run bin/train -nproc "$ranks" -device "$device" "${flags[@]}" -save "$ckpt" > "$out/kill.log" 2>&1 &
  job=$!
  until [ -f "$ckpt" ] || ! kill -0 "$job" 2>/dev/null; do sleep 0.2; done
  sleep 1
  victim=""
  for p in $(pgrep -f 'bin/train'); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=3'; then victim=$p; fi
  done
  if [ -z "$victim" ]; then echo "no rank 3 to kill (the job ended first?)"; wait "$job"; exit 1; fi
  start=$(date +%s.%N)
  kill -9 "$victim"
  wait "$job"
  code=$?
  end=$(date +%s.%N)
  echo "rank 3 (pid $victim) killed; the job exited $code after $(awk "BEGIN{printf \"%.2f\", $end - $start}") s"
  grep -E 'rank 3|error|Error' "$out/kill.log" | cut -c1-250 | head -12
  bash .gpu/run bin/train -nproc "$resume" -device "$device" "${flags[@]}" -resume "$ckpt" -json "$out/resumed.json" > "$out/resumed.log" 2>&1
  echo "resumed on $resume ranks, exit $?"; grep -E 'resumed|test accuracy|epoch' "$out/resumed.log" | cut -c1-200 | head -12
  tar czf /tmp/scale-all.tgz -C "$out" . && mv /tmp/scale-all.tgz "$out/all.tgz"
  ;;
*)
  echo "usage: N=4|8 gpu-scale.sh tests|bench|kill" >&2
  exit 2
  ;;
esac
