#!/usr/bin/env bash
# The device forward of this tree against a baseline, on the GPU machine, in one run of it
# (docs/benchmarks.md: every speed claim is a same-run comparison). The GPU machine gets no .git,
# so the baseline comes as a patch from this tree back to it, made on the dev machine and carried:
#
#   git diff BASE HEAD -- src tests bench CMakeLists.txt > .gl/ab.patch      (then carry .gl)
#   PATCH=.gl/ab.patch LOGS=$OUT bench/forward_ab_on_gpu.sh
#
# Builds cuda_forward_bench twice (this tree, and a copy with the patch reversed) side by side, then
# runs them alternately RUNS times (default 2) with ARGS (default: batches 1, 8, 64 at a 4K context
# and a 4K prefill, 8 steps), printing the step and prefill rows; TRACE=1 adds one --kernel-trace
# run of each to $LOGS. TESTS, if set, names test binaries of this tree to build and run first;
# KERNELS, if set, is a --benchmark_filter for cuda_kernels_bench, built in both and run alternately too.
# The test binaries' output goes to one file, $LOGS/tests.log (the device tool returns a few files).
# BUILD, if set, names more targets of this tree to build with the rest (for commands after this one).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${PATCH:?PATCH: the diff from the baseline to this tree}"
patch_file=$(realpath "$PATCH")
logs=${LOGS:-gpu-logs}
read -r -a args <<< "${ARGS:---batches 1,8,64 --contexts 4096 --prefill 4096 --steps 8}"
read -r -a tests <<< "${TESTS:-}"
targets=(cuda_forward_bench)
[ -n "${KERNELS:-}" ] && targets+=(cuda_kernels_bench)
mkdir -p "$logs"
nvidia-smi --query-gpu=name --format=csv,noheader
base=/tmp/forward-ab-base
rm -rf "$base" && mkdir -p "$base"
shopt -s dotglob nullglob
for entry in *; do
  case $entry in build-ab | .git | .gpu) ;; *) cp -r "$entry" "$base"/ ;; esac
done
if ! (cd "$base" && patch -R -p1 -s < "$patch_file"); then
  echo "forward_ab_on_gpu: $PATCH does not reverse onto this tree"
  exit 1
fi
(cd "$base" && cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null &&
  ninja -C build-ab -j"$(( $(nproc) / 2 ))" "${targets[@]}" > "$logs/base-build.log" 2>&1) &
cmake -S . -B build-ab -G Ninja -DCMAKE_BUILD_TYPE=Release > "$logs/configure.log" 2>&1 ||
  { tail -20 "$logs/configure.log"; exit 1; }
read -r -a more <<< "${BUILD:-}"
ninja -C build-ab -j"$(( $(nproc) / 2 ))" "${targets[@]}" "${tests[@]}" "${more[@]}" > "$logs/build.log" 2>&1 ||
  { grep -E "error|FAILED|undefined reference" "$logs/build.log" | head -30; exit 1; }
for t in "${tests[@]}"; do
  "build-ab/tests/$t" > "$logs/test.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$logs/test.log" | tr '\n' ' ')"
  grep -E -A2 "^\[  FAILED  \]|Failure" "$logs/test.log" | head -12
  { echo "==== $t"; cat "$logs/test.log"; } >> "$logs/tests.log"
  rm "$logs/test.log"
done
wait
[ -x "$base/build-ab/bench/cuda_forward_bench" ] ||
  { grep -E "error|FAILED" "$logs/base-build.log" | head -30; exit 1; }
if [ -n "${KERNELS:-}" ]; then
  for r in 1 2; do
    for v in this base; do
      bin=build-ab/bench/cuda_kernels_bench
      [ $v = base ] && bin=$base/build-ab/bench/cuda_kernels_bench
      echo "== kernels, $v, run $r"
      "$bin" --benchmark_filter="$KERNELS" 2>&1 | grep -E "^BM_"
    done
  done
fi
for r in $(seq 1 "${RUNS:-2}"); do
  for v in this base; do
    bin=build-ab/bench/cuda_forward_bench
    [ $v = base ] && bin=$base/build-ab/bench/cuda_forward_bench
    echo "== $v, run $r"
    "$bin" "${args[@]}" 2>&1 | grep -E "^device-to-device|^\| [0-9]+ \| [0-9]+ \||^\| [0-9]+ \| (exact|default) \|"
  done
done
if [ "${TRACE:-0}" = 1 ]; then
  build-ab/bench/cuda_forward_bench "${args[@]}" --kernel-trace > "$logs/trace-this.txt" 2>&1
  "$base/build-ab/bench/cuda_forward_bench" "${args[@]}" --kernel-trace > "$logs/trace-base.txt" 2>&1
fi
