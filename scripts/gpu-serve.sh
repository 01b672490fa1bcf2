#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./serve (and any others): the serve load test of a
# ResNet-20 (one epoch on the synthetic set, captured, saved as train -save does) on the device:
# 10,000 requests from one client and 100,000 from 16, without and with -empty-cache-every 1000.
# Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 120 bash .gpu/run bin/train -model resnet -dataset synthetic -epochs 1 -measure=false -device cuda \
  -save "$out/r20.st" > "$out/r20-train.log" 2>&1
echo "train exit: $?"; grep -E "^(test accuracy|throughput)" "$out/r20-train.log"
timeout 420 bash .gpu/run sh -c 'cd serve && "$LEANGRAD_BIN/../tests/serve.test" -test.run "^TestLoad$" -test.v \
  -load.checkpoint "$0" -load.device cuda -load.requests "${REQUESTS:-100000}" -load.single "${SINGLE:-10000}" -load.clients 16' \
  "$(cd "$out" && pwd)/r20.st" > "$out/serve-load.log" 2>&1
echo "load exit: $?"; grep -E "serve_test|^ok|FAIL|^---" "$out/serve-load.log"
rm -f "$out/r20.st"
