#include "train/cuda/model/cuda_train_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <string>

#include "backend/cpu/rope.h"
#include "base/error.h"
#include "forward/model.h"
#include "forward/network.h"
#include "forward/window.h"
#include "model/gate.h"
#include "train/cuda/compressor.h"
#include "train/cuda/cross_entropy.h"
#include "train/cuda/dspark.h"
#include "train/cuda/elementwise.h"
#include "train/cuda/embedding.h"
#include "train/cuda/engram.h"
#include "train/cuda/fake_quant.h"
#include "train/cuda/indexer.h"
#include "train/cuda/mhc.h"
#include "train/cuda/moe_gate.h"
#include "train/cuda/norm.h"
#include "train/cuda/rope.h"
#include "train/cuda/sparse_attention.h"
#include "train/cuda/swiglu.h"
#include "train/model/draft_lists.h"
#include "train/model/index_choice.h"

namespace dsv41::train_cuda {

namespace {

template <class T>
using Buffer = std::shared_ptr<cuda::DeviceBuffer<T>>;

// Stream-ordered device memory from the pool (an activation lives for one step).
template <class T>
Buffer<T> buffer(int64_t n) {
  return std::make_shared<cuda::DeviceBuffer<T>>(n, nullptr, true);
}

template <class T>
Buffer<T> zeros(int64_t n) {
  Buffer<T> b = buffer<T>(n);
  if (n > 0) cuda::check(cudaMemsetAsync(b->get(), 0, size_t(b->bytes()), nullptr), "train_cuda: zeros");
  return b;
}

// The host's values on the device, staged through the model's page-locked ring (the call returns
// before the copy has run).
template <class T>
Buffer<T> on_device(PinnedUploads& uploads, const std::vector<T>& host) {
  Buffer<T> b = buffer<T>(int64_t(host.size()));
  uploads.copy(b->get(), host);
  return b;
}

template <class T>
std::vector<T> on_host(const T* device, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0) cuda::check(cudaMemcpy(out.data(), device, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost), "train_cuda: download");
  return out;
}

// x's values as a product's bf16 operand.
Buffer<bf16> as_bf16(const float* x, int64_t n) {
  Buffer<bf16> b = buffer<bf16>(n);
  if (n > 0) cast_bf16(x, n, b->get());
  return b;
}

// A product's operand (linear.h's Operands): a bf16 copy of an fp32 array, or the array itself, then
// kept alive by `keep` for as long as a backward may read it.
struct Operand {
  Buffer<bf16> copy;
  std::shared_ptr<const void> keep;
  const float* x = nullptr;
  const void* get() const { return copy ? static_cast<const void*>(copy->get()) : static_cast<const void*>(x); }
};

// An activation and its gradient (allocated, zero, by the first op that adds to it), as
// train/model/tape.h's Node.
struct Node {
  explicit Node(int64_t n) : value(buffer<float>(n)) {}
  explicit Node(Buffer<float> shared) : value(std::move(shared)) {}
  Buffer<float> value, grad;
  int64_t size() const { return value->size(); }
  float* v() const { return value->get(); }
  bool has_grad() const { return grad != nullptr; }
  float* g() {
    if (!grad) grad = zeros<float>(size());
    return grad->get();
  }
};
using Tensor = std::shared_ptr<Node>;

Tensor tensor(int64_t n) { return std::make_shared<Node>(n); }

// The same values with no way back (the indexer's inputs, docs/training.md "The indexer's gradient").
Tensor detach(const Tensor& x) { return std::make_shared<Node>(x->value); }

// A copy of x's values (an op that writes in place keeps its input for the backward).
Tensor copy_of(const Tensor& x) {
  Tensor y = tensor(x->size());
  if (x->size() > 0)
    cuda::check(cudaMemcpyAsync(y->v(), x->v(), size_t(x->size()) * sizeof(float), cudaMemcpyDeviceToDevice, nullptr),
                "train_cuda: copy");
  return y;
}

}  // namespace

// What every forward's op sets read and no forward changes, made once per model: the RoPE tables'
// frequencies of SWA-only and compressed layers (forward/model.h rope_table); the products'
// operand precision.
struct CudaTrainModel::Constants {
  Constants(const Config& c, Operands operands, PinnedUploads& uploads)
      : freqs_window(on_device(uploads, rope_table(c, false).frequencies())),
        freqs_compressed(on_device(uploads, rope_table(c, true).frequencies())), operands(operands) {}
  Buffer<float> freqs_window, freqs_compressed;
  Operands operands;
};

// network.h's op set on the device: train_ops.h's mirror, served calls (decoder bounded replay) included.
class CudaTrainOps {
 public:
  using Tensor = train_cuda::Tensor;

  // A batch of sequences of one length L, their rows one after the other: row s·L + p is sequence
  // s's input p (until bounded replay cuts rows; the rows that stay keep that order).
  CudaTrainOps(train::Parameters<float>& params, DeviceParameters& dev, Blas& blas, PinnedUploads& uploads,
               const CudaTrainModel::Constants& constants, const train::TrainOptions& options, train::Tape& tape,
               std::span<const train::TrainSequence> batch, Trace* trace, std::vector<std::vector<int64_t>>& load)
      : c_(params.config()), p_(params), dev_(dev), blas_(blas), uploads_(uploads), o_(options), tape_(tape),
        B_(int64_t(batch.size())), L_(batch.empty() ? 0 : int64_t(batch[0].tokens.size()) - 1), R_(B_ * L_),
        trace_(trace), load_(load), freqs_window_(constants.freqs_window), freqs_compressed_(constants.freqs_compressed),
        operands_(constants.operands) {
    refuse_what_is_not_written();
    if (B_ < 1) fail("CUDA train forward", "at least one sequence", "none");
    if (L_ < 1) fail("CUDA train forward", "sequences of at least 2 tokens (inputs and their next tokens)", std::to_string(L_ + 1));
    std::vector<int64_t> inputs, targets;
    bool served = false;
    for (int64_t b = 0; b < B_; ++b) {
      const train::TrainSequence& q = batch[size_t(b)];
      if (int64_t(q.tokens.size()) != L_ + 1)
        fail("CUDA train forward", "the batch's sequences of one length (" + std::to_string(L_ + 1) + " tokens)",
             std::to_string(q.tokens.size()) + " tokens in sequence " + std::to_string(b));
      if (c_.has_engram() && !q.engram_ids) fail("CUDA train forward", "Engram hash ids for a model with Engram", "none");
      for (int64_t t : q.tokens)
        if (t < 0 || t >= c_.vocab_size) fail("CUDA train forward", "token ids in [0, " + std::to_string(c_.vocab_size) + ")", std::to_string(t));
      tokens_host_.emplace_back(q.tokens.begin(), q.tokens.end());
      engram_ids_.push_back(q.engram_ids);
      for (int64_t p = 0; p < L_; ++p) {
        inputs.push_back(q.tokens[size_t(p)]);
        targets.push_back(q.tokens[size_t(p + 1)]);
        positions_host_.push_back(p);
        seq_host_.push_back(b);
      }
      served = served || !q.calls.empty();
    }
    inputs_ = on_device(uploads_, inputs);
    targets_ = on_device(uploads_, targets);
    positions_ = on_device(uploads_, positions_host_);
    find_segments();
    losses.assign(size_t(B_), train::Losses{});
    if (served) {  // each sequence's rows' fates; exact-mode sequences cut nothing, their floors 0
      cut_.assign(size_t(B_ * L_), 0);
      floor_.assign(size_t(B_ * L_), 0);
      for (int64_t b = 0; b < B_; ++b) {
        if (batch[size_t(b)].calls.empty()) continue;
        const train::ReplayRows fate = train::replay_rows(c_, L_, batch[size_t(b)].calls);
        std::copy(fate.cut.begin(), fate.cut.end(), cut_.begin() + b * L_);
        std::copy(fate.floor.begin(), fate.floor.end(), floor_.begin() + b * L_);
      }
    }
  }

