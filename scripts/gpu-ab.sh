#!/usr/bin/env bash
# A/B of step times on one GPU machine: .gpu/old/bench.xz (a bench binary of another commit, built
# here with CGO_ENABLED=0 go build -trimpath ./cmd/bench and xz-compressed) against the staged
# bin/bench (or .gpu/ab/new-bench.xz, built the same way, where it exists), ROUNDS rounds
# alternating which runs first; leangrad's captured steps only. SPECS and CONFIGS choose the rows
# (the CNNs' by default); EXTRA adds bench flags, e.g. for GPT-2:
#   SPECS=gpt2:16 CONFIGS=amp,amp+checkpoint EXTRA="-vocab 50304 -amp-dtype bf16" bash scripts/gpu-ab.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
new="bash .gpu/run bin/bench"
if [ -f .gpu/ab/new-bench.xz ]; then # a new binary beside the old, without a staged build
  xz -dc .gpu/ab/new-bench.xz > /tmp/new-bench && chmod +x /tmp/new-bench && new=/tmp/new-bench
fi
specs=${SPECS:-"resnet20:256,1024 resnet18:256"}
args=(-device cuda -specs "$specs" -configs "${CONFIGS:-fp32,amp,checkpoint,amp+checkpoint}" -pytorch "" -claims=false -eager=false
  -steps 20 -warmup 5 ${EXTRA:-})
for r in $(seq 1 "${ROUNDS:-2}"); do
  order="old new"
  [ $((r % 2)) -eq 0 ] && order="new old"
  for which in $order; do
    if [ "$which" = old ]; then bin=/tmp/old-bench; else bin=$new; fi
    $bin "${args[@]}" -out "$out/$which-$r" > "$out/$which-$r.log" 2>&1
    echo "$which round $r exit $?"
  done
done
grep -hE "^leangrad \(captured\)" "$out"/old-*.log "$out"/new-*.log | sed -E 's/ \(host.*peak/, peak/; s/, reserved.*//' > "$out/summary.txt"
for f in "$out"/old-*.log "$out"/new-*.log; do echo "== $f"; grep -E "^leangrad \(captured\)" "$f" | sed -E 's/leangrad \(captured\) //; s/ \(host[^)]*\)//; s/, reserved.*//'; done
tar czf /tmp/ab-all.tgz -C "$out" . && mv /tmp/ab-all.tgz "$out/all.tgz"
