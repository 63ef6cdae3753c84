// A tiny stand-in for dsv41's OpenAI-compatible server, only to check the e2e scripts themselves
// (self_test.mjs): it speaks the same shapes with made-up tokens. It is not a test of dsv41.
// --fault NAME breaks one thing on purpose, so that self_test.mjs can see each script catch it.
//   node tests/e2e/fake_server.mjs [--port 0] [--model fake-model] [--fault NAME]
// Prints "listening http://127.0.0.1:PORT" once it accepts connections.
import http from 'node:http';

const faults = ['missing-usage', 'accept-n', 'no-done', 'wrong-total', 'flaky', 'usage-not-null', 'one-choice', 'echo-scores-first'];
const opts = { port: '0', model: 'fake-model', fault: '' };
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, '');
  if (!(key in opts) || process.argv[i + 1] === undefined) {
    process.stderr.write(`fake_server: unknown argument ${process.argv[i]}; expected --port, --model, --fault\n`);
    process.exit(2);
  }
  opts[key] = process.argv[i + 1];
}
if (opts.fault && !faults.includes(opts.fault)) {
  process.stderr.write(`fake_server: --fault: expected one of ${faults.join(', ')}, found ${opts.fault}\n`);
  process.exit(2);
}

const words = [' Hello', ' there', ',', ' friend', '!', ' How', ' are', ' you', ' today', '?'];
let served = 0;

function error(res, status, message, param = null, code = null) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message, type: 'invalid_request_error', param, code } }));
}

// Made-up generation: the prompt length picks how many tokens come before a "stop".
function generate(promptTokens, maxTokens, top) {
  const natural = 3 + (promptTokens % 5);
  const n = Math.min(natural, maxTokens);
  const tokens = Array.from({ length: n }, (_, i) => {
    const token = words[(promptTokens + i) % words.length];
    const logprob = -0.1 * (i + 1);
    const alts = [{ token, logprob }, ...words.filter((w) => w !== token).slice(0, Math.max(0, top - 1))
      .map((w, j) => ({ token: w, logprob: logprob - 1 - j }))];
    return { token, logprob, top: alts.slice(0, top) };
  });
  return { tokens, finish: n === maxTokens ? 'length' : 'stop' };
}

function usageOf(prompt, completion) {
  const total = prompt + completion + (opts.fault === 'wrong-total' ? 1 : 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: total, prompt_tokens_details: { cached_tokens: 0 } };
}

const bytes = (s) => [...Buffer.from(s, 'utf8')];
const chatLogprobs = (ts) => ({ content: ts.map((t) => ({ token: t.token, logprob: t.logprob, bytes: bytes(t.token),
  top_logprobs: t.top.map((a) => ({ token: a.token, logprob: a.logprob, bytes: bytes(a.token) })) })), refusal: null });
function completionLogprobs(ts, offset) {
  const text_offset = [];
  for (const t of ts) { text_offset.push(offset); offset += [...t.token].length; }
  return { tokens: ts.map((t) => t.token), token_logprobs: ts.map((t) => t.logprob),
           top_logprobs: ts.map((t) => (t.top === null ? null : Object.fromEntries(t.top.map((a) => [a.token, a.logprob])))), text_offset };
}

