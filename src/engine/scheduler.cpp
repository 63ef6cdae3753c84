#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <random>
#include <span>

#include "base/error.h"
#include "model/accounting.h"

namespace dsv41 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The options with the executor's defaults where they say 0 (the prompt tokens of a step).
SchedulerOptions with_executor_defaults(SchedulerOptions options, const Executor& executor) {
  if (options.step_tokens == 0) options.step_tokens = executor.default_step_tokens();
  return options;
}

}  // namespace

uint64_t choice_seed(uint64_t seed, int choice) {
  if (choice == 0) return seed;
  // SplitMix64's finalizer over the seed stepped `choice` times by its increment.
  uint64_t z = seed + uint64_t(choice) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

GenerationEvent Generation::next() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return !events_.empty(); });
  GenerationEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::optional<GenerationEvent> Generation::next_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  GenerationEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Generation::post(GenerationEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  ready_.notify_one();
}


Scheduler::Scheduler(Executor& executor, const Tokenizer* tokenizer, Mode mode, KvCache* cache, SchedulerOptions options)
    : executor_(executor),
      mode_(mode),
      vocab_(sampling_vocab(executor.model().config(), tokenizer)),
      hasher_(engram_hasher(executor.model().config(), tokenizer)),
      cache_(cache), options_(with_executor_defaults(options, executor)), seeds_(std::random_device{}()) {
  if (options.max_running < 1 || options.max_queued < 0 || options.step_tokens < 0 || options.max_idle < 0 ||
      options.kv_budget_bytes < 0)
    fail("scheduler", "max_running >= 1, max_queued >= 0, step_tokens >= 0, max_idle >= 0, kv_budget_bytes >= 0",
         std::to_string(options.max_running) + ", " + std::to_string(options.max_queued) + ", " +
             std::to_string(options.step_tokens) + ", " + std::to_string(options.max_idle) + ", " +
             std::to_string(options.kv_budget_bytes));
  if (options.speculative) {
    const Config& c = executor.model().config();
    if (!c.has_dspark()) fail(c.source, "a model with DSpark stages for speculative decoding", "none");
    if (!executor.speculates())
      fail(executor.name() + " executor", "speculative decoding (DSpark) on an executor that has it (cpu, cuda)", executor.name());
    SurvivalEstimate(c.dspark_block_size, options.drafting);  // a policy it refuses, refused now
    // The profile at passes of 1, 2, 4, ... rows up to a full step's verification, after a context
    // past the window (a verification's attention reads a full window).
    if (options.step_rate) {
      step_rate_ = options.step_rate;
    } else {
      std::vector<int64_t> rows;
      const int64_t most = int64_t(c.dspark_block_size + 1) * options.max_running;
      for (int64_t n = 1; n < 2 * most && n <= 256; n *= 2) rows.push_back(n);
      step_rate_ = measure_step_rate(executor, rows, 2 * int64_t(c.window_size));
    }
    // The decode path's and the drafter's at 1, 2, 4, ... sequences up to the batch, after a
    // context past the window (the drafter's: a full drafter window).
    std::vector<int64_t> sequences;
    for (int64_t n = 1; n < 2 * int64_t(options.max_running) && n <= 256; n *= 2) sequences.push_back(n);
    if (options.plain_rate) plain_rate_ = options.plain_rate;
    else plain_rate_ = measure_plain_rate(executor, sequences, 2 * int64_t(c.window_size));
    if (options.draft_rate) draft_rate_ = options.draft_rate;
    else draft_rate_ = measure_draft_rate(executor, sequences, int64_t(c.window_size));
  }
  const Accounting::Kv kv = account(executor.model().config(), 1).kv;
  global_bytes_per_token_ = kv.global_bytes_per_token;
  window_bytes_ = kv.swa_bytes_per_sequence;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Generation> Scheduler::submit(GenerationRequest request) {
  const Config& c = executor_.model().config();
  if (request.prompt.empty()) fail("request", "at least one prompt token", "none");
  check_images(request.prompt, request.images, c);
  if (!request.images.empty() && !executor_.takes_images())
    fail(executor_.name() + " executor", "an executor with the vision tower for images (the CPU and CUDA executors)",
         "a request with images");
  // (An image span's image_token_id may lie past the tokenizer's ids: DeepSeek's V3 tokenizer has none.)
  for (int t : text_tokens(request.prompt, request.images))
    if (t < 0 || t >= vocab_) fail("request", "token ids in [0, " + std::to_string(vocab_) + ")", std::to_string(t));
  if (request.max_tokens < 1) fail("request", "max_tokens >= 1", std::to_string(request.max_tokens));
  if (request.n < 1 || request.n > options_.max_running)
    fail("request", "n in [1, " + std::to_string(options_.max_running) + "] (the choices run in one batch)", std::to_string(request.n));
  if (int64_t(request.prompt.size()) + request.max_tokens > c.max_seq_len)
    fail("request", "prompt + max_tokens within the context of " + std::to_string(c.max_seq_len) + " tokens",
         std::to_string(request.prompt.size()) + " + " + std::to_string(request.max_tokens));
  auto generation = std::make_shared<Generation>(std::move(request));
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || int64_t(queue_.size()) >= options_.max_queued) {
      stats_.refused += 1;
      return nullptr;
    }
    queue_.push_back(generation);
    stats_.requests += 1;
    stats_.queued = int64_t(queue_.size());
  }
  wake_.notify_one();
  return generation;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      const bool busy = !running_.empty() || !preempted_.empty();
      wake_.wait(lock, [&] { return stopping_ || busy || !queue_.empty(); });
      if (stopping_) break;
    }
    // No exception leaves this thread (it would end the process): one that escapes a step's
    // own handling fails the requests running, and the loop serves the next ones.
    try {
      admit();
      step();
    } catch (const std::exception& e) {
      for (Running& r : running_) finish(r, FinishKind::Error, e.what());
      running_.clear();
      publish();
    }
  }
  // Shutting down: every waiter hears that its request ended.
  for (Running& r : running_) post_finished(r, FinishKind::Cancelled);
  for (Running& r : preempted_) post_finished(r, FinishKind::Cancelled);
  std::lock_guard lock(mutex_);
  for (auto& g : queue_)
    for (int k = 0; k < g->request.n; ++k) g->post({GenerationEvent::Kind::Finished, {}, {}, FinishKind::Cancelled, {}, k});
}

