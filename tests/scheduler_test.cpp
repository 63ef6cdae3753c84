// Continuous batching (engine/scheduler.h) on fixture v41-tiny: what a request gets does not
// depend on the company it runs in; cancellation, the queue bound, stop tokens, logprobs, and
// the device tier's continuation of a finished sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "engine/scheduler.h"
#include "model/accounting.h"
#include "fixture.h"
#include "test_device.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

struct Outcome {
  PrefixUse use;
  std::vector<int> tokens;
  std::vector<TokenChoice> events;
  FinishKind finish = FinishKind::Error;
};

Outcome collect(Generation& g) {
  Outcome o;
  for (;;) {
    GenerationEvent e = g.next();
    if (e.kind == GenerationEvent::Kind::Prefilled) o.use = e.use;
    if (e.kind == GenerationEvent::Kind::Token) o.tokens.push_back(e.token.token), o.events.push_back(e.token);
    if (e.kind == GenerationEvent::Kind::Finished) {
      o.finish = e.finish;
      return o;
    }
  }
}

struct SchedulerTest : ::testing::Test {
  std::unique_ptr<Model> model = Model::load(fixture_dir("v41-tiny"));
  std::unique_ptr<Executor> owned = test::test_executor(*model);
  Executor& executor = *owned;
  Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  std::vector<int> text;
  SchedulerTest() {
    std::vector<int64_t> t = Expected("v41-tiny").ints("prompt2.tokens");
    text.assign(t.begin(), t.end());
  }
  // A small prompt cache of the fixture's tiers (16 MB host, 16 MB SWA pool).
  static KvCacheOptions cache_options(Mode mode) {
    KvCacheOptions options;
    options.fingerprint = "v41-tiny";
    options.mode = mode_name(mode);
    options.host_budget_bytes = 16 << 20;
    options.swa.budget_bytes = 16 << 20;
    return options;
  }
  std::vector<int> slice(size_t from, size_t n) const { return std::vector<int>(text.begin() + from, text.begin() + from + n); }
  // Greedy tokens of a lone session: the prompt at once, then decode.
  std::vector<int> alone(const std::vector<int>& prompt, int n, Mode mode = Mode::Default) {
    Session s(executor, &tokenizer, mode);
    std::vector<float> logits = s.prefill(prompt);
    std::vector<int> out;
    for (int k = 0; k < n; ++k) {
      out.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (k + 1 < n) logits = s.decode(out.back());
    }
    return out;
  }
  void kv_budget_run(Mode mode, bool tiers);
  GenerationRequest request(std::vector<int> prompt, int max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    return r;
  }
};

}  // namespace

// Five requests in one batch, joining and leaving at different steps, each get exactly the
// greedy tokens they get alone (whole prompts per step: the budget covers them).
TEST_F(SchedulerTest, BatchedRequestsGetWhatTheyGetAlone) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr,
                      SchedulerOptions{.max_running = 8, .max_queued = 16, .step_tokens = 4096, .max_idle = 0});
  const std::vector<std::pair<std::vector<int>, int>> work = {
      {slice(0, 40), 6}, {slice(40, 7), 3}, {slice(100, 90), 9}, {slice(7, 1), 4}, {slice(200, 30), 1}};
  std::vector<std::shared_ptr<Generation>> gens;
  for (const auto& [prompt, n] : work) gens.push_back(scheduler.submit(request(prompt, n)));
  for (size_t i = 0; i < work.size(); ++i) {
    ASSERT_NE(gens[i], nullptr);
    Outcome o = collect(*gens[i]);
    EXPECT_EQ(o.finish, FinishKind::Length);
    EXPECT_EQ(o.tokens, alone(work[i].first, work[i].second)) << "request " << i;
  }
  const SchedulerStats s = scheduler.stats();
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.decode_tokens, 6 + 3 + 9 + 4 + 1);
  EXPECT_EQ(s.prefill_tokens, 40 + 7 + 90 + 1 + 30);
}