  // DSpark's drafter (network.h run_drafter) over draft blocks of `target`'s sequences, as
  // train_ops.h's: block b at anchor a of a sequence holds the rows [token a, noise × (γ − 1)] at
  // positions a .. a + γ − 1; row k's Markov head reads the sequence's token a + k and it predicts
  // token a + k + 1. The blocks of each sequence (batch[s].anchors) follow each other, the
  // sequences in order. The target's forward must have run with record_features.
  CudaTrainOps(train::Parameters<float>& params, DeviceParameters& dev, Blas& blas, PinnedUploads& uploads,
               const train::TrainOptions& options, train::Tape& tape, const CudaTrainOps& target,
               std::span<const train::TrainSequence> batch, Trace* trace, std::vector<std::vector<int64_t>>& load)
      : c_(params.config()), p_(params), dev_(dev), blas_(blas), uploads_(uploads), o_(options), tape_(tape), B_(target.B_),
        L_(target.L_), R_(0), trace_(trace), load_(load), freqs_window_(target.freqs_window_),
        freqs_compressed_(target.freqs_compressed_), operands_(target.operands_), target_(&target) {
    refuse_what_is_not_written();
    const int64_t G = c_.dspark_block_size, L = L_;
    if (!c_.has_dspark()) fail("CUDA train forward", "a model with DSpark stages for draft blocks", "none");
    if (!target.features_) fail("CUDA train forward", "the target's context features for draft blocks", "a forward without them");
    if (int64_t(batch.size()) != B_) fail("CUDA train forward", "the target's " + std::to_string(B_) + " sequences' anchors", std::to_string(batch.size()));
    std::vector<int64_t> inputs, targets, prev;
    for (int64_t b = 0; b < B_; ++b) {
      const std::vector<int64_t>& tokens = target.tokens_host_[size_t(b)];
      anchors_.emplace_back(batch[size_t(b)].anchors.begin(), batch[size_t(b)].anchors.end());
      for (int64_t a : anchors_.back()) {
        if (a < 1 || a > L - G)
          fail("CUDA train forward", "draft anchors in [1, " + std::to_string(L - G) + "] (a context before, " + std::to_string(G) +
                                         " targets after)", std::to_string(a));
        for (int64_t k = 0; k < G; ++k) {
          if (target.row_at(b, a + k) < 0)
            fail("CUDA train forward", "draft blocks on rows the decoder ran (dspark_anchors with the served calls)",
                 "anchor " + std::to_string(a) + ", whose position " + std::to_string(a + k) + " was cut");
          inputs.push_back(k == 0 ? tokens[size_t(a)] : c_.dspark_noise_token_id);
          positions_host_.push_back(a + k);
          seq_host_.push_back(b);
          prev.push_back(tokens[size_t(a + k)]);
          targets.push_back(tokens[size_t(a + k + 1)]);
        }
      }
    }
    R_ = int64_t(inputs.size());
    if (R_ == 0) fail("CUDA train forward", "at least one draft anchor", "none");
    inputs_ = on_device(uploads_, inputs);
    targets_ = on_device(uploads_, targets);
    prev_ = on_device(uploads_, prev);
    positions_ = on_device(uploads_, positions_host_);
    find_segments();
    losses.assign(size_t(B_), train::Losses{});
  }

  std::vector<train::Losses> losses;  // each sequence's
  // The weight of each sequence's losses in the objective the backward differentiates.
  float lm_weight = 1.0f, indexer_weight = 1.0f, dspark_weight = 1.0f;
  // The target records DSpark's context features (record_target) for a drafter to read.
  bool record_features = false;
  const Buffer<float>& logits_buffer() const { return logits_; }

  // --- network.h's op set -----------------------------------------------------------------------

  int64_t rows() const { return R_; }
  // Decoder bounded replay (the served calls): rows leave at the decoder start.
  bool cuts_rows() const { return std::find(cut_.begin(), cut_.end(), uint8_t(1)) != cut_.end(); }

  void embed() {
    const int64_t d = c_.dim, hc = c_.hc_mult;
    Tensor x = tensor(R_ * d), X = tensor(R_ * hc * d);
    gather_rows_forward(dev_.value(p_.embed()), c_.vocab_size, d, inputs_->get(), R_, x->v());
    hc_expand_forward(x->v(), R_, int(hc), d, X->v());
    // The drafter reads the target's embedding frozen (DSpark's loss trains no backbone weight).
    if (!target_) tape_.record([this, x, X, R = R_] {
      if (!X->has_grad()) return;
      hc_expand_backward(X->grad->get(), R, c_.hc_mult, c_.dim, x->g());
      gather_rows_backward(x->grad->get(), c_.dim, inputs_->get(), R, c_.vocab_size, dev_.grad(p_.embed()));
    });
    X_ = X;
    // The first attention input's `pre`: the one-hot e0 (a constant).
    std::vector<float> e0(size_t(R_ * hc), 0.0f);
    for (int64_t r = 0; r < R_; ++r) e0[size_t(r * hc)] = 1.0f;
    mix_[size_t(Sub::Ffn)].pre = std::make_shared<Node>(on_device(uploads_, e0));
  }

  void mix(int l, Sub s) {
    const train::HcParams<float>& w = s == Sub::Attention ? p_.layer(l).hc_attn : p_.layer(l).hc_ffn;
    const int64_t hc = c_.hc_mult, n_mix = (2 + hc) * hc;
    Mix& m = mix_[size_t(s)];
    m = Mix{tensor(R_ * hc), tensor(R_ * hc), tensor(R_ * hc * hc)};
    Buffer<float> raw = buffer<float>(R_ * n_mix), r = buffer<float>(R_);
    hc_mixes_forward(blas_, X_->v(), R_, c_.dim, dev_.value(*w.fn), dev_.value(*w.base), dev_.value(*w.scale), hc_options(),
                     m.pre->v(), m.post->v(), m.comb->v(), raw->get(), r->get());
    tape_.record([this, X = X_, m, raw, r, &w, R = R_] {
      if (!m.pre->has_grad() && !m.post->has_grad() && !m.comb->has_grad()) return;
      hc_mixes_backward(blas_, X->v(), R, c_.dim, dev_.value(*w.fn), dev_.value(*w.base), dev_.value(*w.scale), hc_options(),
                        raw->get(), r->get(), m.pre->g(), m.post->g(), m.comb->g(), X->g(), dev_.grad(*w.fn), dev_.grad(*w.base),
                        dev_.grad(*w.scale));
    });
  }

  // h = norm_s(hc_pre(X, pre)), pre the mix of the sub-layer before s.
  void input(int l, Sub s) {
    const Tensor& pre = mix_[size_t(s == Sub::Attention ? Sub::Ffn : Sub::Attention)].pre;
    Tensor h = collapse(pre);
    rms_norm(h, c_.dim, s == Sub::Attention ? p_.layer(l).attn_norm : p_.layer(l).ffn_norm);
    h_ = h;
  }

  void write_back(Sub s) {
    const Mix m = mix_[size_t(s)];
    Tensor out = tensor(X_->size());
    hc_post_forward(y_->v(), X_->v(), m.post->v(), m.comb->v(), R_, c_.hc_mult, c_.dim, out->v());
    tape_.record([this, y = y_, X = X_, m, out, R = R_] {
      if (!out->has_grad()) return;
      hc_post_backward(y->v(), X->v(), m.post->v(), m.comb->v(), R, c_.hc_mult, c_.dim, out->grad->get(), y->g(), X->g(),
                       m.post->g(), m.comb->g());
    });
    X_ = out;
  }

  void boundary(int l, Sub from, Sub to) {
    write_back(from);
    mix(l, to);
    input(l, to);
  }

  // Engram before block l: the token's n-gram rows, wkv, the gate into each stream.
  void engram(int l) {
    train::EngramParams<float>& g = *p_.layer(l).engram;
    const int e = c_.engram_index(l), cols = c_.engram_hash_columns(), n_engram = int(c_.engram_layer_ids.size());
    const int64_t ehd = c_.engram_head_dim, rows = g.table->shape[0], hc = c_.hc_mult, d = c_.dim;
    std::vector<int64_t> ids(static_cast<size_t>(R_ * cols));
    for (int64_t r = 0; r < R_; ++r)
      std::copy_n(engram_ids_[size_t(seq_host_[size_t(r)])] + (positions_host_[size_t(r)] * n_engram + e) * cols, cols,
                  ids.data() + r * cols);
    Buffer<int64_t> list = on_device(uploads_, ids);
    Tensor emb = tensor(R_ * cols * ehd);
    gather_rows_forward(dev_.value(*g.table), rows, ehd, list->get(), R_ * cols, emb->v());
    tape_.record([this, emb, list, cols, &g, R = R_] {
      if (emb->has_grad())
        gather_rows_backward(emb->grad->get(), c_.engram_head_dim, list->get(), R * cols, g.table->shape[0], dev_.grad(*g.table));
    });
    Tensor kv = linear(emb, g.wkv);
    Tensor out = tensor(X_->size());
    auto saved = std::make_shared<std::vector<Buffer<float>>>();
    for (int i = 0; i < 5; ++i) saved->push_back(buffer<float>(R_ * hc));
    const EngramGateSaved view{(*saved)[0]->get(), (*saved)[1]->get(), (*saved)[2]->get(), (*saved)[3]->get(), (*saved)[4]->get()};
    engram_gate_forward(X_->v(), kv->v(), dev_.value(*g.q_weight), dev_.value(*g.k_weight), R_, int(hc), d, eps(), out->v(), view);
    tape_.record([this, X = X_, kv, out, saved, view, &g, R = R_] {
      if (!out->has_grad()) return;
      engram_gate_backward(X->v(), kv->v(), dev_.value(*g.q_weight), dev_.value(*g.k_weight), R, c_.hc_mult, c_.dim, view,
                           out->grad->get(), X->g(), kv->g(), dev_.grad(*g.q_weight), dev_.grad(*g.k_weight));
    });
    X_ = out;
  }

