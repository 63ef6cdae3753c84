// SSE framing at the byte level (what the openai client's parser forgives): the content type,
// every event a single "data: <json>" line followed by a blank line, and "data: [DONE]" last.
//   node tests/e2e/sse.mjs --base-url http://127.0.0.1:8080 --model NAME [--max-tokens 8]
import { check, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script, { 'max-tokens': 8 });
const headers = { 'content-type': 'application/json', authorization: `Bearer ${args['api-key'] || 'none'}` };

async function framing(endpoint, body) {
  const where = `${endpoint}`;
  const r = await fetch(`${args.baseURL}/${endpoint}`, { method: 'POST', headers, body: JSON.stringify(body) });
  const text = await r.text();
  check(r.status === 200, `${where}: expected HTTP 200`, `${r.status} ${text}`);
  check((r.headers.get('content-type') ?? '').startsWith('text/event-stream'),
        `${where}: expected content-type text/event-stream`, r.headers.get('content-type'));
  check(text.endsWith('data: [DONE]\n\n'), `${where}: expected the stream to end with "data: [DONE]\\n\\n"`, text.slice(-40));
  // Events are separated by one blank line; none is empty, none has more than one line. A
  // comment line (": keep-alive", sent in a long silence) is an event the SSE spec ignores.
  const events = text.slice(0, -2).split('\n\n').filter((e) => !/^: [^\n\r]*$/.test(e));
  for (const [i, e] of events.entries()) {
    check(e.startsWith('data: ') && !e.includes('\n') && !e.includes('\r'),
          `${where}: event ${i}: expected one line "data: ..."`, e);
    if (i === events.length - 1) break;
    try { JSON.parse(e.slice(6)); } catch { check(false, `${where}: event ${i}: expected JSON after "data: "`, e); }
  }
  const last = JSON.parse(events.at(-2).slice(6));
  check(Array.isArray(last.choices) && last.choices.length === 0 && last.usage,
        `${where}: expected the event before [DONE] to be the usage chunk`, last);
  return events.length;
}

run(script, async () => {
  const stream = { stream: true, stream_options: { include_usage: true }, max_tokens: args['max-tokens'], temperature: 0 };
  const chat = await framing('chat/completions', { model: args.model, messages: [{ role: 'user', content: 'Two\nlines.' }], ...stream });
  const completions = await framing('completions', { model: args.model, prompt: 'Line one\nline two', ...stream });
  return { chat_events: chat, completions_events: completions };
});
