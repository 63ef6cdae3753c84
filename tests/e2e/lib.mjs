// What every end-to-end script shares: its arguments, an openai client on them, and the way it
// ends (one JSON summary on stdout and exit 0, or "FAIL <script>: why" on stderr and exit 1).
import OpenAI from 'openai';
import path from 'node:path';

export class Failure extends Error {}

// Throws a Failure that says what was expected and what was found.
export function check(condition, what, found) {
  if (!condition) throw new Failure(`${what}: found ${JSON.stringify(found)}`);
}

// Arguments: --base-url URL --model NAME [--api-key KEY] plus the script's own --flags, each as
// "--flag value" or "--flag=value". DSV41_BASE_URL, DSV41_MODEL and DSV41_API_KEY stand in for
// the first three. The base URL is the server's root or its /v1; requests go to <root>/v1.
export function parseArgs(script, own = {}, argv = process.argv.slice(2)) {
  const known = { 'base-url': process.env.DSV41_BASE_URL, model: process.env.DSV41_MODEL,
                  'api-key': process.env.DSV41_API_KEY, ...own };
  const usage = `usage: node ${script} --base-url URL --model NAME [--api-key KEY]` +
      Object.entries(own).map(([k, v]) => ` [--${k} ${v}]`).join('');
  const values = { ...known };
  for (let i = 0; i < argv.length; ++i) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m || !(m[1] in known)) exitFailure(script, `unknown argument ${JSON.stringify(argv[i])}\n${usage}`);
    const value = m[2] ?? argv[++i];
    if (value === undefined) exitFailure(script, `--${m[1]} needs a value\n${usage}`);
    values[m[1]] = value;
  }
  for (const required of ['base-url', 'model'])
    if (!values[required]) exitFailure(script, `--${required} is required (or DSV41_${required.replace('-', '_').toUpperCase()})\n${usage}`);
  for (const [k, v] of Object.entries(own))
    if (typeof v === 'number') {
      const n = Number(values[k]);
      if (!Number.isFinite(n) || n < 0) exitFailure(script, `--${k}: expected a number >= 0, found ${JSON.stringify(values[k])}`);
      values[k] = n;
    }
  const root = values['base-url'].replace(/\/+$/, '').replace(/\/v1$/, '');
  return { ...values, root, baseURL: `${root}/v1` };
}

export function client(args, options = {}) {
  // No retries: a retried failure would hide exactly what these tests look for.
  return new OpenAI({ baseURL: args.baseURL, apiKey: args['api-key'] || 'none', maxRetries: 0, ...options });
}

export function exitFailure(script, message) {
  process.stderr.write(`FAIL ${path.basename(script)}: ${message}\n`);
  process.exit(1);
}

// A failed check says itself; a refused request says its status and body; anything else (a
// connection error, a bug in the script) says its cause and where it was thrown.
export function describeError(e) {
  if (e instanceof Failure) return e.message;
  if (e instanceof OpenAI.APIError && e.status) return `unexpected HTTP ${e.status}: ${JSON.stringify(e.error ?? e.message)}`;
  let text = String(e?.message ?? e);
  for (let c = e?.cause; c; c = c.cause) text += ` <- ${c.message ?? c}`;
  return `${text}\n${e?.stack ?? ''}`;
}

// Runs main(); prints its summary as JSON and exits 0, or reports the failure and exits 1.
export async function run(script, main) {
  try {
    const summary = await main();
    process.stdout.write(JSON.stringify({ script: path.basename(script), ok: true, ...summary }) + '\n');
  } catch (e) {
    exitFailure(script, describeError(e));
  }
}

// The usage object every response and final chunk carries.
export function checkUsage(usage, where) {
  check(usage && typeof usage === 'object', `${where}: expected a usage object`, usage);
  for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
    check(Number.isInteger(usage[k]) && usage[k] >= 0, `${where}: expected usage.${k} to be an integer >= 0`, usage[k]);
  check(usage.prompt_tokens > 0, `${where}: expected usage.prompt_tokens > 0`, usage.prompt_tokens);
  check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
        `${where}: expected usage.total_tokens = prompt_tokens + completion_tokens`, usage);
  const cached = usage.prompt_tokens_details?.cached_tokens;
  check(Number.isInteger(cached) && cached >= 0 && cached <= usage.prompt_tokens,
        `${where}: expected usage.prompt_tokens_details.cached_tokens in [0, prompt_tokens]`, usage);
  // dsv41's: of the cached tokens, those rerun to rebuild sliding-window KV (other servers leave it out).
  const replayed = usage.prompt_tokens_details?.replayed_tokens;
  check(replayed === undefined || (Number.isInteger(replayed) && replayed >= 0 && replayed <= cached),
        `${where}: expected usage.prompt_tokens_details.replayed_tokens, if sent, in [0, cached_tokens]`, usage);
}

// finish_reason and max_tokens agree: "length" means exactly max_tokens were generated.
export function checkFinish(finish, usage, maxTokens, where) {
  check(['stop', 'length'].includes(finish), `${where}: expected finish_reason "stop" or "length"`, finish);
  check(usage.completion_tokens <= maxTokens, `${where}: expected completion_tokens <= max_tokens (${maxTokens})`, usage);
  if (finish === 'length')
    check(usage.completion_tokens === maxTokens,
          `${where}: expected completion_tokens = max_tokens (${maxTokens}) with finish_reason "length"`, usage);
}

// Nearest-rank percentile of numbers (null when there are none).
export function percentile(values, p) {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}
