// dsv41 data build --out DIR [--sources a,b] [--vocab N] [--validation-fraction F]
//                  [--near-duplicate-fraction F] [--chat] [--threads T] [--json]
//
// The training data of issue 19 (docs/training-data.md): the corpus from installed packages,
// cleaned, deduplicated and split; the byte-level BPE tokenizer trained on its train split; both
// splits packed as token files. A progress bar on stderr when it is a terminal; a summary on
// stdout (with --json, summary.json's text).
#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "train/data/data_build.h"

namespace dsv41::cli {

namespace {

void print_summary(const train::DataBuildSummary& s, const std::string& dir) {
  fmt::print("{:<8} {:>8} {:>11} {:>6} {:>7} {:>6} {:>8} {:>11} {:>8} {:>10}\n", "source", "docs", "bytes", "empty",
             "exact", "near", "train", "bytes", "valid.", "bytes");
  for (const train::SourceStats& x : s.sources)
    fmt::print("{:<8} {:>8} {:>11} {:>6} {:>7} {:>6} {:>8} {:>11} {:>8} {:>10}\n", x.name, x.documents, x.bytes, x.empty,
               x.exact_duplicates, x.near_duplicates, x.kept_documents[0], x.kept_bytes[0], x.kept_documents[1],
               x.kept_bytes[1]);
  for (auto [name, p] : {std::pair{"train", s.train}, {"validation", s.validation}}) {
    const int64_t text_tokens = p.tokens - 2 * p.documents;
    fmt::print("{:<10} {} documents, {} bytes, {} tokens ({} of text: {:.3f} bytes/token)\n", name, p.documents, p.bytes,
               p.tokens, text_tokens, text_tokens > 0 ? double(p.bytes) / double(text_tokens) : 0.0);
  }
  fmt::print("tokenizer: {} tokens ({} distinct words in train)\n", s.vocab_size, s.words);
  fmt::print("time: corpus {:.1f} s, tokenizer {:.1f} s, packing {:.1f} s\n", s.seconds_corpus, s.seconds_tokenizer,
             s.seconds_packing);
  fmt::print("wrote {}: train.jsonl validation.jsonl tokenizer.json tokenizer_config.json train.tokens validation.tokens "
             "summary.json NOTICE\n",
             dir);
}

}  // namespace

void add_data(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Training data: corpus, tokenizer, packed tokens");
  data->require_subcommand(1);

  struct Args {
    train::DataBuildOptions options;
    bool as_json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = data->add_subcommand(
      "build", "Build the corpus from installed packages, train the BPE tokenizer, pack both splits (docs/training-data.md)");
  cmd->add_option("--out", args->options.out_dir, "Directory to write (created if missing; its files replaced)")->required();
  cmd->add_option("--sources", args->options.sources, "Sources to use, comma-separated (default: all of kjv, austen, jargon, devil, wordnet)")
      ->delimiter(',')
      ->default_str("");
  cmd->add_option("--vocab", args->options.vocab_size, "Vocabulary size, the 9 added tokens included")
      ->check(CLI::Range(size_t(265), size_t(1) << 20));
  cmd->add_option("--validation-fraction", args->options.corpus.validation_fraction,
                  "Share of documents in the validation split (by a hash of each document's identity)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--near-duplicate-fraction", args->options.corpus.near_duplicate_fraction,
                  "A document whose lines were seen before make up this share of its text is dropped")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--chat", args->options.chat,
                "Add chat documents: question-and-answer turns from the dictionaries, in the served chat format");
  cmd->add_option("--threads", args->options.threads, "Threads that tokenize")->check(CLI::Range(1, 256));
  cmd->add_flag("--json", args->as_json, "Print summary.json instead of the table");
  cmd->callback([args] {
    Progress progress;
    const train::DataBuildSummary summary = train::build_data(args->options, [&](const train::BuildProgress& p) {
      progress.update(fmt::format("{:<22}", p.stage), int64_t(p.done), int64_t(p.total));
    });
    progress.clear();
    if (args->as_json) fmt::print("{}", train::summary_json(summary));
    else print_summary(summary, args->options.out_dir);
  });
}

}  // namespace dsv41::cli