void Scheduler::post_finished(const Running& r, FinishKind kind, const std::string& error) {
  r.generation->post({GenerationEvent::Kind::Finished, {}, {}, kind, error, r.choice});
  if (r.forks)
    for (int k = 1; k < r.generation->request.n; ++k) r.generation->post({GenerationEvent::Kind::Finished, {}, {}, kind, error, k});
}

Sampler Scheduler::sampler(const GenerationRequest& request, uint64_t seed) const {
  SamplingParams params = request.sampling;
  params.seed = seed;
  Sampler s(params, vocab_);
  s.start_reply(text_tokens(request.prompt, request.images));  // penalties count text, not image spans
  if (request.grammar)
    s.constrain(std::make_shared<grammar::GrammarConstraint>(request.grammar, request.max_tokens, request.grammar_after));
  return s;
}

void Scheduler::fork(Running& r) {
  r.forks = false;
  const GenerationRequest& req = r.generation->request;
  for (int k = 1; k < req.n; ++k) {
    // (Prefilled: the request's one Prefilled event was choice 0's.)
    running_.push_back(Running{.generation = r.generation, .session = r.session->fork(),
                               .sampler = sampler(req, choice_seed(r.sampler.params().seed, k)), .choice = k, .prefilled = true});
  }
}

std::unique_ptr<Session> Scheduler::session_for(const std::vector<int>& prompt, std::span<const PromptImage> images, bool fresh) {
  // The idle session holding the longest proper prefix of the prompt continues (device tier).
  const auto now = std::chrono::steady_clock::now();
  idle_.remove_if([&](const Idle& i) { return i.until <= now; });
  auto best = idle_.end();
  for (auto it = fresh ? idle_.end() : idle_.begin(); it != idle_.end(); ++it)
    if (it->session->extends(prompt, images) && (best == idle_.end() || it->session->tokens().size() > best->session->tokens().size()))
      best = it;
  if (best == idle_.end()) {
    auto s = std::make_unique<Session>(executor_, hasher_, mode_);
    if (options_.speculative) s->enable_drafting();
    return s;
  }
  std::unique_ptr<Session> s = std::move(best->session);
  idle_.erase(best);
  return s;
}

