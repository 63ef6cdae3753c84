// A whole model from the ops of src/train/grad, checked end to end: two V4.1 layers — layer 0 with
// Engram before its block and sliding-window attention, layer 1 a CSA2 Full layer at ratio 2 (its
// compressor, index keys and indexer choosing one compressed entry per row) — each with single-pass
// mHC (hc = 2, 20 Sinkhorn iterations) and an MoE (3 experts, top-2, a shared expert), then the
// final collapse with the last FFN's `pre`, the norm, the head and the next-token loss. The
// backward is the layer loop run in reverse; the language-model loss's gradient of every parameter
// tensor is checked against central differences at a few coordinates each (gradcheck.h's step and
// tolerance), the choices (experts, top-k) held fixed by the data; the indexer's weights and the
// gate's bias get no gradient from this loss (detached; selection only). The same model in float
// gives the same loss and gradients within float's accuracy.
//
// This is the check of how the ops compose (the order of single-pass mHC, the shared residual's
// accumulated gradient, Engram writing the streams, the compressed entries' path back into the
// compressor); the trainer's model is issue 19's next step (docs/training.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/rope.h"
#include "forward/window.h"
#include "gradcheck.h"
#include "train/grad/compressor.h"
#include "train/grad/cross_entropy.h"
#include "train/grad/embedding.h"
#include "train/grad/engram.h"
#include "train/grad/indexer.h"
#include "train/grad/linear.h"
#include "train/grad/mhc.h"
#include "train/grad/moe.h"
#include "train/grad/rms_norm.h"
#include "train/grad/rope.h"
#include "train/grad/sparse_attention.h"

namespace dsv41 {
namespace {

// Sizes: vocabulary, width, streams, heads × head_dim (rope on the last rd), query rank, output
// groups × rank, window; experts × width; compression ratio, indexer heads × dim, top-k; Engram's
// table rows × head_dim, ids per token.
constexpr int64_t kV = 11, kD = 8, kHc = 2, kH = 2, kHd = 4, kRd = 2, kQl = 6, kG = 2, kOl = 3, kW = 3;
constexpr int64_t kE = 3, kInter = 4, kRatio = 2, kHi = 2, kIhd = 4, kTopk = 1;
constexpr int64_t kEngramRows = 7, kEhd = 3, kEcols = 2;
constexpr int kLayers = 2;
constexpr double kEps = 1e-20, kLimit = 10.0;

using Params = std::map<std::string, std::vector<double>>;

// A layer's parameter name, "l<layer>.<name>" (built by appending: GCC 12 warns falsely, -Wrestrict, on a literal + a string).
std::string at(int l, const std::string& name) {
  std::string s = "l";
  s.append(std::to_string(l)).append(".").append(name);
  return s;
}

// Expert e's name ("e<e>"), or the shared expert's for e = kE.
std::string expert_name(int64_t e) {
  if (e == kE) return "shared";
  std::string s = "e";
  s.append(std::to_string(e));
  return s;
}

// Every parameter, seeded: matrices N(0, 1/√in), norm weights 1 + N(0, 0.1), mHC's base N(0, 0.5)
// and scales (0.5, 0.7, 1), sinks N(0, 0.5), the gate's bias N(0, 0.1).
Params make_params() {
  Params p;
  std::mt19937 rng(2024);
  auto normal = [&](const std::string& name, size_t n, double mean, double stddev) {
    std::normal_distribution<double> dist(mean, stddev);
    std::vector<double>& v = p[name];
    v.resize(n);
    for (double& x : v) x = dist(rng);
  };
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) { normal(name, size_t(out * in), 0, 1 / std::sqrt(double(in))); };
  matrix("embed", kV, kD);
  normal("engram.table", size_t(kEngramRows * kEhd), 0, 1);
  matrix("engram.wkv", (kHc + 1) * kD, kEcols * kEhd);
  normal("engram.q", size_t(kHc * kD), 1, 0.3);
  normal("engram.k", size_t(kHc * kD), 1, 0.3);
  const int64_t n_mix = (2 + kHc) * kHc;
  for (int l = 0; l < kLayers; ++l) {
    for (const char* s : {"hc_attn", "hc_ffn"}) {
      matrix(at(l, s) + ".fn", n_mix, kHc * kD);
      normal(at(l, s) + ".base", size_t(n_mix), 0, 0.5);
      p[at(l, s) + ".scale"] = {0.5, 0.7, 1.0};
    }
    normal(at(l, "attn_norm"), kD, 1, 0.1);
    normal(at(l, "ffn_norm"), kD, 1, 0.1);
    matrix(at(l, "wq_a"), kQl, kD);
    normal(at(l, "q_norm"), kQl, 1, 0.1);
    matrix(at(l, "wq_b"), kH * kHd, kQl);
    matrix(at(l, "wkv"), kHd, kD);
    normal(at(l, "kv_norm"), kHd, 1, 0.1);
    matrix(at(l, "wo_a"), kG * kOl, kH * kHd / kG);
    matrix(at(l, "wo_b"), kD, kG * kOl);
    normal(at(l, "sink"), kH, 0, 0.5);
    matrix(at(l, "gate"), kE, kD);
    normal(at(l, "gate_bias"), kE, 0, 0.1);
    for (int64_t e = 0; e <= kE; ++e) {
      const std::string x = expert_name(e);
      matrix(at(l, x + ".w1"), kInter, kD);
      matrix(at(l, x + ".w2"), kD, kInter);
      matrix(at(l, x + ".w3"), kInter, kD);
    }
  }
  matrix(at(1, "c.wkv"), kHd, kD);
  matrix(at(1, "c.wgate"), kHd, kD);
  normal(at(1, "c.norm"), kHd, 1, 0.1);
  matrix(at(1, "i.wq_b"), kHi * kIhd, kQl);
  matrix(at(1, "i.wproj"), kHi, kD);
  matrix(at(1, "i.wk"), kIhd, kHd);
  normal(at(1, "i.k_norm"), kIhd, 1, 0.1);
  normal("norm", kD, 1, 0.1);
  matrix("head", kV, kD);
  return p;
}

template <class T>
class TinyModel {
 public:
  using Tensors = std::map<std::string, std::vector<T>>;

