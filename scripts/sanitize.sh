#!/usr/bin/env bash
# The whole CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer: its own tree in
# build-asan/ (GCC, -O1, every library instrumented, no CUDA), then ctest. Any report fails the
# test that made it (halt_on_error; UBSan errors are not recoverable). Extra arguments go to ctest
# (e.g. -R Fixture).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DDSV41_CUDA=OFF -DDSV41_BENCH=OFF -DDSV41_REQUIRE_ALL=ON >/dev/null
cmake --build "$build"
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -LE gpu "$@"
