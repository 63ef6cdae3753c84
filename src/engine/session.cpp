#include "engine/session.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "forward/call_plan.h"
#include "kv/sequence_blocks.h"
#include "model/engram_compress.h"

namespace dsv41 {

const char* mode_name(Mode mode) { return mode == Mode::Exact ? "exact" : "default"; }

int64_t sampling_vocab(const Config& config, const Tokenizer* tokenizer) {
  return tokenizer ? std::min<int64_t>(config.vocab_size, tokenizer->vocab_size()) : config.vocab_size;
}

std::shared_ptr<const EngramHasher> engram_hasher(const Config& c, const Tokenizer* tokenizer) {
  if (!c.has_engram()) return nullptr;
  if (!tokenizer)
    fail(c.source, "a tokenizer.json beside a model with Engram (it defines the hashed vocabulary)", "none");
  EngramVocabulary vocab = engram_compress_vocabulary(*tokenizer);
  return std::make_shared<const EngramHasher>(c, std::move(vocab.token_map));
}

Session::Session(Executor& executor, const Tokenizer* tokenizer, Mode mode)
    : Session(executor, engram_hasher(executor.model().config(), tokenizer), mode) {}

Session::Session(Executor& executor, std::shared_ptr<const EngramHasher> hasher, Mode mode)
    : executor_(executor), mode_(mode), kv_(executor.new_sequence()), hasher_(std::move(hasher)) {
  if (model().config().has_engram() && !hasher_)
    fail(model().config().source, "an Engram hasher for a model with Engram", "none");
}

Session::Session(const Model& model, const Tokenizer* tokenizer, Mode mode)
    : Session(model, engram_hasher(model.config(), tokenizer), mode) {}

Session::Session(const Model& model, std::shared_ptr<const EngramHasher> hasher, Mode mode)
    : own_executor_(std::make_unique<CpuExecutor>(model)),
      executor_(*own_executor_),
      mode_(mode),
      kv_(executor_.new_sequence()),
      hasher_(std::move(hasher)) {
  if (model.config().has_engram() && !hasher_)
    fail(model.config().source, "an Engram hasher for a model with Engram", "none");
}

Session::Call Session::append(std::span<const int> tokens, int64_t decoder_from) {
  const size_t at = tokens_.size();
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  Call call;
  call.tokens = std::span<const int>(tokens_).subspan(at);
  if (hasher_) {
    call.engram_ids.resize(tokens.size() * size_t(hasher_->n_layers() * hasher_->columns()));
    const std::vector<uint8_t> marks = span_marks(images_, int64_t(at), int64_t(tokens.size()));
    hasher_->hash(call.tokens, marks, history_, call.engram_ids.data());
  }
  call.options.decoder_from = decoder_from;
  return call;
}

void Session::start_over(std::span<const int> tokens, SequenceState state) {
  const int64_t floor = state.decoder_window_floor;
  kv_->assign(std::move(state));
  started_over(tokens, floor);
}

void Session::start_over(std::span<const int> tokens, const StateView& view) {
  kv_->restore(view);
  started_over(tokens, view.decoder_window_floor);
}

void Session::started_over(std::span<const int> tokens, int64_t decoder_floor) {
  pending_ = Call{};
  cursor_ = 0;
  tokens_.assign(tokens.begin(), tokens.end());
  decoder_floor_ = decoder_floor;
  if (hasher_) history_ = hasher_->history_after(tokens, span_marks(images_, 0, int64_t(tokens.size())));
  stored_blocks_ = 0;
  kv_of_mode_ = true;
}

// A prompt segment of n tokens ending at `end`: default mode runs the decoder on its last
// min(W, n) positions only.
static int64_t prompt_decoder_from(Mode mode, int64_t end, int64_t n, int64_t W) {
  return mode == Mode::Default ? default_prompt_decoder_from(end, n, W) : 0;
}

void Session::start_call(Call call, KvCache* cache) {
  // (An exact replay's truncation at its start is no floor: no window past the hit reaches it.)
  decoder_floor_ = std::max(decoder_floor_, call.options.decoder_rows_from());
  pending_ = std::move(call);
  cursor_ = 0;
  prompt_cache_ = cache;
}

std::vector<float> Session::run_alone(const BatchItem& item) {
  std::vector<float> logits = std::move(executor_.forward_batch({item}).front());
  ran();
  return logits;
}

void Session::check_cache(const KvCache& cache) const {
  if (cache.mode() != mode_name(mode_))
    fail("KV cache", std::string("a cache of ") + mode_name(mode_) + "-mode sequences", cache.mode() + "-mode");
}

void Session::adopt_images(std::span<const PromptImage> images) {
  std::vector<std::shared_ptr<const std::vector<float>>> encoded(images.size());
  for (size_t i = 0; i < images.size() && i < images_.size() && images_[i].key() == images[i].key(); ++i) encoded[i] = encoded_[i];
  images_.assign(images.begin(), images.end());
  encoded_ = std::move(encoded);
}

bool Session::extends(std::span<const int> prompt, std::span<const PromptImage> images) const {
  const size_t L = tokens_.size();
  if (L == 0 || L >= prompt.size() || !std::equal(tokens_.begin(), tokens_.end(), prompt.begin())) return false;
  // The same images at the same places on the shared positions (the sequence's are all before L).
  const size_t shared = size_t(std::count_if(images.begin(), images.end(), [&](const PromptImage& im) { return im.start < int64_t(L); }));
  if (shared != images_.size()) return false;
  for (size_t i = 0; i < shared; ++i)
    if (!(images[i].key() == images_[i].key())) return false;
  return true;
}

const float* const* Session::span_rows(int64_t rows) {
  const int64_t first = length(), end = first + rows;
  std::vector<size_t> touched, todo;
  for (size_t i = 0; i < images_.size(); ++i)
    if (images_[i].start < end && images_[i].end() > first) {
      touched.push_back(i);
      if (!encoded_[i]) todo.push_back(i);
    }
  if (touched.empty()) return nullptr;
  if (!executor_.takes_images())
    fail(executor_.name() + " executor", "an executor with the vision tower for images (the CPU and CUDA executors)",
         "a prompt with images");
  // The vision tower on every image these rows need and that is not encoded yet, in one call.
  if (!todo.empty()) {
    std::vector<VisionImage> in;
    for (size_t i : todo) {
      const ImageInput& im = *images_[i].image;
      in.push_back(VisionImage{im.patches.data(), im.plan.n_vit_h, im.plan.n_vit_w});
    }
    std::vector<std::vector<float>> out = executor_.encode_images(in);
    const int64_t d = model().config().dim;
    for (size_t k = 0; k < todo.size(); ++k) {
      const ImagePlan& plan = images_[todo[k]].image->plan;
      if (int64_t(out[k].size()) != plan.image_tokens() * d)
        fail("encode_images", std::to_string(plan.image_tokens()) + " aligner rows of " + std::to_string(d) + " values",
             std::to_string(out[k].size()) + " values");
      encoded_[todo[k]] = std::make_shared<const std::vector<float>>(std::move(out[k]));
    }
    work_.images_encoded += int64_t(todo.size());
  }
  // Each span position's embedding (image_processor.py's layout: IMAGE_START, n_llm_h rows of
  // n_llm_w IMAGE and one IMAGE_NEW_LINE, IMAGE_END; the IMAGE slots take the aligner rows in order).
  const Model::ImageDelimiters& delimiters = model().image_delimiters();
  const int64_t d = model().config().dim;
  span_rows_.assign(size_t(rows), nullptr);
  for (size_t i : touched) {
    const PromptImage& im = images_[i];
    const int64_t w = im.image->plan.n_llm_w, span = im.image->plan.span_tokens();
    for (int64_t p = std::max(im.start, first); p < std::min(im.end(), end); ++p) {
      const int64_t o = p - im.start;
      const float*& row = span_rows_[size_t(p - first)];
      if (o == 0) {
        row = delimiters.start.data();
      } else if (o == span - 1) {
        row = delimiters.end.data();
      } else {
        const int64_t line = (o - 1) / (w + 1), column = (o - 1) % (w + 1);
        row = column == w ? delimiters.newline.data() : encoded_[i]->data() + (line * w + column) * d;
      }
    }
  }
  return span_rows_.data();
}

std::vector<float> Session::prefill(std::span<const int> tokens, std::span<const PromptImage> images) {
  if (!images.empty()) {
    // The new images are checked with the sequence's: in order, after them, inside the new tokens.
    std::vector<int> all(tokens_);
    all.insert(all.end(), tokens.begin(), tokens.end());
    std::vector<PromptImage> placed(images_);
    placed.insert(placed.end(), images.begin(), images.end());
    for (const PromptImage& im : images)
      if (im.start < int64_t(tokens_.size()))
        fail("prefill", "images inside the new tokens (from position " + std::to_string(tokens_.size()) + ")",
             "one at " + std::to_string(im.start));
    check_images(all, placed, model().config());
    adopt_images(placed);
  }
  const int64_t end = length() + int64_t(tokens.size());
  start_call(append(tokens, prompt_decoder_from(mode_, end, int64_t(tokens.size()), model().config().window_size)), nullptr);
  return run_alone(next_chunk(int64_t(tokens.size())));
}

std::vector<float> Session::decode(int token) { return run_alone(next_decode(token)); }

void Session::resume(std::span<const int> tokens, SequenceState state, std::span<const PromptImage> images) {
  if (state.length != int64_t(tokens.size()))
    fail("resume", "the tokens of the restored state (" + std::to_string(state.length) + ")",
         std::to_string(tokens.size()) + " tokens");
  check_images(tokens, images, model().config());
  adopt_images(images);
  start_over(tokens, std::move(state));
}

Session::Call Session::plan(std::span<const int> prompt, KvCache* cache, PrefixUse& use, std::optional<int64_t> continuation,
                            bool prompt_logits, std::span<const PromptImage> images) {
  const Config& c = model().config();
  const int64_t P = int64_t(prompt.size()), W = c.window_size;
  // Where the decoder starts on the segment of n new tokens: bounded replay's cut for a prompt,
  // the stopped sequence's floor for a continuation.
  auto decoder_from = [&](int64_t n) { return continuation ? *continuation : prompt_decoder_from(mode_, P, n, W); };
  if (P == 0) fail("prompt", "at least one token", "none");
  for (int t : prompt)
    if (t < 0 || t >= c.vocab_size) fail("prompt", "token ids in [0, " + std::to_string(c.vocab_size) + ")", std::to_string(t));
  check_images(prompt, images, c);
  if (!images.empty() && !executor_.takes_images())
    fail(executor_.name() + " executor", "an executor with the vision tower for images (the CPU and CUDA executors)",
         "a prompt with images");
  if (cache) check_cache(*cache);
  use = PrefixUse{};
  use.prompt_tokens = P;
  if (prompt_logits) {
    start_over({}, SequenceState(c));
    adopt_images(images);
    kv_of_mode_ = mode_ == Mode::Exact;
    Call call = append(prompt, 0);
    call.prompt_logits = true;
    return call;
  }

  // The running sequence: continue it when the prompt extends it.
  // (A prompt that failed half way leaves tokens the state never ran: such a state starts over.)
  const int64_t L = int64_t(tokens_.size());
  if (L == length() && extends(prompt, images)) {
    use.device_tokens = L;
    adopt_images(images);
    return append(prompt.subspan(size_t(L)), decoder_from(P - L));
  }
  start_over({}, SequenceState(c));
  adopt_images(images);
  if (!cache) return append(prompt, decoder_from(P));

  // The blocks the tiers hold, leaving the last token to run.
  const int B = cache->block_tokens();
  const std::vector<ImageSpanKey> keys = image_keys(images);
  BlockRun run = cache->find_blocks(prompt, (P - 1) / B, keys);  // run.keys name the found blocks
  const int64_t H = run.tokens(B);
  auto count_blocks = [&](int64_t blocks) {
    for (int64_t b = 0; b < blocks; ++b) (run.from_disk[size_t(b)] ? use.disk_blocks : use.host_blocks) += 1;
  };

  // A global hit is adopted with a replay of its last R positions: the encoder's W in default
  // mode, every layer's exact_replay_rows in exact mode.
  const int64_t R = mode_ == Mode::Default ? W : exact_replay_rows(c);
  // An SWA tail continues exactly from any position whose complete blocks were found; one at or
  // before H - R is not worth it: replaying from H costs less than computing from there.
  const int64_t lo = std::max<int64_t>(1, H - R + 1);
  if (auto tail = cache->find_tail(prompt, run.keys, lo, std::min(P - 1, H + B - 1), keys)) {
    const int64_t n = tail->position, blocks = n / B;
    const std::vector<Bytes> payloads = run.payloads(size_t(blocks));
    start_over(prompt.first(size_t(n)), view_sequence(c, payloads, B, &tail->snapshot->tail));
    stored_blocks_ = blocks;
    use.swa_tokens = n;
    count_blocks(blocks);
    return append(prompt.subspan(size_t(n)), decoder_from(P - n));
  }

  // A global hit: the replay over [H - R, H), adopted only past R positions.
  if (H > R) {
    const std::vector<Bytes> payloads = run.payloads(run.blocks.size());
    StateView view = view_sequence(c, payloads, B);
    view.length = H - R;
    start_over(prompt.first(size_t(H - R)), view);
    stored_blocks_ = H / B;
    use.global_tokens = H;
    use.replayed = R;
    count_blocks(H / B);
    Call call = append(prompt.subspan(size_t(H - R)), decoder_from(P));
    call.options.replay_until = H;
    call.options.exact_replay = mode_ == Mode::Exact;
    return call;
  }
  use.short_hit = H;
  return append(prompt, decoder_from(P));
}

PrefixUse Session::begin_prompt(std::span<const int> prompt, KvCache* cache, std::optional<int64_t> continuation,
                                bool prompt_logits, std::span<const PromptImage> images) {
  PrefixUse use;
  start_call(plan(prompt, cache, use, continuation, prompt_logits, images), cache);
  return use;
}

BatchItem Session::item(int64_t from, int64_t rows, ForwardOptions options) {
  const int64_t per_token = hasher_ ? int64_t(hasher_->n_layers()) * hasher_->columns() : 0;
  options.span_embeddings = span_rows(rows);
  handed_ = rows;
  handed_options_ = options;
  BatchItem item{kv_.get(), pending_.tokens.subspan(size_t(from), size_t(rows)),
                 hasher_ ? pending_.engram_ids.data() + from * per_token : nullptr, options};
  item.drafter_context = drafting_;  // the drafter's context: the features of the rows the decoder runs
  return item;
}

BatchItem Session::next_chunk(int64_t max_tokens) {
  if (prompt_left() == 0) fail("next_chunk", "a prompt with tokens left to run", "none");
  const int64_t start = length();
  int64_t rows = std::min(std::max<int64_t>(max_tokens, 1), prompt_left());
  ForwardOptions options = pending_.options;
  // The replay reads the cached global KV up to H: the call that regenerates [H - W, H) must
  // reach H. Later chunks run as any prompt's, the encoder's windows still cut where it began.
  if (options.replay_until > start)
    rows = std::max(rows, options.replay_until - start);
  else
    options.replay_until = 0;
  if (pending_.prompt_logits && prompt_left() > 1) {  // every row's logits, the last token's row apart
    rows = std::min(rows, prompt_left() - 1);
    options.all_logits = true;
  }
  return item(cursor_, rows, options);
}

BatchItem Session::next_decode(int token) {
  if (prompt_left() > 0) fail("next_decode", "a finished prompt", std::to_string(prompt_left()) + " prompt tokens left");
  start_call(append(std::span<const int>(&token, 1), 0), nullptr);
  return item(0, 1, pending_.options);
}

void Session::ran() {
  const int64_t end = length(), start = end - handed_;
  const int64_t decoder_from = handed_options_.decoder_rows_from();
  work_.encoder_tokens += handed_;
  work_.decoder_tokens += end - std::clamp(decoder_from, start, end);
  cursor_ += handed_;
  handed_ = 0;
}

void Session::enable_drafting() {
  const Config& c = model().config();
  if (!c.has_dspark()) fail(c.source, "a model with DSpark stages for speculative decoding", "none");
  if (!executor_.speculates())
    fail(executor_.name() + " executor", "speculative decoding (DSpark) on an executor that has it (cpu, cuda)", executor_.name());
  if (length() > 0)
    fail("enable_drafting", "a session before its first token (the drafter's context starts there)", std::to_string(length()) + " tokens run");
  drafting_ = true;
}

void Session::check_drafts() const {
  if (!drafting_) fail("speculate", "a session with drafting on (enable_drafting)", "drafting off");
  if (prompt_left() > 0) fail("speculate", "a finished prompt", std::to_string(prompt_left()) + " prompt tokens left");
}

void Session::check_draft(const Draft& d, int anchor) const {
  const Config& c = model().config();
  if (d.tokens.empty() || d.tokens.front() != anchor) fail("speculate", "a draft that starts with its anchor", "another draft");
  for (int t : d.tokens)
    if (t < 0 || t >= c.vocab_size) fail("speculate", "draft tokens in [0, " + std::to_string(c.vocab_size) + ")", std::to_string(t));
}

Draft Session::draft(int anchor, Verifier& verifier, const Drafter& drafter) {
  if (!drafter) {
    Session* self = this;
    Verifier* v = &verifier;
    return std::move(draft_together(std::span(&self, 1), std::span(&anchor, 1), std::span(&v, 1)).front());
  }
  check_drafts();
  Draft d = drafter(anchor);
  check_draft(d, anchor);
  return d;
}

std::vector<Draft> Session::draft_together(std::span<Session* const> sessions, std::span<const int> anchors,
                                           std::span<Verifier* const> verifiers) {
  if (anchors.size() != sessions.size() || verifiers.size() != sessions.size())
    fail("speculate", "an anchor and a verifier per session", std::to_string(anchors.size()) + " anchors and " +
                                                                   std::to_string(verifiers.size()) + " verifiers for " +
                                                                   std::to_string(sessions.size()) + " sessions");
  if (sessions.empty()) return {};
  Executor& executor = sessions.front()->executor_;
  // A greedy verifier's drafts are chosen where the executor holds the rows; the others' by the
  // verifier, on the rows brought back.
  std::vector<DraftChoice> choices;
  choices.reserve(sessions.size());
  std::vector<DraftRequest> requests;
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    if (&s.executor_ != &executor) fail("speculate", "sessions of one executor", s.executor_.name() + " beside " + executor.name());
    s.check_drafts();
    Verifier* v = verifiers[i];
    const DraftChoice* choose = nullptr;
    if (!v->greedy()) choose = &choices.emplace_back([v](std::span<const float> row) { return v->draft(row); });
    requests.push_back(DraftRequest{s.kv_.get(), anchors[i], choose});
  }
  std::vector<Draft> drafts = executor.dspark_drafts(requests);
  if (drafts.size() != sessions.size())
    fail(executor.name() + " executor", std::to_string(sessions.size()) + " drafts", std::to_string(drafts.size()));
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->check_draft(drafts[i], anchors[i]);
  return drafts;
}