  TinyModel(const Params& params, std::vector<int64_t> tokens, std::vector<int64_t> engram_ids)
      : tokens_(std::move(tokens)), ids_(std::move(engram_ids)), R_(int64_t(tokens_.size())),
        rope_(int(kRd), 10000.0, 0, 1.0, 32, 1) {
    for (const auto& [name, v] : params) p[name].assign(v.begin(), v.end());
    for (int64_t r = 0; r < R_; ++r) positions_.push_back(r);
    for (int64_t g = 0; g < R_ / kRatio; ++g) group_positions_.push_back(g * kRatio);
    targets_.assign(tokens_.begin() + 1, tokens_.end());
    targets_.push_back(-1);
  }

  Tensors p;  // the parameters, by name

  // The choices the forward made (the experts of each layer, layer 1's top-k): the checks hold them fixed.
  std::vector<int64_t> choices() const {
    std::vector<int64_t> c(layers_[1].topk.begin(), layers_[1].topk.end());
    for (const Layer& L : layers_) c.insert(c.end(), L.moe.experts.begin(), L.moe.experts.end());
    return c;
  }
  // The smallest |dot| of Engram's gate, and the largest |pre-activation| of any expert: the checks
  // keep them off the kinks.
  T engram_min_dot() const {
    T m = INFINITY;
    for (T d : layers_[0].eng.dot) m = std::min(m, std::fabs(d));
    return m;
  }
  T expert_max_preactivation() const {
    T m = 0;
    for (const Layer& L : layers_) {
      for (const grad::ExpertSaved<T>& s : L.moe.routed)
        for (const std::vector<T>* v : {&s.gate, &s.up})
          for (T x : *v) m = std::max(m, std::fabs(x));
      for (const std::vector<T>* v : {&L.moe.shared.gate, &L.moe.shared.up})
        for (T x : *v) m = std::max(m, std::fabs(x));
    }
    return m;
  }

