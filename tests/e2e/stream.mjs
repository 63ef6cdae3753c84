// Streaming chat through the official openai client, with and without
// stream_options.include_usage: the role chunk first, content deltas, exactly one finish_reason,
// one id throughout, and (include_usage) the final usage chunk with "choices": [] while every
// other chunk says "usage": null.
//   node tests/e2e/stream.mjs --base-url http://127.0.0.1:8080 --model NAME [--max-tokens 16]
import { check, checkFinish, checkUsage, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { 'max-tokens': 16 });
const openai = client(args);
const maxTokens = args['max-tokens'];
const messages = [{ role: 'user', content: 'Count to five.' }];
const ms = (x) => (x === null ? null : Math.round(x * 10) / 10);

async function collect(includeUsage) {
  const where = `stream (include_usage ${includeUsage})`;
  const started = performance.now();
  const stream = await openai.chat.completions.create({
    model: args.model, messages, max_tokens: maxTokens, temperature: 0, stream: true,
    ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
  });
  const chunks = [];
  let ttftMs = null;
  for await (const chunk of stream) {
    chunks.push(chunk);
    const d = chunk.choices[0]?.delta;
    if (ttftMs === null && (d?.content || d?.reasoning_content)) ttftMs = performance.now() - started;
  }
  check(chunks.length >= 2, `${where}: expected at least a role chunk and a finish chunk`, chunks);
  for (const [i, c] of chunks.entries()) {
    check(c.object === 'chat.completion.chunk', `${where}: chunk ${i}: expected object "chat.completion.chunk"`, c.object);
    check(c.id === chunks[0].id, `${where}: chunk ${i}: expected the id of the first chunk (${chunks[0].id})`, c.id);
    check(c.model === args.model, `${where}: chunk ${i}: expected model ${JSON.stringify(args.model)}`, c.model);
  }
  check(chunks[0].choices[0]?.delta?.role === 'assistant', `${where}: expected the first delta to carry role "assistant"`, chunks[0]);

  const last = chunks.at(-1);
  if (includeUsage)
    check(Array.isArray(last.choices) && last.choices.length === 0,
          `${where}: expected the last chunk to be the usage chunk, with "choices": []`, last);
  const withChoice = includeUsage ? chunks.slice(0, -1) : chunks;
  let content = '', reasoning = '';
  const finishes = [];
  for (const [i, c] of withChoice.entries()) {
    check(c.choices.length === 1 && c.choices[0].index === 0, `${where}: chunk ${i}: expected one choice with index 0`, c.choices);
    if (includeUsage) check(c.usage === null, `${where}: chunk ${i}: expected "usage": null before the usage chunk`, c.usage);
    else check(c.usage === undefined || c.usage === null, `${where}: chunk ${i}: expected no usage without include_usage`, c.usage);
    content += c.choices[0].delta?.content ?? '';
    reasoning += c.choices[0].delta?.reasoning_content ?? '';
    if (c.choices[0].finish_reason) finishes.push(i);
  }
  check(finishes.length === 1 && finishes[0] === withChoice.length - 1,
        `${where}: expected finish_reason on the last chunk with a choice only (chunk ${withChoice.length - 1})`, finishes);
  const finish = withChoice.at(-1).choices[0].finish_reason;

  if (!includeUsage) return { chunks: chunks.length, finish_reason: finish, content, ttft_ms: ms(ttftMs) };
  checkUsage(last.usage, `${where} usage chunk`);
  checkFinish(finish, last.usage, maxTokens, where);
  return { chunks: chunks.length, finish_reason: finish, content, reasoning_content: reasoning, usage: last.usage, ttft_ms: ms(ttftMs) };
}

run(script, async () => {
  const withUsage = await collect(true);
  const without = await collect(false);
  return { with_usage: withUsage, without_usage: without };
});
