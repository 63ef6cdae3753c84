#include "forward/executor.h"

#include <algorithm>

#include "backend/cpu/sampling.h"
#include "base/error.h"

namespace dsv41 {

namespace {

class CpuSequence final : public Sequence {
 public:
  CpuSequence(const Config& config, GlobalKvFormat global_kv) : config_(config), state_(config) { state_.global_kv = global_kv; }
  int64_t length() const override { return state_.length; }
  const SequenceState& host() override { return state_; }
  // A state keeps the sequence's global KV format: a fresh one (no entries) takes it, one holding
  // entries of another format is refused.
  void assign(SequenceState state) override {
    if (state.global_kv != state_.global_kv)
      for (const auto& [layer, cache] : state.compressed)
        if (cache.entries > 0)
          fail("CpuSequence::assign", std::string("global KV entries in ") + global_kv_format_name(state_.global_kv),
               std::string(global_kv_format_name(state.global_kv)) + " ones");
    state.global_kv = state_.global_kv;
    state_ = std::move(state);
  }
  void restore(const StateView& view) override {
    tiers_format();
    state_ = materialize(config_, view);
  }
  StateView saved(int64_t) override {
    tiers_format();
    return view_of(state_);
  }
  SequenceState& state() { return state_; }

 private:
  // The KV tiers hold KV-FP4 entries only.
  void tiers_format() const {
    if (state_.global_kv != GlobalKvFormat::Fp4)
      fail("KV tiers", "a sequence with KV-FP4 global KV", global_kv_format_name(state_.global_kv));
  }
  const Config& config_;
  SequenceState state_;
};

}  // namespace

void check_sample(const BatchItem& item, int64_t vocab_size) {
  if (!item.sample) return;
  if (!item.choice) fail("forward_batch", "a choice to write for an item to sample", "no choice");
  // Rows to choose from: the call's last row runs the decoder (bounded replay cuts no further);
  // with all_logits every row must.
  const int64_t start = item.sequence->length(), end = start + int64_t(item.tokens.size());
  const int64_t cut = std::max(item.options.decoder_from, item.options.replay_until);
  if (item.options.all_logits ? cut > start : cut >= end)
    fail("forward_batch", std::string(item.options.all_logits ? "every row" : "a row") + " past the cut and the replay for an item to sample (" +
                              (item.options.all_logits ? "at most " + std::to_string(start) : "below " + std::to_string(end)) + ")",
         std::to_string(cut));
  const SampleRequest& q = *item.sample;
  if (item.options.all_logits && (q.params.temperature > 0 || q.top_logprobs >= 0 || !q.edits.empty() || q.allowed))
    fail("forward_batch", "a greedy choice without logprobs, logit edits or a token mask for every row of an all_logits item",
         "temperature " + std::to_string(q.params.temperature) + ", top_logprobs " + std::to_string(q.top_logprobs) + ", " +
             std::to_string(q.edits.size()) + " edits" + (q.allowed ? ", a mask" : ""));
  const int64_t vocab = q.vocab;
  if (vocab < 1 || vocab > vocab_size || q.top_logprobs > kMaxTopLogprobs)
    fail("forward_batch", "a sampled vocabulary of 1 to " + std::to_string(vocab_size) + " ids and at most " +
                              std::to_string(kMaxTopLogprobs) + " top logprobs",
         std::to_string(vocab) + " ids, " + std::to_string(q.top_logprobs) + " top logprobs");
}

namespace {

[[noreturn]] void no_speculation(const Executor& e) {
  fail(e.name() + " executor", "speculative decoding (DSpark) on an executor that has it (cpu, cuda)", e.name());
}

SequenceState& cpu_state(Sequence& s) {
  auto* cpu = dynamic_cast<CpuSequence*>(&s);
  if (!cpu) fail("CpuExecutor", "sequences of the CPU executor", "another executor's");
  return cpu->state();
}

}  // namespace

std::vector<std::vector<float>> Executor::encode_images(const std::vector<VisionImage>&) {
  fail(name() + " executor", "an executor with the vision tower for images (the CPU and CUDA executors)", name());
}

std::vector<std::vector<float>> CpuExecutor::encode_images(const std::vector<VisionImage>& images) {
  if (!model_.has_vision()) fail(model_.config().source, "a checkpoint with a vision tower for images", "a text-only one");
  return dsv41::encode_images(model_.config(), model_.vision(), images);
}

void Executor::dspark_ingest(Sequence&, int64_t, std::span<const float>, int64_t) { no_speculation(*this); }
std::vector<Draft> Executor::dspark_drafts(const std::vector<DraftRequest>&) { no_speculation(*this); }
Draft Executor::dspark_draft(Sequence& sequence, int anchor, const DraftChoice& choose) {
  return std::move(dspark_drafts({DraftRequest{&sequence, anchor, &choose}}).front());
}
SequenceMark Executor::mark(Sequence&, int64_t) { no_speculation(*this); }
void Executor::rewind(Sequence&, const SequenceMark&) { no_speculation(*this); }

void CpuExecutor::dspark_ingest(Sequence& s, int64_t first_pos, std::span<const float> hidden, int64_t rows) {
  dsv41::dspark_ingest(model_, cpu_state(s), first_pos, hidden, rows);
}
// The reference drafts each sequence alone (its logits at hand, greedy or not).
std::vector<Draft> CpuExecutor::dspark_drafts(const std::vector<DraftRequest>& requests) {
  std::vector<Draft> drafts;
  for (const DraftRequest& r : requests)
    drafts.push_back(dsv41::dspark_draft(model_, cpu_state(*r.sequence), r.anchor, r.choose ? *r.choose : DraftChoice(draft_argmax), comm_));
  return drafts;
}
SequenceMark CpuExecutor::mark(Sequence& s, int64_t rows) { return dsv41::mark(cpu_state(s), model_.config(), rows); }
void CpuExecutor::rewind(Sequence& s, const SequenceMark& m) { dsv41::rewind(cpu_state(s), model_.config(), m); }

std::unique_ptr<Sequence> CpuExecutor::new_sequence() { return std::make_unique<CpuSequence>(model_.config(), global_kv_); }

std::vector<std::vector<float>> CpuExecutor::forward_batch(const std::vector<BatchItem>& batch) {
  for (const BatchItem& item : batch)
    if (!dynamic_cast<CpuSequence*>(item.sequence)) fail("CpuExecutor", "sequences of the CPU executor", "another executor's");
  for (const BatchItem& item : batch) check_sample(item, model_.config().vocab_size);
  std::vector<std::vector<float>> logits;
  for (const BatchItem& item : batch) {
    SequenceState& state = static_cast<CpuSequence*>(item.sequence)->state();
    ForwardOptions options = item.options;
    if (comm_) options.comm = comm_;
    std::vector<float> context;
    if (item.drafter_context) options.dspark_hidden = &context;
    logits.push_back(forward(model_, state, item.tokens, item.engram_ids, options));
    if (item.drafter_context && !context.empty()) {  // the rows the decoder ran: the call's last ones
      const Config& c = model_.config();
      const int64_t rows = int64_t(context.size()) / (int64_t(c.dspark_target_layer_ids.size()) * c.dim);
      dsv41::dspark_ingest(model_, state, state.length - rows, context, rows);
    }
    if (item.sample) {  // check_sample: rows to choose from
      const int64_t V = model_.config().vocab_size, rows = int64_t(logits.back().size()) / V;
      for (int64_t r = 0; r < rows; ++r) item.choice[r] = choose(logits.back().data() + r * V, *item.sample);
      logits.back().clear();
    }
  }
  return logits;
}

}  // namespace dsv41
