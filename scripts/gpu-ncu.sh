#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage (the cmd/ binaries are enough):
#   KERNELS='layernorm_bwd_mixed|binary_mixed' bash scripts/gpu-ncu.sh
# runs one eager GPT-2 small step (bf16, batch 16; SPECS, CONFIGS to change
# it) under Nsight Compute and writes each matching kernel's first
# launches (COUNT, default 2 a name) with the speed-of-light, memory and
# occupancy sections into $OUT/ncu.txt.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
bash .gpu/run true # unpacks the binaries where .gpu/run keeps them
bin=/tmp/gpu-stage-$(cksum < .gpu/bin.tar.xz | cut -d' ' -f1)/bin
timeout "${LIMIT:-240}" ncu --clock-control none --kernel-name "regex:${KERNELS:?set KERNELS to a regular expression}" \
  --launch-count "${COUNT:-2}" --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  "$bin/bench" -device cuda -specs "${SPECS:-gpt2:16}" -configs "${CONFIGS:-amp}" -amp-dtype bf16 -vocab 50304 \
  -pytorch "" -claims=false -eager=false -steps 1 -warmup 0 -out "$out/ncu-bench" > "$out/ncu.txt" 2>&1
echo "ncu exit: $?"
grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size" "$out/ncu.txt" | head -80
