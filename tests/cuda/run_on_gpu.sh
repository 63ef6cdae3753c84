#!/usr/bin/env bash
# Builds the CUDA core on the GPU machine, runs the GPU tests (ctest label gpu) and the CUDA kernel
# benchmark. Without the Debian libraries there this is the core-only configuration; with .gpu
# carried (scripts/gpu-env.sh unpacks it) the full one, whose gpu label also holds the engine's
# tests on the CUDA executor (the server with the openai client, the scheduler, greedy speculation). Logs go to $LOGS
# (default ./gpu-logs); BENCH_FILTER, if set, is passed to the benchmark as --benchmark_filter
# (BENCH_FILTER=none: no benchmark). nlohmann-json must be in .deps/include (docs/cuda.md says how).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${LOGS:-gpu-logs}
build=${BUILD:-/tmp/dsv41-gpu}
mkdir -p "$logs"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv; nvcc --version | tail -2;
  cmake --version | head -1; } > "$logs/machine.txt" 2>&1
full=()
if [ -d .gpu ]; then
  source scripts/gpu-env.sh >> "$logs/machine.txt" || exit 1
  full=(-DDSV41_REQUIRE_ALL=ON)
fi
cmake -S . -B "$build" -G Ninja "${full[@]}" > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
targets=$(cd "$build" && ninja -t targets all | grep -oE '^(tests/)?cuda_[a-z_]+(test|bench)' | sed 's#^tests/##' | sort -u)
[ ${#full[@]} -eq 0 ] || targets="$targets dsv41 scheduler_test server_test server_image_test forward_parity_test forward_vision_parity_test speculative_test"
ninja -C "$build" -j"$(nproc)" $targets > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" "$logs/build.log" | head -30; exit 1; }
(cd "$build" && ctest -L gpu --output-on-failure -V) > "$logs/tests.log" 2>&1
tests_rc=$?
grep -E "NMSE|PASSED|FAILED|tests passed|Failure|error" "$logs/tests.log" | head -120
[ "${BENCH_FILTER:-}" = none ] && exit $tests_rc
"$build/bench/cuda_kernels_bench" ${BENCH_FILTER:+--benchmark_filter="$BENCH_FILTER"} --benchmark_out="$logs/bench.json" --benchmark_out_format=json > "$logs/bench.txt" 2>&1
bench_rc=$?
cat "$logs/bench.txt"
exit $((tests_rc | bench_rc))
