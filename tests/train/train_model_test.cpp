// The trainer's model (src/train/model) end to end on the `tiny` preset — its whole layer schedule:
// SWA-only layers, Engram, the encoder's Full + Reuse group at ratio 2, the decoder's Full layer at
// ratio 1 that is the candidate source, its Reindex and Reuse layers; single-pass mHC (hc = 4, 20
// Sinkhorn iterations) and the MoE (8 experts, top-2, a shared expert) in each; the final collapse,
// norm, head and next-token loss — and the same schedule without Engram. It replaces the two-layer
// model of the backward's first whole-model check.
//
//  * Every parameter tensor's gradient, in double, against central differences along a random
//    direction over all its coordinates (gradcheck.h's step and tolerance), with the choices (top-k,
//    candidate pools, experts) held: imposed from the first forward, so that each loss is one smooth
//    function of the parameters. The data keeps every kink (an expert's clamp, the softplus
//    threshold, Engram's floor, the indexer's relu) away from the steps.
//  * The parameters no loss reaches get exactly zero: the gate's bias (selection only, trained by
//    the aux-loss-free update), an expert no row chose, DSpark's stage (no draft blocks here:
//    train_dspark_test.cpp); the
//    indexer's weights get L_indexer's gradient only, every other tensor L_lm's only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "tiny_model.h"
#include "model/config.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"

