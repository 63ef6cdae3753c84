#pragma once
// Continuous batching (DESIGN §2 "engine"): one thread runs steps; every step is one forward_batch
// call holding each running sequence's next piece — a prompt chunk, under a per-step budget of
// prompt tokens, or one decode token — so sequences join and leave at every step.
//
// A request is token ids in and token events out. Its owner (an HTTP handler, a test) waits on
// the Generation it got from submit(); cancel() (a client that went away, a stop string found)
// frees the sequence at the next step. The queue of requests not yet running is bounded: submit()
// refuses when it is full, and the server answers 503.
//
// A request may ask for n choices (OpenAI's `n`): its prompt runs once, up to its last token, in
// one sequence, which then forks (Session::fork: the KV copied) into n; each runs the last token
// and samples on its own, with its own seed (choice_seed). Each choice's events carry its index.
//
// Cache-aware: every prompt is looked up in the KV tiers (Session::begin_prompt). A finished
// sequence stores its blocks and end-of-output tail in the tiers and stays on the device as an
// idle session for a while (the SWA TTL by default): a new request whose prompt extends it
// continues it there (the device tier).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/sampling.h"
#include "engine/grammar/grammar.h"
#include "engine/prefix_schedule.h"
#include "engine/session.h"

namespace dsv41 {

struct GenerationRequest {
  std::vector<int> prompt;
  // The prompt's images at their spans (engine/prompt_image.h, check_images), on an executor
  // that takes them (the CPU one so far).
  std::vector<PromptImage> images;
  SamplingParams sampling;     // seed 0 with temperature > 0: a fresh seed, unless `seeded`
  bool seeded = false;         // the seed is the client's, 0 included (an API request's "seed": 0)
  int64_t max_tokens = 16;     // > 0
  std::vector<int> stop_ids;   // end the reply; not emitted
  int top_logprobs = -1;       // -1: no logprobs; else the chosen token's and this many others
  // With the scheduler's speculative decoding on: whether this request may use it (it does not
  // when it asks for logprobs: a verified draft token has none of its own).
  bool speculative = true;
  // A grammar the reply must follow (structured output, enforced tool calls: engine/grammar),
  // its end token among stop_ids; null: none. It starts after the text `grammar_after`
  // (thinking's "</think>") when that is not empty. No speculation for such a request.
  std::shared_ptr<grammar::Grammar> grammar;
  std::string grammar_after;
  // Choices: 1 to the scheduler's max_running (the n sequences run in one batch together).
  int n = 1;
  // Prompt logprobs (completions' echo with logprobs): -1 none; else each prompt token's logprob
  // from the row before it (the first token has none) and this many alternatives, as PromptToken
  // events. The prompt then runs whole, every row through the decoder (Session::begin_prompt's
  // prompt_logits): nothing looked up, and in default mode nothing stored or kept for a
  // continuation (its KV is not the mode's).
  int prompt_logprobs = -1;
};

// The seed of choice `choice` of a request whose sampling seed is `seed`: the seed itself for
// choice 0 (so that a request's first choice does not depend on n), a SplitMix64 mix of the seed
// and the index for the others; a seeded request's choices are reproducible.
uint64_t choice_seed(uint64_t seed, int choice);


enum class FinishKind { Stop, Length, Cancelled, Error };

// A request's events: one Prefilled (the prompt is shared by its choices), its PromptTokens in
// order (prompt_logprobs), then for each choice its Tokens and one Finished, the choices' events
// interleaved.
struct GenerationEvent {
  enum class Kind { Prefilled, PromptToken, Token, Finished } kind;
  PrefixUse use;       // Prefilled: how the prompt was served
  TokenChoice token;   // Token; PromptToken: the prompt's token at position `position`, scored
  FinishKind finish = FinishKind::Stop;  // Finished
  std::string error;                     // Finished with Error
  int choice = 0;      // Token, Finished: the choice's index in [0, n)
  int64_t position = 0;  // PromptToken: in [1, prompt length)
};

// One request in flight, shared by the scheduler and the request's owner.
class Generation {
 public:
  explicit Generation(GenerationRequest request)
      : request(std::move(request)), choice_cancelled_(size_t(std::max(1, this->request.n))) {}
  const GenerationRequest request;
  const std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();