BatchItem Session::begin_verify(const Draft& drafted, int length, const SampleRequest* row_choice) {
  const int64_t G = int64_t(drafted.tokens.size()) - 1, V = model().config().vocab_size;
  if (length < 0 || length > G) fail("verify", "a length from 0 to the draft's " + std::to_string(G), std::to_string(length));
  if (verifying_) fail("verify", "one pass at a time (end_verify before the next begin_verify)", "a pass under way");
  // The draft's first `length` tokens, with their rows where it has them.
  Verifying v;
  v.draft.tokens.assign(drafted.tokens.begin(), drafted.tokens.begin() + 1 + length);
  if (!drafted.logits.empty())
    v.draft.logits.assign(drafted.logits.begin(), drafted.logits.begin() + std::min<int64_t>(length * V, int64_t(drafted.logits.size())));
  if (!drafted.confidence.empty())
    v.draft.confidence.assign(drafted.confidence.begin(),
                              drafted.confidence.begin() + std::min<int64_t>(length, int64_t(drafted.confidence.size())));
  v.position = this->length();
  const int64_t rows = int64_t(v.draft.tokens.size());
  v.before = executor_.mark(*kv_, rows);
  v.tokens_before = tokens_.size();
  v.history_before = history_;
  verifying_ = std::move(v);
  // The pass: every row's logits; row k follows draft token k.
  start_call(append(verifying_->draft.tokens, 0), nullptr);
  ForwardOptions options = pending_.options;
  options.all_logits = true;
  BatchItem pass = item(0, rows, options);
  if (row_choice) {
    verifying_->choices.resize(size_t(rows));
    pass.sample = row_choice;
    pass.choice = verifying_->choices.data();
  }
  return pass;
}

