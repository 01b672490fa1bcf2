#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package): GPT-2 small's bf16 and fp16 steps on one
# lease, each eager (wall time and every kind of operation's device time) and captured, to see where
# fp16's step loses to bf16's.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
args=(-device cuda -specs gpt2:16 -vocab 50304 -configs amp -pytorch "" -claims=false)
for dt in bf16 f16 f16 bf16; do
  n=$((${n:-0} + 1))
  timeout 120 bash .gpu/run bin/bench "${args[@]}" -amp-dtype "$dt" -profile -profile-share 0.2 -steps 10 -warmup 3 \
    -out "$out/$dt-$n" > "$out/$dt-$n.log" 2>&1
  echo "$dt ($n): $(grep -E '^\| gpt2' "$out/$dt-$n/bench.md" | cut -d'|' -f5,6)"
done
tar czf /tmp/all.tgz -C "$out" --exclude all.tgz . && mv /tmp/all.tgz "$out/all.tgz"
