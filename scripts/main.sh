#!/usr/bin/env bash
# The main job: install what is needed, build, and serve the embedded default model
# (assets/default-model: a small V4.1-architecture model trained by `dsv41 train`, in the official
# layout; docs/default-model.md) with the OpenAI-compatible API. Arguments go to `dsv41 serve`,
# e.g. --port 9000 or --host 0.0.0.0.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh dsv41

# The OpenAI clients' settings, from the arguments `serve` gets. Once listening, `serve` itself
# prints its address and a curl call.
host=127.0.0.1 port=8080 name=default key=none
name_given=false thinking_given=false  # else: the API name "default", thinking off
prev=""
for a in "$@"; do
  case "$prev" in --host) host=$a ;; --port) port=$a ;; --model-name) name=$a name_given=true ;; --api-key) key=$a ;; esac
  case "$a" in --thinking|--thinking=*) thinking_given=true ;; esac
  case "$a" in
    --host=*) host=${a#--host=} ;; --port=*) port=${a#--port=} ;;
    --model-name=*) name=${a#--model-name=} name_given=true ;; --api-key=*) key=${a#--api-key=} ;;
  esac
  prev=$a
done
[ "$host" = 0.0.0.0 ] && host=127.0.0.1
url="http://$host:$port/v1"

cat <<MSG

main: serving assets/default-model as model "$name": a 25M-parameter model of the V4.1 architecture
trained on public-domain English (docs/default-model.md). OpenAI clients:
  Python: OpenAI(base_url="$url", api_key="$key").chat.completions.create(model="$name", messages=[...])
  JS:     new OpenAI({ baseURL: "$url", apiKey: "$key" }).chat.completions.create({ model: "$name", messages: [...] })
MSG
$name_given || set -- --model-name default "$@"
# The model never learned V4.1's reasoning section: its chat turns are answers (docs/default-model.md).
$thinking_given || set -- --thinking off "$@"
exec ./build/dsv41 serve --model assets/default-model "$@"
