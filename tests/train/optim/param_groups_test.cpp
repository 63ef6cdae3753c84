// The parameter-group table (param_groups.h): every tensor of the weights map of the released
// model and of the tiny preset falls in exactly one row, every row is used, the rows give what
// the report says for tensors named here, and docs/training.md lists every row.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "base/error.h"
#include "model/weights.h"
#include "train/optim/param_groups.h"

namespace dsv41::optim {
namespace {

bool vision_tower(const std::string& name) {
  return name.starts_with("vision.") || name.starts_with("aligner.") || name.starts_with("image_");
}

TEST(ParamGroups, EveryTensorOfTheWeightsMapHasExactlyOneRow) {
  std::set<const GroupRule*> used;
  for (const char* preset_name : {"deepseek-v4.1-flash", "tiny"}) {
    const Config c = preset(preset_name);
    int64_t checked = 0;
    for (const TensorSpec& t : expected_tensors(c)) {
      if (t.role == WeightRole::Scale) continue;  // quantization scales are not parameters
      if (vision_tower(t.name)) {
        EXPECT_THROW(param_group(c, t.name), Error) << t.name;
        continue;
      }
      ParamGroup g{};
      ASSERT_NO_THROW(g = param_group(c, t.name)) << preset_name << ": " << t.name;
      used.insert(g.rule);
      // The updates that need a matrix get one.
      if (g.update == Update::Muon || g.update == Update::Sinkhorn) {
        EXPECT_EQ(t.shape.size(), 2u) << t.name;
      }
      if (g.update == Update::Muon) {
        EXPECT_EQ(t.shape[0] % g.row_blocks, 0) << t.name;
      }
      ++checked;
    }
    EXPECT_GT(checked, 100) << preset_name;
  }
  // Every row matches some tensor of these two models (gate.bias_vl: the released model's, for
  // its vision tokens).
  for (const GroupRule& rule : group_rules()) EXPECT_TRUE(used.count(&rule)) << rule.pattern;
}

TEST(ParamGroups, TheReportsAssignmentsForNamedTensors) {
  const Config c = preset("deepseek-v4.1-flash");
  struct Case {
    const char* name;
    Update update;
    float lr;
    bool decay;
    int64_t blocks;
  };
  const Case cases[] = {
      {"embed.weight", Update::Sinkhorn, 1, false, 1},
      {"head.weight", Update::Sinkhorn, 1, false, 1},
      {"norm.weight", Update::AdamW, 1, true, 1},
      {"layers.1.engram.embed.weight", Update::Sinkhorn, 5, false, 1},
      {"layers.1.engram.wkv.weight", Update::Muon, 1, true, 1},
      {"layers.1.engram.q_weight", Update::AdamW, 1, true, 1},
      {"layers.0.attn.wq_b.weight", Update::Muon, 1, true, c.n_heads},
      {"layers.0.attn.wkv.weight", Update::Muon, 1, true, 1},
      {"layers.2.attn.indexer.wq_b.weight", Update::Muon, 1, true, c.index_n_heads},
      {"layers.2.attn.wo_a.weight", Update::Muon, 1, true, c.o_groups},
      {"layers.0.hc_attn_fn", Update::Muon, 1, true, 1},
      {"layers.0.hc_ffn_base", Update::AdamW, 1, false, 1},
      {"layers.0.hc_ffn_scale", Update::AdamW, 1, false, 1},
      {"layers.0.attn.attn_sink", Update::AdamW, 1, false, 1},
      {"layers.39.attn_norm.weight", Update::AdamW, 1, true, 1},
      {"layers.5.ffn.gate.weight", Update::Muon, 1, true, 1},
      {"layers.5.ffn.gate.bias", Update::ExpertBias, 1, false, 1},
      {"layers.5.ffn.experts.383.w2.weight", Update::Muon, 1, true, 1},
      {"mtp.0.main_proj.weight", Update::Muon, 1, true, 1},
      {"mtp.2.markov_head.head.weight", Update::Sinkhorn, 1, false, 1},
      {"mtp.2.norm.weight", Update::AdamW, 1, true, 1},
  };
  for (const Case& k : cases) {
    const ParamGroup g = param_group(c, k.name);
    EXPECT_EQ(g.update, k.update) << k.name;
    EXPECT_EQ(g.lr_multiplier, k.lr) << k.name;
    EXPECT_EQ(g.weight_decay, k.decay) << k.name;
    EXPECT_EQ(g.row_blocks, k.blocks) << k.name;
  }
  EXPECT_EQ(c.n_heads, 64);  // the report's head-wise split of wq_b: 64 blocks of 512 rows
}

TEST(ParamGroups, UnknownNamesAreErrorsNamingTheTensor) {
  const Config c = preset("tiny");
  for (const char* name : {"layers.0.attn.wq_b.scale", "layers.x.attn_norm.weight", "vision.norm.weight", "attn_norm.weight"}) {
    try {
      param_group(c, name);
      ADD_FAILURE() << name << " was given a group";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// docs/training.md's table lists every row's pattern in backquotes (the code's table is the
// truth; this keeps the documentation from drifting).
TEST(ParamGroups, DocumentedInTrainingMd) {
  std::ifstream in(std::string(DSV41_SOURCE_DIR) + "/docs/training.md");
  ASSERT_TRUE(in);
  std::stringstream text;
  text << in.rdbuf();
  for (const GroupRule& rule : group_rules())
    EXPECT_NE(text.str().find(std::string("`") + rule.pattern + "`"), std::string::npos) << rule.pattern;
}

}  // namespace
}  // namespace dsv41::optim