// Under a small per-step budget prompts run in chunks across steps, and every request completes.
TEST_F(SchedulerTest, ChunkedPrefillUnderATokenBudget) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr,
                      SchedulerOptions{.max_running = 4, .max_queued = 16, .step_tokens = 24, .max_idle = 0});
  std::vector<std::shared_ptr<Generation>> gens;
  for (int i = 0; i < 4; ++i) gens.push_back(scheduler.submit(request(slice(size_t(i) * 50, 50 + size_t(i) * 10), 3)));
  for (auto& g : gens) {
    Outcome o = collect(*g);
    EXPECT_EQ(o.finish, FinishKind::Length);
    EXPECT_EQ(o.tokens.size(), 3u);
  }
  // 260 prompt tokens at most 24 per step: at least 11 steps, and every prompt token ran once.
  EXPECT_GE(scheduler.stats().steps, 11);
  EXPECT_EQ(scheduler.stats().prefill_tokens, 50 + 60 + 70 + 80);
  EXPECT_EQ(scheduler.stats().decode_tokens, 4 * 3);
}

// A prompt run in chunks gives the tokens of those chunks: no token comes from a chunk before the
// last one (which has logits too, of its last row, in exact mode and near the end in default).
TEST_F(SchedulerTest, OnlyTheLastChunkOfAPromptIsSampled) {
  const std::vector<int> prompt = slice(0, 50);
  for (Mode mode : {Mode::Default, Mode::Exact}) {
    Scheduler scheduler(executor, &tokenizer, mode, nullptr,
                        SchedulerOptions{.max_running = 1, .max_queued = 4, .step_tokens = 24, .max_idle = 0});
    const Outcome o = collect(*scheduler.submit(request(prompt, 3)));
    EXPECT_EQ(scheduler.stats().prefill_tokens, 50);

    // The same chunks of 24, 24 and 2 by hand, then greedy decoding.
    Session s(executor, &tokenizer, mode);
    s.begin_prompt(prompt, nullptr);
    std::vector<float> logits;
    while (s.prompt_left() > 0) {
      Session* self = &s;
      logits = run_batch(std::span(&self, 1), {s.next_chunk(24)}).front();
      s.ran();
    }
    std::vector<int> expected;
    for (int k = 0; k < 3; ++k) {
      expected.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (k < 2) logits = s.decode(expected.back());
    }
    EXPECT_EQ(o.tokens, expected) << mode_name(mode);
  }
}

TEST_F(SchedulerTest, CancelFreesTheSequence) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr);
  auto g = scheduler.submit(request(slice(0, 20), 1000));
  GenerationEvent e = g->next();
  ASSERT_EQ(e.kind, GenerationEvent::Kind::Prefilled);
  e = g->next();
  ASSERT_EQ(e.kind, GenerationEvent::Kind::Token);
  g->cancel();
  Outcome o = collect(*g);
  EXPECT_EQ(o.finish, FinishKind::Cancelled);
  EXPECT_LT(o.tokens.size(), 1000u);
  // The scheduler notices at its next step; the sequence is gone from the batch.
  for (int i = 0; i < 1000 && scheduler.stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(scheduler.stats().running, 0);
  EXPECT_EQ(scheduler.stats().cancelled, 1);
}

TEST_F(SchedulerTest, TheQueueIsBounded) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr,
                      SchedulerOptions{.max_running = 1, .max_queued = 1, .step_tokens = 256, .max_idle = 0});
  auto first = scheduler.submit(request(slice(0, 10), 3000));  // busy for seconds, even on a fast machine
  ASSERT_EQ(first->next().kind, GenerationEvent::Kind::Prefilled);  // running: the queue is empty again
  auto second = scheduler.submit(request(slice(0, 10), 2));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(scheduler.submit(request(slice(0, 10), 2)), nullptr);
  EXPECT_EQ(scheduler.stats().refused, 1);
  first->cancel();
  EXPECT_EQ(collect(*second).finish, FinishKind::Length);
  // Requests that can never run are refused at once.
  EXPECT_THROW(scheduler.submit(request({}, 2)), Error);
  EXPECT_THROW(scheduler.submit(request({5, 100000}, 2)), Error);
  EXPECT_THROW(scheduler.submit(request({5}, 0)), Error);
  EXPECT_THROW(scheduler.submit(request({5}, int(model->config().max_seq_len))), Error);
}

