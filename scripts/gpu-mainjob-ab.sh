#!/usr/bin/env bash
# On the GPU machine: the main job's throughput, two train binaries alternating (.gpu/ab/old-train.xz
# and new-train.xz, built here with CGO_ENABLED=0 go build -trimpath ./cmd/train and xz-compressed),
# ROUNDS rounds of EPOCHS epochs each, on the Fashion-MNIST that ../shared/gpu/stage copies to .gpu/data.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for w in old new; do xz -dc ".gpu/ab/$w-train.xz" > "/tmp/$w-train" && chmod +x "/tmp/$w-train"; done
for r in $(seq 1 "${ROUNDS:-2}"); do
  order="old new"
  [ $((r % 2)) -eq 0 ] && order="new old"
  for w in $order; do
    timeout 120 "/tmp/$w-train" -model resnet -amp -checkpoint -device cuda -epochs "${EPOCHS:-3}" -measure=false \
      -data .gpu/data/fashion-mnist > "$out/$w-$r.log" 2>&1
    echo "$w round $r exit $?: $(grep -E '^throughput' "$out/$w-$r.log")"
  done
done
