// Several choices per request (`n`) through the official openai client: n = 3 returns three
// choices with indexes 0, 1, 2; greedy ones are the n = 1 reply three times, and the usage counts
// the prompt once and every choice's tokens; a seeded sampled request gives the same choices
// streamed and not (each stream chunk carrying its choice's index, each choice one finish_reason),
// and its choices are not all one text.
//   node tests/e2e/choices.mjs --base-url http://127.0.0.1:8080 --model NAME [--max-tokens 8]
import { check, checkUsage, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { 'max-tokens': 8 });
const openai = client(args);
const maxTokens = args['max-tokens'];
const messages = [{ role: 'user', content: 'Name a colour.' }];
const noThinking = { chat_template_kwargs: { thinking: false } };  // dsv41's; other servers ignore it

function checkIndexes(choices, n, where) {
  check(Array.isArray(choices) && choices.length === n, `${where}: expected ${n} choices`, choices);
  choices.forEach((c, i) => check(c.index === i, `${where}: expected choice ${i} to have index ${i}`, c.index));
}

// A stream's chunks gathered per choice index: the text, the finish_reason (exactly one each),
// and the usage chunk.
async function gather(stream, n, chat, where) {
  const texts = Array(n).fill(''), finishes = Array(n).fill(null), roles = Array(n).fill(0);
  let usage = null;
  for await (const c of stream) {
    if (c.choices.length === 0) { usage = c.usage; continue; }
    check(usage === null, `${where}: expected the usage chunk to be the last`, c);
    for (const ch of c.choices) {
      check(Number.isInteger(ch.index) && ch.index >= 0 && ch.index < n, `${where}: expected a choice index in [0, ${n})`, ch.index);
      check(finishes[ch.index] === null, `${where}: expected nothing of choice ${ch.index} after its finish_reason`, c);
      if (chat && ch.delta?.role === 'assistant') roles[ch.index] += 1;
      texts[ch.index] += chat ? ch.delta?.content ?? '' : ch.text ?? '';
      if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
    }
  }
  finishes.forEach((f, i) => check(f === 'stop' || f === 'length', `${where}: expected a finish_reason for choice ${i}`, finishes));
  if (chat) roles.forEach((r, i) => check(r === 1, `${where}: expected one role delta for choice ${i}`, roles));
  return { texts, finishes, usage };
}

run(script, async () => {
  // Greedy: three times the one reply; the prompt counted once.
  const one = await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0, ...noThinking });
  const three = await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0, n: 3, ...noThinking });
  checkIndexes(three.choices, 3, 'greedy chat n=3');
  for (const c of three.choices) {
    check(c.message.content === one.choices[0].message.content,
          `greedy chat n=3: expected choice ${c.index} to be the n=1 reply ${JSON.stringify(one.choices[0].message.content)}`, c.message.content);
    check(c.finish_reason === one.choices[0].finish_reason, `greedy chat n=3: expected choice ${c.index} to finish as n=1`, c.finish_reason);
  }
  checkUsage(three.usage, 'greedy chat n=3');
  check(three.usage.prompt_tokens === one.usage.prompt_tokens, `greedy chat n=3: expected the prompt counted once (${one.usage.prompt_tokens})`, three.usage);
  check(three.usage.completion_tokens === 3 * one.usage.completion_tokens,
        `greedy chat n=3: expected completion_tokens 3 x ${one.usage.completion_tokens}`, three.usage);

  // Seeded sampling, completions: streamed and not, the same choices.
  const request = { model: args.model, prompt: 'Once upon a time', max_tokens: maxTokens, temperature: 1, seed: 7, n: 3 };
  const plain = await openai.completions.create(request);
  checkIndexes(plain.choices, 3, 'seeded completions n=3');
  checkUsage(plain.usage, 'seeded completions n=3');
  const streamed = await gather(await openai.completions.create({ ...request, stream: true, stream_options: { include_usage: true } }),
                                3, false, 'seeded completions n=3 stream');
  plain.choices.forEach((c, i) => {
    check(streamed.texts[i] === c.text, `seeded completions n=3: expected stream choice ${i} to be the plain one ${JSON.stringify(c.text)}`, streamed.texts[i]);
    check(streamed.finishes[i] === c.finish_reason, `seeded completions n=3: expected stream choice ${i} to finish as the plain one`, streamed.finishes[i]);
  });
  checkUsage(streamed.usage, 'seeded completions n=3 stream usage chunk');
  check(streamed.usage.completion_tokens === plain.usage.completion_tokens && streamed.usage.prompt_tokens === plain.usage.prompt_tokens,
        'seeded completions n=3: expected the stream usage to be the plain one', [streamed.usage, plain.usage]);
  check(new Set(plain.choices.map((c) => c.text)).size > 1, 'seeded completions n=3: expected the sampled choices not to be all one text',
        plain.choices.map((c) => c.text));

  // A streamed chat of two choices: one role delta and one finish per index.
  const chat = await gather(await openai.chat.completions.create({ model: args.model, messages, max_tokens: maxTokens, temperature: 0, n: 2,
                                                                   stream: true, stream_options: { include_usage: true }, ...noThinking }),
                            2, true, 'greedy chat n=2 stream');
  chat.texts.forEach((t, i) => check(t === one.choices[0].message.content, `greedy chat n=2 stream: expected choice ${i} to be the n=1 reply`, t));
  check(chat.usage.completion_tokens === 2 * one.usage.completion_tokens, `greedy chat n=2 stream: expected completion_tokens 2 x ${one.usage.completion_tokens}`, chat.usage);
  return { greedy: three.choices.map((c) => c.message.content), sampled: plain.choices.map((c) => c.text), usage: three.usage };
});