  // The next event, waiting for it; the request is over after n Finished (one per choice).
  GenerationEvent next();
  // The same, waiting at most `timeout`: nothing if no event came.
  std::optional<GenerationEvent> next_for(std::chrono::milliseconds timeout);
  // Asks the scheduler to drop every choice's sequence (each finishes with Cancelled), or one's.
  void cancel() { cancelled_.store(true); }
  void cancel(int choice) { choice_cancelled_.at(size_t(choice)).store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool cancelled(int choice) const { return cancelled_.load() || choice_cancelled_.at(size_t(choice)).load(); }

 private:
  friend class Scheduler;
  void post(GenerationEvent event);
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<GenerationEvent> events_;
  std::atomic<bool> cancelled_{false};
  std::vector<std::atomic<bool>> choice_cancelled_;
};

struct SchedulerOptions {
  int max_running = 8;        // sequences in one batch
  int max_queued = 64;        // requests waiting to join; more are refused
  // Prompt tokens per step, over all prefilling sequences; 0: the executor's default
  // (Executor::default_step_tokens: CUDA 8192, CPU 256).
  int64_t step_tokens = 0;
  int max_idle = 8;           // finished sequences kept on the device for a continuation
  // How long one stays: it holds SWA state, so by default as long as the SWA pool keeps it.
  int64_t idle_ttl_ms = 5 * 60 * 1000;
  // The KV bytes the running and idle sequences may hold together, each counted at its tokens in
  // the cache formats (Accounting::Kv); 0: no limit. A request joins when its prompt fits; when the
  // sequences' growth would pass it, idle sequences go first, then the latest admitted running
  // ones are preempted: their state saved to the KV tiers (when there are tiers; else it is
  // recomputed), to continue where they stopped once there is room.
  int64_t kv_budget_bytes = 0;
  // DSpark speculative decoding (Session::draft, verify) for the requests that allow it: at each
  // step the prefix scheduler (engine/prefix_schedule.h) decides which such sequences draft
  // (drafting_sequences, from each one's SurvivalEstimate: drafting would not pay, the sequence
  // decodes plainly in the step's batch), drafts for them in one call, and sends each one's first
  // ℓ tokens to one target pass, run on its own after the step's batch. The constructor refuses it
  // for a model without DSpark or an executor without it.
  bool speculative = false;
  // The prefix scheduler's profiles: target passes per second by rows (verification), decode
  // passes per second by sequences (the batch's plain decoding), and drafting calls per second by
  // the sequences drafting together; each measured on the executor at construction
  // (measure_step_rate, measure_plain_rate, measure_draft_rate) when speculating without one.
  std::optional<StepRate> step_rate{}, plain_rate{}, draft_rate{};
  DraftingPolicy drafting{};  // how a sequence's survival is estimated before it drafts
};

// Speculative decoding's counters (SchedulerOptions::speculative).
struct SpeculationStats {
  int64_t steps = 0;             // drafts verified
  // Steps of sequences that could speculate and decoded plainly instead (drafting_sequences: a
  // draft would not pay for itself); steps + plain_steps are all their steps.
  int64_t plain_steps = 0;
  int64_t drafted = 0;           // draft tokens proposed (γ per step)
  int64_t verified = 0;          // of them sent to the target (the prefix scheduler's lengths)
  int64_t accepted = 0;          // of them accepted
  std::vector<int64_t> accepted_at;  // [γ]: steps whose draft k (from 0) was accepted
  // Time in the drafting calls / the target's passes and redos (each call's shared by its sequences).
  double draft_seconds = 0, verify_seconds = 0;
  double seconds() const { return draft_seconds + verify_seconds; }
  int64_t passes = 0;            // target calls: one verifies every speculating sequence's draft, one redoes the rejected
};

struct SchedulerStats {
  int64_t queued = 0, running = 0, idle = 0;  // now
  int64_t requests = 0, refused = 0, cancelled = 0, failed = 0;
  int64_t preempted = 0;         // running sequences put back to wait for KV room
  int64_t kv_bytes = 0;          // held by the running and idle sequences now (kv_budget_bytes)
  int64_t prompt_tokens = 0;     // all prompt tokens of admitted requests
  int64_t prefill_tokens = 0;    // prompt tokens run (cached ones not)
  int64_t decode_tokens = 0;     // tokens generated
  double prefill_seconds = 0;    // step time, split between prefill and decode by their rows
  double decode_seconds = 0;
  // Time outside the steps: looking prompts up in the KV tiers and restoring what was found
  // (Session::begin_prompt), and storing blocks and tails at the end of prompts and replies.
  double lookup_seconds = 0, store_seconds = 0;
  double queue_seconds = 0;  // from submission to admission, summed over requests
  int64_t steps = 0;
  SpeculationStats speculation;
};

class Scheduler {
 public:
  // Runs every sequence on `executor` (which must outlive the scheduler).
  Scheduler(Executor& executor, const Tokenizer* tokenizer, Mode mode, KvCache* cache, SchedulerOptions options = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; null when the queue is full or the scheduler is stopping. Throws
  // dsv41::Error for a request that can never run (no prompt tokens, ids the tokenizer does not
  // have outside image spans, max_tokens < 1, beyond the context, n outside [1, max_running],
  // images misplaced or on an executor without the vision tower).
  std::shared_ptr<Generation> submit(GenerationRequest request);
  // Finishes every request as Cancelled (running and queued), refuses new ones, and stops the
  // thread. The destructor does it too.
  void stop();
  SchedulerStats stats() const;
  Mode mode() const { return mode_; }
  // With speculation: the prefix scheduler's profiles, given or measured (bad_optional_access without).
  const StepRate& step_rate() const { return step_rate_.value(); }
  const StepRate& plain_rate() const { return plain_rate_.value(); }
  const StepRate& draft_rate() const { return draft_rate_.value(); }

 private:
  struct Running {
    std::shared_ptr<Generation> generation;
    std::unique_ptr<Session> session;
    Sampler sampler;
    int choice = 0;      // the request's choice this sequence makes
    bool forks = false;  // choice 0 of n > 1 until it forks into the others, before its prompt's last token
    int64_t generated = 0;
    std::optional<int> next_token{};  // sampled and emitted, to run at the next step
    bool prefilled = false;         // its Prefilled event posted
    std::vector<int> resume{};      // a preempted sequence's tokens, to continue from
    std::optional<int64_t> decoder_floor{};  // and its decoder window floor, once it had replied
    int64_t scored = 1;  // prompt_logprobs: the next prompt position to post (its row may run again after a preemption)
    std::optional<SurvivalEstimate> estimate{};  // speculation: its drafts' expected survival, from its first step that could draft
    bool drafts = false;  // speculation: it drafts this step (choose_drafting)
  };
  void loop();
  void admit();
  void step();
  // Books a sequence's batch item and takes its next token when its prompt is done.
  void advance(Running& r, const TokenChoice& choice);
  // Posts the prompt tokens a prompt_logprobs chunk scored: `logits` are the item's rows, run.
  void score_prompt(Running& r, const BatchItem& item, const std::vector<float>& logits);
  // Takes a token chosen for a sequence whose prompt is done: posts it (unless it stops the reply),
  // stores the prompt, finishes on a stop or at max_tokens. False when the sequence finished.
  bool take(Running& r, const TokenChoice& choice);
  // Which sequences that may speculate draft this step (Running::drafts); the others decode
  // plainly. Returns how many may speculate.
  int choose_drafting();
  // The drafting sequences' decode steps (Session::draft_together, begin_verify, end_verify) and
  // their tokens; `candidates` sequences could have drafted this step.
  void speculate(const std::vector<Running*>& speculating, int candidates);
  bool speculates(const Running& r) const;
  // Ends a sequence: posts Finished and keeps the session idle for a continuation.
  void finish(Running& r, FinishKind kind, const std::string& error = {});
  // Posts r's Finished, and those of the choices it has yet to fork into.
  void post_finished(const Running& r, FinishKind kind, const std::string& error = {});
  // A request's sampler for the choice of seed `seed`: its parameters, its prompt counted for
  // the penalties, its grammar.
  Sampler sampler(const GenerationRequest& request, uint64_t seed) const;
  // Choice 0 at its prompt's last token: the other choices, forked from it, join the batch.
  void fork(Running& r);
  // The batch slots a sequence holds: n while it has yet to fork, else 1.
  static int slots(const Running& r) { return r.forks ? r.generation->request.n : 1; }
  // The session a request runs in: an idle one its prompt (and images) continues, or a new one
  // (always, for prompt logprobs: the prompt runs whole).
  std::unique_ptr<Session> session_for(const std::vector<int>& prompt, std::span<const PromptImage> images, bool fresh = false);
  // Starts r's prompt (or, preempted, its continuation) in its session; false if it failed.
  bool start(Running& r);
  // The KV bytes of a sequence of `tokens` tokens, and of every running and idle one after this step.
  int64_t kv_bytes(int64_t tokens) const;
  int used_slots() const;
  int64_t kv_held() const;
  // Frees KV room for the next step, under the budget: idle sequences, then preemption.
  void make_room();
  void preempt(Running& r);
  void publish();  // running and idle counts into the stats
  void book(double SchedulerStats::*field, double seconds);  // time outside the steps into the stats

  Executor& executor_;
  const Mode mode_;
  const int64_t vocab_;  // sampling_vocab
  const std::shared_ptr<const EngramHasher> hasher_;
  KvCache* cache_;
  const SchedulerOptions options_;
  std::optional<StepRate> step_rate_, plain_rate_, draft_rate_;  // with speculation: the options' or the ones measured

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Generation>> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;

  // Owned by the loop thread.
  std::list<Running> running_;
  struct Idle {
    std::unique_ptr<Session> session;
    std::chrono::steady_clock::time_point until;
  };
  std::list<Idle> idle_;  // most recently finished first
  std::deque<Running> preempted_;  // to continue first, in the order they were preempted (oldest first)
  double global_bytes_per_token_ = 0;
  int64_t window_bytes_ = 0;
  uint64_t seeds_ = 0;
  std::thread thread_;
};

}  // namespace dsv41
