#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage): every CUDA test, then the
# main job for 15 epochs, then Python's safetensors reading its checkpoint.
# Everything lands in $OUT/train.tar.gz; summaries go to stdout.
set -uo pipefail
out=${OUT:-gpu-out}
r=$out/train
mkdir -p "$r"
bash .gpu/run tests -test.run CUDA -test.v -test.count 1 > "$r/tests.log" 2>&1
echo "tests exit: $?"
grep -E '^(--- FAIL|FAIL|panic)|^\s+--- FAIL' "$r/tests.log" | head -40
grep -cE '^--- PASS' "$r/tests.log" | sed 's/^/top-level tests passed: /'
grep -E 'convolutions by|peak allocated|one epoch in' "$r/tests.log" | head -8
bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -epochs "${EPOCHS:-15}" \
  -json "$r/train.json" -memplot "$r/train_mem.png" -save "$r/train.ckpt" > "$r/train.log" 2>&1
echo "train exit: $?"
grep -vE 'step [0-9]+/' "$r/train.log" | head -40
python3 - "$r/train.ckpt" <<'PY' 2>&1 | tail -3
import sys
from safetensors.numpy import load_file
d = load_file(sys.argv[1])
k = sorted(d)
print("python safetensors read", len(d), "tensors, e.g.", k[0], d[k[0]].dtype, d[k[0]].shape)
PY
tar -C "$out" -czf "$out/train.tar.gz" train && rm -rf "$r"
