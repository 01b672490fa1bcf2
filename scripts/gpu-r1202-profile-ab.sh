#!/usr/bin/env bash
# ResNet-1202 at 128 with AMP, eager profile and captured step: .gpu/old/bench.xz (see gpu-ab.sh)
# against the staged bench, two rounds alternating. In $OUT/p.tgz.
set -uo pipefail
out=/tmp/p; mkdir -p $out
xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
for r in 1 2; do
  for which in old new; do
    if [ $which = old ]; then bin=/tmp/old-bench; else bin="bash .gpu/run bin/bench"; fi
    timeout 140 $bin -device cuda -specs resnet1202:128 -configs amp -pytorch "" -claims=false -eager=true -profile -steps 5 -warmup 2 -out $out/$which-$r > $out/$which-$r.log 2>&1
    echo "$which $r exit $?"
    grep -E "^leangrad \((captured|eager)\)|^Device time|captured:" $out/$which-$r.log
  done
done
tar czf $OUT/p.tgz -C $out .