Session::Speculation Session::end_verify(const std::vector<float>& logits, Verifier& verifier, std::optional<BatchItem>& redo) {
  if (!verifying_) fail("end_verify", "a pass begun by begin_verify", "none");
  if (handed_ != 0) fail("end_verify", "the pass booked by ran()", std::to_string(handed_) + " rows handed out");
  Verifying v = std::move(*verifying_);
  verifying_.reset();
  Speculation s;
  s.position = v.position;
  s.draft = v.draft.tokens;
  const int64_t rows = int64_t(s.draft.size());
  std::vector<int> chosen;
  for (const TokenChoice& c : v.choices) chosen.push_back(c.token);
  const Verifier::Verdict verdict = v.choices.empty() ? verifier.verify(logits, v.draft) : verifier.verify_choices(chosen, v.draft);
  s.accepted = verdict.accepted;
  s.emitted.assign(s.draft.begin() + 1, s.draft.begin() + 1 + s.accepted);
  s.emitted.push_back(verdict.token);
  redo.reset();
  if (s.accepted < rows - 1) {
    executor_.rewind(*kv_, v.before);
    tokens_.resize(v.tokens_before);
    history_ = v.history_before;
    start_call(append(std::span<const int>(s.draft).first(size_t(s.accepted) + 1), 0), nullptr);
    redo = item(0, s.accepted + 1, pending_.options);
  }
  return s;
}

