// The chat page (src/server/web/chat.html) in headless Chromium against a running `dsv41 serve`
// whose API key is set: the page asks for the key, shows the model, streams two answers (the
// second's prompt cached), a reply's reasoning folded apart from its answer, and a reply stopped
// mid-stream. Prints one JSON summary and exits 0, or "FAIL chat_page.mjs: why" and exits 1.
//
//   node tests/web/chat_page.mjs --base-url http://127.0.0.1:8080 --model M --api-key K
//        [--chromium chromium] [--screenshot docs/web-chat.png]
//
// Chromium is driven by the DevTools protocol over --remote-debugging-pipe (JSON messages ended by
// a NUL byte on file descriptors 3 and 4): a few dozen lines here instead of puppeteer and its
// npm tree, and no port to find.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const script = path.basename(process.argv[1]);
class Failure extends Error {}
function fail(message) {
  throw new Failure(message);
}
function exitFailure(message) {
  process.stderr.write(`FAIL ${script}: ${message}\n`);
  process.exit(1);
}

const args = { 'base-url': null, model: null, 'api-key': null, chromium: process.env.CHROMIUM || 'chromium', screenshot: null };
for (let i = 2; i < process.argv.length; ++i) {
  const m = /^--([a-z-]+)(?:=(.*))?$/.exec(process.argv[i]);
  if (!m || !(m[1] in args)) exitFailure(`unknown argument ${JSON.stringify(process.argv[i])}`);
  args[m[1]] = m[2] ?? process.argv[++i];
}
for (const required of ['base-url', 'model', 'api-key']) if (!args[required]) exitFailure(`--${required} is required`);

