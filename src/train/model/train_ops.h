#pragma once
// The training op set of forward/network.h (docs/training.md, "The model"): network.h's Ops over one
// sequence's rows at positions 0 .. R − 1 in T, each op computed by its src/train/grad forward and
// recording its backward on the tape. Where the CPU forward (forward.cpp) keeps state across calls —
// the KV caches, the published top-k and candidate pool — this keeps it for the one call: the
// compressed KV and index keys of each kv-source, the latest index source's top-k, the candidate
// source's mask. A second instance, built over the first, is DSpark's drafter (run_drafter): its rows
// are the sequence's draft blocks, its attention reads the stages' context KV from the first's
// recorded features, and its head is DSpark's with the paper's loss.
//
// With served calls, the sequence runs as default mode serves those calls (decoder bounded replay,
// docs/training.md "Bounded replay in training"): the rows their plans cut leave at the decoder start
// (network.h's compress_cut, drop_cut), and the decoder's windows stop at each row's floor; rows then
// run at their own positions, no longer 0 .. R − 1.
//
// Against the CPU forward: no bf16 rounding points (docs/training.md, "Precision flow"); the caches'
// quantizations only as TrainOptions switch them on (fake quantization, straight-through); no
// activation quantization in front of fp8/fp4 products (the masters are fp32). The choices are made
// on unrounded scores by the engine's own selection functions (backend/cpu/indexer.h), or imposed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/rope.h"
#include "base/error.h"
#include "forward/model.h"
#include "forward/network.h"
#include "forward/window.h"
#include "model/gate.h"
#include "numerics/codecs.h"
#include "train/grad/compressor.h"
#include "train/grad/cross_entropy.h"
#include "train/grad/dspark.h"
#include "train/grad/embedding.h"
#include "train/grad/engram.h"
#include "train/grad/indexer.h"
#include "train/grad/linear.h"
#include "train/grad/mhc.h"
#include "train/grad/moe.h"
#include "train/grad/rms_norm.h"
#include "train/grad/rope.h"
#include "train/grad/sparse_attention.h"
#include "train/model/draft_lists.h"
#include "train/model/index_choice.h"
#include "train/model/parameters.h"
#include "train/model/tape.h"
#include "train/model/train_model.h"

namespace dsv41::train {

template <class T>
class TrainOps {
 public:
  using Tensor = train::Tensor<T>;  // network.h's Ops::Tensor

  // tokens [R + 1]: the R inputs and, one position on, their targets; engram_ids [R, engram layers,
  // columns] or nullptr; calls: the serving calls decoder bounded replay is simulated as (none: exact
  // mode).
  TrainOps(Parameters<T>& params, const TrainOptions& options, Tape& tape, std::span<const int64_t> tokens,
           const int64_t* engram_ids, Trace* trace, std::vector<std::vector<int64_t>>& expert_load,
           std::span<const ServedCall> calls = {})
      : c_(params.config()), p_(params), o_(options), tape_(tape), R_(int64_t(tokens.size()) - 1), L_(R_), engram_ids_(engram_ids),
        trace_(trace), load_(expert_load), rope_window_(rope_table(c_, false)), rope_compressed_(rope_table(c_, true)) {
    if (R_ < 1) fail("train forward", "a sequence of at least 2 tokens (inputs and their next tokens)", std::to_string(tokens.size()));
    for (int64_t t : tokens)
      if (t < 0 || t >= c_.vocab_size) fail("train forward", "token ids in [0, " + std::to_string(c_.vocab_size) + ")", std::to_string(t));
    if (c_.has_engram() && !engram_ids) fail("train forward", "Engram hash ids for a model with Engram", "none");
    tokens_.assign(tokens.begin(), tokens.end());
    inputs_.assign(tokens.begin(), tokens.end() - 1);
    targets_.assign(tokens.begin() + 1, tokens.end());
    for (int64_t r = 0; r < R_; ++r) positions_.push_back(r);
    check_forced_experts();
    if (!calls.empty()) plan_replay(calls);
  }

  // DSpark's drafter (network.h run_drafter) over draft blocks of `target`'s sequence (docs/training.md,
  // "DSpark"): block b at anchor a = anchors[b] holds the rows [token a, noise × (γ − 1)] at positions
  // a .. a + γ − 1, as forward/dspark.h drafts after the context 0 .. a − 1; row k's Markov head reads
  // the sequence's token a + k (teacher forcing) and it predicts token a + k + 1. The target's forward
  // must have run with record_features; under bounded replay, on every row of the blocks (the
  // target's distribution there is the loss's).
  TrainOps(Parameters<T>& params, const TrainOptions& options, Tape& tape, const TrainOps& target, std::span<const int64_t> anchors,
           grad::DSparkLabels& labels, Trace* trace, std::vector<std::vector<int64_t>>& expert_load)
      : c_(params.config()), p_(params), o_(options), tape_(tape), R_(int64_t(anchors.size()) * c_.dspark_block_size), L_(R_),
        engram_ids_(nullptr), trace_(trace), load_(expert_load), rope_window_(rope_table(c_, false)),
        rope_compressed_(rope_table(c_, true)), target_(&target), labels_(&labels), anchors_(anchors.begin(), anchors.end()) {
    const int64_t G = c_.dspark_block_size, L = target.L_;
    if (!c_.has_dspark()) fail("train forward", "a model with DSpark stages for draft blocks", "none");
    if (!target.features_) fail("train forward", "the target's context features for draft blocks", "a forward without them");
    for (int64_t a : anchors_) {
      if (a < 1 || a > L - G)
        fail("train forward", "draft anchors in [1, " + std::to_string(L - G) + "] (a context before, " + std::to_string(G) +
                                  " targets after)", std::to_string(a));
      for (int64_t k = 0; k < G; ++k) {
        if (target.row_at(a + k) < 0)
          fail("train forward", "draft blocks on rows the decoder ran (dspark_anchors with the served calls)",
               "anchor " + std::to_string(a) + ", whose position " + std::to_string(a + k) + " was cut");
        inputs_.push_back(k == 0 ? target.tokens_[size_t(a)] : c_.dspark_noise_token_id);
        positions_.push_back(a + k);
        prev_.push_back(target.tokens_[size_t(a + k)]);
        targets_.push_back(target.tokens_[size_t(a + k + 1)]);
      }
    }
    if (R_ == 0) fail("train forward", "at least one draft anchor", "none");
    check_forced_experts();
  }

