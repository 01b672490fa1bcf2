#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage and with .gpu/old/bench.xz (see gpu-ab.sh): the
# CNN rows' step times, old binary against new (ROUNDS rounds), the planner's time tolerance
# traded for the AMP rows' workspaces (TOLERANCES), and ResNet-1202 at 128 in every configuration.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
OUT="$out/ab" ROUNDS=${ROUNDS:-2} timeout 300 bash scripts/gpu-ab.sh > "$out/ab.log" 2>&1
echo "ab exit $?"; cat "$out/ab.log" | grep -v "^==" | head -4
for tol in ${TOLERANCES:-0.1 0.25}; do
  timeout 100 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp -pytorch "" \
    -claims=false -eager=false -steps 15 -warmup 4 -plan-tolerance "$tol" -out "$out/tol-$tol" > "$out/tol-$tol.log" 2>&1
  echo "tolerance $tol exit $?"; grep -E "^\| resnet" "$out/tol-$tol/bench.md" | cut -d'|' -f2-5,11
done
timeout 200 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp,checkpoint,amp+checkpoint -pytorch "" \
  -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep" -commit "${COMMIT:-}" > "$out/deep.log" 2>&1
echo "deep exit: $?"; grep -E "^\| resnet" "$out/deep/bench.md" | cut -d'|' -f2-5,11; grep -A5 "What leangrad" "$out/deep/bench.md"
