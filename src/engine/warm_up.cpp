#include "engine/warm_up.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "base/error.h"

namespace dsv41 {

namespace {

// The many-row forms begin at 512 rows (Mega-mHC's row blocks, the GEMM's wide tiles); 1,536 rows
// run them and, in the default mode, leave the decoder layers their W rows of bounded replay.
constexpr int64_t kLongPrompt = 1536;
constexpr int64_t kShortPrompt = 80;
constexpr int64_t kOutputTokens = 4;

// Ids spread over the vocabulary by a fixed stride: what they are does not matter, only that they
// are valid and route to many experts.
std::vector<int> prompt_ids(int64_t n, int64_t vocab, int64_t offset) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int((offset + i * 7919) % vocab);
  return ids;
}

}  // namespace

WarmUpResult warm_up(Executor& executor, const Tokenizer* tokenizer, Mode mode, SchedulerOptions options) {
  const auto start = std::chrono::steady_clock::now();
  const Config& c = executor.model().config();
  const int64_t vocab = sampling_vocab(c, tokenizer);
  options.speculative = false;
  options.max_queued = std::max(options.max_queued, 1);
  options.max_idle = 0;
  options.kv_budget_bytes = 0;  // its few thousand tokens' KV, gone with it: a small budget is no reason to fail
  Scheduler scheduler(executor, tokenizer, mode, /*cache=*/nullptr, options);

  const int64_t room = c.max_seq_len - kOutputTokens;
  GenerationRequest greedy, sampled;
  greedy.prompt = prompt_ids(std::min(kLongPrompt, room), vocab, 1);
  sampled.prompt = prompt_ids(std::min(kShortPrompt, room), vocab, 2);
  greedy.max_tokens = sampled.max_tokens = kOutputTokens;
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 40;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 1;
  sampled.seeded = true;
  sampled.top_logprobs = 2;

  // One after the other: together they would be one call of both prompts' rows, and a turn's few
  // rows alone take other kernels' forms than a long prompt's many.
  WarmUpResult result;
  for (const GenerationRequest* r : {&greedy, &sampled}) {
    result.prompt_tokens += int64_t(r->prompt.size());
    const std::shared_ptr<Generation> g = scheduler.submit(*r);
    if (!g) fail("warm-up", "its request queued", "a refusal");
    for (;;) {
      const GenerationEvent e = g->next();
      if (e.kind == GenerationEvent::Kind::Token) result.output_tokens += 1;
      if (e.kind != GenerationEvent::Kind::Finished) continue;
      if (e.finish == FinishKind::Error) fail("warm-up", "its requests served", "an error: " + e.error);
      break;
    }
    result.requests += 1;
  }
  scheduler.stop();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace dsv41
