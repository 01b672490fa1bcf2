#!/usr/bin/env bash
# ResNet-1202 at 128, fp32 against AMP on one lease: ROUNDS separate runs of the staged bench (each
# plans and chooses its convolutions' algorithms afresh), captured steps. In $OUT/deep.tgz.
set -uo pipefail
out=/tmp/d; mkdir -p $out
for r in $(seq 1 "${ROUNDS:-3}"); do
  timeout 120 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs fp32,amp -pytorch "" -claims=false -eager=false \
    -steps 8 -warmup 3 -out $out/$r > $out/$r.log 2>&1
  echo "round $r exit $?"; grep -E '^leangrad \(captured\)' $out/$r.log | sed -E 's/ \(host[^)]*\)//; s/, reserved.*//'
done
tar czf $OUT/deep.tgz -C $out .
