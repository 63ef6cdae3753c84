#!/usr/bin/env bash
# Remakes assets/default-model, the model scripts/main.sh serves (docs/default-model.md): the
# corpus with its chat documents and a 4,096-id tokenizer from the Debian packages scripts/setup.sh
# installs, then `dsv41 train` with configs/default-model.json, then the final checkpoint's served
# files copied into the assets folder. The run's directory (models/default-train) keeps its resume state:
# running this again continues an unfinished run instead of starting over.
#   [DEVICE=cpu] scripts/train-default-model.sh [DSV41]    # DSV41: the dsv41 binary, ./build/dsv41 by default
# DEVICE: where the steps run (`dsv41 train --device`): cuda by default (about six minutes on one
# H100); cpu works too, at this size for days. A run may move between devices.
set -euo pipefail
cd "$(dirname "$0")/.."
dsv41=${1:-./build/dsv41} device=${DEVICE:-cuda}
data=models/default-data run=models/default-train out=assets/default-model

[ -f "$data/train.tokens" ] || "$dsv41" data build --out "$data" --vocab 4096 --chat
if [ -f "$run/train_config.json" ]; then
  steps=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"])' "$run/train_config.json")
  [ "$(readlink "$run/latest" 2>/dev/null)" = "$(printf step-%08d "$steps")" ] ||
    OMP_WAIT_POLICY=passive "$dsv41" train --device "$device" --resume "$run"
else
  OMP_WAIT_POLICY=passive "$dsv41" train --device "$device" --config configs/default-model.json --out "$run"
fi

# What serving reads, and the corpus's notice (WordNet's licence asks that it go with the model).
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp "$run"/latest/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json} "$data/NOTICE" "$out.tmp/"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "train-default-model: wrote $out ($(du -sh "$out" | cut -f1))"
