#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package; the bench binary is always built):
# the ResNet rows of issue 23's table whose captured peaks are above PyTorch's, with the planned
# steps' workspace room at its default, at 1/16 and at none, the eager step beside
# (bin/bench -plan-room). ROOMS overrides the list ("-1" is the default). Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for room in ${ROOMS:--1 0.0625 0}; do
  timeout 240 bash .gpu/run bin/bench -device cuda -specs "${SPECS:-resnet20:256,1024 resnet18:256}" -configs "${CONFIGS:-amp,amp+checkpoint}" \
    -plan-room "$room" -pytorch "" -claims=false -steps 20 -warmup 5 -out "$out/room$room" -commit "${COMMIT:-}" > "$out/room$room.log" 2>&1
  echo "room $room exit: $?"; grep -E "^\| resnet" "$out/room$room/bench.md"
done