int64_t Scheduler::kv_bytes(int64_t tokens) const { return window_bytes_ + int64_t(std::ceil(global_bytes_per_token_ * double(tokens))); }

int Scheduler::used_slots() const {
  int used = 0;
  for (const Running& r : running_) used += slots(r);
  return used;
}

int64_t Scheduler::kv_held() const {
  int64_t held = 0;
  for (const Running& r : running_) {
    const Session& s = *r.session;
    // The whole prompt, or one more token; a sequence yet to fork, once per choice.
    held += slots(r) * kv_bytes(int64_t(s.tokens().size()) + (s.prompt_left() == 0 ? 1 : 0));
  }
  for (const Idle& i : idle_) held += kv_bytes(i.session->length());
  return held;
}

void Scheduler::admit() {
  const int64_t budget = options_.kv_budget_bytes;
  for (;;) {
    // A preempted sequence continues before a new request starts.
    const bool resuming = !preempted_.empty();
    std::shared_ptr<Generation> g;
    if (resuming) {
      g = preempted_.front().generation;
    } else {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) return;
      g = queue_.front();
    }
    // The batch slots it takes: a new request's n choices (they fork from its prompt).
    const int slots = resuming ? Scheduler::slots(preempted_.front()) : g->request.n;
    if (used_slots() + slots > options_.max_running) return;
    auto pop = [&] {
      if (resuming) return preempted_.pop_front();
      std::lock_guard lock(mutex_);
      queue_.pop_front();
      stats_.queued = int64_t(queue_.size());
    };
    // Ends what was at the front: a preempted sequence (and the choices it has yet to fork), or
    // every choice of a queued request.
    auto drop = [&](FinishKind kind, const std::string& error) {
      if (resuming) post_finished(preempted_.front(), kind, error);
      else
        for (int k = 0; k < g->request.n; ++k) g->post({GenerationEvent::Kind::Finished, {}, {}, kind, error, k});
      pop();
    };
    if (resuming ? g->cancelled(preempted_.front().choice) : g->cancelled()) {  // gone while it waited: nothing to run
      drop(FinishKind::Cancelled, {});
      std::lock_guard lock(mutex_);
      stats_.cancelled += 1;
      continue;
    }
    // Room for its prompt and a first token, per choice: idle sequences make way; else it waits
    // for a running one to end, unless none runs, when it can never fit.
    if (budget > 0) {
      const int64_t tokens = int64_t(resuming ? preempted_.front().resume.size() : g->request.prompt.size());
      const int64_t need = slots * kv_bytes(tokens + 1);
      while (kv_held() + need > budget && !idle_.empty()) idle_.pop_back();
      if (kv_held() + need > budget) {
        if (!running_.empty()) return;
        drop(FinishKind::Error, "the KV budget of " + std::to_string(budget) + " bytes holds fewer than the " +
                                    std::to_string(slots) + " x " + std::to_string(tokens + 1) +
                                    " tokens of this prompt and a first token per choice (" + std::to_string(need) + " bytes)");
        std::lock_guard lock(mutex_);
        stats_.failed += 1;
        continue;
      }
    }
    if (resuming) {
      Running r = std::move(preempted_.front());
      pop();
      try {
        r.session = session_for(r.resume, r.generation->request.images, r.generation->request.prompt_logprobs >= 0);
      } catch (const std::exception& e) {
        finish(r, FinishKind::Error, e.what());
        continue;
      }
      if (start(r)) running_.push_back(std::move(r));
      continue;
    }
    uint64_t seed = g->request.sampling.seed;
    if (g->request.sampling.temperature > 0 && seed == 0 && !g->request.seeded) seed = ++seeds_ * 0x9e3779b97f4a7c15ull;
    std::optional<Running> started;
    try {
      started.emplace(Running{g, session_for(g->request.prompt, g->request.images, g->request.prompt_logprobs >= 0),
                              sampler(g->request, seed)});
      started->forks = g->request.n > 1;
    } catch (const std::exception& e) {  // sampling parameters the sampler refuses, or no memory: this request's fault
      {
        std::lock_guard lock(mutex_);
        stats_.failed += 1;  // counted before its owner hears of it
      }
      drop(FinishKind::Error, e.what());
      continue;
    }
    pop();
    if (start(*started)) running_.push_back(std::move(*started));
  }
}

