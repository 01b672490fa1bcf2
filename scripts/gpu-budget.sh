#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage ./train ./autograd ./memory ./optim ./nn ./kernels/cuda):
# every staged package's CUDA tests, then issue 10's acceptance on the H200: the main job's model in
# fp32 without a budget, then with -max-memory at half of the fp32 step's measured need, both for
# -epochs (default 15); then one epoch under a budget below every whole-batch configuration
# ($SMALL, default 40MiB). Logs and JSON reports land in $OUT; the budget run's memory snapshot
# is rendered with torch.cuda._memory_viz there.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
timeout 400 bash .gpu/run tests -test.run CUDA -test.v -test.count 1 > "$out/tests.log" 2>&1
echo "tests exit: $?"
grep -E '^(--- FAIL|FAIL|ok|panic)|^\s+--- FAIL' "$out/tests.log" | head -40
grep -cE '^--- PASS' "$out/tests.log" | sed 's/^/top-level tests passed: /'
epochs=${EPOCHS:-15}
bash .gpu/run bin/train -model resnet -device cuda -epochs "$epochs" -json "$out/fp32.json" > "$out/fp32.log" 2>&1
echo "fp32 exit: $?"
grep -vE 'step [0-9]+/|^\|' "$out/fp32.log" | head -30
half=$(python3 -c "
import json, sys
r = json.load(open('$out/fp32.json'))
m = [m for m in r['measured_step_peaks'] if m['name'] == 'fp32'][0]
print(max(m['peak_allocated'], m.get('planned', 0)) // 2)")
echo "half of the fp32 step's need: $half bytes"
bash .gpu/run bin/train -model resnet -device cuda -epochs "$epochs" -max-memory "${half}B" \
  -json "$out/budget.json" -memsnapshot "$out/budget.pickle" > "$out/budget.log" 2>&1
echo "budget exit: $?"
grep -vE 'step [0-9]+/|^\|' "$out/budget.log" | head -40
python3 - "$out/fp32.json" "$out/budget.json" "$out/budget.pickle" <<'PY'
import json, pickle, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print("fp32   acc %.2f%%  peak %.1f MiB" % (100 * a["final"]["test_acc"], a["final"]["peak_allocated"] / 2**20))
print("budget acc %.2f%%  peak %.1f MiB  reserved peak %.1f MiB  budget %.1f MiB  chose %s" % (
    100 * b["final"]["test_acc"], b["final"]["peak_allocated"] / 2**20, b["final"]["peak_reserved"] / 2**20,
    b["budget"]["budget"] / 2**20, b["budget"]["chosen"]))
print("accuracy difference %.2f points" % (100 * (b["final"]["test_acc"] - a["final"]["test_acc"])))
s = pickle.load(open(sys.argv[3], "rb"))
print("snapshot: %d segments, %d events" % (len(s["segments"]), len(s["device_traces"][0])))
PY
# PyTorch's own tool renders the snapshot (the viewer's HTML embeds the file).
for plot in trace_plot segment_plot; do
  python3 -m torch.cuda._memory_viz $plot "$out/budget.pickle" -o "$out/$plot.html" > "$out/$plot.log" 2>&1
  echo "torch.cuda._memory_viz $plot exit $?: $(wc -c < "$out/$plot.html" 2>/dev/null) bytes"; tail -n 3 "$out/$plot.log"
done
rm -f "$out/budget.pickle" "$out"/*_plot.html
# A budget below every whole-batch configuration: micro-batches, one epoch.
bash .gpu/run bin/train -model resnet -device cuda -epochs 1 -max-memory "${SMALL:-40MiB}" -json "$out/small.json" > "$out/small.log" 2>&1
echo "small budget exit: $?"
grep -vE 'step [0-9]+/|^\|' "$out/small.log" | grep -v '^memory of one\|^  fp32\|^  amp \|^  checkpoint ' | head -24
