#!/usr/bin/env bash
# Configures and builds dsv41 in build/ (Release, Ninja). CUDA code is built when nvcc is found;
# pass -DDSV41_CUDA=OFF in CMAKE_ARGS to skip it. Extra arguments are build targets.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja ${CMAKE_ARGS:-} >/dev/null
cmake --build build ${1:+--target "$@"}
