// /v1/completions through the official openai client: a text prompt, a token-id prompt, logprobs
// (tokens, token_logprobs, top_logprobs, text_offset), echo with logprobs (the prompt's tokens
// first, the first one unscored), and a stream with include_usage.
//   node tests/e2e/completions.mjs --base-url http://127.0.0.1:8080 --model NAME [--max-tokens 8]
import { check, checkFinish, checkUsage, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { 'max-tokens': 8 });
const openai = client(args);
const maxTokens = args['max-tokens'];

function checkCompletion(r, where) {
  check(r.object === 'text_completion', `${where}: expected object "text_completion"`, r.object);
  check(typeof r.id === 'string' && r.id.length > 0, `${where}: expected a non-empty id`, r.id);
  check(r.model === args.model, `${where}: expected model ${JSON.stringify(args.model)}`, r.model);
  check(r.choices?.length === 1 && r.choices[0].index === 0, `${where}: expected one choice with index 0`, r.choices);
  check(typeof r.choices[0].text === 'string', `${where}: expected choices[0].text to be a string`, r.choices[0].text);
  checkUsage(r.usage, where);
  checkFinish(r.choices[0].finish_reason, r.usage, maxTokens, where);
}

run(script, async () => {
  const text = await openai.completions.create({ model: args.model, prompt: 'Once upon a time', max_tokens: maxTokens, temperature: 0 });
  checkCompletion(text, 'text prompt');

  const ids = [100, 200, 300, 400];
  const tokens = await openai.completions.create({ model: args.model, prompt: ids, max_tokens: maxTokens, temperature: 0 });
  checkCompletion(tokens, 'token-id prompt');
  check(tokens.usage.prompt_tokens === ids.length, `token-id prompt: expected prompt_tokens = ${ids.length}`, tokens.usage);

  const top = 2;
  const lp = await openai.completions.create({ model: args.model, prompt: 'Once upon a time', max_tokens: maxTokens,
                                               temperature: 0, logprobs: top });
  checkCompletion(lp, 'logprobs');
  const l = lp.choices[0].logprobs;
  const n = lp.usage.completion_tokens;
  for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
    check(Array.isArray(l?.[k]) && l[k].length === n, `logprobs: expected ${k} to hold one entry per completion token (${n})`, l);
  check(l.token_logprobs.every((x) => typeof x === 'number' && x <= 0), 'logprobs: expected token_logprobs <= 0', l.token_logprobs);
  check(l.top_logprobs.every((t) => Object.keys(t).length <= top && Object.keys(t).length > 0),
        `logprobs: expected 1..${top} alternatives per position`, l.top_logprobs);
  check(l.text_offset.every((x, i) => Number.isInteger(x) && (i === 0 ? x === 0 : x >= l.text_offset[i - 1])),
        'logprobs: expected text_offset to start at 0 and never decrease', l.text_offset);

  const echoed = await openai.completions.create({ model: args.model, prompt: 'Once upon a time', max_tokens: maxTokens,
                                                   temperature: 0, echo: true, logprobs: 1 });
  checkCompletion(echoed, 'echo with logprobs');
  check(echoed.choices[0].text.startsWith('Once upon a time'), 'echo with logprobs: expected the text to start with the prompt',
        echoed.choices[0].text);
  const e = echoed.choices[0].logprobs;
  const listed = echoed.usage.prompt_tokens + echoed.usage.completion_tokens;
  for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
    check(Array.isArray(e?.[k]) && e[k].length === listed,
          `echo with logprobs: expected ${k} to hold one entry per prompt and completion token (${listed})`, e);
  check(e.token_logprobs[0] === null && e.top_logprobs[0] === null,
        'echo with logprobs: expected the first prompt token unscored (null logprob and top_logprobs)', [e.tokens[0], e.token_logprobs[0], e.top_logprobs[0]]);
  check(e.token_logprobs.slice(1).every((x) => typeof x === 'number' && x <= 0), 'echo with logprobs: expected the other logprobs <= 0',
        e.token_logprobs);
  check(e.top_logprobs.slice(1).every((t) => Object.keys(t).length === 1), 'echo with logprobs: expected 1 alternative per scored token',
        e.top_logprobs);

  const stream = await openai.completions.create({ model: args.model, prompt: 'Once upon a time', max_tokens: maxTokens,
                                                   temperature: 0, stream: true, stream_options: { include_usage: true } });
  let streamed = '', finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    ++chunks;
    check(c.object === 'text_completion', 'stream: expected object "text_completion"', c.object);
    if (c.choices.length === 0) { usage = c.usage; continue; }
    check(usage === null, 'stream: expected the usage chunk to be the last', c);
    streamed += c.choices[0].text;
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  checkUsage(usage, 'stream usage chunk');
  checkFinish(finish, usage, maxTokens, 'stream');
  return { text: text.choices[0].text, usage: text.usage, token_prompt_usage: tokens.usage,
           logprob_tokens: l.tokens.length, echoed_logprobs: e.token_logprobs.length, stream: { chunks, text: streamed, finish_reason: finish, usage } };
});