  T forward() {
    std::vector<T> x(size_t(R_ * kD));
    grad::gather_rows_forward(p["embed"].data(), kV, kD, tokens_.data(), R_, x.data());
    X_.resize(size_t(R_ * kHc * kD));
    grad::hc_expand_forward(x.data(), R_, int(kHc), kD, X_.data());
    std::vector<T> pre_mix(size_t(R_ * kHc), T(0));
    for (int64_t r = 0; r < R_; ++r) pre_mix[size_t(r * kHc)] = 1;  // the one-hot first input mix
    layers_.assign(kLayers, Layer{});
    for (int l = 0; l < kLayers; ++l) {
      Layer& L = layers_[size_t(l)];
      if (l == 0) engram_forward(L);
      L.X = X_;
      L.pre_in = pre_mix;
      mixes(l, "hc_attn", L.X, L.ma, L.apre, L.apost, L.acomb);
      input(l, "attn_norm", L.X, L.pre_in, L.h0, L.an, L.h);
      attention_forward(l, L);
      L.X1.resize(X_.size());
      grad::hc_post_forward(L.y.data(), L.X.data(), L.apost.data(), L.acomb.data(), R_, int(kHc), kD, L.X1.data());
      mixes(l, "hc_ffn", L.X1, L.mf, L.fpre, L.fpost, L.fcomb);
      input(l, "ffn_norm", L.X1, L.apre, L.g0, L.fnorm, L.g);
      L.y2.resize(size_t(R_ * kD));
      grad::moe_forward(L.g.data(), R_, kD, kInter, moe_weights(l, p), gate_options(), T(kLimit), L.y2.data(), L.moe);
      grad::hc_post_forward(L.y2.data(), L.X1.data(), L.fpost.data(), L.fcomb.data(), R_, int(kHc), kD, X_.data());
      pre_mix = L.fpre;
    }
    final_pre_ = pre_mix;
    hf0_.resize(size_t(R_ * kD));
    hf_.resize(hf0_.size());
    grad::hc_pre_forward(X_.data(), final_pre_.data(), R_, int(kHc), kD, hf0_.data());
    grad::rms_norm_forward(hf0_.data(), R_, kD, p["norm"].data(), T(kEps), hf_.data(), final_norm_);
    return grad::head_cross_entropy_forward(hf_.data(), R_, kD, p["head"].data(), kV, targets_.data(), ce_);
  }

  // The gradients of the last forward's loss, by parameter name (absent: none).
  Tensors backward() {
    Tensors g;
    for (const auto& [name, v] : p) g[name].assign(v.size(), T(0));
    std::vector<T> dhf(hf_.size(), T(0)), dhf0(hf_.size(), T(0));
    grad::head_cross_entropy_backward(hf_.data(), R_, kD, p["head"].data(), kV, targets_.data(), ce_, T(1), dhf.data(),
                                      g["head"].data());
    grad::rms_norm_backward(hf0_.data(), R_, kD, p["norm"].data(), final_norm_, dhf.data(), dhf0.data(), g["norm"].data());
    std::vector<T> dX(X_.size(), T(0)), dpre(final_pre_.size(), T(0));
    grad::hc_pre_backward(X_.data(), final_pre_.data(), R_, int(kHc), kD, dhf0.data(), dX.data(), dpre.data());
    for (int l = kLayers - 1; l >= 0; --l) {
      Layer& L = layers_[size_t(l)];
      // X_out = hc_post(y2, X1, ffn post, ffn comb)
      std::vector<T> dy2(L.y2.size(), T(0)), dX1(L.X1.size(), T(0)), dfpost(L.fpost.size(), T(0)), dfcomb(L.fcomb.size(), T(0));
      grad::hc_post_backward(L.y2.data(), L.X1.data(), L.fpost.data(), L.fcomb.data(), R_, int(kHc), kD, dX.data(), dy2.data(),
                             dX1.data(), dfpost.data(), dfcomb.data());
      std::vector<T> dg(L.g.size(), T(0)), dg0(L.g.size(), T(0)), dapre(L.apre.size(), T(0));
      grad::moe_backward(L.g.data(), R_, kD, kInter, moe_weights(l, p), gate_options(), T(kLimit), L.moe, dy2.data(), dg.data(),
                         moe_weights(l, g));
      grad::rms_norm_backward(L.g0.data(), R_, kD, p[at(l, "ffn_norm")].data(), L.fnorm, dg.data(), dg0.data(),
                              g[at(l, "ffn_norm")].data());
      grad::hc_pre_backward(L.X1.data(), L.apre.data(), R_, int(kHc), kD, dg0.data(), dX1.data(), dapre.data());
      mixes_backward(l, "hc_ffn", L.X1, L.mf, dpre, dfpost, dfcomb, dX1, g);
      // X1 = hc_post(y, X, attn post, attn comb)
      std::vector<T> dy(L.y.size(), T(0)), dXin(L.X.size(), T(0)), dapost(L.apost.size(), T(0)), dacomb(L.acomb.size(), T(0));
      grad::hc_post_backward(L.y.data(), L.X.data(), L.apost.data(), L.acomb.data(), R_, int(kHc), kD, dX1.data(), dy.data(),
                             dXin.data(), dapost.data(), dacomb.data());
      std::vector<T> dh(L.h.size(), T(0)), dh0(L.h.size(), T(0)), dpre_in(L.pre_in.size(), T(0));
      attention_backward(l, L, dy, dh, g);
      grad::rms_norm_backward(L.h0.data(), R_, kD, p[at(l, "attn_norm")].data(), L.an, dh.data(), dh0.data(),
                              g[at(l, "attn_norm")].data());
      grad::hc_pre_backward(L.X.data(), L.pre_in.data(), R_, int(kHc), kD, dh0.data(), dXin.data(), dpre_in.data());
      mixes_backward(l, "hc_attn", L.X, L.ma, dapre, dapost, dacomb, dXin, g);
      if (l == 0) dXin = engram_backward(L, dXin, g);
      dX = dXin;
      dpre = dpre_in;  // the previous layer's FFN made this layer's input mix (layer 0's is a constant)
    }
    std::vector<T> dx(size_t(R_ * kD), T(0));
    grad::hc_expand_backward(dX.data(), R_, int(kHc), kD, dx.data());
    grad::gather_rows_backward(dx.data(), kD, tokens_.data(), R_, g["embed"].data());
    return g;
  }

