// A bounded load test: C concurrent clients, each sending R streaming chat requests one after
// another (default 64 x 20), through the official openai client. Records errors, throughput and
// time to first token (TTFT, from the streams), and with --pid the server's resident memory.
// Prints one JSON object; exits 1 when any request failed.
//   node tests/e2e/load.mjs --base-url http://127.0.0.1:8080 --model NAME
//        [--clients 64] [--requests 20] [--max-tokens 16] [--timeout-s 300] [--pid SERVER_PID]
import fs from 'node:fs';
import path from 'node:path';
import { check, client, describeError, exitFailure, parseArgs, percentile } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { clients: 64, requests: 20, 'max-tokens': 16, 'timeout-s': 300, pid: 0 });
const openai = client(args, { timeout: args['timeout-s'] * 1000 });

// Resident memory of the server in bytes, read from /proc (null when unreadable).
function rssBytes(pid) {
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

// Every client shares the system prompt (a prefix the server can cache) and asks its own question.
const system = 'You are a concise assistant. Answer in one short sentence.';

async function one(c, r) {
  const started = performance.now();
  const stream = await openai.chat.completions.create({
    model: args.model, max_tokens: args['max-tokens'], temperature: 0.7, seed: c * 1000 + r, stream: true,
    stream_options: { include_usage: true },
    messages: [{ role: 'system', content: system }, { role: 'user', content: `Client ${c}, question ${r}: name a colour.` }],
  });
  let ttft = null, usage = null, finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    if (ttft === null && (d?.content || d?.reasoning_content)) ttft = performance.now() - started;
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  check(usage !== null, 'expected a usage chunk (include_usage)', null);
  check(finish !== null, 'expected a finish_reason', null);
  return { ttft, latency: performance.now() - started, usage };
}

const results = [];
const errors = new Map();  // message -> count
let rssMax = null;
const rssStart = args.pid ? rssBytes(args.pid) : null;
const sampler = args.pid ? setInterval(() => {
  const rss = rssBytes(args.pid);
  if (rss !== null) rssMax = Math.max(rssMax ?? 0, rss);
}, 250) : null;

const t0 = performance.now();
await Promise.all(Array.from({ length: args.clients }, async (_, c) => {
  for (let r = 0; r < args.requests; ++r) {
    try {
      results.push(await one(c, r));
    } catch (e) {
      const message = describeError(e).split('\n')[0];
      errors.set(message, (errors.get(message) ?? 0) + 1);
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
if (sampler) clearInterval(sampler);

const sum = (k) => results.reduce((a, x) => a + x.usage[k], 0);
const sumCached = results.reduce((a, x) => a + (x.usage.prompt_tokens_details?.cached_tokens ?? 0), 0);
const ttfts = results.map((x) => x.ttft).filter((x) => x !== null);
const latencies = results.map((x) => x.latency);
const ms = (x) => (x === null ? null : Math.round(x * 10) / 10);
const errorCount = [...errors.values()].reduce((a, b) => a + b, 0);
const summary = {
  script: path.basename(script),
  ok: errorCount === 0,
  clients: args.clients,
  requests_per_client: args.requests,
  requests: args.clients * args.requests,
  completed: results.length,
  errors: errorCount,
  error_messages: Object.fromEntries([...errors.entries()].slice(0, 10)),
  wall_s: Math.round(wall * 1000) / 1000,
  requests_per_s: Math.round((results.length / wall) * 100) / 100,
  prompt_tokens: sum('prompt_tokens'),
  cached_tokens: sumCached,
  completion_tokens: sum('completion_tokens'),
  completion_tokens_per_s: Math.round((sum('completion_tokens') / wall) * 10) / 10,
  ttft_ms: { n: ttfts.length, p50: ms(percentile(ttfts, 50)), p99: ms(percentile(ttfts, 99)), max: ms(percentile(ttfts, 100)) },
  latency_ms: { p50: ms(percentile(latencies, 50)), p99: ms(percentile(latencies, 99)), max: ms(percentile(latencies, 100)) },
  ...(args.pid ? { server_rss_bytes: { start: rssStart, max: rssMax, end: rssBytes(args.pid) } } : {}),
};
process.stdout.write(JSON.stringify(summary) + '\n');
if (errorCount > 0) exitFailure(script, `${errorCount} of ${summary.requests} requests failed: ${JSON.stringify(summary.error_messages)}`);