TEST_F(SchedulerTest, StopTokensEndTheReplyUnemitted) {
  const std::vector<int> prompt = slice(0, 30);
  const std::vector<int> greedy = alone(prompt, 5);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr);
  GenerationRequest r = request(prompt, 5);
  r.stop_ids = {greedy[3]};
  const size_t first_stop = size_t(std::find(greedy.begin(), greedy.end(), greedy[3]) - greedy.begin());
  Outcome o = collect(*scheduler.submit(r));
  EXPECT_EQ(o.finish, FinishKind::Stop);
  EXPECT_EQ(o.tokens, std::vector<int>(greedy.begin(), greedy.begin() + long(first_stop)));
}

TEST_F(SchedulerTest, LogprobsAreTheModelsLogSoftmax) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr);
  GenerationRequest r = request(slice(0, 30), 4);
  r.top_logprobs = 5;
  Outcome o = collect(*scheduler.submit(r));
  ASSERT_EQ(o.events.size(), 4u);
  for (const TokenChoice& e : o.events) {
    ASSERT_EQ(e.top.size(), 5u);
    EXPECT_EQ(e.top[0].first, e.token);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(e.top[0].second, e.logprob);
    for (size_t i = 1; i < e.top.size(); ++i) EXPECT_LE(e.top[i].second, e.top[i - 1].second);
    double mass = 0;
    for (const auto& [id, lp] : e.top) mass += std::exp(double(lp));
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_LE(e.logprob, 0.0f);
  }
}

// A finished sequence stays on the device: the next turn, extending it, continues it.
TEST_F(SchedulerTest, NextTurnContinuesTheFinishedSequence) {
  KvCache cache(model->config(), cache_options(Mode::Default));
  Scheduler scheduler(executor, &tokenizer, Mode::Default, &cache);
  std::vector<int> conversation = slice(0, 100);
  Outcome one = collect(*scheduler.submit(request(conversation, 5)));
  conversation.insert(conversation.end(), one.tokens.begin(), one.tokens.end());
  const std::vector<int> more = slice(150, 20);
  conversation.insert(conversation.end(), more.begin(), more.end());
  Outcome two = collect(*scheduler.submit(request(conversation, 3)));
  EXPECT_EQ(two.use.device_tokens, 100 + 5 - 1);  // the last reply token was never run
  EXPECT_EQ(two.use.computed(), 21);
  EXPECT_EQ(cache.stats().counters.device_tokens, 104);
}

// A request the sampler refuses (top_p 0: the API refuses it first, but the engine must not rely
// on that) fails alone, with the sampler's reason; the scheduler thread lives on and serves the
// next request. It used to throw outside any handler and end the process.
TEST_F(SchedulerTest, ARequestTheSamplerRefusesFailsAlone) {
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr);
  GenerationRequest bad = request(slice(0, 10), 3);
  bad.sampling.temperature = 1;
  bad.sampling.top_p = 0;
  std::shared_ptr<Generation> g = scheduler.submit(bad);
  ASSERT_NE(g, nullptr);
  std::string error;
  for (;;) {
    GenerationEvent e = g->next();
    if (e.kind != GenerationEvent::Kind::Finished) continue;
    EXPECT_EQ(e.finish, FinishKind::Error);
    error = e.error;
    break;
  }
  EXPECT_NE(error.find("top_p in (0, 1]"), std::string::npos) << error;
  EXPECT_EQ(scheduler.stats().failed, 1);
  const Outcome next = collect(*scheduler.submit(request(slice(0, 10), 3)));
  EXPECT_EQ(next.finish, FinishKind::Length);
  EXPECT_EQ(next.tokens, alone(slice(0, 10), 3));
}

