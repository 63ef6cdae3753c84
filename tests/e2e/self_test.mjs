// Checks the e2e scripts themselves against fake_server.mjs: each passes against a server that
// behaves, and each fails (exit 1, saying why) against one that breaks what it checks. This
// tests the harness, not dsv41.
//   node tests/e2e/self_test.mjs
import { execFile, spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const model = 'fake-model';

async function withFakeServer(fault, body) {
  const server = spawn(process.execPath, [path.join(here, 'fake_server.mjs'), '--model', model,
                                          ...(fault ? ['--fault', fault] : [])], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const url = await new Promise((resolve, reject) => {
      let out = '';
      server.stdout.on('data', (d) => {
        out += d;
        const m = /listening (\S+)/.exec(out);
        if (m) resolve(m[1]);
      });
      server.on('exit', (code) => reject(new Error(`fake_server exited with ${code} before listening`)));
    });
    return await body(url);
  } finally {
    server.kill();
  }
}

function runScript(name, url, extra = []) {
  return new Promise((resolve) => {
    execFile(process.execPath, [path.join(here, name), '--base-url', url, '--model', model, ...extra],
             { timeout: 120000 }, (err, stdout, stderr) => resolve({ code: err ? err.code : 0, stdout, stderr }));
  });
}

const small = ['--clients', '8', '--requests', '10'];
const scripts = [['chat.mjs'], ['stream.mjs'], ['completions.mjs'], ['choices.mjs'], ['errors.mjs'], ['sse.mjs'], ['load.mjs', small]];
// fault -> the script that must catch it, and what its failure message must say.
const faults = [
  ['wrong-total', 'chat.mjs', 'usage.total_tokens = prompt_tokens + completion_tokens'],
  ['missing-usage', 'stream.mjs', 'usage chunk'],
  ['usage-not-null', 'stream.mjs', '"usage": null before the usage chunk'],
  ['accept-n', 'errors.mjs', 'n = 0: expected HTTP 400'],
  ['one-choice', 'choices.mjs', 'expected 3 choices'],
  ['echo-scores-first', 'completions.mjs', 'expected the first prompt token unscored'],
  ['no-done', 'sse.mjs', 'data: [DONE]'],
  ['flaky', 'load.mjs', 'requests failed', small],
];

const problems = [];
const passed = await withFakeServer('', async (url) => {
  const names = [];
  for (const [name, extra] of scripts) {
    const r = await runScript(name, url, extra);
    let summary = null;
    try { summary = JSON.parse(r.stdout); } catch { /* reported below */ }
    if (r.code !== 0 || summary?.ok !== true) problems.push(`${name} against a correct server: expected exit 0 and {"ok": true}, found exit ${r.code}: ${r.stderr || r.stdout}`);
    else names.push(name);
  }
  return names;
});
const caught = [];
for (const [fault, name, says, extra] of faults) {
  const r = await withFakeServer(fault, (url) => runScript(name, url, extra));
  if (r.code !== 1 || !r.stderr.includes(`FAIL ${name}`) || !r.stderr.includes(says))
    problems.push(`${name} against --fault ${fault}: expected exit 1 and "FAIL ${name}: ...${says}...", found exit ${r.code}: ${r.stderr || r.stdout}`);
  else caught.push(fault);
}
process.stdout.write(JSON.stringify({ script: 'self_test.mjs', ok: problems.length === 0, passed, caught, problems }) + '\n');
process.exit(problems.length === 0 ? 0 : 1);