 private:
  struct Layer {
    std::vector<T> X_eng, emb, ekv;  // Engram: the streams before it, the gathered rows, wkv's output
    grad::EngramGateSaved<T> eng;
    std::vector<T> X, pre_in;  // the block's input streams and the mix of its attention input
    grad::HcMixesSaved<T> ma, mf;
    std::vector<T> apre, apost, acomb, fpre, fpost, fcomb;
    std::vector<T> h0, h, g0, g;  // the sub-layers' inputs before and after their norms
    grad::RmsNormSaved<T> an, fnorm, qn, kvn, cn;
    std::vector<T> qa, qr, q, kva, table;  // the table: the window KV rows, then the compressed entries
    std::vector<T> ckv, cs, pooled;        // layer 1's compressor
    std::vector<int64_t> topk, idx;
    int64_t entries = 0;
    grad::SparseAttentionSaved<T> sa;
    std::vector<T> o, oa, y, X1, y2;
    grad::MoeSaved<T> moe;
  };

  static GateOptions gate_options() {
    GateOptions o;
    o.topk = 2;
    o.route_scale = 1.5f;
    return o;
  }
  static grad::HcOptions hc_options() { return grad::HcOptions{int(kHc), 20, kEps, 1e-6}; }

  grad::MoeWeights<T> moe_weights(int l, Tensors& t) {
    grad::MoeWeights<T> w{t[at(l, "gate")].data(), p[at(l, "gate_bias")].data(), {}, {}};
    auto expert = [&](const std::string& x) {
      return grad::ExpertWeights<T>{t[at(l, x + ".w1")].data(), t[at(l, x + ".w2")].data(), t[at(l, x + ".w3")].data()};
    };
    for (int64_t e = 0; e < kE; ++e) w.experts.push_back(expert(expert_name(e)));
    w.shared = expert(expert_name(kE));
    return w;
  }

  void mixes(int l, const std::string& s, const std::vector<T>& X, grad::HcMixesSaved<T>& saved, std::vector<T>& pre,
             std::vector<T>& post, std::vector<T>& comb) {
    pre.resize(size_t(R_ * kHc));
    post.resize(pre.size());
    comb.resize(size_t(R_ * kHc * kHc));
    grad::hc_mixes_forward(X.data(), R_, kD, p[at(l, s) + ".fn"].data(), p[at(l, s) + ".base"].data(),
                           p[at(l, s) + ".scale"].data(), hc_options(), pre.data(), post.data(), comb.data(), saved);
  }

