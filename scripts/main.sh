#!/usr/bin/env bash
# The main job: install what is needed, build, make the default model (scripts/default-model.sh:
# a small checkpoint in the official layout with random weights and DeepSeek's real tokenizer;
# docs/default-model.md) and serve it with the OpenAI-compatible API. Arguments go to
# `dsv41 serve`, e.g. --port 9000 or --host 0.0.0.0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh dsv41
scripts/default-model.sh

# The OpenAI clients' settings, from the arguments `serve` gets. Once listening, `serve` itself
# prints its address and a curl call.
host=127.0.0.1 port=8080 name=default key=none
prev=""
for a in "$@"; do
  case "$prev" in --host) host=$a ;; --port) port=$a ;; --model-name) name=$a ;; --api-key) key=$a ;; esac
  case "$a" in
    --host=*) host=${a#--host=} ;; --port=*) port=${a#--port=} ;;
    --model-name=*) name=${a#--model-name=} ;; --api-key=*) key=${a#--api-key=} ;;
  esac
  prev=$a
done
[ "$host" = 0.0.0.0 ] && host=127.0.0.1
url="http://$host:$port/v1"

cat <<MSG

main: serving models/default as model "$name": random weights (the text is not language) with
DeepSeek's tokenizer (docs/default-model.md). OpenAI clients:
  Python: OpenAI(base_url="$url", api_key="$key").chat.completions.create(model="$name", messages=[...])
  JS:     new OpenAI({ baseURL: "$url", apiKey: "$key" }).chat.completions.create({ model: "$name", messages: [...] })
MSG
exec ./build/dsv41 serve --model models/default "$@"