bool Scheduler::start(Running& r) {
  // A preempted sequence that had begun its reply continues it: its tokens so far and the one it
  // sampled, under the decoder floor it had (Session::begin_prompt's continuation), from its SWA
  // tail when the tiers kept it, else recomputed. One preempted in its prompt starts it over.
  const std::vector<int> prompt = r.resume.empty() ? r.generation->request.prompt : std::move(r.resume);
  r.resume.clear();
  // A request with prompt logprobs runs its prompt whole; resumed after it replied, it is recomputed
  // under its floor (its KV is in no tier in default mode; in exact mode recomputing is as exact).
  const bool prompt_logits = r.generation->request.prompt_logprobs >= 0;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const PrefixUse use = r.session->begin_prompt(prompt, prompt_logits ? nullptr : cache_, r.generated > 0 ? r.decoder_floor : std::nullopt,
                                                  prompt_logits && r.generated == 0, r.generation->request.images);
    book(&SchedulerStats::lookup_seconds, seconds_since(t0));
    if (cache_) cache_->count(tally(std::span(&use, 1), cache_->block_tokens(), 0));
    if (!r.prefilled) {  // once per request, preempted or not
      r.prefilled = true;
      book(&SchedulerStats::queue_seconds, std::chrono::duration<double>(t0 - r.generation->submitted).count());
      r.generation->post({GenerationEvent::Kind::Prefilled, use, {}, FinishKind::Stop, {}});
      std::lock_guard lock(mutex_);
      stats_.prompt_tokens += use.prompt_tokens;
    }
  } catch (const std::exception& e) {
    finish(r, FinishKind::Error, e.what());
    return false;
  }
  return true;
}

void Scheduler::preempt(Running& r) {
  Session& s = *r.session;
  if (r.generated > 0) {
    r.resume = s.tokens();  // during a continuation's prompt these hold the sampled token already
    r.decoder_floor = s.decoder_floor();
    if (s.prompt_left() == 0) {
      r.resume.push_back(*r.next_token);
      try {
        if (cache_) s.save(*cache_);  // swapped out: its blocks and its tail into the tiers
      } catch (const std::exception& e) {  // then it is recomputed
        std::fprintf(stderr, "dsv41: storing a preempted sequence's KV failed: %s\n", e.what());
      }
    }
  } else {
    r.resume = r.generation->request.prompt;  // recomputed (a prompt's blocks are stored at its end)
  }
  r.session.reset();
  {
    std::lock_guard lock(mutex_);
    stats_.preempted += 1;
  }
}

void Scheduler::make_room() {
  const int64_t budget = options_.kv_budget_bytes;
  if (budget == 0) return;
  while (kv_held() > budget && !idle_.empty()) idle_.pop_back();
  // The latest admitted wait; the earliest admitted of them continues first.
  while (kv_held() > budget && running_.size() > 1) {
    preempt(running_.back());
    preempted_.push_front(std::move(running_.back()));
    running_.pop_back();
  }
  if (kv_held() > budget && !running_.empty()) {
    Running& r = running_.front();
    finish(r, FinishKind::Error,
           "the KV budget of " + std::to_string(budget) + " bytes is full with this sequence alone, at " +
               std::to_string(r.session->tokens().size()) + " tokens");
    running_.clear();
  }
}

