#!/usr/bin/env bash
# The main job: install what is needed, build, and run dsv41 on the embedded DeepSeek-V4.1-Flash
# configuration. Until serving lands this is `dsv41 inspect` (parameters, KV bytes, FLOPs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh dsv41
./build/dsv41 inspect --preset deepseek-v4.1-flash
