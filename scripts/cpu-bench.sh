#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage; optionally with an earlier commit's cmd/train,
# built with CGO_ENABLED=0, as .gpu/old/train.xz): the CPU benchmark behind the README's CPU numbers,
# leangrad and PyTorch pinned to the same two CPUs (taskset; PyTorch inherits the affinity and
# runs 2 threads). CORES picks them (default: the two highest-numbered CPUs on distinct physical
# cores, away from CPU 0, which the system uses most; lscpu's topology is saved beside the logs).
#   1. bench -device cpu: SGEMM GFLOP/s and the FMA peak, ResNet-20 (batch 32) and the MLP
#      (batch 128), fp32 and AMP, beside PyTorch CPU in ROUNDS rounds (default 6) that alternate
#      which engine runs first (with PYTORCH_AMP=0: fp32 beside PyTorch, and AMP against fp32 in
#      one process, also in ROUNDS rounds, with each operation's time);
#   2. the README's CPU main job (2000 images, one epoch), with this build and with .gpu/old's
#      when it is there.
# COMMIT names the commit the binaries were built from; PYTORCH_AMP=0 skips PyTorch's float16
# autocast, which takes seconds a step on the CPU. Everything lands in $OUT/cpu.tar.gz.
set -uo pipefail
final=${OUT:-cpu-out}
w=$(mktemp -d)/cpu
mkdir -p "$w" "$final"
trap 'tar -C "$(dirname "$w")" -czf "$final/cpu.tar.gz" cpu' EXIT
lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-300 > "$w/lscpu.txt"
lscpu -p=CPU,CORE,SOCKET >> "$w/lscpu.txt"
cores=${CORES:-$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | tail -2 | cut -d, -f1 | paste -sd,)}
echo "pinned to CPUs $cores" | tee -a "$w/lscpu.txt"
if [ "${PYTORCH_AMP:-1}" = 0 ]; then
  # PyTorch's float16 autocast on the CPU takes seconds a ResNet-20 step: AMP
  # runs leangrad alone, and the two runs are merged into one report.
  timeout 400 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out "$w/bench-fp32" -specs "resnet20:32 mlp:128" \
    -configs fp32 -steps 15 -warmup 3 -rounds "${ROUNDS:-6}" -claims=false -commit "${COMMIT:-}" > "$w/bench-fp32.log" 2>&1
  echo "bench fp32 exit: $?"
  timeout 240 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out "$w/bench-amp" -specs "resnet20:32 mlp:128" \
    -configs amp -pytorch "" -steps 20 -warmup 3 -claims=false -commit "${COMMIT:-}" > "$w/bench-amp.log" 2>&1
  echo "bench amp exit: $?"
  bash .gpu/run bin/bench -merge "$w/bench-fp32/bench.json,$w/bench-amp/bench.json" -out "$w/bench" > "$w/bench.log" 2>&1
  cat "$w/bench-fp32.log" "$w/bench-amp.log" | grep -E '^(leangrad|pytorch) |over [0-9]+ rounds' >> "$w/bench.log"
  # AMP against fp32 in one process (the two processes above run at
  # different times of a shared machine), in ROUNDS rounds that alternate
  # their order, with each kind of operation's time in a step (-profile).
  timeout 300 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out "$w/bench-pair" -specs "resnet20:32 mlp:128" \
    -configs fp32,amp -pytorch "" -steps 15 -warmup 3 -rounds "${ROUNDS:-6}" -claims=false -profile -commit "${COMMIT:-}" > "$w/bench-pair.log" 2>&1
  echo "bench pair exit: $?"
  grep -E '^(leangrad|profile:) |over [0-9]+ rounds' "$w/bench-pair.log" | sed 's/^/pair: /' >> "$w/bench.log"
else
  timeout 400 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out "$w/bench" -specs "resnet20:32 mlp:128" \
    -configs fp32,amp -steps 15 -warmup 3 -rounds "${ROUNDS:-6}" -claims=false -commit "${COMMIT:-}" > "$w/bench.log" 2>&1
fi
echo "bench exit: $?"
grep -vE '^\|' "$w/bench.log" | tail -30
[ -f .gpu/old/train.xz ] && xz -dc .gpu/old/train.xz > /tmp/old-train && chmod +x /tmp/old-train
for b in bin/train /tmp/old-train; do
  [ "$b" = /tmp/old-train ] && [ ! -x "$b" ] && continue
  name=$(basename "$b")
  start=$(date +%s.%N)
  timeout 200 taskset -c "$cores" bash .gpu/run "$b" -model resnet -amp -checkpoint -device cpu -json "$w/$name.json" \
    > "$w/$name.log" 2>&1
  echo "$b exit: $? wall: $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
  grep -vE 'step [0-9]+/|^\|' "$w/$name.log" | tail -8
done