Session::Speculation Session::verify(const Draft& drafted, int length, Verifier& verifier) {
  const std::vector<float> logits = run_alone(begin_verify(drafted, length, verifier.row_choice()));
  std::optional<BatchItem> redo;
  Speculation s = end_verify(logits, verifier, redo);
  if (redo) run_alone(*redo);
  return s;
}

Session::Speculation Session::speculate(int anchor, Verifier& verifier, const Drafter& drafter) {
  const Draft d = draft(anchor, verifier, drafter);
  return verify(d, int(d.tokens.size()) - 1, verifier);
}

std::unique_ptr<Session> Session::fork() const {
  if (handed_ != 0) fail("fork", "a session between calls", std::to_string(handed_) + " rows handed out and not booked by ran()");
  auto f = std::make_unique<Session>(executor_, hasher_, mode_);
  f->kv_->assign(kv_->host());
  f->tokens_ = tokens_;
  f->history_ = history_;
  f->images_ = images_;
  f->encoded_ = encoded_;
  // The prompt's blocks are this session's to store (store_prompt): the fork's own begin after them.
  f->stored_blocks_ = prompt_cache_ ? int64_t(tokens_.size()) / prompt_cache_->block_tokens() : stored_blocks_;
  f->decoder_floor_ = decoder_floor_;
  f->kv_of_mode_ = kv_of_mode_;
  f->pending_ = pending_;
  f->pending_.tokens = std::span<const int>(f->tokens_).last(pending_.tokens.size());  // a suffix of tokens_, as here
  f->cursor_ = cursor_;
  f->handed_options_ = handed_options_;
  f->drafting_ = drafting_;
  return f;
}