// Under a KV budget that holds two of these sequences at their prompts but not as they grow, the
// third waits to join, and growth preempts the latest admitted. Swapped out to the KV tiers, a
// preempted one continues from its SWA tail as if never stopped — its sampled token runs as a
// decode row under the decoder floor it had, not as a new prompt segment with a truncated decoder
// window; without tiers it is recomputed under that floor. Either way, in either mode, every
// request's tokens are the ones it gets alone, bit for bit; the preemptions are counted.
TEST_F(SchedulerTest, AKvBudgetAdmitsWhatFitsAndPreemptsOnGrowth) {
  for (Mode mode : {Mode::Exact, Mode::Default})
    for (bool tiers : {true, false}) {
      SCOPED_TRACE(std::string(mode_name(mode)) + (tiers ? ", swapped to the tiers" : ", recomputed"));
      kv_budget_run(mode, tiers);
    }
}

void SchedulerTest::kv_budget_run(Mode mode, bool tiers) {
  KvCache cache(model->config(), cache_options(mode));
  const Accounting::Kv kv = account(model->config(), 1).kv;
  auto bytes = [&](int64_t tokens) { return kv.swa_bytes_per_sequence + int64_t(std::ceil(kv.global_bytes_per_token * double(tokens))); };
  const int prompt = 40, n = 24;
  SchedulerOptions o{.max_running = 8, .max_queued = 16, .step_tokens = 4096, .max_idle = 0};
  o.kv_budget_bytes = 2 * bytes(prompt + 1) + (bytes(prompt + n) - bytes(prompt + 1)) / 2;
  ASSERT_GT(3 * bytes(prompt + 1), o.kv_budget_bytes);  // a third does not fit even at its prompt
  Scheduler scheduler(executor, &tokenizer, mode, tiers ? &cache : nullptr, o);
  std::vector<std::shared_ptr<Generation>> gens;
  for (int i = 0; i < 4; ++i) gens.push_back(scheduler.submit(request(slice(size_t(i) * 30, prompt), n)));
  for (int i = 0; i < 4; ++i) {
    const Outcome out = collect(*gens[size_t(i)]);
    EXPECT_EQ(out.finish, FinishKind::Length) << i;
    EXPECT_EQ(out.tokens, alone(slice(size_t(i) * 30, prompt), n, mode)) << "request " << i;
  }
  const SchedulerStats st = scheduler.stats();
  EXPECT_GE(st.preempted, 2);
  EXPECT_LE(st.kv_bytes, o.kv_budget_bytes);
  if (tiers) {
    EXPECT_GT(cache.stats().counters.swa_tokens, 0);  // the continuations came from their SWA tails
  }
}

// A prompt that cannot fit the budget even alone fails at once, saying so; the next one runs.
TEST_F(SchedulerTest, APromptBeyondTheKvBudgetFailsAlone) {
  const Accounting::Kv kv = account(model->config(), 1).kv;
  SchedulerOptions o{.max_running = 8, .max_queued = 16, .step_tokens = 4096, .max_idle = 0};
  o.kv_budget_bytes = kv.swa_bytes_per_sequence + int64_t(kv.global_bytes_per_token * 30);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr, o);
  std::shared_ptr<Generation> g = scheduler.submit(request(slice(0, 100), 3));
  std::string error;
  for (GenerationEvent e = g->next();; e = g->next())
    if (e.kind == GenerationEvent::Kind::Finished) {
      EXPECT_EQ(e.finish, FinishKind::Error);
      error = e.error;
      break;
    }
  EXPECT_NE(error.find("KV budget of " + std::to_string(o.kv_budget_bytes) + " bytes"), std::string::npos) << error;
  EXPECT_EQ(collect(*scheduler.submit(request(slice(0, 10), 3))).finish, FinishKind::Length);
}

