#include "train/model/train_model.h"

#include <malloc.h>

#include <algorithm>
#include <map>
#include <random>

#include "forward/call_plan.h"
#include "forward/network.h"
#include "train/model/train_ops.h"

namespace dsv41::train {

namespace {

// A step allocates its activations, gradients and saved values (tens of MB at tiny's 256 tokens) and
// frees them at the next; glibc would hand the large blocks back to the kernel each time (mmap'd
// blocks, a trimmed heap) and fault them in again, zero-filled: half of tiny's backward time. A
// training process keeps them instead (glibc's tunables, process-wide; set once).
void keep_freed_memory() {
  static const bool kept = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)kept;
}

}  // namespace

template <class T>
TrainModel<T>::TrainModel(Parameters<T>& params, TrainOptions options) : params_(params), options_(options) {
  keep_freed_memory();
  reset_expert_load();
}

template <class T>
TrainModel<T>::~TrainModel() = default;

void prepare_trace(const Config& c, Trace& trace, bool draft) {
  const size_t layers = size_t(draft ? c.n_total_layers() : c.n_layers);
  trace.block_out.assign(size_t(c.n_layers), {});
  trace.route_experts.assign(layers, {});
  trace.route_scores.assign(layers, {});
  trace.topk.clear();
}

template <class T>
Losses TrainModel<T>::forward(std::span<const int64_t> tokens, const int64_t* engram_ids, Trace* trace,
                              std::span<const int64_t> anchors, std::span<const ServedCall> calls) {
  const Config& c = params_.config();
  tape_.clear();  // the last forward's backward, if never run, reads the op sets replaced here
  drafter_.reset();
  const bool draft = !anchors.empty();
  if (trace) prepare_trace(c, *trace, draft);
  ops_ = std::make_unique<TrainOps<T>>(params_, options_, tape_, tokens, engram_ids, trace, expert_load_, calls);
  ops_->record_features = draft;
  run_network(c, *ops_, trace);
  Losses losses = ops_->losses;
  margins_ = ops_->margins;
  if (draft) {
    drafter_ = std::make_unique<TrainOps<T>>(params_, options_, tape_, *ops_, anchors, labels_, trace, expert_load_);
    run_drafter(c, *drafter_);
    losses.dspark = drafter_->losses.dspark;
    losses.dspark_parts = drafter_->losses.dspark_parts;
    const Margins& m = drafter_->margins;  // the stages' experts and gates
    margins_.expert_preactivation = std::max(margins_.expert_preactivation, m.expert_preactivation);
    margins_.gate_logit = std::max(margins_.gate_logit, m.gate_logit);
  }
  return losses;
}

template <class T>
void TrainModel<T>::backward(T lm_weight, T indexer_weight, T dspark_weight) {
  if (!ops_ || tape_.empty()) fail("train backward", "a forward whose backward has not run", "none");
  ops_->lm_weight = lm_weight;
  ops_->indexer_weight = indexer_weight;
  if (drafter_) drafter_->dspark_weight = dspark_weight;
  tape_.backward();
}

template <class T>
const Margins& TrainModel<T>::margins() const {
  if (!ops_) fail("train model", "a forward before its margins are read", "none");
  return margins_;
}

template <class T>
std::vector<T> TrainModel<T>::logits() const {
  if (!ops_) fail("train model", "a forward before its logits are read", "none");
  const Config& c = params_.config();
  const Tensor<T>& h = ops_->final_hidden();
  const int64_t rows = int64_t(h->size()) / c.dim;
  std::vector<T> out(size_t(rows * c.vocab_size));
  grad::linear_forward(h->v(), rows, int64_t(c.dim), params_.head().v(), c.vocab_size, out.data());
  return out;
}

template <class T>
std::vector<T> TrainModel<T>::draft_logits() const {
  return drafter_ ? drafter_->draft_logits()->value : std::vector<T>{};
}

template <class T>
std::vector<T> TrainModel<T>::draft_confidence() const {
  return drafter_ ? drafter_->draft_confidence()->value : std::vector<T>{};
}

template <class T>
void TrainModel<T>::reset_expert_load() {
  const Config& c = params_.config();
  expert_load_.assign(size_t(params_.blocks()), {});
  for (int l = 0; l < params_.blocks(); ++l) expert_load_[size_t(l)].assign(size_t(c.routed_experts(l)), 0);
}