void Session::store_prompt() {
  if (prompt_left() > 0 || !prompt_cache_) return;
  KvCache& cache = *prompt_cache_;
  prompt_cache_ = nullptr;
  save(cache);
}

std::vector<float> Session::prefill_prompt(std::span<const int> prompt, KvCache* cache, PrefixUse* use,
                                           std::span<const PromptImage> images) {
  Session* self = this;
  std::vector<PrefixUse> uses;
  std::vector<std::vector<float>> logits =
      prefill_prompts(std::span(&self, 1), std::span(&prompt, 1), cache, use ? &uses : nullptr, std::span(&images, 1));
  if (use) *use = uses.front();
  return std::move(logits.front());
}

void Session::save(KvCache& cache) {
  check_cache(cache);
  if (length() == 0 || !kv_of_mode_) return;
  const StateView state = kv_->saved(stored_blocks_ * cache.block_tokens());
  const std::vector<ImageSpanKey> keys = image_keys(images_);
  cache.store_blocks(tokens_, state, stored_blocks_, keys);
  stored_blocks_ = state.length / cache.block_tokens();
  cache.store_tail(tokens_, state, keys);
}

std::vector<std::vector<float>> prefill_prompts(std::span<Session* const> sessions,
                                                std::span<const std::span<const int>> prompts, KvCache* cache,
                                                std::vector<PrefixUse>* uses,
                                                std::span<const std::span<const PromptImage>> images) {
  if (sessions.size() != prompts.size() || (!images.empty() && images.size() != prompts.size()))
    fail("prefill_prompts", std::to_string(sessions.size()) + " prompts and image lists, one per session",
         std::to_string(prompts.size()) + " and " + std::to_string(images.size()));
  std::vector<PrefixUse> use;
  std::vector<BatchItem> batch;
  for (size_t i = 0; i < sessions.size(); ++i)
    use.push_back(sessions[i]->begin_prompt(prompts[i], cache, std::nullopt, false, images.empty() ? std::span<const PromptImage>{} : images[i]));
  for (Session* s : sessions) batch.push_back(s->next_chunk(s->prompt_left()));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> logits = run_batch(sessions, batch);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Session* s : sessions) s->ran(), s->store_prompt();
  if (cache) cache->count(tally(use, cache->block_tokens(), seconds));
  if (uses) *uses = std::move(use);
  return logits;
}

KvCacheCounters tally(std::span<const PrefixUse> uses, int64_t block_tokens, double seconds) {
  KvCacheCounters counted;
  for (const PrefixUse& u : uses) {
    counted.device_tokens += u.device_tokens;
    counted.host_tokens += u.host_blocks * block_tokens;
    counted.disk_tokens += u.disk_blocks * block_tokens;
    counted.swa_tokens += u.swa_tokens;
    counted.replayed_tokens += u.replayed;
    counted.short_hits += u.short_hit > 0;
  }
  if (counted.replayed_tokens > 0) counted.replay_seconds = seconds;
  return counted;
}

std::vector<std::vector<float>> run_batch(std::span<Session* const> sessions, const std::vector<BatchItem>& batch) {
  if (sessions.empty()) return {};
  Executor& executor = sessions.front()->executor();
  for (Session* s : sessions)
    if (&s->executor() != &executor) fail("run_batch", "sessions of one executor", "sessions of several");
  return executor.forward_batch(batch);
}

}  // namespace dsv41
