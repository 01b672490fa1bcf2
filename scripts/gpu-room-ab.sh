#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage and with .gpu/old/bench.xz (another commit's bench,
# see gpu-ab.sh): the checkpointed CNN rows under several workspace rooms (ROOMS, -plan-room), for
# both binaries, and the AMP rows under the planner's time tolerances (TOLERANCES, new binary).
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
specs=${SPECS:-"resnet20:256,1024 resnet18:256"}
common=(-device cuda -specs "$specs" -pytorch "" -claims=false -steps 15 -warmup 4)
row() { grep -E "^\| resnet" "$1/bench.md" | cut -d'|' -f2-6,11; }
for room in ${ROOMS:--1 1 2}; do
  for which in new old; do
    if [ "$which" = old ]; then bin=/tmp/old-bench; else bin="bash .gpu/run bin/bench"; fi
    d="$out/$which-room$room"
    timeout 120 $bin "${common[@]}" -configs checkpoint,amp+checkpoint -plan-room "$room" -out "$d" > "$d.log" 2>&1
    echo "$which room $room exit $?"; row "$d"
  done
done
for tol in ${TOLERANCES:-0.05}; do
  d="$out/tol-$tol"
  timeout 100 bash .gpu/run bin/bench "${common[@]}" -configs fp32,amp -eager=false -plan-tolerance "$tol" -out "$d" > "$d.log" 2>&1
  echo "tolerance $tol exit $?"; row "$d"
done