async function complete(req, res, body, chat) {
  if (body.model !== opts.model) return error(res, 404, `model: expected "${opts.model}", found "${body.model}"`, 'model', 'model_not_found');
  const n = body.n ?? 1;
  if (!(Number.isInteger(n) && n >= 1) && opts.fault !== 'accept-n') return error(res, 400, `n: expected an integer >= 1, found ${n}`, 'n', 'invalid_value');
  if (body.temperature != null && !(body.temperature >= 0 && body.temperature <= 2))
    return error(res, 400, `temperature: expected a number in [0, 2], found ${body.temperature}`, 'temperature', 'invalid_value');
  let promptTokens;
  if (chat) {
    promptTokens = body.messages.reduce((a, m) => a + 4 + String(m.content).split(/\s+/).length, 0);
  } else {
    let p = body.prompt;
    if (Array.isArray(p) && typeof p[0] !== 'number') {
      if (p.length !== 1) return error(res, 400, `prompt: expected a single prompt, found ${p.length}`, 'prompt', 'unsupported_value');
      p = p[0];
    }
    promptTokens = Array.isArray(p) ? p.length : p.split(/\s+/).length;
  }
  const top = chat ? (body.logprobs ? body.top_logprobs ?? 0 : 0) : body.logprobs ?? 0;
  const wantLogprobs = chat ? body.logprobs === true : body.logprobs != null;
  // Each choice: greedy ones alike, sampled ones (temperature > 0) apart.
  const outs = Array.from({ length: opts.fault === 'one-choice' ? 1 : Math.max(1, n) }, (_, k) =>
    generate(promptTokens + (body.temperature === 0 ? 0 : k), body.max_tokens ?? (chat ? 1000 : 16), top));
  const usage = usageOf(promptTokens, outs.reduce((a, o) => a + o.tokens.length, 0));
  const head = { id: `${chat ? 'chatcmpl' : 'cmpl'}-fake${served}`, created: Math.floor(Date.now() / 1000), model: opts.model };
  const object = chat ? 'chat.completion.chunk' : 'text_completion';

  // Completions' echo: the prompt's words first, and with logprobs its tokens, the first unscored.
  const echo = !chat && body.echo === true && typeof body.prompt === 'string' ? body.prompt : null;
  const echoTokens = echo === null ? [] : echo.split(/(?=\s)/).map((token, i) =>
    ({ token, logprob: i === 0 && opts.fault !== 'echo-scores-first' ? null : -0.5, top: i === 0 ? null : [{ token, logprob: -0.5 }].slice(0, top) }));
  if (!body.stream) {
    const choices = outs.map(({ tokens, finish }, index) => {
      if (echo !== null) tokens = [...echoTokens, ...tokens];
      const text = tokens.map((t) => t.token).join('');
      return chat
        ? { index, message: { role: 'assistant', content: text }, logprobs: wantLogprobs ? chatLogprobs(tokens) : null, finish_reason: finish }
        : { index, text, logprobs: wantLogprobs ? completionLogprobs(tokens, 0) : null, finish_reason: finish };
    });
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ ...head, object: chat ? 'chat.completion' : 'text_completion', choices, usage }));
  }

  const includeUsage = body.stream_options?.include_usage === true;
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const send = (choice) => {
    const chunk = { ...head, object, choices: [choice] };
    if (includeUsage && opts.fault !== 'usage-not-null') chunk.usage = null;
    res.write(`data: ${JSON.stringify(chunk)}\n\n`);
  };
  if (chat) outs.forEach((_, index) => send({ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
  const offsets = outs.map(() => 0);
  for (let i = 0; outs.some((o) => i <= o.tokens.length); ++i) {  // the choices' chunks interleaved
    await new Promise((r) => setTimeout(r, 2));
    outs.forEach(({ tokens, finish }, index) => {
      if (i > tokens.length) return;
      if (i === tokens.length) {
        if (chat) send({ index, delta: {}, logprobs: null, finish_reason: finish });
        else send({ index, text: '', logprobs: null, finish_reason: finish });
        return;
      }
      const t = tokens[i];
      if (chat) send({ index, delta: { content: t.token }, logprobs: wantLogprobs ? chatLogprobs([t]) : null, finish_reason: null });
      else send({ index, text: t.token, logprobs: wantLogprobs ? completionLogprobs([t], offsets[index]) : null, finish_reason: null });
      offsets[index] += [...t.token].length;
    });
  }
  if (includeUsage && opts.fault !== 'missing-usage') res.write(`data: ${JSON.stringify({ ...head, object, choices: [], usage })}\n\n`);
  if (opts.fault !== 'no-done') res.write('data: [DONE]\n\n');
  res.end();
}

const server = http.createServer((req, res) => {
  let raw = '';
  req.on('data', (d) => { raw += d; });
  req.on('end', async () => {
    ++served;
    if (opts.fault === 'flaky' && served % 25 === 0) return error(res, 500, 'fake_server: a failure on purpose (--fault flaky)');
    const card = { id: opts.model, object: 'model', created: 0, owned_by: 'fake' };
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ object: 'list', data: [card] }));
    }
    if (req.method === 'GET' && req.url === `/v1/models/${encodeURIComponent(opts.model)}`) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify(card));
    }
    const chat = req.url === '/v1/chat/completions';
    if (req.method !== 'POST' || (!chat && req.url !== '/v1/completions')) return error(res, 404, `no route ${req.method} ${req.url}`);
    let body;
    try { body = JSON.parse(raw); } catch (e) { return error(res, 400, `request body: expected JSON, found invalid JSON (${e.message})`, null, 'invalid_json'); }
    await complete(req, res, body, chat);
  });
});
server.listen(Number(opts.port), '127.0.0.1', () => {
  process.stdout.write(`listening http://127.0.0.1:${server.address().port}\n`);
});