namespace dsv41 {
namespace {

using train::Parameters;
using train::TrainModel;
using test::hold;
using test::make_parameters;
using test::make_sequence;
using test::max_abs;
using test::Sequence;
using test::tiny;

bool is_indexer(const std::string& name) { return name.find(".attn.indexer.") != std::string::npos; }
bool selection_only(const std::string& name) { return name.ends_with("gate.bias"); }
bool dspark(const std::string& name) { return name.starts_with("mtp."); }

// A routed expert no row chose (its weights get no gradient): "layers.<l>.ffn.experts.<e>.…".
bool unchosen_expert(const std::string& name, const std::vector<std::vector<int64_t>>& load) {
  int l = 0, e = 0;
  if (std::sscanf(name.c_str(), "layers.%d.ffn.experts.%d.", &l, &e) != 2) return false;
  return load.at(size_t(l)).at(size_t(e)) == 0;
}


// The sequence long enough that every choice is a real one: windows full (16), top-k (8) below the
// visible entries, the candidate pool (4 blocks of 4) below the ratio-1 source's entries.
constexpr int64_t kRows = 20;

void check_gradients(bool engram) {
  const Config c = tiny(engram);
  Parameters<double> p = make_parameters<double>(c);
  TrainModel<double> model(p);
  const Sequence s = make_sequence(c, kRows, 3);
  Trace first;
  model.forward(s.tokens, engram ? s.engram_ids.data() : nullptr, &first);
  Trace held = hold(first);
  auto losses = [&] { return model.forward(s.tokens, engram ? s.engram_ids.data() : nullptr, &held); };
  losses();
  const train::Margins m = model.margins();
  if (engram) {
    EXPECT_GT(m.engram_dot, 1e-3) << "an Engram gate near its signed root's floor";
  }
  EXPECT_GT(m.indexer_dot, 1e-4) << "an indexer dot near relu's kink";
  EXPECT_LT(m.expert_preactivation, c.swiglu_limit - 1) << "an expert near its clamp";
  EXPECT_LT(m.gate_logit, 19) << "a gate logit near softplus's threshold";
  // The choices are real ones: some rows' top-k leave visible entries out.
  for (const auto& [layer, rows] : first.topk) EXPECT_EQ(rows.back().size(), size_t(c.index_topk)) << layer;

  p.zero_grad();
  model.backward();
  // The indexer's weights get L_indexer's gradient alone: backward with L_lm only leaves them zero.
  Parameters<double> lm_only = make_parameters<double>(c);
  TrainModel<double> lm_model(lm_only);
  lm_model.forward(s.tokens, engram ? s.engram_ids.data() : nullptr, &held);
  lm_model.backward(1.0, 0.0);

  // The tensors no loss reaches get exactly zero; every other gets some, and from one objective only:
  // the indexer's weights from L_indexer, the others from L_lm (the same bits as with L_indexer too).
  std::vector<std::vector<train::Param<double>*>> groups;  // checked together: a layer's routed experts
  for (train::Param<double>& t : p.all()) {
    const double scale = max_abs(t.grad);
    if (selection_only(t.name) || dspark(t.name) || unchosen_expert(t.name, model.expert_load())) {
      EXPECT_EQ(scale, 0.0) << t.name << ": no loss reaches it";
      continue;
    }
    EXPECT_GT(scale, 1e-8) << t.name << ": no gradient reaches it";
    const double lm_scale = max_abs(lm_only.at(t.name).grad);
    if (is_indexer(t.name)) EXPECT_EQ(lm_scale, 0.0) << t.name << ": the LM loss reached the indexer";
    else EXPECT_EQ(lm_scale, scale) << t.name << ": the indexer loss reached a model weight";
    test::add_to_groups(groups, t);
  }

  // Each tensor (a layer's routed experts together) along a random unit direction v:
  // (L(θ + h v) − L(θ − h v)) / 2h against g · v — every coordinate at once: a wrong term anywhere
  // moves g · v by its share — with gradcheck.h's step and its tolerance in the directional form,
  // 1e-6 (|g · v| + ‖g‖). L is the objective that trains the tensor (L_indexer for the indexer's
  // weights, L_lm for the others): L_indexer is a distillation with its inputs detached, which depends
  // on the model's weights but does not train them.
  const double worst = test::check_directions(groups, [&](const std::string& name) {
    const train::Losses l = losses();
    return is_indexer(name) ? l.indexer : l.lm;
  });
  std::printf("%zu directional checks, the worst at %.1f%% of its tolerance\n", groups.size(), 100 * worst);
  EXPECT_GT(groups.size(), size_t(150));
}

TEST(TrainModel, GradientsMatchCentralDifferencesTiny) { check_gradients(true); }
TEST(TrainModel, GradientsMatchCentralDifferencesTinyWithoutEngram) { check_gradients(false); }

// The float model (CPU training: its products on the engine's GEMM) against double on 64 rows, the
// double's choices imposed: the losses within 1e-6 relative, every gradient within 1e-4 of its
// tensor's largest. Float rounds each operation by at most 2⁻²⁴ ≈ 6e-8 relative; a gradient passes
// through a few thousand of them (eight layers' backward, sums of up to 1024 products, 39 Sinkhorn
// normalizations per sub-layer whose backward subtracts near-equal terms), so errors of 1e-5 of a
// tensor's scale are expected and a wrong float-only path (an underflowing constant, a narrowed index,
// a GEMM fed the wrong layout) is of order one. Measured: the LM loss to 4e-8, the indexer loss to
// 4e-9, the worst gradient to 1.8e-5 of its scale (a Sinkhorn scale, hc_ffn_scale) — the GEMM sums in
// one fixed order on every CPU (backend/cpu/gemm.h), so these figures are the same everywhere.
TEST(TrainModel, FloatAgreesWithDouble) {
  const Config c = tiny(true);
  Parameters<double> pd = make_parameters<double>(c);
  Parameters<float> pf(c);
  pf.copy_values(pd);
  const Sequence s = make_sequence(c, 64, 9);
  TrainModel<double> md(pd);
  TrainModel<float> mf(pf);
  Trace first;
  const train::Losses ld = md.forward(s.tokens, s.engram_ids.data(), &first);
  Trace held = hold(first);
  const train::Losses lf = mf.forward(s.tokens, s.engram_ids.data(), &held);
  EXPECT_NEAR(lf.lm, ld.lm, 1e-6 * ld.lm);
  EXPECT_NEAR(lf.indexer, ld.indexer, 1e-6 * ld.indexer);
  pd.zero_grad();
  pf.zero_grad();
  md.backward();
  mf.backward();
  int compared = 0;
  for (const train::Param<double>& t : pd.all()) {
    const double scale = max_abs(t.grad);
    const std::vector<float>& f = pf.at(t.name).grad;
    double err = 0;
    for (size_t i = 0; i < f.size(); ++i) err = std::max(err, std::fabs(double(f[i]) - t.grad[i]));
    EXPECT_LE(err, 1e-4 * scale) << t.name;
    compared += scale > 0;
  }
  EXPECT_GT(compared, 300);
}

}  // namespace
}  // namespace dsv41