namespace {

// Every choice's outcome of a request of n choices, by index; `prefilled` counts its Prefilled
// events (one per request).
struct Choices {
  std::vector<Outcome> choices;
  int prefilled = 0;
};

Choices collect_choices(Generation& g) {
  Choices c;
  c.choices.resize(size_t(g.request.n));
  std::vector<bool> finished(size_t(g.request.n), false);
  for (int left = g.request.n; left > 0;) {
    GenerationEvent e = g.next();
    if (e.kind == GenerationEvent::Kind::Prefilled) c.prefilled += 1, c.choices[0].use = e.use;
    Outcome& o = c.choices.at(size_t(e.choice));
    if (e.kind == GenerationEvent::Kind::Token) {
      EXPECT_FALSE(finished[size_t(e.choice)]) << "a token of choice " << e.choice << " after its Finished";
      o.tokens.push_back(e.token.token), o.events.push_back(e.token);
    }
    if (e.kind == GenerationEvent::Kind::Finished) {
      EXPECT_FALSE(finished[size_t(e.choice)]) << "choice " << e.choice << " finished twice";
      finished[size_t(e.choice)] = true;
      o.finish = e.finish;
      --left;
    }
  }
  return c;
}

}  // namespace

// A fork continues exactly as the session it came from would have, and the two are independent
// afterwards: its KV is a copy, not a view. Forked before a prompt's last token (as the scheduler
// forks a request's choices), both give the unforked session's logits, bit for bit, in both
// modes; then each decodes its own token and gets what an unforked session decoding that token
// gets.
TEST_F(SchedulerTest, AForkedSessionContinuesAsTheOriginal) {
  const std::vector<int> prompt = slice(0, 50);
  for (Mode mode : {Mode::Default, Mode::Exact}) {
    SCOPED_TRACE(mode_name(mode));
    auto run = [](Session& s, int64_t rows) {
      Session* self = &s;
      std::vector<float> logits = run_batch(std::span(&self, 1), {s.next_chunk(rows)}).front();
      s.ran();
      return logits;
    };
    Session reference(executor, &tokenizer, mode);
    const std::vector<float> at_prompt = reference.prefill(prompt);

    Session a(executor, &tokenizer, mode);
    a.begin_prompt(prompt, nullptr);
    while (a.prompt_left() > 1) run(a, std::min<int64_t>(24, a.prompt_left() - 1));
    std::unique_ptr<Session> b = a.fork();
    EXPECT_EQ(b->tokens(), a.tokens());
    EXPECT_EQ(b->prompt_left(), 1);
    EXPECT_EQ(run(a, 1), at_prompt);
    EXPECT_EQ(run(*b, 1), at_prompt);

    const int ta = int(std::max_element(at_prompt.begin(), at_prompt.end()) - at_prompt.begin());
    const int tb = ta == 7 ? 8 : 7;  // another token for the fork
    Session other(executor, &tokenizer, mode);
    other.prefill(prompt);
    const std::vector<float> decoded_b = b->decode(tb);  // the fork first: a shared state would show in `a`
    EXPECT_EQ(a.decode(ta), reference.decode(ta));
    EXPECT_EQ(decoded_b, other.decode(tb));
  }
}