  void mixes_backward(int l, const std::string& s, const std::vector<T>& X, const grad::HcMixesSaved<T>& saved,
                      const std::vector<T>& dpre, const std::vector<T>& dpost, const std::vector<T>& dcomb, std::vector<T>& dX,
                      Tensors& g) {
    grad::hc_mixes_backward(X.data(), R_, kD, p[at(l, s) + ".fn"].data(), p[at(l, s) + ".base"].data(),
                            p[at(l, s) + ".scale"].data(), hc_options(), saved, dpre.data(), dpost.data(), dcomb.data(),
                            dX.data(), g[at(l, s) + ".fn"].data(), g[at(l, s) + ".base"].data(), g[at(l, s) + ".scale"].data());
  }

  void input(int l, const std::string& norm, const std::vector<T>& X, const std::vector<T>& pre, std::vector<T>& h0,
             grad::RmsNormSaved<T>& saved, std::vector<T>& h) {
    h0.resize(size_t(R_ * kD));
    h.resize(h0.size());
    grad::hc_pre_forward(X.data(), pre.data(), R_, int(kHc), kD, h0.data());
    grad::rms_norm_forward(h0.data(), R_, kD, p[at(l, norm)].data(), T(kEps), h.data(), saved);
  }

  void engram_forward(Layer& L) {
    L.X_eng = X_;
    L.emb.resize(size_t(R_ * kEcols * kEhd));
    L.ekv.resize(size_t(R_ * (kHc + 1) * kD));
    grad::gather_rows_forward(p["engram.table"].data(), kEngramRows, kEhd, ids_.data(), R_ * kEcols, L.emb.data());
    grad::linear_forward(L.emb.data(), R_, kEcols * kEhd, p["engram.wkv"].data(), (kHc + 1) * kD, L.ekv.data());
    grad::engram_gate_forward(L.X_eng.data(), L.ekv.data(), p["engram.q"].data(), p["engram.k"].data(), R_, int(kHc), kD,
                              T(kEps), X_.data(), L.eng);
  }

  std::vector<T> engram_backward(Layer& L, const std::vector<T>& dout, Tensors& g) {
    std::vector<T> dX(dout.size(), T(0)), dkv(L.ekv.size(), T(0)), demb(L.emb.size(), T(0));
    grad::engram_gate_backward(L.X_eng.data(), L.ekv.data(), p["engram.q"].data(), p["engram.k"].data(), R_, int(kHc), kD,
                               L.eng, dout.data(), dX.data(), dkv.data(), g["engram.q"].data(), g["engram.k"].data());
    grad::linear_backward(L.emb.data(), R_, kEcols * kEhd, p["engram.wkv"].data(), (kHc + 1) * kD, dkv.data(), demb.data(),
                          g["engram.wkv"].data());
    grad::gather_rows_backward(demb.data(), kEhd, ids_.data(), R_ * kEcols, g["engram.table"].data());
    return dX;
  }

  void rope(std::vector<T>& x, int64_t rows, int64_t heads, int64_t dim, const std::vector<int64_t>& pos, bool inverse) {
    grad::rope_forward(x.data(), rows, heads, dim, kRd, pos.data(), rope_.frequencies().data(), inverse);
  }
  void unrope(std::vector<T>& dx, int64_t rows, int64_t heads, int64_t dim, const std::vector<int64_t>& pos, bool inverse) {
    grad::rope_backward(dx.data(), rows, heads, dim, kRd, pos.data(), rope_.frequencies().data(), inverse);
  }

