// Images in chat through the official openai client (a model with a vision tower): a user message
// with an image_url part (a data: URL of the PNG or JPEG given) gets an answer whose usage counts
// the image's tokens; the same request again has them cached (the image comes first, so the
// prompt's first block holds it); an http(s) URL and a file that is no image get 400 naming what
// was expected, and the server answers the next request.
//   node tests/e2e/images.mjs --base-url http://127.0.0.1:8080 --model NAME --image FILE [--max-tokens 8]
import fs from 'node:fs';
import OpenAI from 'openai';
import { check, checkUsage, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { image: '', 'max-tokens': 8 });
const openai = client(args);
check(args.image !== '', '--image FILE: expected a PNG or JPEG file', args.image);
const bytes = fs.readFileSync(args.image);
const type = bytes[0] === 0x89 ? 'image/png' : 'image/jpeg';
const url = `data:${type};base64,${bytes.toString('base64')}`;
// Text after the image, long enough that the prompt's first cache block (64 tokens) ends before it.
const question = 'Describe this picture: its colours, its shapes, what it shows, and anything unusual about it, ' +
                 'in a few short sentences for someone who cannot see it. Mention the light and the background too.';
const ask = (imageUrl) => openai.chat.completions.create({
  model: args.model, max_tokens: args['max-tokens'], temperature: 0,
  messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: imageUrl } }, { type: 'text', text: question }] }],
  chat_template_kwargs: { thinking: false },  // dsv41's; other servers ignore it
});

async function refused(where, imageUrl, says) {
  try {
    await ask(imageUrl);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === 400, `${where}: expected HTTP 400`, e.status ?? String(e));
    check(typeof e.error?.message === 'string' && e.error.message.includes(says),
          `${where}: expected an error message that says ${JSON.stringify(says)}`, e.error);
    return e.error.message;
  }
  check(false, `${where}: expected HTTP 400`, 'a successful response');
}

run(script, async () => {
  const first = await ask(url);
  checkUsage(first.usage, 'image chat');
  check(typeof first.choices[0]?.message?.content === 'string', 'image chat: expected an answer', first.choices);
  const imageTokens = first.usage.prompt_tokens_details?.image_tokens;
  check(Number.isInteger(imageTokens) && imageTokens > 0 && imageTokens < first.usage.prompt_tokens,
        'image chat: expected usage.prompt_tokens_details.image_tokens, part of the prompt', first.usage);

  const again = await ask(url);
  checkUsage(again.usage, 'the same image again');
  check(again.usage.prompt_tokens_details.cached_tokens > imageTokens,
        `the same image again: expected more than its ${imageTokens} image tokens cached`, again.usage);

  const http = await refused('an http URL', 'https://example.com/cat.png', 'data: URL');
  const notImage = await refused('a text file', `data:image/png;base64,${Buffer.from('just some text').toString('base64')}`,
                                 'expected PNG or JPEG');
  const after = await ask(url);
  checkUsage(after.usage, 'after the refusals');
  return { image_tokens: imageTokens, cached_tokens: again.usage.prompt_tokens_details.cached_tokens, refused: [http, notImage] };
});
