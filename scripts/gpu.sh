#!/usr/bin/env bash
# gpu.sh: the named suites behind docs/benchmarks.md, run on the GPU machine from the project root
# after scripts/stage.sh here (see docs/benchmarks.md, "How to run a suite"):
#
#   bash scripts/gpu.sh SUITE...
#
# Suites (each in $OUT's one archive, results.tgz, beside summary.txt; COMMIT names the commit):
#   tests     the staged packages' tests matching TESTS (default CUDA), COUNT times each (default 1)
#   cnn       ResNet-20 at 256 and 1024 and ResNet-18 at 256 in fp32, AMP, checkpointing and both,
#             then ResNet-1202 at 128 with AMP and sqrt(n) segments, each beside PyTorch eager
#   gpt2      GPT-2 small (batch 16, context 1024, vocabulary 50,304) in CONFIGS (default
#             fp32,bf16,f16,bf16+checkpoint) beside PyTorch eager and torch.compile, and the largest
#             batch under 24 GiB at context 512 (LARGEST=gpt2:512:24; "" to skip)
#   mainjob   train -model resnet -amp -checkpoint, once a seed of SEEDS (default 1), with PyTorch's
#             twin (benchmarks/pytorch/mainjob.py) beside when TWIN=1 (all at once: accuracy only)
#   text      train -model gpt -amp -amp-dtype bf16 beside its PyTorch twin (TWIN=0 skips it; staged with BROWN=1),
#             once an optimizer of OPTIMIZERS (default adamw; adamw8bit, offload: -offload-optimizer)
#   claims    the seed claims: bench's suite (ResNet-20) and GPT-2 small's largest batches, both engines
#   budget    the main job's model in fp32, then under -max-memory at half its fp32 step's need
#   serve     a trained ResNet-20 served (package serve's load test), from 1 and 16 clients
#   gptserve  GPT-2 small trained STEPS (default 300) steps on text made there, then served in bf16
#             (the engine's mixed and shared-prefix loads profiled by operation first, the former's host
#             time in engine-mixed-cpu.prof too; both from
#             stage.sh's OLD build too when staged; LOADS=0 stops there):
#             the engine against the plain forward (serve's TestCUDAEngineMatchesForwardTrained), and
#             cmd/loadgen's loads: 1, 16, 64 and 256 clients x 128 tokens; mixed lengths, continuous
#             and static batching; 64 prompts sharing 512 tokens with and without the prefix cache;
#             SERVEFLAGS adds flags to every server (SERVEFLAGS="-max-memory 20GiB"); LOADS=prefix runs only
#             the shared prefix: its profile, then its load ROUNDS times on each server (default 1; new
#             prompts each time), each time also with the connections opened first (loadgen -warm); the
#             engine against the forward runs in every case (STEPS=2 leaves too untrained a model for it);
#             ENGINE=0 skips it and the profiles, straight to the loads
#   offload   MODEL (default gpt2-xl) in bf16 with checkpointing, batch BATCH (default 8; of CONTEXT tokens, default the
#             model's; in micro-batches of MICRO when set, which -max-memory keeps), STEPS (default 8) steps, its
#             optimizer state on the device and then in host memory (-offload-optimizer; WHERE lists
#             them, and "budget" runs under -max-memory BUDGET, default 10GiB, to let it choose, "budget-blocks"
#             without -checkpoint, to let it choose how many blocks to checkpoint too; "8bit",
#             "fused" and "8bit+fused" run -optimizer adamw8bit, -fuse-optimizer and both
#             ("fused-clip": -fuse-optimizer -clip 1, two passes a step); "acts" and
#             "host+acts" -offload-activations alone and with -offload-optimizer; "host-fused"
#             -offload-optimizer -fuse-optimizer, the host's update beside the backward (no clipping) on all
#             cores but one; "host-fused-kept" that with -device-state SHARE (default 0.06: GPT-2 XL's
#             embeddings); "bf16w" and "bf16w-fused" "host" and "host-fused" with -bf16-weights under
#             -max-memory BUDGET (default 24GiB here), "bf16w-fused-all" the last on all the cores,
#             "bf16w-fused-acts" with -offload-activations;
#             EVERY steps a period, default STEPS, each period's tokens/s printed; LIMIT seconds a run,
#             default 280; FLAGS, more of train's flags for every run); beside "host",
#             the host's AdamW (kernels/cpu's benchmark, 1 and 16 cores) and PyTorch's fused CPU AdamW
#   largest   the seed's "24 GB trains 1.2B parameters": bench -largest-model CAP (default 24 GiB) over the GPT family
#             (MODELS, comma-separated, for only those; LIMIT seconds, default 420; PROFILE=1 adds the Go CPU
#             profile, largest-cpu.prof), then PyTorch's largest under the same cap
#             (benchmarks/pytorch/gpt.py largest-model; TORCH=0 skips it)
#   acts      GPT-2 small's checkpointed bf16 step (batch 16) with and without -offload-activations, eager and
#             captured, beside PyTorch (TORCH=0: without it)
#   profile   each operation's device time in an eager step of SPECS in CONFIGS
#   ab        bench of .gpu/old (stage.sh OLD=<commit>) against this build, ROUNDS alternating, on SPECS
#   ddp       data parallel over NPROC GPUs (default 2) beside PyTorch DDP, and the main job on them
#   kernels   the kernel harnesses: flash-bench.py, flash32-bench.py and x3gemm-bench.py
#   cpu       leangrad beside PyTorch on two pinned cores of this machine (CORES), ROUNDS alternating
set -uo pipefail
cd "$(dirname "$0")/.."
final=${OUT:-gpu-out}
w=$(mktemp -d)/results
mkdir -p "$w" "$final"
trap 'tar -C "$(dirname "$w")" -czf "$final/results.tgz" results' EXIT
trap 'exit 143' TERM # the archive, also when a time limit stops the run
ln -sf "$(realpath "$final")/summary.txt" "$w/summary.txt" # the summary where it is read, as it grows
say() { echo "$*" | tee -a "$w/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$w/machine.txt" 2>&1
commit=${COMMIT:-$(cat .gpu/commit 2>/dev/null || echo unknown)}
bench=(bash .gpu/run bin/bench -commit "$commit") # timeout runs it as a command
bench() { "${bench[@]}" "$@"; }
rows() { grep -E "^\| $1" "$2" | cut -d'|' -f2-13 | tee -a "$w/summary.txt"; }

python_text() { # about 24 MB of text: the machine's Python standard library
  python3 -c "
import pathlib, sys, sysconfig
n = 0
for f in sorted(pathlib.Path(sysconfig.get_paths()['stdlib']).rglob('*.py')):
    t = f.read_text(errors='ignore'); sys.stdout.write(t); n += len(t)
    if n > 24e6: break"
}

for suite in "$@"; do
  say "== $suite"
  case $suite in
  tests)
    timeout 560 bash .gpu/run tests -test.run "${TESTS:-CUDA}" -test.v -test.count "${COUNT:-1}" > "$w/tests.log" 2>&1
    say "tests exit $?"
    grep -E '^(--- FAIL|FAIL|panic)|^\s+--- FAIL' "$w/tests.log" | head -40 | tee -a "$w/summary.txt"
    say "top-level passed: $(grep -cE '^--- PASS' "$w/tests.log"), skipped: $(grep -cE '^--- SKIP' "$w/tests.log")"
    ;;
  cnn)
    timeout 300 "${bench[@]}" -device cuda -specs "resnet20:256,1024 resnet18:256" -configs fp32,amp,checkpoint,amp+checkpoint \
      -compile-configs "" -claims=false -steps 15 -warmup 4 -out "$w/cnn" > "$w/cnn.log" 2>&1
    say "cnn exit $?"; rows resnet "$w/cnn/bench.md"
    timeout 240 "${bench[@]}" -device cuda -specs resnet1202:128 -configs amp+checkpoint \
      -compile-configs "" -claims=false -steps 5 -warmup 3 -out "$w/resnet1202" > "$w/resnet1202.log" 2>&1
    say "resnet1202 exit $?"; rows resnet "$w/resnet1202/bench.md"
    ;;
  gpt2)
    cfgs=${CONFIGS:-fp32,bf16,f16,bf16+checkpoint}
    largest=${LARGEST-gpt2:512:24}
    timeout 585 "${bench[@]}" -device cuda -specs gpt2:16 -configs "$cfgs" -compile-configs "${COMPILE:-$cfgs}" -amp-dtype f16 \
      -vocab "${VOCAB:-50304}" ${largest:+-largest-batch $largest} -claims=false -eager=false \
      -steps 10 -warmup 3 -out "$w/gpt2" > "$w/gpt2.log" 2>&1
    say "gpt2 exit $?"; rows gpt2 "$w/gpt2/bench.md"; grep -E "MFU|^claim|largest" "$w/gpt2.log" | head -12 | tee -a "$w/summary.txt"
    ;;
  mainjob)
    for s in ${SEEDS:-1}; do
      bash .gpu/run bin/train -model resnet -amp -checkpoint -device cuda -seed "$s" -json "$w/main-$s.json" > "$w/main-$s.log" 2>&1 &
      [ -n "${TWIN:-}" ] && python3 benchmarks/pytorch/mainjob.py --data .gpu/data/fashion-mnist --seed "$s" \
        > "$w/twin-$s.json" 2> "$w/twin-$s.log" &
    done
    wait
    for s in ${SEEDS:-1}; do say "seed $s: $(grep -E '^(test accuracy|throughput|peak)' "$w/main-$s.log" | tr '\n' ' ')"; done
    ;;
  text)
    for opt in ${OPTIMIZERS:-adamw}; do # the same job with another optimizer: its loss curve beside AdamW's
      case $opt in
      adamw) flags=(); name=text ;;
      adamw8bit) flags=(-optimizer adamw8bit); name=text-8bit ;;
      offload) flags=(-offload-optimizer); name=text-offload ;;
      *) say "text: unknown optimizer $opt"; continue ;;
      esac
      timeout 300 bash .gpu/run bin/train -model gpt -amp -amp-dtype bf16 -sample 64 -device cuda "${flags[@]}" \
        -json "$w/$name.json" > "$w/$name.log" 2> "$w/$name.err"
      say "text, $opt: exit $?"; grep -E "^(validation|throughput|peak|text)" "$w/$name.log" | tee -a "$w/summary.txt"
    done
    [ "${TWIN:-1}" = 1 ] || continue
    tokens=$(grep -o 'tokens in [^)]*' "$w/text.log" | head -1 | cut -c11-)
    timeout 240 python3 benchmarks/pytorch/gpt.py train --tokens "$tokens" --layers 6 --heads 6 --width 384 --context 256 \
      --dropout 0.1 --batch 32 --steps 1000 --eval-every 200 --lr 1e-3 --beta2 0.99 --warmup 100 --amp bf16 \
      > "$w/twin.json" 2> "$w/twin.err"
    say "twin exit $?"; tail -2 "$w/twin.err" | tee -a "$w/summary.txt"
    ;;
  claims)
    timeout 300 "${bench[@]}" -device cuda -specs resnet20:256 -configs fp32,amp,checkpoint,amp+checkpoint -compile-configs "" \
      -steps 15 -warmup 4 -out "$w/claims-cnn" > "$w/claims-cnn.log" 2>&1
    say "cnn claims exit $?"; grep -E "^- \*\*" "$w/claims-cnn/bench.md" | cut -c1-200 | tee -a "$w/summary.txt"
    timeout 300 "${bench[@]}" -device cuda -specs gpt2:1 -configs fp32 -largest-batch gpt2:512:24 -amp-dtype f16 \
      -pytorch "" -claims=false -eager=false -steps 1 -warmup 1 -out "$w/claims-gpt2" > "$w/claims-gpt2.log" 2>&1
    say "gpt2 claims exit $?"; grep -E "^claim|largest" "$w/claims-gpt2.log" | tee -a "$w/summary.txt"
    for cfg in "--amp none" "--amp f16"; do
      timeout 150 python3 benchmarks/pytorch/gpt.py largest --layers 12 --heads 12 --width 768 --context 512 --cap-gib 24 $cfg \
        >> "$w/claims-pytorch-largest.jsonl" 2>> "$w/claims-pytorch.err"
      say "pytorch largest $cfg: $(tail -1 "$w/claims-pytorch-largest.jsonl" | grep -o '"largest_batch": [0-9]*')"
    done
    ;;
  budget)
    bash .gpu/run bin/train -model resnet -device cuda -epochs "${EPOCHS:-15}" -json "$w/fp32.json" > "$w/fp32.log" 2>&1
    say "fp32 exit $?"
    half=$(python3 -c "
import json
m = [m for m in json.load(open('$w/fp32.json'))['measured_step_peaks'] if m['name'] == 'fp32'][0]
print(max(m['peak_allocated'], m.get('planned', 0)) // 2)")
    bash .gpu/run bin/train -model resnet -device cuda -epochs "${EPOCHS:-15}" -max-memory "${half}B" \
      -json "$w/budget.json" > "$w/budget.log" 2>&1
    say "budget ${half}B exit $?"; grep -E "^(chose|test accuracy|throughput|peak)" "$w/budget.log" | tee -a "$w/summary.txt"
    ;;
  serve)
    timeout 120 bash .gpu/run bin/train -model resnet -dataset synthetic -epochs 1 -measure=false -device cuda \
      -save "$w/r20.st" > "$w/r20-train.log" 2>&1
    timeout 420 bash .gpu/run sh -c 'cd serve && "$LEANGRAD_BIN/../tests/serve.test" -test.run "^TestLoad$" -test.v \
      -load.checkpoint "$0" -load.device cuda -load.requests "${REQUESTS:-100000}" -load.single "${SINGLE:-10000}" \
      -load.clients 16' "$w/r20.st" > "$w/serve-load.log" 2>&1
    say "serve exit $?"; grep -E "serve_test" "$w/serve-load.log" | tee -a "$w/summary.txt"
    rm -f "$w/r20.st"
    ;;
  gptserve)
    python_text > "$w/text.txt"
    timeout 300 bash .gpu/run bin/train -model gpt2 -device cuda -amp -amp-dtype bf16 -steps "${STEPS:-300}" -batch 8 \
      -measure=false -data "$w/text.txt" -save "$w/gpt2.st" > "$w/gpt2-train.log" 2>&1
    say "train exit $?"; grep -E "^(validation|throughput|peak)" "$w/gpt2-train.log" | tail -3 | tee -a "$w/summary.txt"
    if [ "${ENGINE:-1}" = 1 ]; then # ENGINE=0: straight to the HTTP loads
      timeout 240 bash .gpu/run sh -c 'cd serve && "$LEANGRAD_BIN/../tests/serve.test" -test.run "^TestCUDAEngineMatchesForwardTrained$" \
        -test.v -engine.checkpoint "$0"' "$w/gpt2.st" > "$w/engine-trained.log" 2>&1
      say "engine against the forward exit $?"; grep -E "identical|differs|FAIL" "$w/engine-trained.log" | tee -a "$w/summary.txt"
      if [ "${LOADS:-1}" != prefix ]; then
        timeout 120 bash .gpu/run sh -c 'cd serve && "$LEANGRAD_BIN/../tests/serve.test" -test.run "^$" -test.bench "^BenchmarkCUDAEngineMixed$" \
          -test.benchtime 1x -test.v -test.cpuprofile "$1" -engine.checkpoint "$0"' "$w/gpt2.st" "$w/engine-mixed-cpu.prof" > "$w/engine-mixed.log" 2>&1
        say "the mixed load's device time by operation exit $?"; grep -E "tokens|ms|^Benchmark" "$w/engine-mixed.log" | head -64 | tee -a "$w/summary.txt"
      fi
      timeout 120 bash .gpu/run sh -c 'cd serve && "$LEANGRAD_BIN/../tests/serve.test" -test.run "^$" -test.bench "^BenchmarkCUDAEnginePrefix$" \
        -test.benchtime 2x -test.v' > "$w/engine-prefix.log" 2>&1
      say "the shared prefix's device time by operation exit $?"; grep -E "requests in|busy|µs|^Benchmark" "$w/engine-prefix.log" | head -80 | tee -a "$w/summary.txt"
      if [ -f .gpu/old/serve.test.xz ]; then # the same profile from the build of stage.sh's OLD
        xz -dc .gpu/old/serve.test.xz > /tmp/old-serve.test && chmod +x /tmp/old-serve.test
        (cd serve && timeout 120 /tmp/old-serve.test -test.run "^$" -test.bench "^BenchmarkCUDAEnginePrefix$" -test.benchtime 2x -test.v) \
          > "$w/engine-prefix-old.log" 2>&1
        say "the same at $(cat .gpu/old/commit) exit $?"; grep -E "requests in|busy|µs|^Benchmark" "$w/engine-prefix-old.log" | head -80 | tee -a "$w/summary.txt"
        if [ "${LOADS:-1}" != prefix ]; then
          (cd serve && timeout 120 /tmp/old-serve.test -test.run "^$" -test.bench "^BenchmarkCUDAEngineMixed$/captured" -test.benchtime 1x -test.v \
            -engine.checkpoint "$w/gpt2.st") > "$w/engine-mixed-old.log" 2>&1
          say "the mixed load at $(cat .gpu/old/commit) exit $?"; grep -E "tokens|ms|^Benchmark" "$w/engine-mixed-old.log" | head -30 | tee -a "$w/summary.txt"
        fi
      fi
    fi
    if [ "${LOADS:-1}" = 0 ]; then rm -f "$w/gpt2.st" "$w/text.txt"*; continue; fi
    port=18080
    serving() { # serving NAME [serve flags]: start a server, wait until it is ready
      name=$1; shift
      # shellcheck disable=SC2086 # SERVEFLAGS is words
      bash .gpu/run bin/serve -addr "127.0.0.1:$port" -device cuda ${SERVEFLAGS:-} "$@" "$w/gpt2.st" > "$w/serve-$name.log" 2>&1 &
      spid=$!
      for _ in $(seq 1 240); do grep -q "^ready on" "$w/serve-$name.log" && break; sleep 0.5; done
      say "server $name: $(grep -E '^serving' "$w/serve-$name.log" | sed -E 's/^serving [^:]*: //')"
    }
    stopped() { kill -TERM "$spid"; wait "$spid"; say "server $name exit $?"; }
    load() { # load NAME [loadgen flags]: its report goes into summary.txt, its figures into a JSON file
      lname=$1; shift
      timeout 120 bash .gpu/run bin/loadgen -url "http://127.0.0.1:$port" -json "$w/load-$name-$lname.json" "$@" \
        > "$w/load.out" 2>&1
      say "load $name $lname exit $?"; tee -a "$w/summary.txt" < "$w/load.out"; rm -f "$w/load.out"
    }
    mixed=(-prompt 8-512 -max-tokens 16-512 -requests 512 -clients 256 -rate 400)
    prefix=(-shared-prefix 512 -prompt 16 -max-tokens 32 -requests 64 -clients 64)
    if [ "${LOADS:-1}" = prefix ]; then # the prefix cache's time to first token, each round new prompts
      for v in continuous noprefix; do
        flags=(); [ "$v" = noprefix ] && flags=(-no-prefix-cache)
        serving "$v" "${flags[@]}"
        load warm -clients 16 -requests 32 -max-tokens 32
        for r in $(seq "${ROUNDS:-1}"); do
          load "prefix$r" "${prefix[@]}" -seed "$r"
          load "prefix$r-warm" "${prefix[@]}" -seed "$((100 + r))" -warm
        done
        stopped
      done
      rm -f "$w/gpt2.st" "$w/text.txt"*
      continue
    fi
    serving continuous
    load warm -clients 16 -requests 32 -max-tokens 32
    for c in 1 16 64 256; do load "c$c" -clients "$c" -requests $((c == 1 ? 8 : 4 * c)) -max-tokens 128; done
    load mixed "${mixed[@]}"
    load prefix "${prefix[@]}"
    stopped
    for m in 64 256; do
      serving "static$m" -static-batching -max-seqs "$m"
      load c64 -clients 64 -requests 256 -max-tokens 128
      load mixed "${mixed[@]}"
      stopped
    done
    serving noprefix -no-prefix-cache
    load prefix "${prefix[@]}"
    stopped
    rm -f "$w/gpt2.st" "$w/text.txt"*
    ;;
  offload)
    python_text > "$w/text.txt"
    model=${MODEL:-gpt2-xl} steps=${STEPS:-8}
    for where in ${WHERE:-device host}; do
      ckpt=(-checkpoint)
      case $where in
      host) flags=(-offload-optimizer) ;;
      budget) flags=(-max-memory "${BUDGET:-10GiB}") ;;
      budget-blocks) flags=(-max-memory "${BUDGET:-10GiB}"); ckpt=() ;;
      8bit) flags=(-optimizer adamw8bit) ;;
      fused) flags=(-fuse-optimizer) ;;
      fused-clip) flags=(-fuse-optimizer -clip 1) ;;
      8bit+fused) flags=(-optimizer adamw8bit -fuse-optimizer) ;;
      acts) flags=(-offload-activations) ;;
      host+acts) flags=(-offload-optimizer -offload-activations) ;;
      host-fused) flags=(-offload-optimizer -fuse-optimizer) ;;
      host-fused-kept) flags=(-offload-optimizer -fuse-optimizer -device-state "${SHARE:-0.06}") ;;
      bf16w) flags=(-offload-optimizer -bf16-weights -max-memory "${BUDGET:-24GiB}") ;;
      bf16w-fused) flags=(-offload-optimizer -bf16-weights -max-memory "${BUDGET:-24GiB}" -fuse-optimizer) ;;
      bf16w-fused-all) flags=(-offload-optimizer -bf16-weights -max-memory "${BUDGET:-24GiB}" -fuse-optimizer -host-threads "$(nproc)") ;;
      bf16w-fused-acts) flags=(-offload-optimizer -bf16-weights -max-memory "${BUDGET:-24GiB}" -fuse-optimizer -offload-activations) ;;
      *) flags=() ;;
      esac
      timeout "${LIMIT:-280}" bash .gpu/run bin/train -model "$model" -device cuda -amp -amp-dtype bf16 "${ckpt[@]}" -batch "${BATCH:-8}" \
        ${MICRO:+-micro-batch "$MICRO"} ${CONTEXT:+-context "$CONTEXT"} -steps "$steps" -eval-every "${EVERY:-$steps}" -eval-batches 1 -measure=false -data "$w/text.txt" "${flags[@]}" ${FLAGS:-} \
        -json "$w/offload-$where.json" > "$w/offload-$where.log" 2>&1
      say "$model, $where (${flags[*]:-the state on the device}): exit $?"
      grep -E "^(validation|throughput|peak|model|chose|host memory)|fits|predicted" "$w/offload-$where.log" | tail -12 | tee -a "$w/summary.txt"
      [ -s "$w/offload-$where.json" ] && python3 -c "import json, sys; print('tokens/s a period:', ' '.join(f\"{e['predictions_per_sec']:.0f}\" for e in json.load(open(sys.argv[1]))['epochs']))" \
        "$w/offload-$where.json" 2>&1 | tee -a "$w/summary.txt"
    done
    if [[ " ${WHERE:-device host} " == *" host "* ]]; then # the host's AdamW beside a run that offloads
      timeout 120 bash .gpu/run sh -c '"$LEANGRAD_BIN/../tests/kernels_cpu.test" -test.run XXX -test.bench BenchmarkAdamW -test.benchtime 10x \
        -test.cpu 1,16' > "$w/adamw.log" 2>&1
      say "leangrad's host AdamW exit $?"; grep -E "^Benchmark" "$w/adamw.log" | tee -a "$w/summary.txt"
      timeout 120 python3 -c "