  // Layer 1's compressed entries (appended to the table) and each row's top-k among them.
  void compress_and_index(int l, Layer& L) {
    const int64_t groups = R_ / kRatio;
    L.ckv.resize(size_t(R_ * kHd));
    L.cs.resize(L.ckv.size());
    L.pooled.resize(size_t(groups * kHd));
    std::vector<T> latent(L.pooled.size());
    grad::linear_forward(L.h.data(), R_, kD, p[at(l, "c.wkv")].data(), kHd, L.ckv.data());
    grad::linear_forward(L.h.data(), R_, kD, p[at(l, "c.wgate")].data(), kHd, L.cs.data());
    grad::compressor_pool_forward(L.ckv.data(), L.cs.data(), R_, kHd, int(kRatio), L.pooled.data());
    grad::rms_norm_forward(L.pooled.data(), groups, kHd, p[at(l, "c.norm")].data(), T(kEps), latent.data(), L.cn);
    // The indexer (no gradient from the language-model loss): keys from the latent before RoPE.
    std::vector<T> kr(size_t(groups * kIhd)), keys(kr.size()), iq(size_t(R_ * kHi * kIhd)), w(size_t(R_ * kHi));
    grad::RmsNormSaved<T> kn;
    grad::linear_forward(latent.data(), groups, kHd, p[at(l, "i.wk")].data(), kIhd, kr.data());
    grad::rms_norm_forward(kr.data(), groups, kIhd, p[at(l, "i.k_norm")].data(), T(kEps), keys.data(), kn);
    rope(keys, groups, 1, kIhd, group_positions_, false);
    grad::linear_forward(L.qr.data(), R_, kQl, p[at(l, "i.wq_b")].data(), kHi * kIhd, iq.data());
    rope(iq, R_, kHi, kIhd, positions_, false);
    grad::linear_forward(L.h.data(), R_, kD, p[at(l, "i.wproj")].data(), kHi, w.data());
    for (T& v : w) v *= T(1 / std::sqrt(double(kIhd * kHi)));
    std::vector<int64_t> all;
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t t = 0; t < groups; ++t) all.push_back(t);
    std::vector<T> scores(all.size());
    grad::indexer_scores_forward(iq.data(), w.data(), keys.data(), all.data(), R_, kHi, kIhd, groups, scores.data());
    L.topk.assign(size_t(R_ * kTopk), -1);
    for (int64_t r = 0; r < R_; ++r) {
      const int64_t visible = (positions_[size_t(r)] + 1) / kRatio;
      for (int64_t t = 0; t < visible; ++t)  // top-1: the best visible entry, ties to the lower
        if (L.topk[size_t(r)] < 0 || scores[size_t(r * groups + t)] > scores[size_t(r * groups + L.topk[size_t(r)])])
          L.topk[size_t(r)] = t;
    }
    // Main KV entries: the latent RoPE'd at its group's first position.
    rope(latent, groups, 1, kHd, group_positions_, false);
    L.table.insert(L.table.end(), latent.begin(), latent.end());
  }

  void attention_forward(int l, Layer& L) {
    L.qa.resize(size_t(R_ * kQl));
    L.qr.resize(L.qa.size());
    L.q.resize(size_t(R_ * kH * kHd));
    grad::linear_forward(L.h.data(), R_, kD, p[at(l, "wq_a")].data(), kQl, L.qa.data());
    grad::rms_norm_forward(L.qa.data(), R_, kQl, p[at(l, "q_norm")].data(), T(kEps), L.qr.data(), L.qn);
    grad::linear_forward(L.qr.data(), R_, kQl, p[at(l, "wq_b")].data(), kH * kHd, L.q.data());
    rope(L.q, R_, kH, kHd, positions_, false);
    L.kva.resize(size_t(R_ * kHd));
    L.table.resize(L.kva.size());
    grad::linear_forward(L.h.data(), R_, kD, p[at(l, "wkv")].data(), kHd, L.kva.data());
    grad::rms_norm_forward(L.kva.data(), R_, kHd, p[at(l, "kv_norm")].data(), T(kEps), L.table.data(), L.kvn);
    rope(L.table, R_, 1, kHd, positions_, false);
    const bool compressed = l == 1;
    if (compressed) compress_and_index(l, L);
    L.idx.clear();
    std::vector<int64_t> slots;
    for (int64_t r = 0; r < R_; ++r) {
      window_positions(positions_[size_t(r)], 0, R_, kW, 0, slots);
      L.idx.insert(L.idx.end(), slots.begin(), slots.end());
      if (compressed)
        for (int64_t j = 0; j < kTopk; ++j) {
          const int64_t t = L.topk[size_t(r * kTopk + j)];
          L.idx.push_back(t < 0 ? -1 : R_ + t);
        }
    }
    L.entries = int64_t(L.idx.size()) / R_;
    L.o.resize(L.q.size());
    grad::sparse_attention_forward(L.q.data(), R_, kH, kHd, L.table.data(), L.idx.data(), L.entries, p[at(l, "sink")].data(),
                                   T(1 / std::sqrt(double(kHd))), L.o.data(), L.sa);
    rope(L.o, R_, kH, kHd, positions_, true);
    L.oa.resize(size_t(R_ * kG * kOl));
    L.y.resize(size_t(R_ * kD));
    grad::linear_grouped_forward(L.o.data(), R_, kG, kH * kHd / kG, p[at(l, "wo_a")].data(), kOl, L.oa.data());
    grad::linear_forward(L.oa.data(), R_, kG * kOl, p[at(l, "wo_b")].data(), kD, L.y.data());
  }