void Scheduler::finish(Running& r, FinishKind kind, const std::string& error) {
  post_finished(r, kind, error);
  {
    std::lock_guard lock(mutex_);
    if (kind == FinishKind::Cancelled) stats_.cancelled += 1;
    if (kind == FinishKind::Error) stats_.failed += 1;
  }
  // A sequence whose prompt has not finished, or whose step failed, or whose KV is not its mode's,
  // is no use to anyone; else it stays for a continuation, and the SWA pool gets its end of output.
  if (kind == FinishKind::Error || !r.session || r.session->prompt_left() > 0 || r.session->length() == 0 ||
      !r.session->kv_of_mode())
    return;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    if (cache_) r.session->save(*cache_);
    book(&SchedulerStats::store_seconds, seconds_since(t0));
  } catch (const std::exception& e) {  // the reply is whole: a tier that refuses its blocks costs only their reuse
    std::fprintf(stderr, "dsv41: storing a finished sequence's KV failed: %s\n", e.what());
    return;
  }
  idle_.push_front({std::move(r.session), std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.idle_ttl_ms)});
  while (int64_t(idle_.size()) > options_.max_idle) idle_.pop_back();
}

void Scheduler::step() {
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->generation->cancelled(it->choice)) {
      finish(*it, FinishKind::Cancelled);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  make_room();
  if (running_.empty()) {
    publish();
    return;
  }
  // A request's choices fork from its sequence at the prompt's last token (appended to running_,
  // which this loop then passes over too: they fork no further).
  for (Running& r : running_) {
    if (!r.forks || r.session->prompt_left() != 1) continue;
    try {
      fork(r);
    } catch (const std::exception& e) {
      finish(r, FinishKind::Error, e.what());
      r.generation = nullptr;
    }
  }
  running_.remove_if([](const Running& r) { return r.generation == nullptr; });

  // This step's batch: prompt chunks under the token budget, one token for every decoder but those
  // that draft (their own step, after the batch).
  const int candidates = choose_drafting();
  std::vector<Running*> members, speculating;
  std::vector<Session*> sessions;
  std::vector<BatchItem> batch;
  int64_t budget = options_.step_tokens, prefill_rows = 0, decode_rows = 0;
  for (Running& r : running_) {
    Session& s = *r.session;
    if (s.prompt_left() > 0) {
      if (budget <= 0) continue;
      // A sequence yet to fork stops before its prompt's last token (each choice runs that one).
      batch.push_back(s.next_chunk(r.forks && s.prompt_left() > 1 ? std::min(budget, s.prompt_left() - 1) : budget));
      budget -= int64_t(batch.back().tokens.size());
      prefill_rows += int64_t(batch.back().tokens.size());
    } else if (r.drafts) {
      speculating.push_back(&r);
      continue;
    } else {
      batch.push_back(s.next_decode(*r.next_token));
      decode_rows += 1;
    }
    members.push_back(&r);
    sessions.push_back(&s);
  }
  // Each decode and each prompt's last chunk give a token: chosen by the executor (on CUDA, on the
  // device) at the point the sequence's sampler draws.
  std::vector<SampleRequest> requests(batch.size());
  std::vector<TokenChoice> choices(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    Running& r = *members[i];
    if (int64_t(batch[i].tokens.size()) < r.session->prompt_left()) continue;
    requests[i] = r.sampler.request(vocab_, r.generation->request.top_logprobs);
    batch[i].sample = &requests[i];
    batch[i].choice = &choices[i];
  }
  std::vector<std::vector<float>> logits;  // of the items that return rows: prompt logprobs' chunks
  if (!batch.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      logits = run_batch(sessions, batch);
    } catch (const std::exception& e) {
      for (Running& r : running_) finish(r, FinishKind::Error, e.what());
      running_.clear();
      publish();
      return;
    }
    const double seconds = seconds_since(t0);
    if (cache_ && std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) { return b.options.replay_until > 0; })) {
      KvCacheCounters replay;
      replay.replay_seconds = seconds;
      cache_->count(replay);
    }
    {
      std::lock_guard lock(mutex_);
      stats_.steps += 1;
      stats_.prefill_tokens += prefill_rows;
      const double rows = double(prefill_rows + decode_rows);
      stats_.prefill_seconds += seconds * double(prefill_rows) / rows;
      stats_.decode_seconds += seconds * double(decode_rows) / rows;
    }
  }

  // Book every item; sample every sequence whose prompt just ended or that decoded; then the
  // speculating sequences' steps.
  for (size_t i = 0; i < members.size(); ++i) {
    Running& r = *members[i];
    try {
      if (batch[i].options.all_logits) score_prompt(r, batch[i], logits[i]);
      advance(r, choices[i]);
    } catch (const std::exception& e) {
      finish(r, FinishKind::Error, e.what());
      r.generation = nullptr;
    }
  }
  if (!speculating.empty()) speculate(speculating, candidates);
  running_.remove_if([](const Running& r) { return r.generation == nullptr; });
  publish();
}

