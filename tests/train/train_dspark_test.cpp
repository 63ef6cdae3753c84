// DSpark in the trainer's model (src/train/model; docs/training.md, "DSpark"): the `tiny` preset's
// whole backbone, then its drafter over three draft blocks of the sequence — anchors 3 and 11 with a
// partial context window (empty slots), anchor 20 past the window (W = 16: the ring's slot order) —
// the stage's mHC, SWA attention over the context KV and the bidirectional block, its MoE (6
// experts, top-3), the head, the Markov and confidence heads and the DSpark paper's loss.
//
//  * Every DSpark tensor's gradient (the stage, main_proj, main_norm, the norm, the Markov tables,
//    the confidence projection) in double against central differences along a random direction
//    (tiny_model.h check_directions), the choices (top-k, every block's experts) and the loss's
//    labels held, so that L_dspark is one smooth function of the parameters.
//  * DSpark's loss reaches no backbone tensor — not the shared embedding and head either (the
//    report: no gradient from the DSpark objective into the backbone) — and the LM and indexer
//    losses reach no DSpark tensor: each tensor's gradient is the same bits with either objective
//    left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "gradcheck.h"
#include "tiny_model.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"

namespace dsv41 {
namespace {

using train::Parameters;
using train::TrainModel;

bool dspark(const std::string& name) { return name.starts_with("mtp."); }

// A routed expert of block l (backbone "layers.<l>", DSpark "mtp.<j>" = block n_layers + j) that no
// row chose.
bool unchosen_expert(const Config& c, const std::string& name, const std::vector<std::vector<int64_t>>& load) {
  int b = 0, e = 0;
  if (std::sscanf(name.c_str(), "layers.%d.ffn.experts.%d.", &b, &e) != 2) {
    if (std::sscanf(name.c_str(), "mtp.%d.ffn.experts.%d.", &b, &e) != 2) return false;
    b += c.n_layers;
  }
  return load.at(size_t(b)).at(size_t(e)) == 0;
}

constexpr int64_t kRows = 24;
const std::vector<int64_t> kAnchors = {3, 11, 20};

TEST(TrainDSpark, GradientsMatchCentralDifferences) {
  const Config c = test::tiny(true);
  Parameters<double> p = test::make_parameters<double>(c);
  TrainModel<double> model(p);
  const test::Sequence s = test::make_sequence(c, kRows, 3);
  Trace first;
  model.forward(s.tokens, s.engram_ids.data(), &first, kAnchors);
  ASSERT_EQ(first.route_experts.size(), size_t(c.n_total_layers()));
  ASSERT_EQ(first.route_experts.back().size(), kAnchors.size() * size_t(c.dspark_block_size * c.activated_experts(c.n_layers)));
  Trace held = test::hold(first);
  model.hold_dspark_labels(true);
  auto losses = [&] { return model.forward(s.tokens, s.engram_ids.data(), &held, kAnchors); };
  const train::Losses l0 = losses();
  EXPECT_GT(l0.dspark, 0);
  EXPECT_GT(l0.dspark_parts.accept, 0);
  EXPECT_LT(l0.dspark_parts.accept, 1);
  const train::Margins m = model.margins();
  EXPECT_GT(m.engram_dot, 1e-3) << "an Engram gate near its signed root's floor";
  EXPECT_GT(m.indexer_dot, 1e-4) << "an indexer dot near relu's kink";
  EXPECT_LT(m.expert_preactivation, c.swiglu_limit - 1) << "an expert near its clamp";
  EXPECT_LT(m.gate_logit, 19) << "a gate logit near softplus's threshold";

  p.zero_grad();
  model.backward();
  // The same forward's gradients with DSpark's loss alone, and without it.
  auto gradients = [&](double lm, double indexer, double dspark_weight) {
    Parameters<double> q = test::make_parameters<double>(c);
    TrainModel<double> other(q);
    other.hold_dspark_labels(false);
    other.forward(s.tokens, s.engram_ids.data(), &held, kAnchors);
    other.backward(lm, indexer, dspark_weight);
    return q;
  };
  const Parameters<double> dspark_only = gradients(0, 0, 1), backbone_only = gradients(1, 1, 0);

  std::vector<std::vector<train::Param<double>*>> groups;
  int backbone_tensors = 0;
  for (train::Param<double>& t : p.all()) {
    const double scale = test::max_abs(t.grad);
    if (t.name.ends_with("gate.bias") || unchosen_expert(c, t.name, model.expert_load())) {
      EXPECT_EQ(scale, 0.0) << t.name << ": no loss reaches it";
      continue;
    }
    EXPECT_GT(scale, 1e-8) << t.name << ": no gradient reaches it";
    const double from_dspark = test::max_abs(dspark_only.at(t.name).grad), from_backbone = test::max_abs(backbone_only.at(t.name).grad);
    if (dspark(t.name)) {
      EXPECT_EQ(from_backbone, 0.0) << t.name << ": the backbone's losses reached DSpark";
      EXPECT_EQ(from_dspark, scale) << t.name;
      test::add_to_groups(groups, t);
    } else {
      EXPECT_EQ(from_dspark, 0.0) << t.name << ": DSpark's loss reached the backbone";
      EXPECT_EQ(from_backbone, scale) << t.name;
      ++backbone_tensors;
    }
  }
  EXPECT_GT(backbone_tensors, 150);
  const double worst = test::check_directions(groups, [&](const std::string&) { return losses().dspark; });
  std::printf("%zu directional checks of DSpark's tensors, the worst at %.1f%% of its tolerance\n", groups.size(), 100 * worst);
  EXPECT_GE(groups.size(), size_t(25));
}

// The float drafter (CPU training) against double on a 64-row sequence with 8 blocks, the double's
// choices imposed: DSpark's loss within 1e-6 relative and each DSpark tensor's gradient
// within 1e-4 of its largest — the backbone's figures (train_model_test.cpp FloatAgreesWithDouble:
// float's 2⁻²⁴ per operation through a few thousand of them), the drafter's path being one stage
// past the backbone's features.
TEST(TrainDSpark, FloatAgreesWithDouble) {
  const Config c = test::tiny(true);
  Parameters<double> pd = test::make_parameters<double>(c);
  Parameters<float> pf(c);
  pf.copy_values(pd);
  const test::Sequence s = test::make_sequence(c, 64, 9);
  const std::vector<int64_t> anchors = train::dspark_anchors(c, 64, 8, 0, 0);
  TrainModel<double> md(pd);
  TrainModel<float> mf(pf);
  Trace first;
  const train::Losses ld = md.forward(s.tokens, s.engram_ids.data(), &first, anchors);
  Trace held = test::hold(first);
  const train::Losses lf = mf.forward(s.tokens, s.engram_ids.data(), &held, anchors);
  EXPECT_NEAR(lf.dspark, ld.dspark, 1e-6 * ld.dspark);
  pd.zero_grad();
  pf.zero_grad();
  md.backward();
  mf.backward();
  int compared = 0;
  for (const train::Param<double>& t : pd.all()) {
    if (!dspark(t.name)) continue;
    const double scale = test::max_abs(t.grad);
    const std::vector<float>& f = pf.at(t.name).grad;
    double err = 0;
    for (size_t i = 0; i < f.size(); ++i) err = std::max(err, std::fabs(double(f[i]) - t.grad[i]));
    EXPECT_LE(err, 1e-4 * scale) << t.name;
    compared += scale > 0;
  }
  EXPECT_GE(compared, 25);
}

// Anchors: distinct, ascending, in [1, L − γ], as many as asked (at most L − γ), a function of
// (seed, sequence) alone; another sequence or seed draws others.
TEST(TrainDSpark, Anchors) {
  const Config c = test::tiny(true);
  const int64_t G = c.dspark_block_size;
  const std::vector<int64_t> a = train::dspark_anchors(c, 64, 8, 1, 5);
  ASSERT_EQ(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i], 1);
    EXPECT_LE(a[i], 64 - G);
    if (i > 0) {
      EXPECT_LT(a[i - 1], a[i]);
    }
  }
  EXPECT_EQ(train::dspark_anchors(c, 64, 8, 1, 5), a);
  EXPECT_NE(train::dspark_anchors(c, 64, 8, 1, 6), a);
  EXPECT_NE(train::dspark_anchors(c, 64, 8, 2, 5), a);
  const std::vector<int64_t> all = train::dspark_anchors(c, 10, 100, 0, 0);
  EXPECT_EQ(all, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(train::dspark_anchors(c, G, 4, 0, 0).empty());
}

// An anchor without a context before it, or without γ targets after it, is refused by name.
TEST(TrainDSpark, BadAnchorsRefused) {
  const Config c = test::tiny(true);
  Parameters<float> p(c);
  train::init_parameters(p, {});
  TrainModel<float> model(p);
  const test::Sequence s = test::make_sequence(c, 12, 1);
  for (int64_t bad : {int64_t(0), int64_t(12 - c.dspark_block_size + 1)}) {
    const std::vector<int64_t> anchors = {bad};
    try {
      model.forward(s.tokens, s.engram_ids.data(), nullptr, anchors);
      ADD_FAILURE() << "anchor " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("draft anchors in [1, 8]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dsv41