  void attention(int l) { dsv41::attention(c_, *this, l); }

  void moe(int l) {
    train::LayerParams<float>& L = p_.layer(l);
    const int64_t d = c_.dim, E = c_.routed_experts(l);
    const GateOptions opt = gate_options(c_, l);
    const int k = opt.topk;
    const GateParams gp{k, opt.score_func == "sigmoid", opt.norm_topk_prob && k > 1, opt.gate_temp, opt.route_scale};
    Buffer<int32_t> forced;
    if (trace_ && trace_->forced_experts && size_t(l) < trace_->forced_experts->size()) {
      const std::vector<int32_t>& f = (*trace_->forced_experts)[size_t(l)];
      if (int64_t(f.size()) != R_ * k)
        fail("CUDA train forward", "imposed experts of layer " + std::to_string(l) + " for " + std::to_string(R_) + " rows",
             std::to_string(f.size()) + " experts");
      forced = on_device(uploads_, f);
    }
    // The gate: its product in fp32 (a bf16 product would move its choices near ties), its choices
    // downloaded to group the rows by expert on the host.
    auto gate = std::make_shared<Gate>();
    gate->logits = buffer<float>(R_ * E);
    gate->scores = buffer<float>(R_ * E);
    gate->experts = buffer<int32_t>(R_ * k);
    gate->weights = tensor(R_ * k);
    Tensor x = h_, y = tensor(R_ * d);
    linear_forward(blas_, Operands::Fp32, x->v(), R_, d, dev_.value(*L.gate), E, gate->logits->get());
    gate_forward(gate->logits->get(), R_, E, dev_.value(*L.gate_bias), gp, forced ? forced->get() : nullptr, gate->scores->get(),
                 gate->experts->get(), gate->weights->v());
    const std::vector<int32_t> experts = on_host(gate->experts->get(), R_ * k);
    if (trace_) {
      trace_->route_experts[size_t(l)] = experts;
      const std::vector<float> scores = on_host(gate->scores->get(), R_ * E), bias = on_host(dev_.value(*L.gate_bias), E);
      std::vector<float>& biased = trace_->route_scores[size_t(l)];
      biased.resize(size_t(R_ * E));
      for (int64_t i = 0; i < R_ * E; ++i) biased[size_t(i)] = scores[size_t(i)] + bias[size_t(i % E)];
    }
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E)), slot_of(static_cast<size_t>(E));
    for (int64_t r = 0; r < R_; ++r)
      for (int j = 0; j < k; ++j) {
        const int32_t e = experts[size_t(r * k + j)];
        if (e < 0 || e >= E) fail("CUDA train forward", "experts in [0, " + std::to_string(E) + ")", std::to_string(e));
        // The rows in increasing order, so a repeat is the last one: an expert's rows are distinct,
        // as their scatter back needs (the gate's top-k is; an imposed choice is checked).
        if (!rows_of[size_t(e)].empty() && rows_of[size_t(e)].back() == r)
          fail("CUDA train forward", "distinct experts in each row",
               "expert " + std::to_string(e) + " twice in row " + std::to_string(r));
        rows_of[size_t(e)].push_back(r);
        slot_of[size_t(e)].push_back(r * k + j);  // the row's slot in weights [R, k]
      }
    // The shared expert on every row writes y; each routed expert adds its rows' outputs, in expert order.
    auto shared = std::make_shared<ExpertRun>();
    expert_forward(x->v(), R_, L.shared, nullptr, y->v(), *shared);
    auto routed = std::make_shared<std::vector<Routed>>();
    for (int64_t e = 0; e < E; ++e) {
      load_[size_t(l)][size_t(e)] += int64_t(rows_of[size_t(e)].size());
      if (rows_of[size_t(e)].empty()) continue;
      Routed& re = routed->emplace_back();
      re.expert = e;
      re.n = int64_t(rows_of[size_t(e)].size());
      re.rows = on_device(uploads_, rows_of[size_t(e)]);
      re.slots = on_device(uploads_, slot_of[size_t(e)]);
      re.x = buffer<float>(re.n * d);
      re.weight = buffer<float>(re.n);
      gather_rows_forward(x->v(), R_, d, re.rows->get(), re.n, re.x->get());
      gather_rows_forward(gate->weights->v(), R_ * k, 1, re.slots->get(), re.n, re.weight->get());
      Buffer<float> ye = buffer<float>(re.n * d);
      expert_forward(re.x->get(), re.n, L.experts[size_t(e)], re.weight->get(), ye->get(), re.run);
      gather_rows_backward_distinct(ye->get(), d, re.rows->get(), re.n, R_, y->v());  // y[rows] += ye
    }
    tape_.record([this, l, x, y, gate, gp, shared, routed, R = R_] {
      if (!y->has_grad()) return;
      train::LayerParams<float>& L = p_.layer(l);
      const int64_t d = c_.dim, E = c_.routed_experts(l), k = gp.topk;
      expert_backward(R, L.shared, nullptr, *shared, y->grad->get(), x->g(), nullptr);
      float* dweights = gate->weights->g();
      for (const Routed& re : *routed) {
        Buffer<float> dye = buffer<float>(re.n * d), dxe = zeros<float>(re.n * d), drw = zeros<float>(re.n);
        gather_rows_forward(y->grad->get(), R, d, re.rows->get(), re.n, dye->get());
        expert_backward(re.n, L.experts[size_t(re.expert)], re.weight->get(), re.run, dye->get(), dxe->get(), drw->get());
        gather_rows_backward_distinct(dxe->get(), d, re.rows->get(), re.n, R, x->g());
        gather_rows_backward_distinct(drw->get(), 1, re.slots->get(), re.n, R * k, dweights);
      }
      Buffer<float> dlogits = buffer<float>(R * E);
      gate_backward(gate->logits->get(), gate->scores->get(), R, E, gate->experts->get(), dweights, gp, dlogits->get());
      linear_backward(blas_, Operands::Fp32, x->v(), R, d, dev_.value(*L.gate), E, dlogits->get(), x->g(), dev_.grad(*L.gate));
    });
    y_ = y;
  }

  // The final collapse with the last FFN's `pre`, the norm, the head and each sequence's next-token
  // loss (the mean over its rows).
  void logits() {
    const int64_t d = c_.dim, V = c_.vocab_size;
    Tensor h = collapse(mix_[size_t(Sub::Ffn)].pre);
    rms_norm(h, d, &p_.norm());
    const Operand hb = operand(h->v(), h->size(), h);
    logits_ = buffer<float>(R_ * V);
    logit_max_ = buffer<float>(R_);
    logit_sum_ = buffer<float>(R_);
    const Buffer<float>& row_max = logit_max_, &row_sum = logit_sum_;
    Buffer<float> loss = buffer<float>(2 * B_);
    linear_forward(blas_, operands_, hb.get(), R_, d, weight(p_.head()), V, logits_->get());
    cross_entropy_forward(logits_->get(), R_, V, targets_->get(), row_begin_device_->get(), B_, row_max->get(), row_sum->get(),
                          loss->get());
    const std::vector<float> sums = on_host(loss->get(), 2 * B_);
    for (int64_t b = 0; b < B_; ++b) losses[size_t(b)].lm = double(sums[size_t(2 * b)]);
    final_ = h;
    tape_.record([this, h, hb, z = logits_, targets = targets_, row_max, row_sum, loss, R = R_, begin = row_begin_device_] {
      const int64_t d = c_.dim, V = c_.vocab_size;
      Buffer<float> dz = buffer<float>(R * V);
      cross_entropy_backward(z->get(), R, V, targets->get(), begin->get(), B_, row_max->get(), row_sum->get(), loss->get(),
                             lm_weight, dz->get());
      const Operand dzb = operand(dz->get(), R * V);
      linear_backward(blas_, operands_, hb.get(), R, d, weight(p_.head()), V, dzb.get(), h->g(), dev_.grad(p_.head()));
    });
  }

  void record_block(int l) { trace_->block_out[size_t(l)] = on_host(X_->v(), X_->size()); }

  // Decoder bounded replay at the decoder start (network.h): its kv-source compresses every row's
  // collapsed stream, the cut rows included, and is not run again in its attention.
  void compress_cut(int l) {
    compress(l);
    compressed_at_cut_ = true;
  }

  // The cut rows leave: the streams and the `pre` of their next input keep the other rows (a gather,
  // whose backward adds the gradient back), as do the rows' positions and targets.
  void drop_cut() {
    const int64_t hc = c_.hc_mult, d = c_.dim;
    std::vector<int64_t> kept, positions, seqs, targets;  // the current rows that stay, their positions, sequences, targets
    for (int64_t r = 0; r < R_; ++r) {
      const int64_t b = seq_host_[size_t(r)], t = positions_host_[size_t(r)];
      if (cut_[size_t(b * L_ + t)]) continue;
      kept.push_back(r);
      positions.push_back(t);
      seqs.push_back(b);
      targets.push_back(tokens_host_[size_t(b)][size_t(t + 1)]);
    }
    const Buffer<int64_t> rows = on_device(uploads_, kept);
    X_ = gather(X_, rows, hc * d);
    mix_[size_t(Sub::Ffn)].pre = gather(mix_[size_t(Sub::Ffn)].pre, rows, hc);
    R_ = int64_t(kept.size());
    positions_host_ = std::move(positions);
    seq_host_ = std::move(seqs);
    positions_ = on_device(uploads_, positions_host_);
    targets_ = on_device(uploads_, targets);
    row_at_.assign(size_t(B_ * L_), -1);
    for (int64_t r = 0; r < R_; ++r) row_at_[size_t(seq_host_[size_t(r)] * L_ + positions_host_[size_t(r)])] = r;
    find_segments();
  }

  // Not reached: a trace imposing layer inputs was refused (refuse_what_is_not_written()).
  void impose_input(int) { not_written("imposed layer inputs"); }

  // DSpark's context features (network.h record_target): the residual entering target layer l
  // averaged over the streams, [rows, targets, dim], detached. The mean is hc_pre with every weight
  // 1/hc: for hc a power of two, Σ (X_i / hc) is the CPU's (Σ X_i) / hc bit for bit.
  bool records_targets() const { return record_features; }
  void record_target(int l) {
    const int64_t hc = c_.hc_mult, d = c_.dim, n = int64_t(c_.dspark_target_layer_ids.size()), t = c_.dspark_target_index(l);
    if (!features_) {
      features_ = std::make_shared<Node>(zeros<float>(R_ * n * d));
      feature_positions_host_ = positions_host_;
      feature_positions_ = positions_;
      feature_row_begin_ = row_begin_;
    }
    if (int64_t(feature_positions_host_.size()) != R_)
      fail("CUDA train forward", "DSpark target layers that all run on the same rows (none before the decoder start when rows leave there)",
           "layer " + std::to_string(l) + " on " + std::to_string(R_) + " rows");
    const Buffer<float> mean = buffer<float>(R_ * d);
    const Buffer<float> weights = on_device(uploads_, std::vector<float>(size_t(R_ * hc), 1.0f / float(hc)));
    hc_pre_forward(X_->v(), weights->get(), R_, int(hc), d, mean->get());
    if (R_ > 0)
      cuda::check(cudaMemcpy2DAsync(features_->v() + t * d, size_t(n * d) * sizeof(float), mean->get(), size_t(d) * sizeof(float),
                                    size_t(d) * sizeof(float), size_t(R_), cudaMemcpyDeviceToDevice, nullptr),
                  "train_cuda: DSpark features");
  }

  // DSpark's head (forward/dspark.h) and loss (grad/dspark.h), as train_ops.h's: the last stage's
  // `pre` collapses the streams into x; base logits u = head(norm(x)) through the target's head,
  // frozen; the Markov bias of each row's token before; the confidence of [x ; e]; the loss against
  // the target's distribution at the same positions and the sequence's next tokens.
  void draft_head() {
    const int64_t d = c_.dim, V = c_.vocab_size, rank = c_.dspark_markov_rank, G = c_.dspark_block_size;
    train::DSparkParams<float>& w = p_.dspark();
    Tensor x = collapse(mix_[size_t(Sub::Ffn)].pre);
    Tensor h = x;
    rms_norm(h, d, w.norm);
    const Operand hb = operand(h->v(), h->size(), h);
    Tensor u = tensor(R_ * V);
    linear_forward(blas_, operands_, hb.get(), R_, d, weight(p_.head()), V, u->v());
    tape_.record([this, h, hb, u, R = R_] {
      if (!u->has_grad()) return;
      const Operand dub = operand(u->grad->get(), u->size());
      linear_backward(blas_, operands_, hb.get(), R, c_.dim, weight(p_.head()), c_.vocab_size, dub.get(), h->g(), nullptr);
    });
    Tensor e = tensor(R_ * rank);
    gather_rows_forward(dev_.value(*w.markov_embed), V, rank, prev_->get(), R_, e->v());
    tape_.record([this, e, &w, R = R_] {
      if (e->has_grad())
        gather_rows_backward(e->grad->get(), c_.dspark_markov_rank, prev_->get(), R, c_.vocab_size, dev_.grad(*w.markov_embed));
    });
    // z = u + W2 e.
    const Operand eb = operand(e->v(), e->size(), e);
    Tensor z = tensor(R_ * V);
    linear_forward(blas_, operands_, eb.get(), R_, rank, weight(*w.markov_head), V, z->v());
    add_into(u->v(), R_ * V, z->v());
    tape_.record([this, u, e, eb, z, &w, R = R_] {
      if (!z->has_grad()) return;
      add_into(z->grad->get(), z->size(), u->g());
      const Operand dzb = operand(z->grad->get(), z->size());
      linear_backward(blas_, operands_, eb.get(), R, c_.dspark_markov_rank, weight(*w.markov_head), c_.vocab_size, dzb.get(),
                      e->g(), dev_.grad(*w.markov_head));
    });
    Tensor conf = tensor(R_);
    confidence_forward(x->v(), e->v(), R_, d, rank, dev_.value(*w.confidence), conf->v());
    tape_.record([this, x, e, conf, &w, R = R_] {
      if (conf->has_grad())
        confidence_backward(x->v(), e->v(), R, c_.dim, c_.dspark_markov_rank, dev_.value(*w.confidence), conf->grad->get(), x->g(),
                            e->g(), dev_.grad(*w.confidence));
    });

    // The target's distribution at each row's position: the softmax of the target's logits there
    // (its head's product and its loss's row maxima and sums), as the CPU's softmax of the same
    // product; and the rows' shares: position weights exp(−k/γ) normalized over a block, averaged
    // over the blocks (ρ); every row alike for L_conf (κ).
    std::vector<int64_t> target_rows;
    for (int64_t r = 0; r < R_; ++r) target_rows.push_back(target_->row_at(seq_host_[size_t(r)], positions_host_[size_t(r)]));
    const Buffer<int64_t> rows = on_device(uploads_, target_rows);
    auto loss = std::make_shared<DraftLoss>();
    loss->q = buffer<float>(R_ * V);
    cross_entropy_probabilities(target_->logits_->get(), V, target_->logit_max_->get(), target_->logit_sum_->get(), rows->get(), R_,
                                loss->q->get());
    // Each sequence's loss over its blocks: its rows' ρ over its own blocks, its κ 1 / its rows.
    float weight_sum = 0;
    for (int64_t k = 0; k < G; ++k) weight_sum += std::exp(-float(k) / float(G));
    std::vector<float> rho(static_cast<size_t>(R_)), kappa(static_cast<size_t>(R_));
    for (int64_t b = 0; b < B_; ++b) {
      const int64_t r0 = row_begin_[size_t(b)], n = rows_of(b), blocks = n / G;
      for (int64_t r = r0; r < r0 + n; ++r) {
        rho[size_t(r)] = std::exp(-float((r - r0) % G) / float(G)) / (weight_sum * float(blocks));
        kappa[size_t(r)] = 1.0f / float(n);
      }
    }
    loss->rho = on_device(uploads_, rho);
    loss->kappa = on_device(uploads_, kappa);
    loss->signs = buffer<int8_t>(R_ * V);
    loss->target = buffer<float>(R_);
    loss->p = buffer<float>(R_ * V);
    const Buffer<double> parts = buffer<double>(4 * B_);
    dspark_loss_forward(z->v(), loss->q->get(), R_, V, targets_->get(), conf->v(), loss->rho->get(), loss->kappa->get(),
                        row_begin_device_->get(), B_, loss->labels(), loss->p->get(), parts->get());
    const std::vector<double> sums = on_host(parts->get(), 4 * B_);
    for (int64_t b = 0; b < B_; ++b) {
      const double* part = sums.data() + 4 * b;
      const grad::DSparkLossParts parts_of{part[0], part[1], part[2], part[3]};
      losses[size_t(b)].dspark = parts_of.total(grad::DSparkLossWeights{});
      losses[size_t(b)].dspark_parts = parts_of;
    }
    tape_.record([this, z, conf, loss, targets = targets_, R = R_] {
      const grad::DSparkLossWeights a;
      dspark_loss_backward(conf->v(), R, c_.vocab_size, targets->get(), loss->rho->get(), loss->kappa->get(), loss->labels(),
                           loss->p->get(), float(a.ce), float(a.tv), float(a.conf), dspark_weight, z->g(), conf->g());
    });
  }

  // --- the attention's ops (network.h attention()) -------------------------------------------------

  const train::LayerParams<float>& layer(int l) const { return p_.layer(l); }
  const Tensor& h() const { return h_; }

  // x [n] as a product's operand: its bf16 copy, or x itself (kept alive by `keep`).
  Operand operand(const float* x, int64_t n, std::shared_ptr<const void> keep = nullptr) const {
    if (operands_ == Operands::Fp32) return {nullptr, std::move(keep), x};
    return {as_bf16(x, n), nullptr, nullptr};
  }
  // A weight as a product's operand: its bf16 copy, or its fp32 master.
  const void* weight(const train::Param<float>& w) {
    return operands_ == Operands::Fp32 ? static_cast<const void*>(dev_.value(w)) : dev_.weight_bf16(w);
  }

  // y = x Wᵀ, rows of W.shape[1] values in, W.shape[0] out.
  Tensor linear(const Tensor& x, train::Param<float>* w) {
    const int64_t N = w->shape[0], K = w->shape[1], M = x->size() / K;
    const Operand xb = operand(x->v(), x->size(), x);
    Tensor y = tensor(M * N);
    linear_forward(blas_, operands_, xb.get(), M, K, weight(*w), N, y->v());
    tape_.record([this, x, xb, y, w, M, N, K] {
      if (!y->has_grad()) return;
      const Operand dyb = operand(y->grad->get(), y->size());
      linear_backward(blas_, operands_, xb.get(), M, K, weight(*w), N, dyb.get(), x->g(), dev_.grad(*w));
    });
    return y;
  }

  // RMSNorm over rows of `cols` (w: the weight), in place of x.
  void rms_norm(Tensor& x, int64_t cols, train::Param<float>* w) {
    const int64_t rows = x->size() / cols;
    Tensor y = tensor(x->size());
    Buffer<float> r = buffer<float>(rows);
    rms_norm_forward(x->v(), rows, cols, dev_.value(*w), eps(), y->v(), r->get());
    tape_.record([this, x, y, w, rows, cols, r] {
      if (y->has_grad()) rms_norm_backward(x->v(), rows, cols, dev_.value(*w), r->get(), y->grad->get(), x->g(), dev_.grad(*w));
    });
    x = y;
  }

  // RoPE of layer l on each head's last rope_head_dim values, at the rows' positions.
  void rope(Tensor& x, int l, int heads, int64_t head_dim, bool inverse) {
    rope_at(x, freqs(l), heads, head_dim, positions_, R_, inverse);
  }

  // A kv-source's compressed entries (main KV, after RoPE) and index keys (from the latent before
  // RoPE, detached), one per complete group of `ratio` rows.
  void compress(int l) {
    if (compressed_at_cut_ && l == c_.decoder_start()) return;
    const train::AttentionParams<float>& a = p_.layer(l).attn;
    const int ratio = c_.compress_ratios[size_t(l)];
    const int64_t hd = c_.head_dim, ihd = c_.index_head_dim;
    if (R_ != B_ * L_) fail("CUDA train forward", "a kv-source over every row (none after the cut)", std::to_string(R_) + " rows");
    Compressed& s = compressed_[l];
    s = Compressed{};
    s.entries = L_ / ratio;
    const int64_t total = B_ * s.entries;
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t g = 0; g < s.entries; ++g) positions.push_back(g * ratio);  // the group's first token
    s.positions = on_device(uploads_, positions);
    Tensor latent;
    if (ratio == 1) {
      latent = linear(h_, a.compressor_wkv);
    } else {
      // Each sequence's complete groups (one pooling of all rows where no group straddles two).
      Tensor kv = linear(h_, a.compressor_wkv), score = linear(h_, a.compressor_wgate);
      latent = tensor(total * hd);
      const int64_t calls = L_ % ratio == 0 ? 1 : B_, rows = R_ / calls, groups = total / calls;
      for (int64_t i = 0; i < calls; ++i)
        compressor_pool_forward(kv->v() + i * rows * hd, score->v() + i * rows * hd, rows, hd, ratio, latent->v() + i * groups * hd);
      tape_.record([kv, score, pooled = latent, ratio, hd, calls, rows, groups] {
        if (!pooled->has_grad()) return;
        for (int64_t i = 0; i < calls; ++i)
          compressor_pool_backward(kv->v() + i * rows * hd, score->v() + i * rows * hd, rows, hd, ratio, pooled->v() + i * groups * hd,
                                   pooled->grad->get() + i * groups * hd, kv->g() + i * rows * hd, score->g() + i * rows * hd);
      });
    }
    rms_norm(latent, hd, a.compressor_norm);
    Tensor keys = linear(detach(latent), a.indexer_wk);
    rms_norm(keys, ihd, a.indexer_k_norm);
    rope_at(keys, freqs(l), 1, ihd, s.positions, total, false);
    if (o_.mxfp4_indexer) fake_quantized(keys, FakeQuant::Mxfp4);
    rope_at(latent, freqs(l), 1, hd, s.positions, total, false);
    if (o_.kv_fp4) fake_quantized(latent, FakeQuant::KvFp4);
    s.kv = latent;
    s.keys = keys;
  }

  // An index source's top-k over its kv-source's entries (the candidate source's pool first), and
  // the indexer's query and weights for its loss (from qr and h detached). The scores of every
  // visible entry are computed on the device and the choice made on the host by the engine's own
  // selection (backend/cpu/indexer.h), as the CPU trainer makes it.
  void index(int l, const Tensor& qr) {
    const train::AttentionParams<float>& a = p_.layer(l).attn;
    const Compressed& s = compressed_.at(c_.kv_source_of(l));
    const int ratio = c_.compress_ratios[size_t(l)], heads = c_.index_n_heads;
    const int64_t ihd = c_.index_head_dim, n = s.entries, k = std::min<int64_t>(c_.index_topk, n);
    Indexed& ix = indexed_;
    ix = Indexed{};
    ix.keys = s.keys;
    ix.n = B_ * n;
    ix.q = linear(detach(qr), a.indexer_wq_b);
    rope(ix.q, l, heads, ihd, false);
    if (o_.mxfp4_indexer) fake_quantized(ix.q, FakeQuant::Mxfp4);
    ix.w = linear(detach(h_), a.indexer_weights_proj);
    scale(ix.w, float(std::pow(double(ihd), -0.5) * std::pow(double(heads), -0.5)));

    if (l == c_.candidate_source_layer) candidates_.assign(size_t(R_), {});
    const std::vector<std::vector<int64_t>>* imposed = train::imposed_topk(trace_, l, R_);
    std::vector<float> all;  // [R, n]: every entry of the row's sequence, its score
    if (n > 0) {
      // Sequence by sequence against its own keys, one list of every entry for the longest.
      int64_t most = 0;
      for (int64_t b = 0; b < B_; ++b) most = std::max(most, rows_of(b));
      std::vector<int64_t> every(static_cast<size_t>(most * n));
      for (int64_t i = 0; i < most * n; ++i) every[size_t(i)] = i % n;
      const Buffer<int64_t> list = on_device(uploads_, every);
      const Buffer<float> scores = buffer<float>(R_ * n);
      for (int64_t b = 0; b < B_; ++b) {
        const int64_t r = row_begin_[size_t(b)];
        if (rows_of(b) > 0)
          indexer_scores_forward(ix.q->v() + r * heads * ihd, ix.w->v() + r * heads, ix.keys->v() + b * n * ihd, list->get(), rows_of(b),
                                 heads, ihd, n, scores->get() + r * n);
      }
      all = on_host(scores->get(), R_ * n);
    }
    // The rows choose independently (each writes only its own top-k and pool): over the cores, but
    // for imposed choices, whose checks may throw.
    topk_.assign(size_t(R_), {});
#pragma omp parallel for schedule(static) if (!imposed && R_ * n >= (int64_t(1) << 16))
    for (int64_t r = 0; r < R_; ++r) {
      const int64_t visible = (positions_host_[size_t(r)] + 1) / ratio;
      topk_[size_t(r)] = train::choose_index_row(c_, l, r, all.data() + r * n, n, visible, k, candidates_, imposed);
    }
    ix.k = int64_t(topk_[0].size());
    if (trace_) trace_->topk[l] = topk_;
  }

  // This call's window entries: SWA-FP8 when switched on.
  void window_entries(int, Tensor& kv) {
    if (o_.swa_fp8) fake_quantized(kv, FakeQuant::SwaFp8);
  }
  void keep_window(int, const Tensor&) {}  // no cache: the window is this call's rows

  // Each row over its window (forward/window.h's list, from the sequence's start) and its chosen
  // compressed entries, with the sink; at an index source, the indexer's loss against it.
  Tensor attend(int l, const Tensor& q, const Tensor& kv) {
    if (target_) return attend_draft(l, q, kv);
    const train::AttentionParams<float>& a = p_.layer(l).attn;
    const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window_size;
    const bool compressed = c_.compress_ratios[size_t(l)] > 0;
    const Compressed* s = compressed ? &compressed_.at(c_.kv_source_of(l)) : nullptr;
    const int64_t k = compressed ? int64_t(topk_.empty() ? 0 : topk_[0].size()) : 0;
    const int64_t window = std::min(L_, W), entries = window + k, per_seq = s ? s->entries : 0, n = B_ * per_seq;
    // The KV table: the window rows, then the compressed entries.
    Tensor table = tensor((R_ + n) * hd);
    copy_into(kv->v(), R_ * hd, table->v());
    if (n > 0) copy_into(s->kv->v(), n * hd, table->v() + R_ * hd);
    std::vector<int64_t> idx, slots;
    idx.reserve(size_t(R_ * entries));
    // Each row's window as a first prefill of the whole sequence lists it (window.h), stopped at the
    // row's floor: the decoder window floor of its call under bounded replay (call_plan.h), else 0.
    // Every position the window keeps runs this layer (the decoder runs [floor, row] whole).
    const bool floored = !floor_.empty() && l >= c_.decoder_start();
    for (int64_t r = 0; r < R_; ++r) {
      const int64_t b = seq_host_[size_t(r)], t0 = positions_host_[size_t(r)];
      window_positions(t0, 0, L_, W, floored ? floor_[size_t(b * L_ + t0)] : 0, slots);
      for (int64_t t : slots) idx.push_back(t == kEmptySlot ? -1 : row_at(b, t));
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = topk_[size_t(r)][size_t(j)];
        idx.push_back(e < 0 ? -1 : R_ + b * per_seq + e);
      }
    }
    Buffer<int64_t> list = on_device(uploads_, idx);
    Tensor o = tensor(R_ * H * hd);
    Buffer<float> p = buffer<float>(R_ * H * entries), sink_p = buffer<float>(R_ * H);
    const float scale_qk = float(std::pow(double(hd), -0.5));
    sparse_attention_forward(q->v(), R_, H, hd, table->v(), list->get(), entries, dev_.value(*a.attn_sink), scale_qk, o->v(),
                             p->get(), sink_p->get());
    tape_.record([this, q, kv, kvc = s ? s->kv : Tensor(), table, n, list, entries, p, sink_p, o, scale_qk, sink = a.attn_sink, R = R_] {
      if (!o->has_grad()) return;
      const int64_t hd = c_.head_dim;
      sparse_attention_backward(q->v(), R, c_.n_heads, hd, table->v(), R + n, list->get(), entries, scale_qk, p->get(),
                                sink_p->get(), o->grad->get(), q->g(), table->g(), dev_.grad(*sink));
      add_into(table->grad->get(), R * hd, kv->g());
      if (kvc && n > 0) add_into(table->grad->get() + R * hd, n * hd, kvc->g());
    });
    if (c_.is_index_source(l) && k > 0) index_loss(p, window, entries);
    return o;
  }

  Tensor linear_grouped(const Tensor& o, train::Param<float>* wo_a) {
    const int64_t G = c_.o_groups, Kg = int64_t(c_.n_heads) * c_.head_dim / G, Ng = c_.o_lora_rank;
    const Operand ob = operand(o->v(), o->size(), o);
    Tensor y = tensor(R_ * G * Ng);
    linear_grouped_forward(blas_, operands_, ob.get(), R_, G, Kg, weight(*wo_a), Ng, y->v());
    tape_.record([this, o, ob, y, wo_a, G, Kg, Ng, R = R_] {
      if (!y->has_grad()) return;
      const Operand dyb = operand(y->grad->get(), y->size());
      linear_grouped_backward(blas_, operands_, ob.get(), R, G, Kg, weight(*wo_a), Ng, dyb.get(), o->g(), dev_.grad(*wo_a));
    });
    return y;
  }

  int heads() const { return c_.n_heads; }
  template <class W>
  void output(const Tensor& x, W w) {
    y_ = linear(x, w);
  }

 private:
  struct Mix {
    Tensor pre, post, comb;  // [R, hc], [R, hc], [R, hc, hc]
  };
  // A kv-source's output: its compressed entries (main KV after RoPE) and index keys.
  struct Compressed {
    int64_t entries = 0;        // each sequence's (its complete groups)
    Buffer<int64_t> positions;  // each entry's group's first position
    Tensor kv, keys;            // [B · entries, head_dim], [B · entries, index_head_dim]: sequence by sequence
  };
  // An index source's indexer, for its loss in attend().
  struct Indexed {
    Tensor q, w, keys;  // [R, heads, index_head_dim], [R, heads], [entries, index_head_dim]
    int64_t k = 0, n = 0;
  };
  // DSpark's loss, kept for its backward: the target's probabilities, the rows' shares (ρ and κ), the
  // labels the forward wrote (the signs of p − q and c*), p = softmax(z).
  struct DraftLoss {
    Buffer<float> q, rho, kappa, target, p;
    Buffer<int8_t> signs;
    DSparkLabels labels() const { return {signs->get(), target->get(), false}; }
  };
  struct Gate {
    Buffer<float> logits, scores;  // [R, experts]
    Buffer<int32_t> experts;       // [R, k]
    Tensor weights;                // [R, k]
  };
  // An expert's forward, kept for its backward: its input and activation as products' operands,
  // W1 x and W3 x.
  struct ExpertRun {
    Operand xb, hb;
    Buffer<float> g, u;
  };
  struct Routed {
    int64_t expert = 0, n = 0;
    Buffer<int64_t> rows, slots;  // its rows, and their slots in the gate's weights [R, k]
    Buffer<float> x, weight;      // its rows of x and their routing weights
    ExpertRun run;
  };

  // y [n, dim] = W2 (w · silu(min(W1 x, L)) · clamp(W3 x, ±L)) (swiglu.h), written.
  void expert_forward(const float* x, int64_t n, const train::ExpertParams<float>& w, const float* row_weights, float* y,
                      ExpertRun& s) {
    const int64_t d = c_.dim, inter = c_.moe_inter_dim;
    s.xb = operand(x, n * d);  // x outlives the backward: the caller's tape keeps it
    s.g = buffer<float>(n * inter);
    s.u = buffer<float>(n * inter);
    linear_forward(blas_, operands_, s.xb.get(), n, d, weight(*w.w1), inter, s.g->get());
    linear_forward(blas_, operands_, s.xb.get(), n, d, weight(*w.w3), inter, s.u->get());
    Buffer<float> h = buffer<float>(n * inter);
    swiglu_forward(s.g->get(), s.u->get(), n, inter, float(c_.swiglu_limit), row_weights, h->get());
    s.hb = operand(h->get(), n * inter, h);
    linear_forward(blas_, operands_, s.hb.get(), n, inter, weight(*w.w2), d, y);
  }

  // Adds into dx [n, dim], the expert's weight gradients and drow_weights [n] (unless nullptr).
  void expert_backward(int64_t n, const train::ExpertParams<float>& w, const float* row_weights, const ExpertRun& s,
                       const float* dy, float* dx, float* drow_weights) {
    const int64_t d = c_.dim, inter = c_.moe_inter_dim;
    const Operand dyb = operand(dy, n * d);
    Buffer<float> dh = zeros<float>(n * inter), dg = buffer<float>(n * inter), du = buffer<float>(n * inter);
    linear_backward(blas_, operands_, s.hb.get(), n, inter, weight(*w.w2), d, dyb.get(), dh->get(), dev_.grad(*w.w2));
    swiglu_backward(s.g->get(), s.u->get(), n, inter, float(c_.swiglu_limit), row_weights, dh->get(), dg->get(), du->get(),
                    drow_weights);
    const Operand dgb = operand(dg->get(), n * inter), dub = operand(du->get(), n * inter);
    linear_backward(blas_, operands_, s.xb.get(), n, d, weight(*w.w1), inter, dgb.get(), dx, dev_.grad(*w.w1));
    linear_backward(blas_, operands_, s.xb.get(), n, d, weight(*w.w3), inter, dub.get(), dx, dev_.grad(*w.w3));
  }

  // The streams collapsed by `pre`: hc_pre(X, pre).
  Tensor collapse(const Tensor& pre) {
    Tensor y = tensor(R_ * c_.dim);
    hc_pre_forward(X_->v(), pre->v(), R_, c_.hc_mult, c_.dim, y->v());
    tape_.record([this, X = X_, pre, y, R = R_] {
      if (y->has_grad()) hc_pre_backward(X->v(), pre->v(), R, c_.hc_mult, c_.dim, y->grad->get(), X->g(), pre->g());
    });
    return y;
  }

  // RoPE at `rows` positions (device), a new tensor; the backward turns the gradient back.
  void rope_at(Tensor& x, const Buffer<float>& freqs, int64_t heads, int64_t head_dim, const Buffer<int64_t>& positions,
               int64_t rows, bool inverse) {
    Tensor y = copy_of(x);
    rope_forward(y->v(), rows, heads, head_dim, c_.rope_head_dim, positions->get(), freqs->get(), inverse);
    tape_.record([this, x, y, freqs, heads, head_dim, positions, rows, inverse] {
      if (!y->has_grad()) return;
      Tensor dx = copy_of(std::make_shared<Node>(y->grad));
      rope_backward(dx->v(), rows, heads, head_dim, c_.rope_head_dim, positions->get(), freqs->get(), inverse);
      add_into(dx->v(), dx->size(), x->g());
    });
    x = y;
  }

  // x ← s · x.
  void scale(Tensor& x, float s) {
    Tensor y = std::make_shared<Node>(zeros<float>(x->size()));
    add_scaled_into(x->v(), x->size(), s, y->v());
    tape_.record([x, y, s] {
      if (y->has_grad()) add_scaled_into(y->grad->get(), y->size(), s, x->g());
    });
    x = y;
  }

  // The indexer's distillation loss at this index source (docs/training.md): its scores of the chosen
  // entries against the attention's probabilities of them (slots [window, entries) of each row).
  void index_loss(const Buffer<float>& p, int64_t window, int64_t entries) {
    const Indexed ix = indexed_;
    const int64_t heads = c_.index_n_heads, ihd = c_.index_head_dim, k = ix.k;
    Buffer<float> target = buffer<float>(R_ * k), scores = buffer<float>(R_ * k), loss = buffer<float>(B_);
    attention_target(p->get(), R_, c_.n_heads, entries, window, k, target->get());
    std::vector<int64_t> chosen;  // into the keys of every sequence
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t e : topk_[size_t(r)]) chosen.push_back(e < 0 ? -1 : seq_host_[size_t(r)] * (ix.n / B_) + e);
    Buffer<int64_t> idx = on_device(uploads_, chosen);
    indexer_scores_forward(ix.q->v(), ix.w->v(), ix.keys->v(), idx->get(), R_, heads, ihd, k, scores->get());
    // Each sequence's loss, the mean over its rows.
    index_distillation_loss(scores->get(), target->get(), R_, k, row_begin_device_->get(), B_, loss->get());
    const std::vector<float> sums = on_host(loss->get(), B_);
    for (int64_t b = 0; b < B_; ++b)
      if (rows_of(b) > 0) losses[size_t(b)].indexer += double(sums[size_t(b)]) / double(rows_of(b));
    tape_.record([this, ix, target, idx, scores, R = R_, begin = row_begin_device_] {
      const int64_t k = ix.k;
      Buffer<float> weighted = zeros<float>(R * k);
      index_distillation_backward(scores->get(), target->get(), R, k, begin->get(), B_, indexer_weight, weighted->get());
      indexer_scores_backward(ix.q->v(), ix.w->v(), ix.keys->v(), ix.n, idx->get(), R, c_.index_n_heads, c_.index_head_dim, k,
                              weighted->get(), ix.q->g(), ix.w->g(), ix.keys->g());
    });
  }

  // The current row of sequence b's position t (−1: cut).
  int64_t row_at(int64_t b, int64_t t) const { return row_at_.empty() ? b * L_ + t : row_at_[size_t(b * L_ + t)]; }

  // row_begin_ from seq_host_: the rows of each sequence follow each other, in sequence order. Its
  // copy on the device delimits the sequences for the losses, each one set of launches for the batch.
  void find_segments() {
    row_begin_.assign(size_t(B_ + 1), 0);
    for (int64_t b : seq_host_) ++row_begin_[size_t(b + 1)];
    for (int64_t b = 0; b < B_; ++b) row_begin_[size_t(b + 1)] += row_begin_[size_t(b)];
    row_begin_device_ = on_device(uploads_, row_begin_);
  }
  int64_t rows_of(int64_t b) const { return row_begin_[size_t(b + 1)] - row_begin_[size_t(b)]; }

  // The rows `rows` of x (width values each); the backward adds their gradient back.
  Tensor gather(const Tensor& x, const Buffer<int64_t>& rows, int64_t width) {
    const int64_t n = rows->size(), total = x->size() / width;
    Tensor y = tensor(n * width);
    gather_rows_forward(x->v(), total, width, rows->get(), n, y->v());
    tape_.record([x, y, rows, width, n, total] {
      if (y->has_grad()) gather_rows_backward(y->grad->get(), width, rows->get(), n, total, x->g());
    });
    return y;
  }

  static void copy_into(const float* from, int64_t n, float* to) {
    if (n > 0)
      cuda::check(cudaMemcpyAsync(to, from, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, nullptr), "train_cuda: copy");
  }

  // The layer's RoPE frequencies: compressed layers' with YaRN, SWA-only layers' without (forward/model.h).
  const Buffer<float>& freqs(int l) const { return c_.compress_ratios[size_t(l)] > 0 ? freqs_compressed_ : freqs_window_; }

  // A DSpark stage's context KV: its kv_norm(wkv(main_norm(main_proj(features)))) at the feature
  // rows' positions, RoPE'd, SWA-FP8 (train_ops.h's context_kv).
  const Tensor& context_kv(int l) {
    Tensor& kv = context_kv_[l];
    if (kv) return kv;
    const train::DSparkParams<float>& w = p_.dspark();
    if (!main_x_) {
      main_x_ = linear(target_->features_, w.main_proj);
      rms_norm(main_x_, c_.dim, w.main_norm);
    }
    const train::AttentionParams<float>& a = p_.layer(l).attn;
    kv = linear(main_x_, a.wkv);
    rms_norm(kv, c_.head_dim, a.kv_norm);
    rope_at(kv, freqs(l), 1, c_.head_dim, target_->feature_positions_, int64_t(target_->feature_positions_host_.size()), false);
    if (o_.swa_fp8) fake_quantized(kv, FakeQuant::SwaFp8);
    return kv;
  }

  // DSpark's attention: each row over its stage's context window before its anchor and its own
  // block (draft_lists.h), the table the context KV's rows and then the blocks'.
  Tensor attend_draft(int l, const Tensor& q, const Tensor& kv) {
    const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window_size, G = c_.dspark_block_size;
    const Tensor& ctx = context_kv(l);
    const int64_t L = int64_t(target_->feature_positions_host_.size());  // the context KV's rows
    Tensor table = tensor((L + R_) * hd);
    copy_into(ctx->v(), L * hd, table->v());
    copy_into(kv->v(), R_ * hd, table->v() + L * hd);
    const int64_t entries = W + G;
    // Each sequence's lists over its own context rows and blocks, moved to their rows in the table.
    std::vector<int64_t> lists;
    lists.reserve(size_t(R_ * entries));
    for (int64_t b = 0; b < B_; ++b) {
      if (anchors_[size_t(b)].empty()) continue;
      const int64_t f0 = target_->feature_row_begin_[size_t(b)], nf = target_->feature_row_begin_[size_t(b + 1)] - f0;
      const std::span<const int64_t> positions(target_->feature_positions_host_.data() + f0, size_t(nf));
      const std::span<const int64_t> floors =
          target_->floor_.empty() ? std::span<const int64_t>() : std::span<const int64_t>(target_->floor_.data() + b * L_, size_t(L_));
      for (int64_t i : train::draft_attention_lists(anchors_[size_t(b)], G, W, floors, positions, L_))
        lists.push_back(i < 0 ? -1 : i < nf ? f0 + i : L + row_begin_[size_t(b)] + (i - nf));
    }
    const Buffer<int64_t> list = on_device(uploads_, lists);
    const train::AttentionParams<float>& at = p_.layer(l).attn;
    Tensor o = tensor(R_ * H * hd);
    const Buffer<float> p = buffer<float>(R_ * H * entries), sink_p = buffer<float>(R_ * H);
    const float scale_qk = float(std::pow(double(hd), -0.5));
    sparse_attention_forward(q->v(), R_, H, hd, table->v(), list->get(), entries, dev_.value(*at.attn_sink), scale_qk, o->v(),
                             p->get(), sink_p->get());
    tape_.record([this, q, kv, ctx, table, list, entries, p, sink_p, o, scale_qk, sink = at.attn_sink, L, R = R_] {
      if (!o->has_grad()) return;
      const int64_t hd = c_.head_dim;
      sparse_attention_backward(q->v(), R, c_.n_heads, hd, table->v(), L + R, list->get(), entries, scale_qk, p->get(),
                                sink_p->get(), o->grad->get(), q->g(), table->g(), dev_.grad(*sink));
      add_into(table->grad->get(), L * hd, ctx->g());
      add_into(table->grad->get() + L * hd, R * hd, kv->g());
    });
    return o;
  }

  // x ← Q(x) (fake_quant.h); the gradient passes unchanged (straight-through).
  void fake_quantized(Tensor& x, FakeQuant codec) {
    Tensor y = tensor(x->size());
    fake_quantize(codec, x->v(), x->size(), y->v());
    tape_.record([x, y] {
      if (y->has_grad()) add_into(y->grad->get(), y->size(), x->g());
    });
    x = y;
  }

  void refuse_what_is_not_written() const {
    if (trace_ && trace_->forced_streams) fail("CUDA trainer", "a trace that imposes choices only", "imposed layer inputs");
  }
  [[noreturn]] static void not_written(const std::string& what) {
    fail("CUDA trainer", "the ops it has", what + " (not yet on the CUDA trainer)");
  }

  float eps() const { return float(c_.norm_eps); }
  HcMixOptions hc_options() const { return {c_.hc_mult, c_.hc_sinkhorn_iters, float(c_.norm_eps), float(c_.hc_eps)}; }

  const Config& c_;
  train::Parameters<float>& p_;
  DeviceParameters& dev_;
  Blas& blas_;
  PinnedUploads& uploads_;  // the model's: every upload of its forwards
  const train::TrainOptions& o_;
  train::Tape& tape_;
  const int64_t B_;  // the sequences
  const int64_t L_;  // each sequence's rows
  int64_t R_;        // the rows running: all of the sequences', until bounded replay cuts some
  std::vector<const int64_t*> engram_ids_;  // each sequence's, host [L, engram layers, columns]
  Trace* trace_;
  std::vector<std::vector<int64_t>>& load_;
  // Each running row's position and sequence; each sequence's first row (and the rows' end).
  std::vector<int64_t> positions_host_, seq_host_, row_begin_;
  Buffer<int64_t> row_begin_device_;  // row_begin_ on the device
  std::vector<std::vector<int64_t>> tokens_host_;  // each sequence's
  Buffer<int64_t> inputs_, targets_, positions_, prev_;  // prev_: the drafter's Markov tokens
  // Decoder bounded replay, by sequence b and position t at b·L + t (empty when no sequence is served
  // as calls): cut at the decoder start, the decoder window floor; the current row of each after the
  // cut (−1: cut); whether the decoder's kv-source compressed at the cut.
  std::vector<uint8_t> cut_;
  std::vector<int64_t> floor_, row_at_;
  bool compressed_at_cut_ = false;
  Buffer<float> freqs_window_, freqs_compressed_;  // the model's Constants
  Operands operands_;                               // the model's Constants
  Buffer<float> logits_, logit_max_, logit_sum_;     // the head's [R, vocab] and each row's max and Σ exp(z − max)
  Tensor X_, h_, y_;  // the streams [R, hc, dim]; the sub-layer's input and output [R, dim]
  Mix mix_[2];
  std::map<int, Compressed> compressed_;          // by kv-source layer
  Indexed indexed_;                               // the latest index source's
  std::vector<std::vector<int64_t>> topk_;        // [row] the latest index source's choice
  std::vector<std::vector<uint8_t>> candidates_;  // [row] the candidate source's pool
  // DSpark: the target's final hidden and context features [R, targets, dim]; the drafter's target,
  // anchors, main_x and each stage's context KV.
  Tensor final_, features_;
  std::vector<int64_t> feature_positions_host_, feature_row_begin_;  // features_' rows: positions, each sequence's first
  Buffer<int64_t> feature_positions_;
  const CudaTrainOps* target_ = nullptr;
  std::vector<std::vector<int64_t>> anchors_;  // each sequence's
  Tensor main_x_;
  std::map<int, Tensor> context_kv_;
};