void Scheduler::score_prompt(Running& r, const BatchItem& item, const std::vector<float>& logits) {
  // Row j of the chunk follows position start + j: it scores the prompt's token after it.
  const std::vector<int>& prompt = r.generation->request.prompt;
  const int64_t V = executor_.model().config().vocab_size, rows = int64_t(item.tokens.size());
  const int64_t start = item.sequence->length() - rows;
  if (int64_t(logits.size()) != rows * V)
    fail("prompt logprobs", "the logits of every row of the chunk (" + std::to_string(rows) + " x " + std::to_string(V) + ")",
         std::to_string(logits.size()) + " values");
  for (int64_t j = 0; j < rows; ++j) {
    const int64_t position = start + j + 1;
    if (position < r.scored || position >= int64_t(prompt.size())) continue;
    r.generation->post({GenerationEvent::Kind::PromptToken, {},
                        score(logits.data() + j * V, vocab_, prompt[size_t(position)], r.generation->request.prompt_logprobs),
                        FinishKind::Stop, {}, 0, position});
    r.scored = position + 1;
  }
}

void Scheduler::advance(Running& r, const TokenChoice& choice) {
  r.session->ran();
  if (r.session->prompt_left() > 0) return;  // a prompt chunk before the last: no token
  take(r, choice);
}

bool Scheduler::take(Running& r, const TokenChoice& choice) {
  const GenerationRequest& req = r.generation->request;
  const int token = choice.token;
  const bool stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), token) != req.stop_ids.end();
  r.sampler.chose(token);
  if (!stop) r.generation->post({GenerationEvent::Kind::Token, {}, choice, FinishKind::Stop, {}, r.choice});
  // The prompt's blocks and tail once its first token is out (a no-op after a decode row).
  const auto t0 = std::chrono::steady_clock::now();
  r.session->store_prompt();
  book(&SchedulerStats::store_seconds, seconds_since(t0));
  if (stop) {
    finish(r, FinishKind::Stop);
    r.generation = nullptr;
    return false;
  }
  r.generated += 1;
  {
    std::lock_guard lock(mutex_);
    stats_.decode_tokens += 1;
  }
  r.next_token = token;
  if (r.generated >= req.max_tokens) {
    finish(r, FinishKind::Length);
    r.generation = nullptr;
    return false;
  }
  return true;
}

bool Scheduler::speculates(const Running& r) const {
  // (Logprobs, logit edits and a grammar's mask change what a verifier compares: those sequences
  // step plainly.)
  return options_.speculative && r.generation->request.speculative && r.generation->request.top_logprobs < 0 &&
         !r.sampler.params().edits_logits() && !r.sampler.constraint() &&
         r.session->drafting() && r.session->prompt_left() == 0 && r.next_token.has_value();
}

