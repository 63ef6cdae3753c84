#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ for SECONDS each (default 60; as many at once as there are
# cores, ~0.5 GB each) under ASan + UBSan, starting from its seeds in fuzz/corpus/<target>/ (new
# inputs it finds go to build-fuzz/corpus/, never to the tree). Fails if a target finds anything:
# the crashing input is left in build-fuzz/findings/ and the report printed. Builds with clang in
# build-fuzz/ (a separate tree: every library instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=build-fuzz
# Debug: its flags add only -g, so -O1 holds (RelWithDebInfo appended -O2: the same findings per
# second, ~1/3 longer to build).
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_FLAGS="$flags" -DDSV41_CUDA=OFF -DDSV41_TESTS=OFF -DDSV41_BENCH=OFF -DDSV41_FUZZ=ON -DDSV41_REQUIRE_ALL=ON >/dev/null
targets=$(cd fuzz && ls *_fuzz.cpp | sed 's/\.cpp$//')
# shellcheck disable=SC2086
cmake --build "$build" --target $targets
mkdir -p "$build/findings"
# One target: libFuzzer on one core for `seconds`; its log and exit status beside it.
fuzz_one() {
  local t=$1 seeds=()
  mkdir -p "$build/corpus/$t"
  [ -d "fuzz/corpus/$t" ] && seeds=("fuzz/corpus/$t")
  local status=0
  UBSAN_OPTIONS=print_stacktrace=1 "$build/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$build/findings/$t-" -print_final_stats=1 "$build/corpus/$t" "${seeds[@]}" > "$build/$t.log" 2>&1 || status=$?
  echo "$status" > "$build/$t.status"
}
# As many targets at once as there are cores (each fuzzes on one).
rm -f "$build"/*.status
for t in $targets; do
  echo "fuzz.sh: $t for ${seconds}s"
  fuzz_one "$t" &
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
done
wait
for t in $targets; do
  if [ "$(cat "$build/$t.status")" != 0 ]; then
    tail -60 "$build/$t.log"
    echo "fuzz.sh: $t FOUND A FAILURE (input in $build/findings/)"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/$t.log" | sed "s/^/fuzz.sh: $t /"
done
echo "fuzz.sh: every target ran ${seconds}s with no finding"
