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

# The address the server will listen on, for the instructions below.
host=127.0.0.1 port=8080
prev=""
for a in "$@"; do
  case "$prev" in --host) host=$a ;; --port) port=$a ;; esac
  case "$a" in --host=*) host=${a#--host=} ;; --port=*) port=${a#--port=} ;; esac
  prev=$a
done
[ "$host" = 0.0.0.0 ] && host=127.0.0.1
url="http://$host:$port/v1"

cat <<MSG

Serving models/default (random weights: the text is not language) at $url
  curl $url/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "default", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}'
  Python: OpenAI(base_url="$url", api_key="none")
  JS:     new OpenAI({ baseURL: "$url", apiKey: "none" })
MSG
exec ./build/dsv41 serve --model models/default "$@"