int Scheduler::choose_drafting() {
  std::vector<Running*> candidates;
  for (Running& r : running_) {
    r.drafts = false;
    if (speculates(r)) candidates.push_back(&r);
  }
  if (candidates.empty()) return 0;
  const int G = executor_.model().config().dspark_block_size;
  std::vector<std::vector<double>> estimated;
  for (Running* r : candidates) {
    if (!r->estimate) r->estimate.emplace(G, options_.drafting);
    estimated.push_back(r->estimate->survival());
  }
  const std::vector<bool> drafts = drafting_sequences(estimated, *plain_rate_, *step_rate_, *draft_rate_, true);
  int64_t plain = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    candidates[i]->drafts = drafts[i];
    if (!drafts[i]) candidates[i]->estimate->plain(), plain += 1;
  }
  std::lock_guard lock(mutex_);
  stats_.speculation.plain_steps += plain;
  return int(candidates.size());
}

void Scheduler::speculate(const std::vector<Running*>& speculating, int candidates) {
  // Every drafting sequence's draft in one executor call; then how much of each the target
  // verifies, chosen from the drafts' confidences and the profiles (engine/prefix_schedule.h; the
  // candidates that did not draft, decoded in the step's batch, priced as the rule decided with
  // them); then one pass for the drafting sequences.
  struct Step {
    Running* r;
    std::unique_ptr<Verifier> verifier;
    Draft draft;
    double seconds;
  };
  const int64_t V = executor_.model().config().vocab_size;
  std::vector<Step> steps;
  std::vector<Session*> drafting;
  std::vector<int> anchors;
  std::vector<Verifier*> verifiers;
  for (Running* r : speculating) {
    std::unique_ptr<Verifier> verifier;
    if (r->sampler.params().temperature > 0) verifier = std::make_unique<SamplingVerifier>(r->sampler, V, vocab_);
    else verifier = std::make_unique<GreedyVerifier>(V, vocab_);
    drafting.push_back(r->session.get());
    anchors.push_back(*r->next_token);
    verifiers.push_back(verifier.get());
    steps.push_back({r, std::move(verifier), {}, 0});
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Draft> drafts;
  try {
    drafts = Session::draft_together(drafting, anchors, verifiers);
  } catch (const std::exception& e) {
    for (Step& step : steps) finish(*step.r, FinishKind::Error, e.what()), step.r->generation = nullptr;
    return;
  }
  // The drafting call's time is shared by its sequences.
  const double draft_seconds = seconds_since(t0) / double(std::max<size_t>(steps.size(), 1));
  std::vector<std::vector<double>> survival;
  for (size_t i = 0; i < steps.size(); ++i) {
    steps[i].draft = std::move(drafts[i]);
    steps[i].seconds = draft_seconds;
    const size_t G = steps[i].draft.tokens.size() - 1;
    // A draft without confidences (no confidence head) is verified whole.
    survival.push_back(steps[i].draft.confidence.size() == G ? prefix_survival(steps[i].draft.confidence) : std::vector<double>(G, 1.0));
  }
  // The candidates that did not draft decoded in the step's batch: their pass and tokens are the
  // step's outside this one, as drafting_sequences priced them.
  const int64_t plain = std::max<int64_t>(0, candidates - int64_t(steps.size()));
  const double outside = 1 / draft_rate_->at(int64_t(steps.size())) + (plain > 0 ? 1 / plain_rate_->at(plain) : 0.0);
  const std::vector<int> lengths = verification_lengths(survival, *step_rate_, StepCost{outside, true, plain});

  // One target pass for every sequence's [anchor, d_1 .. d_length] (the lengths were chosen for a
  // pass of that many rows), then the verdicts, then one call that runs again what the rejections
  // undid. A pass's time is shared by its rows.
  std::vector<Session*> sessions;
  std::vector<BatchItem> items;
  std::vector<size_t> in_pass;  // steps[in_pass[j]] is items[j]'s
  for (size_t i = 0; i < steps.size(); ++i) {
    try {
      items.push_back(steps[i].r->session->begin_verify(steps[i].draft, lengths[i], steps[i].verifier->row_choice()));
      sessions.push_back(steps[i].r->session.get());
      in_pass.push_back(i);
    } catch (const std::exception& e) {
      finish(*steps[i].r, FinishKind::Error, e.what());
      steps[i].r->generation = nullptr;
    }
  }
  auto run = [&](const std::vector<Session*>& who, const std::vector<BatchItem>& what) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<float>> logits = run_batch(who, what);
    for (Session* s : who) s->ran();
    int64_t rows = 0;
    for (const BatchItem& b : what) rows += int64_t(b.tokens.size());
    return std::make_pair(std::move(logits), seconds_since(t0) / double(std::max<int64_t>(rows, 1)));
  };
  std::vector<std::vector<float>> logits;
  double per_row = 0;
  try {
    std::tie(logits, per_row) = run(sessions, items);
  } catch (const std::exception& e) {
    for (size_t j : in_pass) finish(*steps[j].r, FinishKind::Error, e.what()), steps[j].r->generation = nullptr;
    return;
  }
  std::vector<Session::Speculation> verdicts(steps.size());
  std::vector<Session*> redo_sessions;
  std::vector<BatchItem> redo_items;
  std::vector<size_t> redone;
  for (size_t j = 0; j < in_pass.size(); ++j) {
    Step& step = steps[in_pass[j]];
    step.seconds += per_row * double(items[j].tokens.size());
    try {
      std::optional<BatchItem> redo;
      verdicts[in_pass[j]] = step.r->session->end_verify(logits[j], *step.verifier, redo);
      if (redo) redo_sessions.push_back(step.r->session.get()), redo_items.push_back(*redo), redone.push_back(in_pass[j]);
    } catch (const std::exception& e) {
      finish(*step.r, FinishKind::Error, e.what());
      step.r->generation = nullptr;
    }
  }
  if (!redo_items.empty()) {
    try {
      std::tie(logits, per_row) = run(redo_sessions, redo_items);
      for (size_t j = 0; j < redone.size(); ++j) steps[redone[j]].seconds += per_row * double(redo_items[j].tokens.size());
    } catch (const std::exception& e) {
      for (size_t i : redone) finish(*steps[i].r, FinishKind::Error, e.what()), steps[i].r->generation = nullptr;
    }
  }
  {
    std::lock_guard lock(mutex_);
    stats_.speculation.passes += 1 + !redo_items.empty();
  }

  for (size_t j : in_pass) {
    Step& step = steps[j];
    Running& r = *step.r;
    if (!r.generation) continue;
    const Session::Speculation& s = verdicts[j];
    {
      std::lock_guard lock(mutex_);
      SpeculationStats& st = stats_.speculation;
      const int64_t G = int64_t(step.draft.tokens.size()) - 1;
      st.steps += 1, st.drafted += G, st.verified += lengths[j], st.accepted += s.accepted;
      st.draft_seconds += draft_seconds, st.verify_seconds += step.seconds - draft_seconds;
      if (int64_t(st.accepted_at.size()) < G) st.accepted_at.resize(size_t(G), 0);
      for (int k = 0; k < s.accepted; ++k) st.accepted_at[size_t(k)] += 1;
      stats_.steps += 1;
      stats_.decode_seconds += step.seconds;
    }
    r.estimate->drafted(survival[j], lengths[j], s.accepted);
    // The emitted tokens in order, until one ends the reply; the last is the next anchor.
    for (const int token : s.emitted)
      if (!take(r, TokenChoice{token, 0, {}})) break;
  }
}

void Scheduler::book(double SchedulerStats::*field, double seconds) {
  std::lock_guard lock(mutex_);
  stats_.*field += seconds;
}

void Scheduler::publish() {
  const auto now = std::chrono::steady_clock::now();
  idle_.remove_if([&](const Idle& i) { return i.until <= now; });
  std::lock_guard lock(mutex_);
  stats_.running = int64_t(running_.size());
  stats_.idle = int64_t(idle_.size());
  stats_.kv_bytes = kv_held();
}

}  // namespace dsv41