import time, torch
n = 1 << 24
for threads in (1, 16):
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n)); p.grad = torch.randn(n) * 0.01
    o = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    o.step()
    t = time.perf_counter()
    for _ in range(10): o.step()
    print(f'PyTorch {torch.__version__} fused AdamW on the CPU, {threads} threads: {(time.perf_counter() - t) / 10 / n * 1e9:.3f} ns/param')
" 2>&1 | tee -a "$w/summary.txt"
    fi
    rm -f "$w/text.txt"*
    ;;
  largest)
    cap=${CAP:-24}
    timeout "${LIMIT:-420}" "${bench[@]}" -device cuda -specs "" -pytorch "" -claims=false -largest-model "$cap${MODELS:+:1024:8:$MODELS}" \
      ${PROFILE:+-cpuprofile "$w/largest-cpu.prof"} -out "$w/largest" > "$w/largest.log" 2>&1
    say "leangrad's largest model under ${cap} GiB exit $?"; grep -E "^(largest model|claim)" "$w/largest.log" | tee -a "$w/summary.txt"
    if [ "${TORCH:-1}" = 1 ]; then
      timeout 300 python3 benchmarks/pytorch/gpt.py largest-model --cap-gib "$cap" --context 1024 --batch 8 --steps 3 \
        --shapes "gpt2=12,12,768 gpt2-medium=24,16,1024 gpt2-large=36,20,1280 gpt3-1.3b=24,16,2048 gpt2-xl=48,25,1600 gpt3-2.7b=32,32,2560 gpt3-6.7b=32,32,4096" \
        --vocab 50257 --amp bf16 --checkpoint --lr 2e-4 --beta2 0.95 --wd 0.1 --clip 1 > "$w/largest-pytorch.json" 2> "$w/largest-pytorch.log"
      say "PyTorch's largest model under ${cap} GiB exit $?"
      python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