  void attention_backward(int l, Layer& L, const std::vector<T>& dy, std::vector<T>& dh, Tensors& g) {
    std::vector<T> doa(L.oa.size(), T(0)), dout(L.o.size(), T(0));
    grad::linear_backward(L.oa.data(), R_, kG * kOl, p[at(l, "wo_b")].data(), kD, dy.data(), doa.data(), g[at(l, "wo_b")].data());
    grad::linear_grouped_backward(L.o.data(), R_, kG, kH * kHd / kG, p[at(l, "wo_a")].data(), kOl, doa.data(), dout.data(),
                                  g[at(l, "wo_a")].data());
    unrope(dout, R_, kH, kHd, positions_, true);
    std::vector<T> dq(L.q.size(), T(0)), dtable(L.table.size(), T(0));
    grad::sparse_attention_backward(L.q.data(), R_, kH, kHd, L.table.data(), L.idx.data(), L.entries,
                                    T(1 / std::sqrt(double(kHd))), L.sa, dout.data(), dq.data(), dtable.data(),
                                    g[at(l, "sink")].data());
    unrope(dq, R_, kH, kHd, positions_, false);
    std::vector<T> dqr(L.qr.size(), T(0)), dqa(L.qa.size(), T(0));
    grad::linear_backward(L.qr.data(), R_, kQl, p[at(l, "wq_b")].data(), kH * kHd, dq.data(), dqr.data(), g[at(l, "wq_b")].data());
    grad::rms_norm_backward(L.qa.data(), R_, kQl, p[at(l, "q_norm")].data(), L.qn, dqr.data(), dqa.data(),
                            g[at(l, "q_norm")].data());
    grad::linear_backward(L.h.data(), R_, kD, p[at(l, "wq_a")].data(), kQl, dqa.data(), dh.data(), g[at(l, "wq_a")].data());
    // The window KV rows.
    std::vector<T> dkv(dtable.begin(), dtable.begin() + R_ * kHd), dkva(L.kva.size(), T(0));
    unrope(dkv, R_, 1, kHd, positions_, false);
    grad::rms_norm_backward(L.kva.data(), R_, kHd, p[at(l, "kv_norm")].data(), L.kvn, dkv.data(), dkva.data(),
                            g[at(l, "kv_norm")].data());
    grad::linear_backward(L.h.data(), R_, kD, p[at(l, "wkv")].data(), kHd, dkva.data(), dh.data(), g[at(l, "wkv")].data());
    if (l != 1) return;
    // The compressed entries, back through RoPE, the compressor's norm, the pooling and its projections.
    const int64_t groups = R_ / kRatio;
    std::vector<T> dlatent(dtable.begin() + R_ * kHd, dtable.end()), dpooled(L.pooled.size(), T(0));
    unrope(dlatent, groups, 1, kHd, group_positions_, false);
    grad::rms_norm_backward(L.pooled.data(), groups, kHd, p[at(l, "c.norm")].data(), L.cn, dlatent.data(), dpooled.data(),
                            g[at(l, "c.norm")].data());
    std::vector<T> dckv(L.ckv.size(), T(0)), dcs(L.cs.size(), T(0));
    grad::compressor_pool_backward(L.ckv.data(), L.cs.data(), R_, kHd, int(kRatio), L.pooled.data(), dpooled.data(), dckv.data(),
                                   dcs.data());
    grad::linear_backward(L.h.data(), R_, kD, p[at(l, "c.wkv")].data(), kHd, dckv.data(), dh.data(), g[at(l, "c.wkv")].data());
    grad::linear_backward(L.h.data(), R_, kD, p[at(l, "c.wgate")].data(), kHd, dcs.data(), dh.data(), g[at(l, "c.wgate")].data());
  }

