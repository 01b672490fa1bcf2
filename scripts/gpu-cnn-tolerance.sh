#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (any package; the bench binary is always built): the
# CNN memory table's rows, leangrad's captured steps alone, at each of the planner's time tolerances
# in TOLERANCES (bench -plan-tolerance; the default is memory.DefaultPlanOptions'). Lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for tol in ${TOLERANCES:-0.03 0.05 0.1}; do
  timeout 120 bash .gpu/run bin/bench -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
    -pytorch "" -claims=false -eager=false -steps 15 -warmup 4 -plan-tolerance "$tol" -out "$out/tol-$tol" -commit "${COMMIT:-}" \
    > "$out/tol-$tol.log" 2>&1
  echo "tolerance $tol exit $?"; grep -E "^\| resnet" "$out/tol-$tol/bench.md" | cut -d'|' -f2-5,11
done
