#!/usr/bin/env bash
# The serving benchmark of docs/benchmarks.md ("Serving on the H200"), on the GPU machine with .gpu
# carried (scripts/gpu-env.sh): builds dsv41 and cuda_forward_bench, writes a bench-1gpu layout
# checkpoint, and measures in one run of the machine, at one commit:
#   raw  the device forward's batch-64 decode at a 4K context (cuda_forward_bench)
#   c1, c8, c64  `dsv41 bench serve` against one `dsv41 serve --device cuda --random-weights 1`
#                (128-token prompts, 64 output tokens); c64_decode: 16 in, 256 out
#   agent        `dsv41 bench serve --agent` (its own server: the disk phase restarts it)
#   c64_32k      (LONG_SESSIONS=1) 64 concurrent 32K-token sessions: device memory and KV held
# Every result is a JSON line in $LOGS/serve.jsonl as soon as it is measured; AGENT_SESSIONS,
# PREFIX_TOKENS size the agent run; AGENT_ONLY=1 runs the agent workload alone; SERVE_ARGS are
# added to every `dsv41 serve` (an A/B of a server flag: SERVE_ARGS='--warm-up off').
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${LOGS:-gpu-logs}
build=${BUILD:-/tmp/dsv41-gpu}
mkdir -p "$logs"
source scripts/gpu-env.sh > "$logs/machine.txt" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$logs/machine.txt" 2>&1
cmake -S . -B "$build" -G Ninja -DDSV41_REQUIRE_ALL=ON -DDSV41_TESTS=OFF > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
targets=(dsv41)
[ "${AGENT_ONLY:-0}" != 1 ] && targets+=(cuda_forward_bench)
ninja -C "$build" -j"$(nproc)" "${targets[@]}" > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" "$logs/build.log" | head -30; exit 1; }
dsv41=$build/dsv41
out=$logs/serve.jsonl
: > "$out"

model=/tmp/bench-1gpu
[ -f $model/config.json ] || $dsv41 init-random --preset bench-1gpu --layout-only --out $model > "$logs/init.log" 2>&1
# Speculation off: the scenarios are compared with the raw forward's plain decode (issue 15), and
# random weights accept no draft (DSpark's own figures: `dsv41 bench spec`).
serve="--model $model --device cuda --random-weights 1 --max-running 64 --max-queued 1024 --step-tokens 8192 --speculative off ${SERVE_ARGS:-}"
if [ "${AGENT_ONLY:-0}" != 1 ]; then
"$build/bench/cuda_forward_bench" --batches 64 --contexts 4096 --prefill , --steps 8 > "$logs/raw.txt" 2>&1
# the tokens/s column found by its header (the table gains columns)
raw=$(awk -F'|' '/^\| batch /{for (i = 2; i < NF; ++i) if ($i ~ /^ *tokens\/s *$/) c = i}
  c && $2 ~ /^ *64 *$/ && $3 ~ /^ *4,?096 *$/ {gsub(/[ ,]/, "", $c); print $c}' "$logs/raw.txt")
echo "{\"scenario\":\"raw\",\"raw_batch64_tokens_per_s\":${raw:-null}}" >> "$out"
cat "$logs/raw.txt"

$dsv41 serve --port 8090 $serve > "$logs/server.log" 2>&1 &
server=$!
until python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8090/health')" 2> /dev/null; do sleep 1; kill -0 $server 2>/dev/null || { cat "$logs/server.log"; exit 1; }; done
# key concurrency requests prompt-tokens output-tokens; c64_decode: decode-bound, the prefill's share small
while read -r key c requests prompt output; do
  $dsv41 bench serve --url http://127.0.0.1:8090 --concurrency $c --requests $requests --prompt-tokens $prompt \
    --output-tokens $output --max-id 100000 --json | sed "s/^{/{\"key\":\"$key\",/" >> "$out"
  [ $key = c64 ] && nvidia-smi --query-gpu=memory.used --format=csv,noheader > "$logs/memory_c64.txt"
  tail -1 "$out"
done <<'RUNS'
c1 1 8 128 64
c8 8 16 128 64
c64 64 64 128 64
c64_decode 64 64 16 256
RUNS
# c64_32k (LONG_SESSIONS=1): 64 concurrent sessions of 32K-token prompts, with the largest device
# memory in use (nvidia-smi), KV bytes held and sequences running (/metrics) sampled every second.
if [ "${LONG_SESSIONS:-0}" = 1 ]; then
  samples=$logs/c64_32k_samples.txt
  : > "$samples"
  ( while sleep 1; do
      mem=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
      python3 - "$mem" >> "$samples" <<'PY' 2> /dev/null
import sys, urllib.request
m = {}
for line in urllib.request.urlopen("http://127.0.0.1:8090/metrics").read().decode().splitlines():
    if line.startswith(("dsv41_kv_bytes ", "dsv41_running_sequences ", "dsv41_kv_budget_bytes ")):
        k, v = line.split()
        m[k] = float(v)
print(sys.argv[1], int(m.get("dsv41_kv_bytes", 0)), int(m.get("dsv41_running_sequences", 0)), int(m.get("dsv41_kv_budget_bytes", 0)))
PY
    done ) &
  sampler=$!
  line=$($dsv41 bench serve --url http://127.0.0.1:8090 --concurrency 64 --requests 64 --prompt-tokens 32768 \
    --output-tokens 16 --max-id 100000 --json)
  kill $sampler; wait $sampler 2> /dev/null
  # the largest of each of the first three columns, and the budget
  read -r peak kv running budget < <(awk '{for (i = 1; i <= 3; ++i) if ($i > m[i]) m[i] = $i; b = $4}
    END {printf "%.0f %.0f %.0f %.0f\n", m[1], m[2], m[3], b}' "$samples")
  echo "$line" | sed "s/^{/{\"key\":\"c64_32k\",\"device_memory_mib_max\":$peak,\"kv_bytes_max\":$kv,\"running_max\":$running,\"kv_budget_bytes\":$budget,/" >> "$out"
  tail -1 "$out"
fi
kill $server; wait $server
fi

store=/tmp/bench-store
rm -rf $store
$dsv41 bench serve --agent --sessions "${AGENT_SESSIONS:-3}" --prefix-tokens "${PREFIX_TOKENS:-32768}" --turn-tokens 64 \
  --turn-output 16 --ttl-wait 6 --max-id 100000 --json --serve "$serve --store $store --swa-ttl 5" \
  2> "$logs/agent.log" | sed 's/^{/{"key":"agent",/' >> "$out"
tail -1 "$out"