  std::vector<int64_t> tokens_, ids_, targets_, positions_, group_positions_;
  int64_t R_;
  RopeTable rope_;
  std::vector<Layer> layers_;
  std::vector<T> X_, final_pre_, hf0_, hf_;
  grad::RmsNormSaved<T> final_norm_;
  grad::CrossEntropySaved<T> ce_;
};

const std::vector<int64_t> kTokens = {3, 7, 1, 7, 10, 0, 5};
// [tokens, 2]. Chosen so that no Engram gate's dot lies near the signed root's floor, where its
// third derivative (~|dot|^-5/2) would make the central differences' truncation error large.
const std::vector<int64_t> kEngramIds = {4, 2, 6, 2, 4, 3, 5, 5, 3, 6, 0, 5, 5, 3};

// Parameters the language-model loss does not reach: the indexer's (detached, selection only) and
// the gate's bias (selection only).
bool selection_only(const std::string& name) { return name.find(".i.") != std::string::npos || name.find("gate_bias") != std::string::npos; }

TEST(GradTinyModel, EveryParameterTensorMatchesCentralDifferences) {
  TinyModel<double> m(make_params(), kTokens, kEngramIds);
  m.forward();
  const std::vector<int64_t> chosen = m.choices();
  ASSERT_GT(m.engram_min_dot(), 0.1) << "an Engram gate near the signed root's floor";
  ASSERT_LT(m.expert_max_preactivation(), kLimit - 1) << "an expert near its clamp";
  // Layer 1 attends to compressed entries: some rows chose one.
  ASSERT_TRUE(std::any_of(chosen.begin(), chosen.begin() + int64_t(kTokens.size()), [](int64_t t) { return t >= 0; }));
  const auto grads = m.backward();
  double global = 0;
  for (const auto& [name, g] : grads)
    for (double v : g) global = std::max(global, std::fabs(v));
  int checked = 0;
  for (auto& [name, values] : m.p) {
    const std::vector<double>& g = grads.at(name);
    double scale = 0;
    for (double v : g) scale = std::max(scale, std::fabs(v));
    if (selection_only(name)) EXPECT_EQ(scale, 0.0) << name;
    else EXPECT_GT(scale, 1e-6) << name << ": no gradient reaches it";
    // A few coordinates of each tensor, spread over it.
    for (size_t k = 0; k < std::min<size_t>(3, values.size()); ++k) {
      const size_t i = (k * 7919 + 13) % values.size();
      const double saved = values[i];
      values[i] = saved + test::kFdStep;
      const double up = m.forward();
      EXPECT_EQ(m.choices(), chosen) << name << "[" << i << "]: a step changed a choice";
      values[i] = saved - test::kFdStep;
      const double down = m.forward();
      EXPECT_EQ(m.choices(), chosen) << name << "[" << i << "]: a step changed a choice";
      values[i] = saved;
      const double fd = (up - down) / (2 * test::kFdStep);
      const double tol = test::kFdTolerance * (std::fabs(g[i]) + (selection_only(name) ? global : scale));
      EXPECT_NEAR(fd, g[i], tol) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
}

// The same model in float (the instantiation CPU training runs): the same choices, the loss within
// 1e-6 relative and every gradient within 1e-4 of its tensor's largest. Float rounds each of the
// few hundred operations a value passes through by 2⁻²⁴ relative, and the softmaxes, norms and
// Sinkhorn sweeps are well conditioned on this data: measured, the loss agrees to 1e-7 and every
// gradient to 1e-5 of its tensor's scale, a tenth of the bounds. A float-only error (a constant
// that underflows, a narrowed index) is of order one.
TEST(GradTinyModel, FloatAgreesWithDouble) {
  const Params params = make_params();
  TinyModel<double> md(params, kTokens, kEngramIds);
  TinyModel<float> mf(params, kTokens, kEngramIds);
  const double ld = md.forward();
  const float lf = mf.forward();
  ASSERT_EQ(mf.choices(), md.choices());
  EXPECT_NEAR(lf, ld, 1e-6 * ld);
  const auto gd = md.backward();
  const auto gf = mf.backward();
  for (const auto& [name, g] : gd) {
    double scale = 0;
    for (double v : g) scale = std::max(scale, std::fabs(v));
    const std::vector<float>& f = gf.at(name);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(f[i], g[i], 1e-4 * scale) << name << "[" << i << "]";
  }
}

}  // namespace
}  // namespace dsv41
