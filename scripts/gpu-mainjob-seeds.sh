#!/usr/bin/env bash
# The main job's accuracy over seeds: `train -model resnet -amp -checkpoint -seed S` beside its PyTorch
# twin (benchmarks/pytorch/mainjob.py, the same recipe), on the GPU machine after ../shared/gpu/stage
# (which copies Fashion-MNIST into .gpu/data). All the runs share the GPU at once: they measure
# accuracy, and their times mean nothing.
#
#   SEEDS="1 2 3" [PYTORCH=0] bash scripts/gpu-mainjob-seeds.sh   # PYTORCH=0: leangrad's runs only
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
seeds=${SEEDS:-"1 2 3"}
for s in $seeds; do
  bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -seed "$s" -json "$out/leangrad-$s.json" > "$out/leangrad-$s.log" 2>&1 &
  if [ "${PYTORCH:-1}" = 1 ]; then
    python3 benchmarks/pytorch/mainjob.py --data .gpu/data/fashion-mnist --seed "$s" > "$out/pytorch-$s.json" 2> "$out/pytorch-$s.log" &
  fi
done
wait
python3 - "$out" $seeds <<'PY'
import json, os, statistics, sys
out, seeds = sys.argv[1], sys.argv[2:]
rows = {"leangrad": [], "pytorch": []}
for s in seeds:
    try:
        rows["leangrad"].append(100 * json.load(open(f"{out}/leangrad-{s}.json"))["final"]["test_acc"])
    except Exception as e:
        print(f"leangrad seed {s}: {e}")
    try:
        if os.environ.get("PYTORCH", "1") != "1":
            continue
        rows["pytorch"].append(100 * json.load(open(f"{out}/pytorch-{s}.json"))["test_acc"])
    except Exception as e:
        print(f"pytorch seed {s}: {e}")
for k, v in rows.items():
    if v:
        print(f"{k}: " + " ".join(f"{a:.2f}%" for a in v) + f"  mean {statistics.mean(v):.2f}%" +
              (f", sd {statistics.stdev(v):.2f}" if len(v) > 1 else ""))
PY
# Everything in one file: the machine sends back a limited number of files.
tar czf /tmp/seeds-all.tgz -C "$out" . && rm -f "$out"/*.json "$out"/*.log && mv /tmp/seeds-all.tgz "$out/all.tgz"