// ---- a minimal DevTools-protocol client ------------------------------------------------------
class Browser {
  constructor() {
    this.profile = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv41-chromium-'));
    // Chromium refuses to run as root with its sandbox on (CI runs as root).
    const sandbox = process.getuid?.() === 0 ? ['--no-sandbox'] : [];
    this.proc = spawn(args.chromium, ['--headless=new', '--remote-debugging-pipe', ...sandbox, '--disable-gpu',
                                      '--no-first-run', '--no-default-browser-check', '--hide-scrollbars',
                                      `--user-data-dir=${this.profile}`, 'about:blank'],
                      { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'], detached: true });
    // Chromium's helpers (zygote, network and storage services) share its process group, led by
    // the browser (detached): close() and an early exit end them all at once.
    this.killGroup = () => { try { process.kill(-this.proc.pid, 'SIGKILL'); } catch {} };
    process.on('exit', this.killGroup);
    this.stderr = '';
    this.proc.stderr.on('data', (d) => { this.stderr = (this.stderr + d).slice(-4000); });
    this.exited = new Promise((resolve) => this.proc.on('exit', resolve));
    this.proc.on('error', (e) => {
      fs.rmSync(this.profile, { recursive: true, force: true });
      exitFailure(`could not start ${args.chromium} (${e.message}); scripts/setup.sh installs Debian's chromium`);
    });
    this.nextId = 1;
    this.pending = new Map();
    let buffer = Buffer.alloc(0);
    this.proc.stdio[4].on('data', (chunk) => {
      buffer = Buffer.concat([buffer, chunk]);
      for (let end; (end = buffer.indexOf(0)) >= 0; buffer = buffer.subarray(end + 1)) {
        const message = JSON.parse(buffer.subarray(0, end).toString());
        const waiter = this.pending.get(message.id);
        if (!waiter) continue;  // an event: nothing here listens to any
        this.pending.delete(message.id);
        if (message.error) waiter.reject(new Error(`${waiter.method}: ${message.error.message}`));
        else waiter.resolve(message.result);
      }
    });
    this.exited.then((code) => {
      for (const w of this.pending.values()) w.reject(new Error(`chromium exited (${code}): ${this.stderr}`));
    });
  }
  send(method, params = {}, sessionId = this.session) {
    const id = this.nextId++;
    this.proc.stdio[3].write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + '\0');
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, method }));
  }
  async open(url) {
    const { targetId } = await this.send('Target.createTarget', { url: 'about:blank' });
    this.session = (await this.send('Target.attachToTarget', { targetId, flatten: true })).sessionId;
    await this.send('Emulation.setDeviceMetricsOverride', { width: 1000, height: 820, deviceScaleFactor: 1, mobile: false });
    await this.send('Page.navigate', { url });
  }
  async evaluate(expression) {
    const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value;
  }
  // Polls `expression` until it is truthy (one that throws, as on a page still loading, is not);
  // fails saying `what` was awaited and `show`'s value.
  async waitFor(expression, what, show = expression, seconds = 60) {
    for (const until = Date.now() + seconds * 1000; Date.now() < until; await new Promise((r) => setTimeout(r, 50)))
      if (await this.evaluate(`(() => { try { return !!(${expression}); } catch { return false; } })()`)) return;
    fail(`waited ${seconds} s for ${what}: found ${JSON.stringify(await this.evaluate(show))}`);
  }
  // A real click: mouse events at the element's centre, as a user's would be.
  async click(selector) {
    const { x, y } = await this.evaluate(`(() => { const r = document.querySelector(${JSON.stringify(selector)})
        .getBoundingClientRect(); return { x: r.x + r.width / 2, y: r.y + r.height / 2 }; })()`);
    for (const type of ['mousePressed', 'mouseReleased'])
      await this.send('Input.dispatchMouseEvent', { type, x, y, button: 'left', clickCount: 1 });
  }
  // Replaces a field's text as typing would (input events), after clicking into it; '' clears it.
  async type(selector, text) {
    await this.click(selector);
    await this.evaluate(`document.querySelector(${JSON.stringify(selector)}).select()`);
    if (text) return this.send('Input.insertText', { text });
    for (const type of ['keyDown', 'keyUp'])
      await this.send('Input.dispatchKeyEvent', { type, key: 'Backspace', code: 'Backspace', windowsVirtualKeyCode: 8 });
  }
  // Browser.close asks every Chromium process to end; then the whole process group is killed: a
  // SIGTERM to the browser alone left its helpers writing to the profile's cache while it was being
  // removed (rmdir: ENOTEMPTY, a failed run after the test had passed). A helper can still be
  // flushing as it dies, so the removal lists the profile again on each of its tries.
  async close() {
    await Promise.race([this.send('Browser.close', {}, null).catch(() => {}), new Promise((r) => setTimeout(r, 3000).unref())]);
    this.killGroup();
    await this.exited;
    for (let tries = 1; ; ++tries) {
      try {
        return fs.rmSync(this.profile, { recursive: true, force: true });
      } catch (e) {
        if (tries === 50) return process.stderr.write(`${script}: left ${this.profile} behind (${e.message})\n`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }
}

// ---- the test --------------------------------------------------------------------------------
const last = `[...document.querySelectorAll('#log .turn.assistant')].at(-1)`;
const lastState = `${last}?.dataset.state`;
const turnOf = (turn) => `(() => { const t = ${turn}; return t && { state: t.dataset.state,
    answer: t.querySelector('.text').textContent, reasoning: t.querySelector('.reasoning-text').textContent,
    reasoningShown: !t.querySelector('.reasoning').hidden, reasoningOpen: t.querySelector('.reasoning').open,
    status: t.querySelector('.status').textContent }; })()`;

// Types a message, clicks Send, waits for the reply to end; returns the turn as the DOM shows it.
async function ask(b, text) {
  const turns = await b.evaluate(`document.querySelectorAll('#log .turn.assistant').length`);
  await b.type('#prompt', text);
  await b.click('#send');
  await b.waitFor(`document.querySelectorAll('#log .turn.assistant').length === ${turns + 1} && ${lastState} !== 'streaming'`,
                  `the reply to ${JSON.stringify(text)}`, turnOf(last));
  const turn = await b.evaluate(turnOf(last));
  if (turn.state !== 'done') fail(`the reply to ${JSON.stringify(text)} ended ${turn.state}: ${turn.status}`);
  return turn;
}

// "prompt P (cached C, replayed R, computed P-C) · output N" from a turn's status line.
function counts(turn) {
  const m = /^prompt (\d+) \(cached (\d+), replayed (\d+), computed (\d+)\) · output (\d+)/.exec(turn.status);
  if (!m) fail(`a status line with the token counts: found ${JSON.stringify(turn.status)}`);
  const [prompt, cached, replayed, computed, output] = m.slice(1).map(Number);
  if (prompt !== cached + computed) fail(`prompt = cached + computed: found ${turn.status}`);
  if (replayed > cached) fail(`replayed <= cached (the replayed rows are cached ones rerun): found ${turn.status}`);
  return { prompt, cached, output };
}

const b = new Browser();
try {
  await b.open(args['base-url'].replace(/\/+$/, '') + '/');

  // The server has a key: the page says so and opens its settings; the key typed in, the model shows.
  await b.waitFor(`document.getElementById('model').textContent.includes('API key needed')`, 'the page to ask for the API key',
                  `document.getElementById('model').textContent`);
  if (await b.evaluate(`document.getElementById('settings').hidden`)) fail('the settings open for the key: found them closed');
  await b.type('#api-key', args['api-key']);
  await b.click('#prompt');  // leaving the field commits the key
  await b.waitFor(`document.getElementById('model').textContent === ${JSON.stringify(args.model)}`, `the model name ${args.model}`,
                  `document.getElementById('model').textContent`);

  // Two answers without thinking, greedy: no reasoning shown, the counts shown, the second turn's
  // prompt served from the cache up to the first turn's prompt at least.
  await b.type('#temperature', '0');
  await b.type('#max-tokens', '16');
  await b.click('#thinking');
  const first = await ask(b, 'Hello! What is the sea made of?');
  if (!first.answer || first.reasoningShown) fail(`an answer and no reasoning: found ${JSON.stringify(first)}`);
  const c1 = counts(first);
  if (c1.output < 1 || c1.output > 16) fail(`output 1 to 16 tokens (max tokens 16): found ${first.status}`);
  const second = await ask(b, 'And why is it blue?');
  const c2 = counts(second);
  if (c2.cached < c1.prompt) fail(`the second turn's cached tokens cover the first prompt (${c1.prompt}): found ${second.status}`);

  // Thinking on: the reasoning streams into its own folded <details>, not into the answer.
  await b.click('#thinking');
  await b.type('#max-tokens', '8');
  const third = await ask(b, 'Think about it first.');
  if (!third.reasoningShown || !third.reasoning || third.reasoningOpen)
    fail(`the reasoning shown folded apart from the answer: found ${JSON.stringify(third)}`);
  if (third.answer.includes(third.reasoning)) fail(`the answer without the reasoning: found ${JSON.stringify(third)}`);
  counts(third);

  // Stop: a long reply cut once it has begun; the page says so and can send again.
  await b.click('#thinking');
  await b.type('#max-tokens', '');  // no limit: the reply runs until stopped
  const before = await b.evaluate(`document.querySelectorAll('#log .turn.assistant').length`);
  await b.type('#prompt', 'Tell me a very long story.');
  await b.click('#send');
  await b.waitFor(`document.querySelectorAll('#log .turn.assistant').length === ${before + 1} && ${last}.querySelector('.text').textContent`,
                  'the long reply to begin', turnOf(last));
  if (await b.evaluate(`document.getElementById('stop').disabled`)) fail('Stop enabled while a reply streams: found it disabled');
  await b.click('#stop');
  await b.waitFor(`${lastState} === 'stopped'`, 'the reply to stop', turnOf(last), 10);
  if (await b.evaluate(`document.getElementById('send').disabled`)) fail('Send enabled after Stop: found it disabled');

  if (args.screenshot) {
    await b.evaluate(`document.activeElement.blur()`);
    const { data } = await b.send('Page.captureScreenshot', { format: 'png' });
    fs.writeFileSync(args.screenshot, Buffer.from(data, 'base64'));
  }
  process.stdout.write(JSON.stringify({ script, ok: true, first: c1, second: c2, reasoning_chars: third.reasoning.length }) + '\n');
} catch (e) {
  process.exitCode = 1;
  process.stderr.write(`FAIL ${script}: ${e instanceof Failure ? e.message : `${e.message}\n${e.stack}`}\n`);
} finally {
  await b.close();
}