for m in r['models']:
    print(m['model'], m.get('params'), 'fits' if m['fits'] else 'out of memory', round(m.get('tokens_per_s', 0)), m.get('peak_allocated'))
print('largest', r['largest'])" "$w/largest-pytorch.json" 2>&1 | tee -a "$w/summary.txt"
    fi
    ;;
  acts)
    torch=(); [ "${TORCH:-1}" = 0 ] && torch=(-pytorch "")
    timeout 300 "${bench[@]}" -device cuda -specs gpt2:16 -configs bf16+checkpoint,bf16+checkpoint+offload -vocab 50304 -eager \
      -compile-configs "" "${torch[@]}" -claims=false -steps 10 -warmup 3 -out "$w/acts" > "$w/acts.log" 2>&1
    say "acts exit $?"; rows gpt2 "$w/acts/bench.md"
    ;;
  profile)
    timeout 300 "${bench[@]}" -device cuda -specs "${SPECS:-gpt2:16}" -configs "${CONFIGS:-bf16}" -vocab "${VOCAB:-50304}" -profile \
      -pytorch "" -claims=false -eager=false -steps 3 -warmup 2 -out "$w/profile" > "$w/profile.log" 2>&1
    say "profile exit $?"; grep -E "^profile|leangrad .*ms" "$w/profile.log" | head -30 | tee -a "$w/summary.txt"
    ;;
  ab)
    xz -dc .gpu/old/bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
    args=(-device cuda -specs "${SPECS:-resnet20:256,1024 resnet18:256}" -configs "${CONFIGS:-fp32,amp,checkpoint,amp+checkpoint}"
      -pytorch "" -claims=false -eager=false -steps 20 -warmup 5 ${EXTRA:-})
    for r in $(seq 1 "${ROUNDS:-2}"); do
      order="old new"; [ $((r % 2)) -eq 0 ] && order="new old"
      for which in $order; do
        if [ "$which" = old ]; then /tmp/old-bench "${args[@]}" -out "$w/ab-old-$r" > "$w/ab-old-$r.log" 2>&1
        else bench "${args[@]}" -out "$w/ab-new-$r" > "$w/ab-new-$r.log" 2>&1; fi
        say "$which ($( [ "$which" = old ] && cat .gpu/old/commit || echo "$commit")) round $r exit $?"
        grep -E "^leangrad \(captured\)" "$w/ab-$which-$r.log" | sed -E 's/ \(host[^)]*\)//; s/, reserved.*//' | tee -a "$w/summary.txt"
      done
    done
    ;;
  ddp)
    n=${NPROC:-2}
    specs=${SPECS:-"resnet18:256 resnet20:256"}
    bench -device cuda -specs "$specs" -configs fp32,amp -pytorch "" -claims=false -eager=false -warmup 10 -steps 30 \
      -out "$w/ddp-1" > "$w/ddp-1.log" 2>&1
    bench -nproc "$n" -device cuda -specs "$specs" -configs fp32,amp -warmup 10 -steps 30 -out "$w/ddp-$n" > "$w/ddp-$n.log" 2>&1
    say "leangrad on $n GPUs exit $?"; grep -E 'leangrad-ddp' "$w/ddp-$n.log" | tee -a "$w/summary.txt"
    for k in 1 "$n"; do
      torchrun --standalone --nproc-per-node "$k" benchmarks/pytorch/ddp.py --specs $specs --configs fp32,amp \
        --warmup 10 --steps 30 --out "$w/pytorch-ddp-$k.json" > "$w/pytorch-ddp-$k.log" 2>&1
      say "pytorch on $k GPU(s) exit $?"
    done
    bash .gpu/run bin/train -nproc "$n" -model resnet -amp -checkpoint -batch $((128 / n)) -json "$w/main-ddp.json" > "$w/main-ddp.log" 2>&1
    say "main job on $n GPUs exit $?"; grep -E 'test accuracy|throughput' "$w/main-ddp.log" | tee -a "$w/summary.txt"
    ;;
  kernels)
    export PATH="$PATH:/usr/local/cuda/bin"
    python3 scripts/flash-bench.py --torch --source .gpu/kernels.cu tree=kernels/cuda/src/transformer_flash.cu \
      > "$w/flash-bench.log" 2>&1; say "flash-bench exit $?"; tail -8 "$w/flash-bench.log" | tee -a "$w/summary.txt"
    python3 scripts/flash32-bench.py --source .gpu/kernels.cu tree= > "$w/flash32-bench.log" 2>&1
    say "flash32-bench exit $?"; tail -6 "$w/flash32-bench.log" | tee -a "$w/summary.txt"
    python3 scripts/x3gemm-bench.py --source .gpu/kernels.cu tree= > "$w/x3gemm-bench.log" 2>&1
    say "x3gemm-bench exit $?"; tail -8 "$w/x3gemm-bench.log" | tee -a "$w/summary.txt"
    ;;
  cpu)
    cores=${CORES:-$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | tail -2 | cut -d, -f1 | paste -sd,)}
    lscpu -p=CPU,CORE,SOCKET > "$w/lscpu.txt"; say "pinned to CPUs $cores"
    timeout 400 taskset -c "$cores" bash .gpu/run bin/bench -device cpu -out "$w/cpu" -specs "resnet20:32 mlp:128" \
      -configs fp32 -steps 15 -warmup 3 -rounds "${ROUNDS:-6}" -claims=false -commit "$commit" > "$w/cpu.log" 2>&1
    say "cpu exit $?"; grep -E 'over [0-9]+ rounds' "$w/cpu.log" | tee -a "$w/summary.txt"
    start=$(date +%s)
    timeout 200 taskset -c "$cores" bash .gpu/run bin/train -model resnet -amp -checkpoint -device cpu -json "$w/cpu-main.json" \
      > "$w/cpu-main.log" 2>&1
    say "cpu main job exit $?, $(( $(date +%s) - start )) s"
    ;;
  *)
    say "gpu.sh: unknown suite $suite (see the list at the top of scripts/gpu.sh)"
    ;;
  esac
done