  Losses losses;
  Margins margins;
  const Tensor& final_hidden() const { return final_; }
  // The seeds of the losses' gradients, read when the backward runs.
  T lm_weight = T(1), indexer_weight = T(1), dspark_weight = T(1);
  // The target records DSpark's context features (record_target) for a drafter to read.
  bool record_features = false;
  // The drafter's last Markov-corrected logits [rows, vocab] and confidence logits [rows].
  const Tensor& draft_logits() const { return draft_logits_; }
  const Tensor& draft_confidence() const { return draft_confidence_; }

  // --- network.h's op set -----------------------------------------------------------------------

  int64_t rows() const { return R_; }
  // Decoder bounded replay (plan_replay): rows leave at the decoder start.
  bool cuts_rows() const { return std::find(cut_.begin(), cut_.end(), uint8_t(1)) != cut_.end(); }

  void embed() {
    const int64_t d = c_.dim, hc = c_.hc_mult;
    std::vector<T> x(size_t(R_ * d));
    grad::gather_rows_forward(p_.embed().v(), c_.vocab_size, d, inputs_.data(), R_, x.data());
    Tensor X = tensor<T>(size_t(R_ * hc * d));
    grad::hc_expand_forward(x.data(), R_, int(hc), d, X->v());
    // The drafter reads the target's embedding frozen (DSpark's loss trains no backbone weight).
    if (!target_) tape_.record([this, X, R = R_] {
      if (!X->has_grad()) return;
      const int64_t d = c_.dim;
      std::vector<T> dx(size_t(R * d), T(0));
      grad::hc_expand_backward(X->grad.data(), R, c_.hc_mult, d, dx.data());
      grad::gather_rows_backward(dx.data(), d, inputs_.data(), R, p_.embed().g());
    });
    X_ = X;
    // The first attention input's `pre`: the one-hot e0 (a constant).
    mix_[size_t(Sub::Ffn)].pre = tensor<T>(size_t(R_ * hc));
    for (int64_t r = 0; r < R_; ++r) mix_[size_t(Sub::Ffn)].pre->value[size_t(r * hc)] = T(1);
  }

