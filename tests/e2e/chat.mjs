// Non-streaming chat through the official openai client: the chat.completion object, its usage
// (with prompt_tokens_details.cached_tokens), finish_reason against max_tokens, the model listed and
// retrieved by id, and logprobs.
//   node tests/e2e/chat.mjs --base-url http://127.0.0.1:8080 --model NAME [--max-tokens 16]
import { check, checkFinish, checkUsage, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { 'max-tokens': 16 });
const openai = client(args);
const maxTokens = args['max-tokens'];

run(script, async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello.' }];
  const r = await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0 });
  check(r.object === 'chat.completion', 'expected object "chat.completion"', r.object);
  check(typeof r.id === 'string' && r.id.length > 0, 'expected a non-empty id', r.id);
  check(Number.isInteger(r.created) && r.created > 0, 'expected created to be Unix seconds', r.created);
  check(r.model === args.model, `expected model ${JSON.stringify(args.model)}`, r.model);
  check(Array.isArray(r.choices) && r.choices.length === 1, 'expected exactly one choice', r.choices);
  const [c] = r.choices;
  check(c.index === 0, 'expected choices[0].index 0', c.index);
  check(c.message?.role === 'assistant', 'expected message.role "assistant"', c.message);
  check(typeof c.message.content === 'string', 'expected message.content to be a string', c.message.content);
  check(c.logprobs === null || c.logprobs === undefined, 'expected no logprobs when not asked', c.logprobs);
  checkUsage(r.usage, 'chat');
  checkFinish(c.finish_reason, r.usage, maxTokens, 'chat');

  // The model, listed and by id (models.retrieve).
  const listed = await openai.models.list();
  check(listed.data.some((m) => m.id === args.model), `expected models.list to name ${JSON.stringify(args.model)}`, listed.data);
  const card = await openai.models.retrieve(args.model);
  check(card.id === args.model && card.object === 'model', `expected models.retrieve to give ${JSON.stringify(args.model)}`, card);

  // logprobs: one entry per generated token, each with top_logprobs alternatives.
  const top = 2;
  const l = await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0,
                                                   logprobs: true, top_logprobs: top });
  const content = l.choices[0].logprobs?.content;
  checkUsage(l.usage, 'chat with logprobs');
  check(Array.isArray(content) && content.length === l.usage.completion_tokens,
        `expected logprobs.content to hold one entry per completion token (${l.usage.completion_tokens})`, content);
  for (const [i, t] of content.entries()) {
    const where = `logprobs.content[${i}]`;
    check(typeof t.token === 'string', `${where}: expected a string token`, t);
    check(typeof t.logprob === 'number' && t.logprob <= 0, `${where}: expected a logprob <= 0`, t);
    check(Array.isArray(t.bytes) && t.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256),
          `${where}: expected bytes to be an array of byte values`, t.bytes);
    check(Array.isArray(t.top_logprobs) && t.top_logprobs.length === top,
          `${where}: expected ${top} top_logprobs`, t.top_logprobs);
    // Greedy: the chosen token is the most likely one, so no alternative beats it.
    check(t.top_logprobs.every((a) => a.logprob <= t.logprob + 1e-6),
          `${where}: expected no alternative above the greedy choice`, t);
  }
  return { id: r.id, finish_reason: c.finish_reason, content: c.message.content, usage: r.usage,
           logprob_tokens: content.length };
});