CudaTrainModel::CudaTrainModel(train::Parameters<float>& params, DeviceParameters& device, train::TrainOptions options,
                               Operands operands)
    : params_(params), device_(device), options_(options),
      constants_(std::make_unique<Constants>(params.config(), operands, uploads_)) {
  reset_expert_load();
}

CudaTrainModel::~CudaTrainModel() = default;

std::vector<train::Losses> CudaTrainModel::forward(std::span<const train::TrainSequence> batch, Trace* trace) {
  const Config& c = params_.config();
  tape_.clear();  // the last forward's backward, if never run, reads the op sets replaced here
  drafter_.reset();
  ops_.reset();
  const bool draft = std::any_of(batch.begin(), batch.end(), [](const train::TrainSequence& q) { return !q.anchors.empty(); });
  if (trace) train::prepare_trace(c, *trace, draft);
  ops_ = std::make_unique<CudaTrainOps>(params_, device_, blas_, uploads_, *constants_, options_, tape_, batch, trace,
                                        expert_load_);
  ops_->record_features = draft;
  run_network(c, *ops_, trace);
  std::vector<train::Losses> losses = ops_->losses;
  if (draft) {
    drafter_ = std::make_unique<CudaTrainOps>(params_, device_, blas_, uploads_, options_, tape_, *ops_, batch, trace,
                                              expert_load_);
    run_drafter(c, *drafter_);
    for (size_t b = 0; b < losses.size(); ++b) {
      losses[b].dspark = drafter_->losses[b].dspark;
      losses[b].dspark_parts = drafter_->losses[b].dspark_parts;
    }
  }
  return losses;
}