// n = 3 greedy: the prompt runs once (chunked under the step budget up to its last token, which
// each choice runs), and the three choices are the tokens the request gets alone, each with its
// own Finished; one Prefilled for the request.
TEST_F(SchedulerTest, ChoicesShareThePromptAndGreedyChoicesAgree) {
  const std::vector<int> prompt = slice(0, 50);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr,
                      SchedulerOptions{.max_running = 4, .max_queued = 16, .step_tokens = 24, .max_idle = 0});
  GenerationRequest r = request(prompt, 5);
  r.n = 3;
  const Choices c = collect_choices(*scheduler.submit(r));
  EXPECT_EQ(c.prefilled, 1);
  const std::vector<int> expected = alone(prompt, 5);
  for (const Outcome& o : c.choices) {
    EXPECT_EQ(o.finish, FinishKind::Length);
    EXPECT_EQ(o.tokens, expected);
  }
  const SchedulerStats st = scheduler.stats();
  EXPECT_EQ(st.prompt_tokens, 50);
  EXPECT_EQ(st.prefill_tokens, 49 + 3);  // the prompt once, its last token once per choice
  EXPECT_EQ(st.decode_tokens, 3 * 5);
}

// Sampled choices: each samples on its own, with the seed choice_seed gives it — choice k's
// tokens are those of a lone request of that seed — so a seeded request's choices are
// reproducible, and they differ from one another.
TEST_F(SchedulerTest, SampledChoicesHaveSeedsOfTheirOwn) {
  const std::vector<int> prompt = slice(10, 20);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr);
  auto seeded = [&](uint64_t seed, int n) {
    GenerationRequest r = request(prompt, 8);
    r.sampling.temperature = 1;
    r.sampling.seed = seed;
    r.n = n;
    return collect_choices(*scheduler.submit(r));
  };
  const Choices three = seeded(42, 3);
  EXPECT_EQ(choice_seed(42, 0), 42u);
  for (int k = 0; k < 3; ++k) {
    const Choices lone = seeded(choice_seed(42, k), 1);
    EXPECT_EQ(three.choices[size_t(k)].tokens, lone.choices[0].tokens) << "choice " << k;
  }
  EXPECT_NE(three.choices[0].tokens, three.choices[1].tokens);
  EXPECT_NE(three.choices[1].tokens, three.choices[2].tokens);
  // Seed 0 too, when the client chose it (an API request's "seed": 0; unseeded, 0 draws a fresh one).
  auto zero = [&] {
    GenerationRequest r = request(prompt, 8);
    r.sampling.temperature = 1;
    r.seeded = true;
    return collect(*scheduler.submit(r)).tokens;
  };
  EXPECT_EQ(zero(), zero());
  const Choices again = seeded(42, 3);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(again.choices[size_t(k)].tokens, three.choices[size_t(k)].tokens) << "choice " << k;
  EXPECT_NE(choice_seed(42, 1), choice_seed(43, 1));
}

// One choice cancelled (its stop string found) ends alone; the others run on. A request's choices
// take that many batch slots: one of more than max_running is refused, and two that together
// exceed it run one after the other, each choice still the lone greedy reply.
TEST_F(SchedulerTest, ChoicesEndAloneAndTakeBatchSlots) {
  const std::vector<int> prompt = slice(0, 30);
  const std::vector<int> expected = alone(prompt, 6);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr,
                      SchedulerOptions{.max_running = 3, .max_queued = 16, .step_tokens = 256, .max_idle = 0});
  GenerationRequest r = request(prompt, 6);
  r.n = 4;
  EXPECT_THROW(scheduler.submit(r), Error);
  r.n = 2;
  std::shared_ptr<Generation> first = scheduler.submit(r), second = scheduler.submit(r);
  first->cancel(1);
  const Choices one = collect_choices(*first), two = collect_choices(*second);
  EXPECT_EQ(one.choices[0].finish, FinishKind::Length);
  EXPECT_EQ(one.choices[0].tokens, expected);
  EXPECT_EQ(one.choices[1].finish, FinishKind::Cancelled);
  for (const Outcome& o : two.choices) EXPECT_EQ(o.tokens, expected);
  EXPECT_EQ(scheduler.stats().cancelled, 1);
}

