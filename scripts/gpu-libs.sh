#!/usr/bin/env bash
# GPT-2 small's step on the GPU machine with the system's cuBLAS and cuDNN (what leangrad finds first)
# and with the ones PyTorch's wheels carry (what PyTorch runs with), and bf16 beside fp16 with the
# GPU's clocks, power and throttle reasons sampled. Here: ../shared/gpu/stage ./kernels/cuda ./autograd
# ./nn ./train && rm -rf .gpu/data; there: bash scripts/gpu-libs.sh versions tests profile ab
#   versions  the cuBLAS(Lt) and cuDNN versions of both sets, and the GPU's clocks and power limit
#   tests     the CUDA tests of the staged packages (TESTS, CUDA|WGMMA)
#   profile   an eager bf16 step's device time by kernel with each set
#   ab        captured bf16 and fp16 steps, the two sets alternating (ROUNDS, 2), clocks sampled
#   pytorch   torch.compile's bf16 and fp16 (GradScaler) steps of the same model, clocks sampled, and
#             their kernels' device times side by side (scripts/profile-diff.py)
#   power     PyTorch's products in F16 and BF16, each in turn for seconds, with clocks and power
#             (scripts/f16-power.py)
#   f16profile  leangrad's eager bf16 and fp16 steps' device time by kernel, every kind listed
# Everything lands in $OUT, packed into $OUT/all.tgz.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
pack() { tar czf /tmp/libs.tgz -C "$out" --exclude all.tgz . && mv /tmp/libs.tgz "$out/all.tgz"; }
# wheels is the folders of the cuBLAS and cuDNN that PyTorch loads (its wheels'), found on first use.
wheels=
findwheels() {
  [ -n "$wheels" ] && return
  wheels=$(python3 - <<'EOF'
import os, torch
a = torch.randn(8, 8, device="cuda")
a @ a  # loads cuBLAS
torch.backends.cudnn.version()  # loads cuDNN
dirs = []
for line in open("/proc/self/maps"):
    p = line.split()[-1]
    if os.path.basename(p).startswith(("libcublas", "libcudnn")) and os.path.dirname(p) not in dirs:
        dirs.append(os.path.dirname(p))
print(":".join(dirs))
EOF
)
}
# The throttle reasons' field, by its newer name where nvidia-smi knows it.
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 || reasons=clocks_throttle_reasons.active
args=(-device cuda -specs gpt2:16 -vocab 50304 -configs amp -pytorch "" -claims=false -eager=false -steps 20 -warmup 5)
# sampled runs a command with the GPU's state written every 100 ms to $1.csv.
sampled() {
  local log=$1
  shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
    --format=csv,noheader -lms 100 > "$log.csv" 2>&1 &
  local smi=$!
  "$@" > "$log" 2>&1
  local rc=$?
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  return $rc
}
# busy prints the median clocks, power and temperature of a sampled run's busy samples.
busy() {
  python3 - "$1" <<'EOF'
import csv, statistics, sys
def num(x):
    try:
        return float(x.split()[0])
    except (ValueError, IndexError):
        return None
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) >= 6 and num(r[3]) is not None]
# The samples while the GPU worked: power above half the run's highest.
top = max((num(r[3]) for r in rows), default=0)
busy = [r for r in rows if num(r[3]) >= top / 2]
def med(i):
    v = [num(r[i]) for r in busy if num(r[i]) is not None]
    return statistics.median(v) if v else float("nan")
reasons = sorted({r[5].strip() for r in busy})
print(f"  {len(busy)} busy samples: sm {med(1):.0f} MHz, mem {med(2):.0f} MHz, power {med(3):.0f} W (max {top:.0f}), {med(4):.0f} C, reasons {reasons}")
EOF
}
# withlibs runs a command with the set named by $1 (system or wheels) first on the loader's path.
withlibs() {
  local set=$1
  shift
  if [ "$set" = wheels ]; then findwheels; LD_LIBRARY_PATH="$wheels${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; else "$@"; fi
}
for what in "$@"; do
  case $what in
  versions)
    findwheels
    {
      echo "PyTorch's cuBLAS and cuDNN: $wheels"
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,power.max_limit --format=csv
      # One process a library: a second library of the same soname would not load beside the first.
      for dir in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu ${wheels//:/ }; do
        for lib in libcublasLt.so.13:cublasLtGetVersion libcudnn.so.9:cudnnGetVersion; do
          [ -e "$dir/${lib%%:*}" ] && python3 -c 'import ctypes, sys
f = getattr(ctypes.CDLL(sys.argv[1]), sys.argv[2]); f.restype = ctypes.c_size_t; print(sys.argv[1], f())' "$dir/${lib%%:*}" "${lib##*:}"
        done
      done
    } > "$out/versions.txt" 2>&1
    cat "$out/versions.txt"
    ;;
  tests)
    OUT="$out" TESTS="${TESTS:-CUDA|WGMMA}" bash scripts/gpu-attn.sh tests
    ;;
  profile)
    for set in system wheels; do
      withlibs $set timeout 120 bash .gpu/run bin/bench "${args[@]}" -amp-dtype bf16 -eager -profile -profile-share 0.2 \
        -steps 10 -warmup 3 -out "$out/profile-$set" > "$out/profile-$set.log" 2>&1
      echo "profile $set exit: $?"; grep -E "^(leangrad|profile)|attention:|rror" "$out/profile-$set.log" | cut -c1-900
    done
    ;;
  ab)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      order="system wheels"
      [ $((r % 2)) -eq 0 ] && order="wheels system"
      for set in $order; do
        for dt in bf16 f16; do
          sampled "$out/$set-$dt-$r.log" withlibs $set timeout 120 bash .gpu/run bin/bench "${args[@]}" -amp-dtype $dt -out "$out/$set-$dt-$r"
          echo "$set $dt round $r exit $?: $(grep -E '^leangrad \(captured\)' "$out/$set-$dt-$r.log" | sed -E 's/ \(host[^)]*\)//; s/, reserved.*//')"
          busy "$out/$set-$dt-$r.log.csv"
        done
      done
    done
    ;;
  pytorch)
    for dt in bf16 f16; do
      sampled "$out/pytorch-$dt.log" timeout 240 python3 benchmarks/pytorch/gpt.py bench --layers 12 --heads 12 --width 768 \
        --context 1024 --batch 16 --vocab 50304 --amp $dt --compile --timed 20 --profile 3
      echo "pytorch compile $dt exit $?: $(grep -o '"median_ms": [0-9.]*' "$out/pytorch-$dt.log")"
      busy "$out/pytorch-$dt.log.csv"
    done
    python3 scripts/profile-diff.py "$out/pytorch-bf16.log" "$out/pytorch-f16.log" | tee "$out/pytorch-diff.txt"
    ;;
  power)
    timeout 200 python3 scripts/f16-power.py --seconds "${SECONDS_EACH:-3}" --rounds 2 | tee "$out/power.log"
    ;;
  f16profile)
    for dt in bf16 f16; do
      timeout 120 bash .gpu/run bin/bench "${args[@]}" -amp-dtype $dt -eager -profile -profile-share 0 \
        -steps 10 -warmup 3 -out "$out/profile-$dt" > "$out/profile-$dt.log" 2>&1
      echo "profile $dt exit: $?"; grep -E "^leangrad" "$out/profile-$dt.log" | head -2
    done
    ;;
  esac
done
pack
