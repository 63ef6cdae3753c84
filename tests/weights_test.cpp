// The weights map against the official layout (the fixtures' own safetensors headers), and the
// checkpoint check that names every missing, unexpected or mis-shaped tensor.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "fixture.h"
#include "test_util.h"

using namespace dsv41;
using json = nlohmann::json;

namespace {

std::string fixture(const std::string& name, const std::string& file) { return test::fixture_dir(name) + "/" + file; }

}  // namespace

class WeightsMapOfFixture : public testing::TestWithParam<std::string> {};

// Every tensor the official reference wrote for a fixture is in the map with the same dtype and
// shape, and the map asks for nothing else.
TEST_P(WeightsMapOfFixture, EqualsTheReferenceCheckpointLayout) {
  Config c = parse_config(test::read_text(fixture(GetParam(), "config.json")), GetParam());
  json official = json::parse(test::read_text(fixture(GetParam(), "tensors.json")));
  std::map<std::string, const TensorSpec*> ours;
  std::vector<TensorSpec> specs = expected_tensors(c);
  for (const TensorSpec& s : specs) ours[s.name] = &s;
  EXPECT_EQ(ours.size(), specs.size()) << "a name appears twice in the map";

  for (auto& [name, t] : official.items()) {
    auto it = ours.find(name);
    if (it == ours.end()) {
      ADD_FAILURE() << "missing from the map: " << name;
      continue;
    }
    EXPECT_STREQ(dtype_name(it->second->dtype), t["dtype"].get<std::string>().c_str()) << name;
    EXPECT_EQ(it->second->shape, t["shape"].get<std::vector<int64_t>>()) << name;
  }
  for (auto& [name, spec] : ours) EXPECT_TRUE(official.contains(name)) << "not in the reference checkpoint: " << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WeightsMapOfFixture, testing::ValuesIn(test::kFixtures), test::FixtureName());

TEST(WeightsMap, CountsLogicalParametersOfPackedFp4) {
  Config c = preset("tiny");
  for (const TensorSpec& s : expected_tensors(c)) {
    if (s.dtype == DType::I8) {
      EXPECT_EQ(s.params, s.shape[0] * s.shape[1] * 2) << s.name;  // two e2m1 per byte
      EXPECT_EQ(s.compute, Precision::FP8);  // fp8 activations x fp4 weights: the fp8 rate
    }
    if (s.role == WeightRole::Scale) {
      EXPECT_EQ(s.params, 0) << s.name;
    }
  }
}

TEST(WeightsMap, CheckNamesEveryMismatch) {
  Config c = random_checkpoint_config(preset("tiny"), true);
  test::TempDir dir("weights_test");
  {
    ShardedWriter out(dir.string(), size_t(1) << 30);
    for (const TensorSpec& s : expected_tensors(c)) {
      if (s.name == "layers.3.attn.wq_a.weight") continue;  // missing
      std::vector<int64_t> shape = s.shape;
      if (s.name == "layers.5.ffn_norm.weight") shape[0] += 1;  // mis-shaped
      int64_t n = int64_t(dtype_size(s.dtype));
      for (int64_t d : shape) n *= d;
      out.add(s.name, s.dtype, shape, std::vector<uint8_t>(size_t(n)));
    }
    out.add("layers.0.attn.surprise", DType::F32, {1}, std::vector<uint8_t>(4));  // unexpected
    out.finish();
  }
  Checkpoint ckpt = Checkpoint::open(dir.string());
  try {
    check_weights(c, ckpt);
    ADD_FAILURE() << "mismatched checkpoint accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("3 tensor(s)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'layers.3.attn.wq_a.weight': expected F8_E4M3[32, 128], found missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'layers.5.ffn_norm.weight': expected BF16[128], found BF16[129]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'layers.0.attn.surprise': expected no such tensor"), std::string::npos) << msg;
  }
}
