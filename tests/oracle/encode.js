// The oracle: transformers.js tokenizers (@lenml/tokenizers) encoding a corpus.
//
//   node encode.js TOKENIZER INPUT [--time]
//
// TOKENIZER is deepseek_v3, qwen3 or llama3 (the @lenml/tokenizer-* package, with its own
// tokenizer_config.json), or the path of a tokenizer.json (read with an empty config). INPUT holds one JSON string per line; for each, one JSON array of ids is
// written to stdout (special tokens added as the tokenizer's post-processor says). With --time,
// only the encode times of two passes over the whole input are printed (for docs/benchmarks.md):
// the first with the tokenizer's caches empty, the second with them filled by the first; wall
// and CPU seconds.
"use strict";
const fs = require("fs");

function load(name) {
  if (["deepseek_v3", "qwen3", "llama3"].includes(name)) {
    return require(`@lenml/tokenizer-${name}`).fromPreTrained();
  }
  const { TokenizerLoader } = require("@lenml/tokenizers");
  return TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(name, "utf8")),
    tokenizerConfig: {},
  });
}

function main() {
  const [name, input, flag] = process.argv.slice(2);
  if (!name || !input) {
    process.stderr.write("usage: node encode.js TOKENIZER INPUT [--time]\n");
    process.exit(2);
  }
  const tokenizer = load(name);
  const lines = fs.readFileSync(input, "utf8").split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  const texts = lines.map((l) => JSON.parse(l));

  if (flag === "--time") {
    const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t, "utf8"), 0);
    for (const pass of ["cold", "warm"]) {
      const start = process.hrtime.bigint();
      const cpuStart = process.cpuUsage();
      let tokens = 0;
      for (const t of texts) tokens += tokenizer.encode(t).length;
      const seconds = Number(process.hrtime.bigint() - start) / 1e9;
      const cpu = process.cpuUsage(cpuStart);
      const cpuSeconds = (cpu.user + cpu.system) / 1e6;  // the whole process, GC threads included
      process.stdout.write(
        JSON.stringify({ pass, bytes, tokens, seconds, cpu_seconds: cpuSeconds, mb_per_s: bytes / 1e6 / seconds }) + "\n"
      );
    }
    return;
  }

  // Written in blocks: one write per line would dominate the run time.
  let block = [];
  for (const t of texts) {
    block.push(JSON.stringify(tokenizer.encode(t)));
    if (block.length === 1000) {
      process.stdout.write(block.join("\n") + "\n");
      block = [];
    }
  }
  if (block.length) process.stdout.write(block.join("\n") + "\n");
}

main();
