#pragma once
// A server's warm-up before it says it is ready: a few requests served to itself on a scheduler
// of its own with no KV tiers, so that what a process does once — CUDA's lazy loading of each
// kernel at its first launch, the device memory pools' growth, the host threads' start — is not
// in the time of the first requests it serves (the first turn after a restart above all: the
// agent workload's disk hit, docs/benchmarks.md). Nothing is stored in the tiers, counted in the
// server's metrics or kept on the device: the scheduler and its sequences end with the call.
#include <cstdint>

#include "engine/scheduler.h"

namespace dsv41 {

struct WarmUpResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double seconds = 0;
};

// Serves, one after the other: a prompt long enough that the encoder's layers run the prefill's
// many-row kernels while the decoder's run bounded replay's W rows, chosen greedily, then a short
// one (a turn's rows) sampled with top-k, top-p and logprobs; a few decode steps each.
// `options` are the server's scheduler's (speculation aside: a speculating scheduler measures its
// step rates, which runs its kernels, when it is made). Throws dsv41::Error if a request fails.
WarmUpResult warm_up(Executor& executor, const Tokenizer* tokenizer, Mode mode, SchedulerOptions options);

}  // namespace dsv41
