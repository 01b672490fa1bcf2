#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/stage ./kernels/cuda ./autograd ./nn ./train: channels-last
# convolutions checked and measured (Note [channels last]).
#   bash scripts/gpu-nhwc.sh tests profile deep
# tests: the CUDA tests of the staged packages (TESTS, a -test.run pattern); profile: each kind of
# operation's device time in an eager ResNet-1202 step at 128 (CONFIGS); deep: ResNet-1202 at 128 in
# every configuration (CONFIGS), captured, ROUNDS runs. Everything lands in $OUT.
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
for what in "$@"; do
  case $what in
  tests)
    timeout "${TESTS_TIMEOUT:-300}" bash .gpu/run tests -test.run "${TESTS:-CUDA}" -test.skip "${SKIP:-GPT|DataParallel|Sharded}" \
      -test.count 1 -test.v > "$out/tests.log" 2>&1
    echo "tests exit: $?"; grep -E "^(--- FAIL|FAIL|ok|panic)|Error|error" "$out/tests.log" | head -30
    ;;
  profile)
    timeout 200 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs "${CONFIGS:-fp32,amp}" -profile -profile-share 1 \
      -pytorch "" -claims=false -eager=false -steps 3 -warmup 2 -out "$out/profile" > "$out/profile.log" 2>&1
    echo "profile exit: $?"; grep -E "^profile|^  |leangrad .*ms|rror" "$out/profile.log" | grep -v "captured:" | cut -c1-160
    ;;
  deep)
    for r in $(seq 1 "${ROUNDS:-1}"); do
      timeout 200 bash .gpu/run bin/bench -device cuda -specs resnet1202:128 -configs "${CONFIGS:-fp32,amp,checkpoint,amp+checkpoint}" -pytorch "" \
        -claims=false -eager=false -steps 5 -warmup 3 -out "$out/deep$r" -commit "${COMMIT:-}" > "$out/deep$r.log" 2>&1
      echo "deep $r exit $?"; grep -E "^\| resnet" "$out/deep$r/bench.md" | cut -d'|' -f2-5,11
    done
    ;;
  esac
done