// Each choice is kept for its continuation: the next turn of a conversation that took choice 1's
// reply continues choice 1's sequence on the device.
TEST_F(SchedulerTest, EachChoiceIsKeptForItsContinuation) {
  KvCache cache(model->config(), cache_options(Mode::Default));
  Scheduler scheduler(executor, &tokenizer, Mode::Default, &cache);
  std::vector<int> conversation = slice(0, 100);
  GenerationRequest r = request(conversation, 5);
  r.n = 2;
  r.sampling.temperature = 1;
  r.sampling.seed = 5;
  const Choices c = collect_choices(*scheduler.submit(r));
  ASSERT_NE(c.choices[0].tokens, c.choices[1].tokens);
  conversation.insert(conversation.end(), c.choices[1].tokens.begin(), c.choices[1].tokens.end());
  const std::vector<int> more = slice(150, 20);
  conversation.insert(conversation.end(), more.begin(), more.end());
  const Outcome two = collect(*scheduler.submit(request(conversation, 3)));
  EXPECT_EQ(two.use.device_tokens, 100 + 5 - 1);  // choice 1's sequence: its last reply token was never run
  EXPECT_EQ(two.use.computed(), 21);
}

namespace {

// A row's log-softmax at `token`, in double: the test's own, not score()'s.
double log_softmax(const float* row, int64_t vocab, int token) {
  const double top = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - top);
  return double(row[token]) - top - std::log(sum);
}

// A request's PromptToken events, each checked to come once, in order, before any Token; choice
// 0's tokens into `reply` if given.
std::vector<TokenChoice> prompt_scores(Generation& g, std::vector<int>* reply = nullptr) {
  std::vector<TokenChoice> scores;
  bool tokens = false;
  for (int left = g.request.n; left > 0;) {
    GenerationEvent e = g.next();
    if (e.kind == GenerationEvent::Kind::PromptToken) {
      EXPECT_FALSE(tokens) << "a prompt token after a reply token";
      EXPECT_EQ(e.position, int64_t(scores.size()) + 1);
      EXPECT_EQ(e.token.token, g.request.prompt[size_t(e.position)]);
      scores.push_back(e.token);
    }
    if (e.kind == GenerationEvent::Kind::Token) {
      tokens = true;
      if (reply && e.choice == 0) reply->push_back(e.token.token);
    }
    if (e.kind == GenerationEvent::Kind::Finished) {
      EXPECT_EQ(e.finish, FinishKind::Length);
      --left;
    }
  }
  return scores;
}

}  // namespace

// Prompt logprobs against DeepSeek's reference: the fixture's recorded logits of every row of
// prompt0's prefill (model.py's), in both modes (every prompt row runs the decoder) and in chunks
// of 2 (the prompt's last token apart). Tolerance: the CPU forward holds v41-tiny's logits to the
// reference's within 1e-5 (forward_parity_test; prompt0 has no near-tied choice); a log-softmax
// moves by at most twice the largest change of its logits, and score() rounds in fp32 at
// magnitudes ~1 (~1e-7): 5e-5.
TEST_F(SchedulerTest, PromptLogprobsAreTheReferencesLogSoftmax) {
  const Expected ex("v41-tiny");
  const std::vector<int64_t> ids = ex.ints("prompt0.tokens");
  const std::vector<float> reference = ex.floats("prompt0.prefill.logits");
  const int64_t V = model->config().vocab_size, vocab = sampling_vocab(model->config(), &tokenizer);
  for (Mode mode : {Mode::Default, Mode::Exact}) {
    SCOPED_TRACE(mode_name(mode));
    Scheduler scheduler(executor, &tokenizer, mode, nullptr,
                        SchedulerOptions{.max_running = 4, .max_queued = 16, .step_tokens = 2, .max_idle = 0});
    GenerationRequest r = request(std::vector<int>(ids.begin(), ids.end()), 2);
    r.prompt_logprobs = 3;
    const std::vector<TokenChoice> scores = prompt_scores(*scheduler.submit(r));
    ASSERT_EQ(scores.size(), ids.size() - 1);
    for (size_t p = 1; p < ids.size(); ++p) {
      const float* row = reference.data() + (p - 1) * size_t(V);
      EXPECT_NEAR(scores[p - 1].logprob, log_softmax(row, vocab, int(ids[p])), 5e-5) << "position " << p;
      ASSERT_EQ(scores[p - 1].top.size(), 3u);
      const int best = int(std::max_element(row, row + vocab) - row);
      EXPECT_EQ(scores[p - 1].top[0].first, best) << "position " << p;
      EXPECT_NEAR(scores[p - 1].top[0].second, log_softmax(row, vocab, best), 5e-5) << "position " << p;
    }
  }
}