train::Losses CudaTrainModel::forward(std::span<const int64_t> tokens, const int64_t* engram_ids, Trace* trace,
                                     std::span<const int64_t> anchors, std::span<const train::ServedCall> calls) {
  const train::TrainSequence one{tokens, engram_ids, anchors, calls};
  return forward(std::span<const train::TrainSequence>(&one, 1), trace)[0];
}

void CudaTrainModel::backward(float lm_weight, float indexer_weight, float dspark_weight) {
  if (!ops_) fail("CUDA train backward", "a forward first", "none");
  ops_->lm_weight = lm_weight;
  ops_->indexer_weight = indexer_weight;
  if (drafter_) drafter_->dspark_weight = dspark_weight;
  tape_.backward();
}

std::vector<float> CudaTrainModel::logits() const {
  if (!ops_ || !ops_->logits_buffer()) return {};
  const auto& z = ops_->logits_buffer();
  return on_host(z->get(), z->size());
}

// Every layer's experts, as the CPU's: a layer whose MoE did not run (a drafter not run) has loads
// of 0, which leave its bias where it is.
void CudaTrainModel::reset_expert_load() {
  const Config& c = params_.config();
  expert_load_.assign(size_t(params_.blocks()), {});
  for (int l = 0; l < params_.blocks(); ++l) expert_load_[size_t(l)].assign(size_t(c.routed_experts(l)), 0);
}

}  // namespace dsv41::train_cuda
