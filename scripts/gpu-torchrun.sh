#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package; the train binary is always built):
# train on two CPU ranks launched by PyTorch's torchrun, which serves its agent's TCPStore on
# MASTER_PORT: the ranks meet through it (dist's store client). Each rank's torchrun variables
# land in $OUT/env-RANK.txt, the run's output in $OUT/torchrun.log.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
if [ "${1:-}" = rank ]; then # one rank, under torchrun
  env | grep -E '^(TORCHELASTIC|MASTER|RANK|LOCAL_RANK|WORLD_SIZE)' | sort > "$out/env-$RANK.txt"
  exec "$LEANGRAD_BIN/train" -model mlp -device cpu -dataset synthetic -epochs 1 -limit 1024 -test-limit 128 -batch 32
fi
timeout 180 bash .gpu/run sh -c "torchrun --nproc-per-node 2 --master-port 29533 --no-python bash $0 rank" > "$out/torchrun.log" 2>&1
echo "torchrun exit: $?"
tail -8 "$out/torchrun.log"
cat "$out"/env-0.txt