// A longer prompt with n = 2, in default mode: the prompt scored once, each row's logprob that of
// one call of the executor over the prompt's first P - 1 tokens with every row's logits and the
// decoder on every row (the CPU executor's forward() on the CPU) — the scheduler's own first chunk
// under this budget, so the logits are bit for bit those, and the only difference is score()'s
// fp32 log-softmax against this test's double one (1e-5 at these magnitudes). The reply is the
// exact-mode one (the prompt ran as exact mode runs it). Such a sequence's KV is not default
// mode's: nothing of it is stored, nor kept for a continuation; in exact mode it is (the next turn
// continues a choice's sequence on the device).
TEST_F(SchedulerTest, PromptLogprobsRunTheDecoderOnEveryRow) {
  const std::vector<int> prompt = slice(0, 40);
  const Config& c = model->config();
  const int64_t V = c.vocab_size, vocab = sampling_vocab(c, &tokenizer), P = int64_t(prompt.size());
  std::vector<int64_t> engram;
  if (const auto hasher = engram_hasher(c, &tokenizer)) {
    engram.resize(size_t(P - 1) * size_t(hasher->n_layers() * hasher->columns()));
    EngramHistory history;
    hasher->hash(std::span(prompt).first(size_t(P - 1)), {}, history, engram.data());
  }
  std::unique_ptr<Sequence> sequence = executor.new_sequence();
  BatchItem item{sequence.get(), std::span(prompt).first(size_t(P - 1)), engram.empty() ? nullptr : engram.data()};
  item.options.all_logits = true;
  const std::vector<float> rows = executor.forward_batch({item}).front();
  ASSERT_EQ(int64_t(rows.size()), (P - 1) * V);

  for (Mode mode : {Mode::Default, Mode::Exact}) {
    SCOPED_TRACE(mode_name(mode));
    KvCache cache(c, cache_options(mode));
    Scheduler scheduler(executor, &tokenizer, mode, &cache,
                        SchedulerOptions{.max_running = 4, .max_queued = 16, .step_tokens = 4096, .max_idle = 8});
    GenerationRequest r = request(prompt, 4);
    r.prompt_logprobs = 0;
    r.n = 2;
    std::vector<int> reply;
    const std::vector<TokenChoice> scores = prompt_scores(*scheduler.submit(r), &reply);
    ASSERT_EQ(int64_t(scores.size()), P - 1);
    for (int64_t p = 1; p < P; ++p) {
      EXPECT_NEAR(scores[size_t(p - 1)].logprob, log_softmax(rows.data() + (p - 1) * V, vocab, prompt[size_t(p)]), 1e-5) << p;
      EXPECT_TRUE(scores[size_t(p - 1)].top.empty());
    }
    EXPECT_EQ(reply, alone(prompt, 4, Mode::Exact));
    std::vector<int> next = prompt;
    next.insert(next.end(), reply.begin(), reply.end());
    next.push_back(prompt[0]);
    const Outcome turn = collect(*scheduler.submit(request(next, 2)));
    if (mode == Mode::Default) {
      EXPECT_EQ(turn.use.cached(), 0) << "nothing of the prompt-logprobs request was kept";
      EXPECT_EQ(cache.stats().host.blocks, 0);
    } else {
      EXPECT_EQ(turn.use.device_tokens, P + 4 - 1) << "a choice of the prompt-logprobs request continued";
    }
  }
}