std::vector<int64_t> dspark_anchors(const Config& c, int64_t L, int64_t blocks, uint64_t seed, uint64_t sequence,
                                    std::span<const ServedCall> calls) {
  if (!c.has_dspark()) fail("dspark anchors", "a model with DSpark stages", "none");
  const int64_t G = c.dspark_block_size;
  std::vector<int64_t> pool;  // the candidates, ascending
  if (calls.empty()) {
    for (int64_t a = 1; a <= L - G; ++a) pool.push_back(a);
  } else {
    int64_t at = 0;
    for (const ServedCall& call : calls) {
      if (call.decoded)  // blocks inside the decoded rows [at, at + rows)
        for (int64_t a = std::max<int64_t>(1, at); a + G <= at + call.rows; ++a) pool.push_back(a);
      at += call.rows;
    }
    if (at != L) fail("dspark anchors", "served calls covering the " + std::to_string(L) + " rows", std::to_string(at));
  }
  const int64_t n = int64_t(pool.size());
  if (n < 1 || blocks < 1) return {};
  // mt19937_64 and seed_seq are specified bit for bit by the standard: the same anchors everywhere.
  std::seed_seq keys{uint32_t(seed), uint32_t(seed >> 32), uint32_t(sequence), uint32_t(sequence >> 32), 0x44537061u /* "DSpa" */};
  std::mt19937_64 rng(keys);
  const int64_t k = std::min(blocks, n);
  for (int64_t i = 0; i < k; ++i) std::swap(pool[size_t(i)], pool[size_t(i + int64_t(rng() % uint64_t(n - i)))]);
  pool.resize(size_t(k));
  std::sort(pool.begin(), pool.end());
  return pool;
}

std::vector<ServedCall> replay_calls(const Config& c, int64_t L, int64_t turns, uint64_t seed, uint64_t sequence) {
  if (L < 1 || turns < 1) fail("replay calls", "a sequence of at least 1 row and at least 1 turn", std::to_string(L) + " rows, " + std::to_string(turns) + " turns");
  std::seed_seq keys{uint32_t(seed), uint32_t(seed >> 32), uint32_t(sequence), uint32_t(sequence >> 32), 0x52706C79u /* "Rply" */};
  std::mt19937_64 rng(keys);
  // The turns' starts: 0 and min(turns, L) − 1 distinct positions of [1, L − 1] (a partial shuffle).
  std::vector<int64_t> pool(size_t(L - 1));
  for (int64_t i = 0; i < L - 1; ++i) pool[size_t(i)] = i + 1;
  const int64_t k = std::min(turns, L) - 1;
  for (int64_t i = 0; i < k; ++i) std::swap(pool[size_t(i)], pool[size_t(i + int64_t(rng() % uint64_t(L - 1 - i)))]);
  pool.resize(size_t(k));
  pool.push_back(0);
  std::sort(pool.begin(), pool.end());
  pool.push_back(L);
  const int64_t W = c.window_size;
  std::vector<ServedCall> calls;
  for (size_t t = 0; t + 1 < pool.size(); ++t) {
    const int64_t b = pool[t], n = pool[t + 1] - b, P = 1 + int64_t(rng() % uint64_t(n));
    calls.push_back({P, default_prompt_decoder_from(b + P, P, W)});  // the prompt, as default mode serves it
    if (n > P) calls.push_back({n - P, 0, true});    // the reply, decoded
  }
  return calls;
}

ReplayRows replay_rows(const Config& c, int64_t L, std::span<const ServedCall> calls) {
  const int ds = c.decoder_start();
  if (ds >= c.n_layers) fail("train forward", "a model with a decoder (a ratio-1 kv-source) for bounded replay", "none");
  for (int s : c.kv_source_layers)
    if (s > ds) fail("train forward", "no kv-source after the decoder start " + std::to_string(ds) + " under bounded replay", "layer " + std::to_string(s));
  struct Compressor {
    int pending = 0;
    int64_t entries = 0;
  };
  struct Counters {  // call_plan.h's state: its counters, with no compressor (the cuts and floors only)
    int64_t length = 0, encoder_window_floor = 0, decoder_window_floor = 0;
    std::map<int, Compressor> compressed;
  } state;
  ReplayRows rows{std::vector<uint8_t>(size_t(L), 0), std::vector<int64_t>(size_t(L), 0)};
  for (const ServedCall& call : calls) {
    if (call.rows < 1 || state.length + call.rows > L)
      fail("train forward", "served calls of at least 1 row covering the " + std::to_string(L) + " rows",
           std::to_string(call.rows) + " rows from position " + std::to_string(state.length));
    if (call.decoded && call.decoder_from != 0)
      fail("train forward", "a decoded call with decoder_from 0", "decoder_from " + std::to_string(call.decoder_from));
    ForwardOptions options;
    options.decoder_from = call.decoder_from;
    const ItemPlan plan = plan_item(c, state, call.rows, options);
    for (int64_t r = plan.start; r < plan.end(); ++r) {
      rows.cut[size_t(r)] = r < plan.start + plan.cut;
      rows.floor[size_t(r)] = plan.decoder_floor;
    }
    advance(state, plan);
  }
  if (state.length != L) fail("train forward", "served calls covering the " + std::to_string(L) + " rows", std::to_string(state.length));
  return rows;
}

template class TrainModel<float>;
template class TrainModel<double>;

}  // namespace dsv41::train
