// Refused requests through the official openai client (and one raw request the client cannot
// send): each gets the right status and an OpenAI error body, and the server keeps serving.
//   node tests/e2e/errors.mjs --base-url http://127.0.0.1:8080 --model NAME
import OpenAI from 'openai';
import { check, client, parseArgs, run } from './lib.mjs';

const script = process.argv[1];
const args = parseArgs(script);
const openai = client(args);
const messages = [{ role: 'user', content: 'hi' }];

function checkErrorBody(error, where, status, param) {
  check(error && typeof error.message === 'string' && error.message.length > 0, `${where}: expected error.message`, error);
  check(error.type === 'invalid_request_error', `${where}: expected error.type "invalid_request_error"`, error);
  check(error.param === param, `${where}: expected error.param ${JSON.stringify(param)}`, error);
  check('code' in error, `${where}: expected an error.code field`, error);
}

// The request must fail with an APIError of this status; returns the error body.
async function refused(where, status, param, request) {
  try {
    await request();
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${where}: expected an OpenAI.APIError`, String(e));
    check(e.status === status, `${where}: expected HTTP ${status}`, e.status);
    checkErrorBody(e.error, where, status, param);
    return { status: e.status, ...e.error };
  }
  check(false, `${where}: expected HTTP ${status}`, 'a successful response');
}

run(script, async () => {
  const cases = {};
  cases.n0 = await refused('n = 0', 400, 'n', () =>
    openai.chat.completions.create({ model: args.model, messages, n: 0, max_tokens: 4 }));
  cases.unknown_model = await refused('unknown model', 404, 'model', () =>
    openai.chat.completions.create({ model: `${args.model}-no-such-model`, messages, max_tokens: 4 }));
  cases.temperature = await refused('temperature 5', 400, 'temperature', () =>
    openai.chat.completions.create({ model: args.model, messages, temperature: 5, max_tokens: 4 }));
  cases.completions_batch = await refused('a batch of two prompts', 400, 'prompt', () =>
    openai.completions.create({ model: args.model, prompt: ['a', 'b'], max_tokens: 4 }));

  // Invalid JSON: the client always sends valid JSON, so this one goes by hand.
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${args['api-key'] || 'none'}` };
  const raw = await fetch(`${args.baseURL}/chat/completions`, { method: 'POST', headers, body: '{"model": ' });
  const text = await raw.text();
  check(raw.status === 400, 'invalid JSON: expected HTTP 400', `${raw.status} ${text}`);
  let body;
  try { body = JSON.parse(text); } catch { check(false, 'invalid JSON: expected a JSON error body', text); }
  checkErrorBody(body.error, 'invalid JSON', 400, null);
  cases.invalid_json = { status: raw.status, ...body.error };

  // After all that, the server still answers.
  const ok = await openai.chat.completions.create({ model: args.model, messages, max_tokens: 4 });
  check(ok.choices?.length === 1, 'after the errors: expected a normal completion', ok);
  return { cases, still_serving: true };
});
