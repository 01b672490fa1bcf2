#!/usr/bin/env bash
# On the GPU machine (after ../shared/gpu/stage): the benchmark harness with
# PyTorch beside it. Everything lands in $OUT/bench.tar.gz; the table goes to stdout.
set -uo pipefail
out=${OUT:-gpu-out}
r=$out/bench
mkdir -p "$r"
bash .gpu/run bin/bench -device cuda -out "$r" ${BENCH_ARGS:-} > "$r/bench.log" 2>&1
echo "bench exit: $?"
grep -E '^(leangrad|pytorch|claim)|bench:' "$r/bench.log" | head -60
cat "$r/bench.md" 2>/dev/null
tar -C "$out" -czf "$out/bench.tar.gz" bench && rm -rf "$r"
