#!/usr/bin/env bash
# Data-parallel work on the two-GPU machine (nvidia-h200-x2), from the project
# root after ../shared/gpu/stage ./dist ./train ./nn ./autograd ./optim ./kernels/cuda:
#
#   bash scripts/gpu-ddp.sh tests   # the CUDA tests (NCCL, the captured data-parallel step, ...)
#   bash scripts/gpu-ddp.sh bench   # throughput on 1 and 2 GPUs beside PyTorch DDP, the main job on 2 GPUs
#
# Logs and JSON go to $OUT (or ./gpu-out), and all of them into all.tgz there; COMMIT names
# the commit measured.
# NCCL_NVLS_ENABLE=0 (NVLink multicast off) is the machine's setting and stays.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
commit=${COMMIT:-unknown}
specs=${SPECS:-"resnet18:256 resnet20:256"}
configs=${CONFIGS:-fp32,amp}

case "${1:-}" in
tests)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$out/machine.txt" 2>&1
  env | grep -E '^NCCL_' >> "$out/machine.txt"
  cat "$out/machine.txt"
  timeout 540 bash .gpu/run tests -test.run CUDA -test.v -test.count 1 -test.timeout 500s > "$out/tests.log" 2>&1
  echo "tests exit: $?"
  grep -E '^(=== [a-z]|--- FAIL|FAIL|ok|PASS|panic)|^\s+\S+_test\.go:[0-9]+:' "$out/tests.log" | cut -c1-300 | head -120
  grep -cE '^--- PASS' "$out/tests.log" | sed 's/^/top-level tests passed: /'
  grep -E '^--- SKIP' "$out/tests.log" | head
  ;;
bench)
  nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$out/machine.txt" 2>&1
  # The data-parallel tests first (NCCL, a dead rank, the captured step on two GPUs in one process).
  timeout 120 bash .gpu/run tests -test.run 'CUDANCCL|CUDADataParallel' -test.v -test.count 1 > "$out/tests-ddp.log" 2>&1
  echo "data-parallel tests exit $?"; grep -E '^(--- |panic)|_test\.go:[0-9]+:' "$out/tests-ddp.log" | cut -c1-250 | head -20
  # leangrad: one GPU (captured steps), then two ranks.
  bash .gpu/run bin/bench -device cuda -specs "$specs" -configs "$configs" -pytorch "" -claims=false -eager=false \
    -warmup 10 -steps 30 -commit "$commit" -out "$out/one" > "$out/one.log" 2>&1
  echo "leangrad 1 GPU exit $?"; grep -E '^leangrad|img/s' "$out/one.log" | head -20
  bash .gpu/run bin/bench -nproc 2 -device cuda -specs "$specs" -configs "$configs" \
    -warmup 10 -steps 30 -commit "$commit" -out "$out/two" > "$out/two.log" 2>&1
  echo "leangrad 2 GPUs exit $?"; grep -E 'leangrad-ddp|rank|FAIL|panic' "$out/two.log" | head -20
  # The same with the all-reduce after the backward: what overlapping gains.
  bash .gpu/run bin/bench -nproc 2 -overlap=false -device cuda -specs "$specs" -configs "$configs" \
    -warmup 10 -steps 30 -commit "$commit" -out "$out/two-no-overlap" > "$out/two-no-overlap.log" 2>&1
  echo "leangrad 2 GPUs, no overlap, exit $?"; grep -E 'leangrad-ddp|FAIL|panic' "$out/two-no-overlap.log" | head -20
  # PyTorch: the same models and configurations, one GPU, then DDP over two.
  for n in 1 2; do
    torchrun --standalone --nproc-per-node $n benchmarks/pytorch/ddp.py --specs $specs --configs "$configs" \
      --warmup 10 --steps 30 --out "$out/pytorch-$n.json" > "$out/pytorch-$n.log" 2>&1
    echo "pytorch $n GPU(s) exit $?"; grep -E 'img/s|Error' "$out/pytorch-$n.log" | head -10
  done
  # The main job on two GPUs (batch 64 per rank: the single-GPU default's 128 in all), and on one.
  bash .gpu/run bin/train -nproc 2 -model resnet -amp -checkpoint -batch 64 -json "$out/main-2gpu.json" > "$out/main-2gpu.log" 2>&1
  echo "main job 2 GPUs exit $?"; grep -E 'data parallel|rank [01]  |test accuracy|throughput|epoch 15:' "$out/main-2gpu.log" | head -12
  bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -json "$out/main-1gpu.json" > "$out/main-1gpu.log" 2>&1
  echo "main job 1 GPU exit $?"; grep -E 'test accuracy|throughput|epoch 15:' "$out/main-1gpu.log" | head -5
  # Everything in one file: the machine sends back a limited number of files.
  tar czf /tmp/ddp-all.tgz -C "$out" . && mv /tmp/ddp-all.tgz "$out/all.tgz"
  ;;
*)
  echo "usage: gpu-ddp.sh tests|bench" >&2
  exit 2
  ;;
esac