  void mix(int l, Sub s) {
    HcParams<T>& w = s == Sub::Attention ? p_.layer(l).hc_attn : p_.layer(l).hc_ffn;
    const int64_t hc = c_.hc_mult;
    Mix& m = mix_[size_t(s)];
    m = Mix{tensor<T>(size_t(R_ * hc)), tensor<T>(size_t(R_ * hc)), tensor<T>(size_t(R_ * hc * hc))};
    auto saved = std::make_shared<grad::HcMixesSaved<T>>();
    grad::hc_mixes_forward(X_->v(), R_, c_.dim, w.fn->v(), w.base->v(), w.scale->v(), hc_options(), m.pre->v(), m.post->v(),
                           m.comb->v(), *saved);
    tape_.record([this, X = X_, m, saved, &w, R = R_] {
      if (!m.pre->has_grad() && !m.post->has_grad() && !m.comb->has_grad()) return;
      grad::hc_mixes_backward(X->v(), R, c_.dim, w.fn->v(), w.base->v(), w.scale->v(), hc_options(), *saved, m.pre->g(),
                              m.post->g(), m.comb->g(), X->g(), w.fn->g(), w.base->g(), w.scale->g());
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
    const int64_t hc = c_.hc_mult, d = c_.dim;
    const Mix m = mix_[size_t(s)];
    Tensor out = tensor<T>(X_->size());
    grad::hc_post_forward(y_->v(), X_->v(), m.post->v(), m.comb->v(), R_, int(hc), d, out->v());
    tape_.record([this, y = y_, X = X_, m, out, R = R_] {
      if (!out->has_grad()) return;
      grad::hc_post_backward(y->v(), X->v(), m.post->v(), m.comb->v(), R, c_.hc_mult, c_.dim, out->grad.data(), y->g(), X->g(),
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
    EngramParams<T>& g = *p_.layer(l).engram;
    const int e = c_.engram_index(l), cols = c_.engram_hash_columns(), n_engram = int(c_.engram_layer_ids.size());
    const int64_t ehd = c_.engram_head_dim, rows = g.table->shape[0], hc = c_.hc_mult, d = c_.dim;
    auto ids = std::make_shared<std::vector<int64_t>>(size_t(R_ * cols));
    for (int64_t r = 0; r < R_; ++r)
      std::copy_n(engram_ids_ + (positions_[size_t(r)] * n_engram + e) * cols, cols, ids->data() + r * cols);
    Tensor emb = tensor<T>(size_t(R_ * cols * ehd));
    grad::gather_rows_forward(g.table->v(), rows, ehd, ids->data(), R_ * cols, emb->v());
    tape_.record([this, emb, ids, &g] {
      if (emb->has_grad()) grad::gather_rows_backward(emb->grad.data(), c_.engram_head_dim, ids->data(), ids->size(), g.table->g());
    });
    Tensor kv = linear(emb, g.wkv);
    Tensor out = tensor<T>(X_->size());
    auto saved = std::make_shared<grad::EngramGateSaved<T>>();
    grad::engram_gate_forward(X_->v(), kv->v(), g.q_weight->v(), g.k_weight->v(), R_, int(hc), d, eps(), out->v(), *saved);
    for (T dot : saved->dot) margins.engram_dot = std::min(margins.engram_dot, double(std::fabs(dot)));
    tape_.record([this, X = X_, kv, out, saved, &g, R = R_] {
      if (!out->has_grad()) return;
      grad::engram_gate_backward(X->v(), kv->v(), g.q_weight->v(), g.k_weight->v(), R, c_.hc_mult, c_.dim, *saved,
                                 out->grad.data(), X->g(), kv->g(), g.q_weight->g(), g.k_weight->g());
    });
    X_ = out;
  }

  void attention(int l) { dsv41::attention(c_, *this, l); }

  void moe(int l) {
    LayerParams<T>& L = p_.layer(l);
    const int64_t d = c_.dim, inter = c_.moe_inter_dim, E = c_.routed_experts(l);
    const GateOptions opt = gate_options(c_, l);
    const int32_t* forced = nullptr;
    if (trace_ && trace_->forced_experts && size_t(l) < trace_->forced_experts->size()) {
      const std::vector<int32_t>& f = (*trace_->forced_experts)[size_t(l)];
      if (int64_t(f.size()) != R_ * opt.topk)
        fail("train forward", "imposed experts of layer " + std::to_string(l) + " for " + std::to_string(R_) + " rows",
             std::to_string(f.size()) + " experts");
      forced = f.data();
    }
    Tensor x = h_, y = tensor<T>(size_t(R_ * d));
    auto saved = std::make_shared<grad::MoeSaved<T>>();
    grad::moe_forward(x->v(), R_, d, inter, moe_weights(L, false), opt, T(c_.swiglu_limit), y->v(), *saved, forced);
    if (trace_) {
      trace_->route_experts[size_t(l)] = saved->experts;
      std::vector<float>& biased = trace_->route_scores[size_t(l)];
      biased.resize(size_t(R_ * E));
      for (int64_t i = 0; i < R_ * E; ++i) biased[size_t(i)] = float(saved->gate.scores[size_t(i)] + L.gate_bias->value[size_t(i % E)]);
    }
    for (T z : saved->gate.logits) margins.gate_logit = std::max(margins.gate_logit, double(std::fabs(z)));
    auto widest = [&](const grad::ExpertSaved<T>& e) {
      for (const std::vector<T>* v : {&e.gate, &e.up})
        for (T z : *v) margins.expert_preactivation = std::max(margins.expert_preactivation, double(std::fabs(z)));
    };
    for (const grad::ExpertSaved<T>& e : saved->routed) widest(e);
    widest(saved->shared);
    load_[size_t(l)].resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) load_[size_t(l)][size_t(e)] += int64_t(saved->rows_of[size_t(e)].size());
    tape_.record([this, x, y, saved, l, opt, R = R_] {
      if (!y->has_grad()) return;
      LayerParams<T>& L = p_.layer(l);
      grad::moe_backward(x->v(), R, c_.dim, int64_t(c_.moe_inter_dim), moe_weights(L, false), opt, T(c_.swiglu_limit), *saved,
                         y->grad.data(), x->g(), moe_weights(L, true));
    });
    y_ = y;
  }

  // The final collapse with the last FFN's `pre`, the norm, the head and the next-token loss.
  void logits() {
    Tensor h = collapse(mix_[size_t(Sub::Ffn)].pre);
    rms_norm(h, c_.dim, &p_.norm());
    auto saved = std::make_shared<grad::CrossEntropySaved<T>>();
    losses.lm = double(grad::head_cross_entropy_forward(h->v(), R_, c_.dim, p_.head().v(), c_.vocab_size, targets_.data(), *saved));
    tape_.record([this, h, saved, R = R_] {
      grad::head_cross_entropy_backward(h->v(), R, c_.dim, p_.head().v(), c_.vocab_size, targets_.data(), *saved, lm_weight, h->g(),
                                        p_.head().g());
    });
    final_ = h;
  }

  // DSpark's context features (network.h record_target): the residual entering target layer l
  // averaged over the streams, [rows, targets, dim], detached: DSpark's loss does not reach the
  // backbone (docs/decisions.md). Under bounded replay, of the rows the layer runs (feature_positions_),
  // as serving records them: every target layer on the same rows.
  bool records_targets() const { return record_features; }
  void record_target(int l) {
    const int64_t hc = c_.hc_mult, d = c_.dim, n = int64_t(c_.dspark_target_layer_ids.size()), t = c_.dspark_target_index(l);
    if (!features_) {
      features_ = tensor<T>(size_t(R_ * n * d));
      feature_positions_ = positions_;
    }
    if (feature_positions_.size() != size_t(R_))
      fail("train forward", "DSpark target layers that all run on the same rows (none before the decoder start when rows leave there)",
           "layer " + std::to_string(l) + " on " + std::to_string(R_) + " rows");
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t k = 0; k < d; ++k) {
        T sum = 0;
        for (int64_t m = 0; m < hc; ++m) sum += X_->value[size_t((r * hc + m) * d + k)];
        features_->value[size_t((r * n + t) * d + k)] = sum / T(hc);
      }
  }

  // DSpark's head (forward/dspark.h) and loss (grad/dspark.h): the last stage's `pre` collapses the
  // streams into x; base logits u = head(norm(x)) through the target's head, frozen; the Markov bias
  // of each row's token before; the confidence of [x ; e]; the loss against the target's
  // distribution at the same positions (its logits, detached) and the sequence's next tokens.
  void draft_head() {
    const int64_t d = c_.dim, V = c_.vocab_size, rank = c_.dspark_markov_rank, G = c_.dspark_block_size;
    DSparkParams<T>& w = p_.dspark();
    Tensor x = collapse(mix_[size_t(Sub::Ffn)].pre);
    Tensor h = x;
    rms_norm(h, d, w.norm);
    Tensor u = tensor<T>(size_t(R_ * V));
    grad::linear_forward(h->v(), R_, d, p_.head().v(), V, u->v());
    tape_.record([this, h, u, R = R_] {
      if (u->has_grad())
        grad::linear_backward(h->v(), R, c_.dim, p_.head().v(), c_.vocab_size, u->grad.data(), h->g(), static_cast<T*>(nullptr));
    });
    Tensor e = tensor<T>(size_t(R_ * rank));
    grad::gather_rows_forward(w.markov_embed->v(), V, rank, prev_.data(), R_, e->v());
    tape_.record([this, e, &w, R = R_] {
      if (e->has_grad()) grad::gather_rows_backward(e->grad.data(), c_.dspark_markov_rank, prev_.data(), R, w.markov_embed->g());
    });
    Tensor z = tensor<T>(size_t(R_ * V));
    grad::markov_forward(u->v(), R_, V, w.markov_head->v(), rank, e->v(), z->v());
    tape_.record([this, u, e, z, &w, R = R_] {
      if (z->has_grad())
        grad::markov_backward(e->v(), R, c_.vocab_size, w.markov_head->v(), c_.dspark_markov_rank, z->grad.data(), u->g(), e->g(),
                              w.markov_head->g());
    });
    Tensor conf = tensor<T>(size_t(R_));
    grad::confidence_forward(x->v(), e->v(), R_, d, rank, w.confidence->v(), conf->v());
    tape_.record([this, x, e, conf, &w, R = R_] {
      if (conf->has_grad())
        grad::confidence_backward(x->v(), e->v(), R, c_.dim, int64_t(c_.dspark_markov_rank), w.confidence->v(), conf->grad.data(),
                                  x->g(), e->g(), w.confidence->g());
    });

    // The target's distribution at each row's position, and the rows' shares: position weights
    // exp(−k/γ) normalized over a block, averaged over the blocks (ρ); every row alike for L_conf (κ).
    auto q = std::make_shared<std::vector<T>>(size_t(R_ * V));
    std::vector<T> hidden(size_t(R_ * d));
    for (int64_t r = 0; r < R_; ++r)
      std::copy_n(target_->final_->value.begin() + target_->row_at(positions_[size_t(r)]) * d, d, hidden.begin() + r * d);
    grad::linear_forward(hidden.data(), R_, d, p_.head().v(), V, q->data());
    for (int64_t r = 0; r < R_; ++r) {
      T* row = q->data() + r * V;
      const T mx = *std::max_element(row, row + V);
      T sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += (row[v] = std::exp(row[v] - mx));
      for (int64_t v = 0; v < V; ++v) row[v] /= sum;
    }
    const int64_t blocks = R_ / G;
    T weight_sum = 0;
    for (int64_t k = 0; k < G; ++k) weight_sum += std::exp(-T(k) / T(G));
    rho_.resize(size_t(R_));
    for (int64_t r = 0; r < R_; ++r) rho_[size_t(r)] = std::exp(-T(r % G) / T(G)) / (weight_sum * T(blocks));
    const T kappa = T(1) / T(R_);
    auto saved = std::make_shared<grad::DSparkLossSaved<T>>();
    const grad::DSparkLossParts parts =
        grad::dspark_loss_forward(z->v(), q->data(), R_, V, targets_.data(), conf->v(), rho_.data(), kappa, *labels_, *saved);
    losses.dspark = parts.total(grad::DSparkLossWeights{});
    losses.dspark_parts = parts;
    tape_.record([this, z, conf, saved, kappa, R = R_] {
      grad::dspark_loss_backward(conf->v(), R, c_.vocab_size, targets_.data(), rho_.data(), kappa, *labels_, *saved,
                                 grad::DSparkLossWeights{}, dspark_weight, z->g(), conf->g());
    });
    draft_logits_ = z;
    draft_confidence_ = conf;
  }
  // Decoder bounded replay at the decoder start (network.h): its kv-source compresses every row's
  // collapsed stream, the cut rows included, and is not run again in its attention.
  void compress_cut(int l) {
    compress(l);
    compressed_at_cut_ = true;
  }

  // The cut rows leave: the streams and the `pre` of their next input keep the other rows (a gather,
  // whose backward scatters the gradient back), as do the rows' positions, targets and floors.
  void drop_cut() {
    const int64_t hc = c_.hc_mult, d = c_.dim;
    auto kept = std::make_shared<std::vector<int64_t>>();  // current rows that stay
    for (int64_t r = 0; r < R_; ++r)
      if (!cut_[size_t(positions_[size_t(r)])]) kept->push_back(r);
    const int64_t n = int64_t(kept->size());
    auto gather = [&](const Tensor& x, int64_t width) {
      Tensor y = tensor<T>(size_t(n * width));
      for (int64_t i = 0; i < n; ++i) std::copy_n(x->value.begin() + (*kept)[size_t(i)] * width, width, y->value.begin() + i * width);
      tape_.record([x, y, kept, width] {
        if (!y->has_grad()) return;
        T* dx = x->g();
        for (size_t i = 0; i < kept->size(); ++i)
          for (int64_t j = 0; j < width; ++j) dx[(*kept)[i] * width + j] += y->grad[i * size_t(width) + size_t(j)];
      });
      return y;
    };
    X_ = gather(X_, hc * d);
    mix_[size_t(Sub::Ffn)].pre = gather(mix_[size_t(Sub::Ffn)].pre, hc);
    std::vector<int64_t> positions, targets;
    for (int64_t r : *kept) {
      positions.push_back(positions_[size_t(r)]);
      targets.push_back(targets_[size_t(r)]);
    }
    positions_ = std::move(positions);
    targets_ = std::move(targets);
    R_ = n;
    row_at_.assign(size_t(L_), -1);
    for (int64_t r = 0; r < R_; ++r) row_at_[size_t(positions_[size_t(r)])] = r;
  }

  // Layer-local parity (Trace::forced_streams): layer l starts from the imposed streams and mix.
  void impose_input(int l) {
    if (!trace_->forced_pre_mix) fail("train forward", "imposed input mixes with the imposed streams", "none");
    const std::vector<float>& streams = trace_->forced_streams->at(size_t(l - 1));
    const std::vector<float>& pre = trace_->forced_pre_mix->at(size_t(l - 1));
    if (streams.size() != X_->size() || pre.size() != mix_[size_t(Sub::Ffn)].pre->size())
      fail("train forward", "imposed inputs of layer " + std::to_string(l) + " for " + std::to_string(R_) + " rows",
           std::to_string(streams.size()) + " stream and " + std::to_string(pre.size()) + " mix values");
    X_ = std::make_shared<Node<T>>(std::vector<T>(streams.begin(), streams.end()));
    mix_[size_t(Sub::Ffn)].pre = std::make_shared<Node<T>>(std::vector<T>(pre.begin(), pre.end()));
  }
  void record_block(int l) { trace_->block_out[size_t(l)].assign(X_->value.begin(), X_->value.end()); }

  // --- the attention's ops (network.h attention()) -------------------------------------------------

  const LayerParams<T>& layer(int l) const { return p_.layer(l); }
  const Tensor& h() const { return h_; }

  // y = x Wᵀ, rows of W.shape[1] values in, W.shape[0] out.
  Tensor linear(const Tensor& x, Param<T>* w) {
    const int64_t N = w->shape[0], K = w->shape[1], M = int64_t(x->size()) / K;
    Tensor y = tensor<T>(size_t(M * N));
    grad::linear_forward(x->v(), M, K, w->v(), N, y->v());
    tape_.record([x, y, w, M, N, K] {
      if (y->has_grad()) grad::linear_backward(x->v(), M, K, w->v(), N, y->grad.data(), x->g(), w->g());
    });
    return y;
  }

  // RMSNorm over rows of `cols` (w: the weight), in place of x.
  void rms_norm(Tensor& x, int64_t cols, Param<T>* w) {
    const int64_t rows = int64_t(x->size()) / cols;
    Tensor y = tensor<T>(x->size());
    auto saved = std::make_shared<grad::RmsNormSaved<T>>();
    grad::rms_norm_forward(x->v(), rows, cols, w->v(), eps(), y->v(), *saved);
    tape_.record([x, y, w, rows, cols, saved] {
      if (y->has_grad()) grad::rms_norm_backward(x->v(), rows, cols, w->v(), *saved, y->grad.data(), x->g(), w->g());
    });
    x = y;
  }

  // RoPE of layer l on each head's last rope_head_dim values, at the rows' positions.
  void rope(Tensor& x, int l, int heads, int64_t head_dim, bool inverse) {
    rope_at(x, table(l), heads, head_dim, positions_, inverse);
  }

  // This call's window entries: SWA-FP8 when switched on.
  void window_entries(int, Tensor& kv) {
    if (o_.swa_fp8) fake_quantize(kv, c_.head_dim, swa_fp8::quantize_dequantize);
  }
  void keep_window(int, const Tensor&) {}  // no cache: the window is this call's rows

  // A kv-source's compressed entries (main KV, after RoPE) and index keys (from the latent before
  // RoPE, detached: docs/training.md "The indexer's gradient"), one per complete group of `ratio` rows.
  void compress(int l) {
    if (compressed_at_cut_ && l == c_.decoder_start()) return;
    const AttentionParams<T>& a = p_.layer(l).attn;
    const int ratio = c_.compress_ratios[size_t(l)];
    const int64_t hd = c_.head_dim;
    Compressed& s = compressed_[l];
    s.entries = R_ / ratio;
    for (int64_t g = 0; g < s.entries; ++g) s.positions.push_back(g * ratio);  // the group's first token
    Tensor latent;
    if (ratio == 1) {
      latent = linear(h_, a.compressor_wkv);
    } else {
      Tensor kv = linear(h_, a.compressor_wkv), score = linear(h_, a.compressor_wgate);
      latent = tensor<T>(size_t(s.entries * hd));
      grad::compressor_pool_forward(kv->v(), score->v(), R_, hd, ratio, latent->v());
      tape_.record([this, kv, score, pooled = latent, ratio, hd, R = R_] {
        if (pooled->has_grad())
          grad::compressor_pool_backward(kv->v(), score->v(), R, hd, ratio, pooled->v(), pooled->grad.data(), kv->g(), score->g());
      });
    }
    rms_norm(latent, hd, a.compressor_norm);
    Tensor keys = linear(detach(latent), a.indexer_wk);
    rms_norm(keys, c_.index_head_dim, a.indexer_k_norm);
    rope_at(keys, table(l), 1, c_.index_head_dim, s.positions, false);
    if (o_.mxfp4_indexer) fake_quantize(keys, c_.index_head_dim, mxfp4::quantize_dequantize);
    rope_at(latent, table(l), 1, hd, s.positions, false);
    if (o_.kv_fp4) fake_quantize(latent, hd, kv_fp4::quantize_dequantize);
    s.kv = latent;
    s.keys = keys;
  }

  // An index source's top-k over its kv-source's entries (the candidate source's pool first), and
  // the indexer's query and weights for its loss (from qr and h detached).
  void index(int l, const Tensor& qr) {
    const AttentionParams<T>& a = p_.layer(l).attn;
    const Compressed& s = compressed_.at(c_.kv_source_of(l));
    const int ratio = c_.compress_ratios[size_t(l)], heads = c_.index_n_heads;
    const int64_t ihd = c_.index_head_dim, n = s.entries, k = std::min<int64_t>(c_.index_topk, n);
    Indexed& ix = indexed_;
    ix = Indexed{};
    ix.keys = s.keys;
    ix.q = linear(detach(qr), a.indexer_wq_b);
    rope(ix.q, l, heads, ihd, false);
    if (o_.mxfp4_indexer) fake_quantize(ix.q, ihd, mxfp4::quantize_dequantize);
    ix.w = linear(detach(h_), a.indexer_weights_proj);
    scale(ix.w, T(std::pow(double(ihd), -0.5) * std::pow(double(heads), -0.5)));

    if (l == c_.candidate_source_layer) candidates_.assign(size_t(R_), {});
    const std::vector<std::vector<int64_t>>* imposed = imposed_topk(trace_, l, R_);
    topk_.assign(size_t(R_), {});
    std::vector<float> scores(static_cast<size_t>(n));
    for (int64_t r0 = 0; r0 < R_; r0 += kScoreRows) {
      const int64_t rows = std::min(kScoreRows, R_ - r0);
      const std::vector<T> block = index_scores(ix, r0, rows, n);
      for (int64_t r = r0; r < r0 + rows; ++r) {
        for (int64_t t = 0; t < n; ++t) scores[size_t(t)] = float(block[size_t((r - r0) * n + t)]);
        const int64_t visible = (positions_[size_t(r)] + 1) / ratio;
        topk_[size_t(r)] = choose_index_row(c_, l, r, scores.data(), n, visible, k, candidates_, imposed);
      }
    }
    ix.k = int64_t(topk_[0].size());
    if (trace_) trace_->topk[l] = topk_;
  }

  // o: each row over its window (this call's kv rows) and its chosen compressed entries, with the
  // sink; at an index source, the indexer's loss against this attention.
  Tensor attend(int l, const Tensor& q, const Tensor& kv) {
    if (target_) return attend_draft(l, q, kv);
    const AttentionParams<T>& a = p_.layer(l).attn;
    const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window_size;
    const bool compressed = c_.compress_ratios[size_t(l)] > 0;
    const Compressed* s = compressed ? &compressed_.at(c_.kv_source_of(l)) : nullptr;
    const int64_t k = compressed ? int64_t(topk_.empty() ? 0 : topk_[0].size()) : 0;
    const int64_t window = std::min(L_, W), entries = window + k, n = s ? s->entries : 0;
    // The KV table: the window rows, then the compressed entries.
    Tensor table = tensor<T>(size_t((R_ + n) * hd));
    std::copy(kv->value.begin(), kv->value.end(), table->value.begin());
    if (s) std::copy(s->kv->value.begin(), s->kv->value.end(), table->value.begin() + R_ * hd);
    auto idx = std::make_shared<std::vector<int64_t>>();
    idx->reserve(size_t(R_ * entries));
    std::vector<int64_t> slots;
    // Each row's window as a first prefill of the whole sequence lists it (window.h), stopped at the
    // row's floor: the decoder window floor of its call under bounded replay (call_plan.h), else 0.
    // Every position the window keeps runs this layer (the decoder runs [floor, row] whole).
    const bool floored = !floor_.empty() && l >= c_.decoder_start();
    for (int64_t r = 0; r < R_; ++r) {
      window_positions(positions_[size_t(r)], 0, L_, W, floored ? floor_[size_t(positions_[size_t(r)])] : 0, slots);
      for (int64_t t : slots) idx->push_back(t == kEmptySlot ? kEmptySlot : row_at(t));
      for (int64_t j = 0; j < k; ++j) idx->push_back(topk_[size_t(r)][size_t(j)] < 0 ? -1 : R_ + topk_[size_t(r)][size_t(j)]);
    }
    Tensor o = tensor<T>(size_t(R_ * H * hd));
    auto saved = std::make_shared<grad::SparseAttentionSaved<T>>();
    const T scale_qk = T(std::pow(double(hd), -0.5));
    grad::sparse_attention_forward(q->v(), R_, H, hd, table->v(), idx->data(), entries, a.attn_sink->v(), scale_qk, o->v(), *saved);
    tape_.record([this, q, kv, kvc = s ? s->kv : Tensor(), table, idx, entries, saved, o, scale_qk, sink = a.attn_sink, R = R_] {
      if (!o->has_grad()) return;
      const int64_t hd = c_.head_dim;
      grad::sparse_attention_backward(q->v(), R, int64_t(c_.n_heads), hd, table->v(), idx->data(), entries, scale_qk, *saved,
                                      o->grad.data(), q->g(), table->g(), sink->g());
      add_to(table->grad.data(), R * hd, kv->g());
      if (kvc) add_to(table->grad.data() + R * hd, int64_t(kvc->size()), kvc->g());
    });
    if (c_.is_index_source(l) && k > 0) index_loss(*saved, window, entries);
    return o;
  }

  Tensor linear_grouped(const Tensor& o, Param<T>* wo_a) {
    const int64_t G = c_.o_groups, Kg = int64_t(c_.n_heads) * c_.head_dim / G, Ng = c_.o_lora_rank;
    Tensor y = tensor<T>(size_t(R_ * G * Ng));
    grad::linear_grouped_forward(o->v(), R_, G, Kg, wo_a->v(), Ng, y->v());
    tape_.record([this, o, y, wo_a, G, Kg, Ng, R = R_] {
      if (y->has_grad()) grad::linear_grouped_backward(o->v(), R, G, Kg, wo_a->v(), Ng, y->grad.data(), o->g(), wo_a->g());
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
    int64_t entries = 0;
    std::vector<int64_t> positions;  // each entry's group's first position
    Tensor kv, keys;                 // [entries, head_dim], [entries, index_head_dim]
  };
  // An index source's indexer, for its loss in attend().
  struct Indexed {
    Tensor q, w, keys;  // [R, heads, index_head_dim], [R, heads], [entries, index_head_dim]
    int64_t k = 0;
  };

  static constexpr int64_t kScoreRows = 64;  // rows scored against every entry at once

  void check_forced_experts() const {
    if (!trace_ || !trace_->forced_experts) return;
    const size_t n = trace_->forced_experts->size();
    if (n != size_t(c_.n_layers) && n != size_t(c_.n_total_layers()))
      fail("train forward", "imposed experts for " + std::to_string(c_.n_layers) + " layers (or " + std::to_string(c_.n_total_layers()) +
                                " with the DSpark stages)", std::to_string(n));
  }

  // Stage l's context KV (forward/dspark.h dspark_ingest): kv_norm(wkv(main_x)) RoPE'd at the
  // position of each row the target recorded features of (SWA-FP8 when on), main_x =
  // main_norm(main_proj(features)).
  const Tensor& context_kv(int l) {
    Tensor& kv = context_kv_[l];
    if (kv) return kv;
    const DSparkParams<T>& w = p_.dspark();
    if (!main_x_) {
      main_x_ = linear(target_->features_, w.main_proj);
      rms_norm(main_x_, c_.dim, w.main_norm);
    }
    const AttentionParams<T>& a = p_.layer(l).attn;
    kv = linear(main_x_, a.wkv);
    rms_norm(kv, c_.head_dim, a.kv_norm);
    rope_at(kv, table(l), 1, c_.head_dim, target_->feature_positions_, false);
    if (o_.swa_fp8) fake_quantize(kv, c_.head_dim, swa_fp8::quantize_dequantize);
    return kv;
  }

  // DSpark's attention (forward.cpp attend_draft): each row over its stage's context window before
  // its anchor and its own block (draft_lists.h).
  Tensor attend_draft(int l, const Tensor& q, const Tensor& kv) {
    const int64_t H = c_.n_heads, hd = c_.head_dim, W = c_.window_size, G = c_.dspark_block_size;
    const Tensor& ctx = context_kv(l);
    const int64_t L = int64_t(target_->feature_positions_.size());  // the context KV's rows
    Tensor table = tensor<T>(size_t((L + R_) * hd));
    std::copy(ctx->value.begin(), ctx->value.end(), table->value.begin());
    std::copy(kv->value.begin(), kv->value.end(), table->value.begin() + L * hd);
    const int64_t entries = W + G;
    auto idx = std::make_shared<std::vector<int64_t>>(
        draft_attention_lists(anchors_, G, W, target_->floor_, target_->feature_positions_, target_->L_));
    const AttentionParams<T>& at = p_.layer(l).attn;
    Tensor o = tensor<T>(size_t(R_ * H * hd));
    auto saved = std::make_shared<grad::SparseAttentionSaved<T>>();
    const T scale_qk = T(std::pow(double(hd), -0.5));
    grad::sparse_attention_forward(q->v(), R_, H, hd, table->v(), idx->data(), entries, at.attn_sink->v(), scale_qk, o->v(), *saved);
    tape_.record([this, q, kv, ctx, table, idx, entries, saved, o, scale_qk, sink = at.attn_sink, L, R = R_] {
      if (!o->has_grad()) return;
      const int64_t hd = c_.head_dim;
      grad::sparse_attention_backward(q->v(), R, int64_t(c_.n_heads), hd, table->v(), idx->data(), entries, scale_qk, *saved,
                                      o->grad.data(), q->g(), table->g(), sink->g());
      add_to(table->grad.data(), L * hd, ctx->g());
      add_to(table->grad.data() + L * hd, R * hd, kv->g());
    });
    return o;
  }

  // Decoder bounded replay (TrainModel::forward's served calls): each row's fate (replay_rows).
  void plan_replay(std::span<const ServedCall> calls) {
    ReplayRows fate = replay_rows(c_, R_, calls);
    cut_ = std::move(fate.cut);
    floor_ = std::move(fate.floor);
  }

  int64_t row_at(int64_t position) const { return row_at_.empty() ? position : row_at_[size_t(position)]; }

  static void add_to(const T* from, int64_t n, T* to) {
    for (int64_t i = 0; i < n; ++i) to[i] += from[i];
  }

  T eps() const { return T(c_.norm_eps); }
  grad::HcOptions hc_options() const { return grad::HcOptions{c_.hc_mult, c_.hc_sinkhorn_iters, c_.norm_eps, c_.hc_eps}; }
  // The layer's RoPE (forward/model.h rope_table): compressed layers' with YaRN, SWA-only layers' without.
  const RopeTable& table(int l) const { return c_.compress_ratios[size_t(l)] > 0 ? rope_compressed_ : rope_window_; }

  // The streams collapsed by `pre`: hc_pre(X, pre).
  Tensor collapse(const Tensor& pre) {
    Tensor y = tensor<T>(size_t(R_ * c_.dim));
    grad::hc_pre_forward(X_->v(), pre->v(), R_, c_.hc_mult, c_.dim, y->v());
    tape_.record([this, X = X_, pre, y, R = R_] {
      if (y->has_grad()) grad::hc_pre_backward(X->v(), pre->v(), R, c_.hc_mult, c_.dim, y->grad.data(), X->g(), pre->g());
    });
    return y;
  }

  void rope_at(Tensor& x, const RopeTable& rope, int64_t heads, int64_t head_dim, const std::vector<int64_t>& positions,
               bool inverse) {
    const int64_t rows = int64_t(positions.size()), rd = c_.rope_head_dim;
    Tensor y = std::make_shared<Node<T>>(x->value);
    grad::rope_forward(y->v(), rows, heads, head_dim, rd, positions.data(), rope.frequencies().data(), inverse);
    tape_.record([x, y, &rope, rows, heads, head_dim, rd, pos = positions, inverse] {
      if (!y->has_grad()) return;
      std::vector<T> dx = y->grad;
      grad::rope_backward(dx.data(), rows, heads, head_dim, rd, pos.data(), rope.frequencies().data(), inverse);
      add_to(dx.data(), int64_t(dx.size()), x->g());
    });
    x = y;
  }

  // x ← Q(x) per vector of d values, Q a codec's quantize_dequantize (in fp32); the gradient passes
  // unchanged (straight-through).
  void fake_quantize(Tensor& x, int64_t d, void (*q)(float*, int)) {
    Tensor y = tensor<T>(x->size());
    std::vector<float> v(static_cast<size_t>(d));
    for (size_t i = 0; i < x->size(); i += size_t(d)) {
      std::copy_n(x->value.begin() + int64_t(i), d, v.begin());
      q(v.data(), int(d));
      std::copy(v.begin(), v.end(), y->value.begin() + int64_t(i));
    }
    tape_.record([x, y] {
      if (y->has_grad()) add_to(y->grad.data(), int64_t(y->size()), x->g());
    });
    x = y;
  }

  void scale(Tensor& x, T s) {
    Tensor y = std::make_shared<Node<T>>(x->value);
    for (T& v : y->value) v *= s;
    tape_.record([x, y, s] {
      if (!y->has_grad()) return;
      T* dx = x->g();
      for (size_t i = 0; i < y->size(); ++i) dx[i] += s * y->grad[i];
    });
    x = y;
  }

  // I[r][t] = Σ_h relu(q_h · k_t) w_h for rows [r0, r0 + rows) and every entry t < n: [rows, n].
  std::vector<T> index_scores(const Indexed& ix, int64_t r0, int64_t rows, int64_t n) const {
    const int64_t heads = c_.index_n_heads, ihd = c_.index_head_dim;
    std::vector<T> dots(size_t(rows * heads * n)), out(size_t(rows * n), T(0));
    grad::linear_forward(ix.q->v() + r0 * heads * ihd, rows * heads, ihd, ix.keys->v(), n, dots.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        const T w = ix.w->value[size_t((r0 + r) * heads + h)];
        const T* dot = dots.data() + (r * heads + h) * n;
        for (int64_t t = 0; t < n; ++t) out[size_t(r * n + t)] += std::max(dot[t], T(0)) * w;
      }
    return out;
  }

  // The indexer's distillation loss at this index source (docs/training.md): its scores of the chosen
  // entries against the attention's probabilities of them (slots [window, entries) of each row).
  void index_loss(const grad::SparseAttentionSaved<T>& attn, int64_t window, int64_t entries) {
    const Indexed ix = indexed_;
    const int64_t heads = c_.index_n_heads, ihd = c_.index_head_dim, k = ix.k;
    auto target = std::make_shared<std::vector<T>>(size_t(R_ * k));
    grad::attention_target(attn.p.data(), R_, int64_t(c_.n_heads), entries, window, k, target->data());
    auto idx = std::make_shared<std::vector<int64_t>>();
    for (const std::vector<int64_t>& row : topk_) idx->insert(idx->end(), row.begin(), row.end());
    auto scores = std::make_shared<std::vector<T>>(size_t(R_ * k));
    grad::indexer_scores_forward(ix.q->v(), ix.w->v(), ix.keys->v(), idx->data(), R_, heads, ihd, k, scores->data());
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t t = (*idx)[size_t(r * k + j)];
        for (int64_t h = 0; t >= 0 && h < heads; ++h) {
          T dot = 0;
          for (int64_t i = 0; i < ihd; ++i) dot += ix.q->value[size_t((r * heads + h) * ihd + i)] * ix.keys->value[size_t(t * ihd + i)];
          margins.indexer_dot = std::min(margins.indexer_dot, double(std::fabs(dot)));
        }
      }
    losses.indexer += double(grad::index_distillation_loss(scores->data(), target->data(), R_, k, static_cast<T*>(nullptr))) / double(R_);
    tape_.record([this, ix, target, idx, scores, R = R_] {
      const int64_t k = ix.k;
      std::vector<T> dscores(size_t(R * k), T(0));
      grad::index_distillation_loss(scores->data(), target->data(), R, k, dscores.data());
      for (T& g : dscores) g *= indexer_weight / T(R);
      grad::indexer_scores_backward(ix.q->v(), ix.w->v(), ix.keys->v(), idx->data(), R, int64_t(c_.index_n_heads),
                                    int64_t(c_.index_head_dim), k, dscores.data(), ix.q->g(), ix.w->g(), ix.keys->g());
    });
  }

  // The MoE's parameters (or, grads, their gradients) in grad::moe's form.
  static grad::MoeWeights<T> moe_weights(LayerParams<T>& L, bool grads) {
    auto at = [grads](Param<T>* p) { return grads ? p->g() : p->v(); };
    grad::MoeWeights<T> w{at(L.gate), grads ? nullptr : L.gate_bias->v(), {}, {}};
    for (ExpertParams<T>& e : L.experts) w.experts.push_back({at(e.w1), at(e.w2), at(e.w3)});
    w.shared = {at(L.shared.w1), at(L.shared.w2), at(L.shared.w3)};
    return w;
  }

  const Config& c_;
  Parameters<T>& p_;
  const TrainOptions& o_;
  Tape& tape_;
  int64_t R_;        // the rows running: all of the sequence's, until bounded replay cuts some
  const int64_t L_;  // the sequence's rows
  std::vector<int64_t> tokens_, inputs_, targets_, positions_;  // (the drafter: its rows' targets are the drafts' next tokens)
  const int64_t* engram_ids_;
  Trace* trace_;
  std::vector<std::vector<int64_t>>& load_;
  RopeTable rope_window_, rope_compressed_;

  Tensor X_, h_, y_, final_;  // the streams [R, hc, dim]; the sub-layer's input and output [R, dim]
  Mix mix_[2];
  std::map<int, Compressed> compressed_;         // by kv-source layer
  Indexed indexed_;                              // the latest index source's
  std::vector<std::vector<int64_t>> topk_;       // [row] the latest index source's choice (published)
  std::vector<std::vector<uint8_t>> candidates_; // [row] the candidate source's pool

  // Decoder bounded replay, by position (empty in exact mode): cut at the decoder start, the decoder
  // window floor; the current row of each position after the cut (−1: cut); whether the decoder's
  // kv-source ran at the cut.
  std::vector<uint8_t> cut_;
  std::vector<int64_t> floor_, row_at_;
  bool compressed_at_cut_ = false;

  // DSpark: the target's context features [R, targets, dim] (record_target); the drafter's target,
  // labels, anchors, its rows' Markov tokens, position shares, main_x and each stage's context KV.
  Tensor features_;
  std::vector<int64_t> feature_positions_;  // the positions of features_' rows
  const TrainOps* target_ = nullptr;
  grad::DSparkLabels* labels_ = nullptr;
  std::vector<int64_t> anchors_, prev_;
  std::vector<T> rho_;
  Tensor main_x_, draft_logits_, draft_confidence_;
  std::map<int, Tensor> context_kv_;
};

}  // namespace dsv41::train
