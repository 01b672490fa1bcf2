#!/usr/bin/env bash
# ResNet-1202's AMP step against how its convolutions' algorithms are chosen: the staged bench
# (cudnnFindRounds as committed) against .gpu/ab/r9-bench.xz (a build with 9 rounds), with the
# planner's default tolerance and with -plan-tolerance 0, ROUNDS rounds interleaved. In $OUT.
set -uo pipefail
out=/tmp/fr; mkdir -p $out
xz -dc .gpu/ab/r9-bench.xz > /tmp/r9 && chmod +x /tmp/r9
args=(-device cuda -specs resnet1202:128 -configs "${CONFIGS:-amp}" -pytorch "" -claims=false -eager=false -steps 8 -warmup 3)
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in r3 r9 r9t0; do
    case $v in r3) bin="bash .gpu/run bin/bench"; x="";; r9) bin=/tmp/r9; x="";; r9t0) bin=/tmp/r9; x="-plan-tolerance 0";; esac
    timeout 100 $bin "${args[@]}" $x -out $out/$v-$r > $out/$v-$r.log 2>&1
    echo "$v $r exit $? $(grep -E '^leangrad \(captured\)' $out/$v-$r.log | sed -E 's/ \(host[^)]*\)//; s/, reserved.*//')"
  done
done
tar czf $OUT/fr.tgz -C $out .
