// Config: both on-disk layouts, every preset, and refusals that name the key, what was expected
// and what was found.
#include <gtest/gtest.h>

#include <limits>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/config.h"
#include "test_util.h"

using namespace dsv41;
using json = nlohmann::json;

namespace {

std::string fixture_config(const std::string& name) {
  return test::read_text(std::string(DSV41_TEST_DATA) + "/fixtures/" + name + "/config.json");
}

// Parses `text` expecting a refusal whose message contains every one of `parts`.
void expect_refused(const std::string& text, std::initializer_list<std::string> parts) {
  try {
    parse_config(text, "config.json");
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

json official(const std::string& fixture) { return json::parse(fixture_config(fixture)); }

// The released model as the Hugging Face config.json lays it out (text_config, vision_config,
// quantization_config), written from the report's and the HF port's documented values.
json released_hf() {
  json ratios = json::array();
  for (int i = 0; i < 2; ++i) ratios.push_back(0);
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  return {
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"model_type", "deepseek_v41"},
      {"image_token_id", 129264},
      {"text_config",
       {{"vocab_size", 129280}, {"hidden_size", 5120}, {"num_hidden_layers", 40}, {"num_attention_heads", 64},
        {"num_key_value_heads", 1}, {"head_dim", 512}, {"q_lora_rank", 1280}, {"qk_rope_head_dim", 64},
        {"rope_theta", 10000}, {"compress_rope_theta", 160000},
        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
                          {"original_max_position_embeddings", 65536}}},
        {"max_position_embeddings", 1048576}, {"sliding_window", 128}, {"compress_ratios", ratios},
        {"kv_source_layer_ids", {2, 8, 14, 20}}, {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}},
        {"candidate_source_layer_id", 20}, {"candidate_topk_blocks", 2048}, {"candidate_block_size", 8},
        {"index_n_heads", 32}, {"index_head_dim", 128}, {"index_topk", 512}, {"o_groups", 8}, {"o_lora_rank", 1024},
        {"moe_intermediate_size", 2304}, {"n_routed_experts", 384}, {"n_shared_experts", 1},
        {"num_experts_per_tok", 6}, {"scoring_func", "sqrtsoftplus"}, {"routed_scaling_factor", 1.5},
        {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"swiglu_limit", 10.0}, {"hc_mult", 4},
        {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"engram_layer_ids", {1, 14}},
        {"engram_num_embeddings", {384006168, 384016682}}, {"engram_vocab_size", 16000000},
        {"engram_max_ngram_size", 4}, {"engram_n_heads", 8}, {"engram_head_dim", 256}, {"engram_pad_id", 2},
        {"engram_compressed_vocab_size", 99092}, {"num_nextn_predict_layers", 3}, {"dspark_block_size", 5},
        {"dspark_noise_token_id", 128799}, {"dspark_target_layer_ids", {37, 38, 39}}, {"dspark_markov_rank", 256},
        {"dspark_n_routed_experts", 128}, {"dspark_num_experts_per_tok", 3}, {"hidden_act", "silu"},
        {"rms_norm_eps", 1e-20}, {"initializer_range", 0.02}, {"use_cache", true}, {"eos_token_id", 1}}},
      {"vision_config",
       {{"hidden_size", 1024}, {"intermediate_size", 2816}, {"num_hidden_layers", 32}, {"num_attention_heads", 16},
        {"patch_size", 14}, {"downsample_ratio", 3}, {"max_image_tokens", 1024}, {"min_pixels", 295936}}},
      {"quantization_config",
       {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"}, {"activation_scheme", "dynamic"},
        {"weight_block_size", {32, 32}}}},
  };
}

}  // namespace

TEST(Config, EveryPresetValidates) {
  for (const std::string& name : preset_names()) {
    Config c = preset(name);
    EXPECT_NO_THROW(validate(c)) << name;
    // What a preset says about itself survives the trip through the official config.json.
    Config again = parse_config(to_official_json(c), name);
    EXPECT_EQ(to_official_json(again), to_official_json(c)) << name;
  }
  EXPECT_THROW(preset("deepseek-v5"), Error);
}

TEST(Config, ReleasedScheduleHasTheReportsLayerRoles) {
  Config c = preset("deepseek-v4.1-flash");
  ASSERT_EQ(c.compress_ratios.size(), 43u);
  // Report §4.2.1: two SWA layers; three m=2 encoder groups of six (Full + 5 Reuse); decoder
  // m=1 in five groups of four: Full + 3 Reuse, then Reindex + 3 Reuse.
  for (int l = 0; l < 2; ++l) EXPECT_EQ(c.layer_kind(l), LayerKind::Swa);
  for (int l = 2; l < 20; ++l) {
    EXPECT_EQ(c.compress_ratios[l], 2);
    EXPECT_EQ(c.layer_kind(l), (l - 2) % 6 == 0 ? LayerKind::Full : LayerKind::Reuse) << l;
    EXPECT_EQ(c.kv_source_of(l), 2 + (l - 2) / 6 * 6);
  }
  for (int l = 20; l < 40; ++l) {
    LayerKind want = l == 20 ? LayerKind::Full : (l % 4 == 0 ? LayerKind::Reindex : LayerKind::Reuse);
    EXPECT_EQ(c.layer_kind(l), want) << l;
    EXPECT_EQ(c.kv_source_of(l), 20);
  }
  EXPECT_EQ(c.decoder_start(), 20);
  EXPECT_EQ(c.routed_experts(41), 128);
  EXPECT_EQ(c.activated_experts(41), 3);
  EXPECT_EQ(c.routed_experts(39), 384);
}

TEST(Config, TinyHasTheSameScheduleShape) {
  Config c = preset("tiny");
  std::vector<LayerKind> kinds;
  for (int l = 0; l < c.n_layers; ++l) kinds.push_back(c.layer_kind(l));
  EXPECT_EQ(kinds, (std::vector<LayerKind>{LayerKind::Swa, LayerKind::Swa, LayerKind::Full, LayerKind::Reuse,
                                           LayerKind::Full, LayerKind::Reuse, LayerKind::Reindex, LayerKind::Reuse}));
  EXPECT_EQ(c.compress_ratios[2], 2);
  EXPECT_EQ(c.compress_ratios[4], 1);
  EXPECT_EQ(c.decoder_start(), 4);
}

TEST(Config, ReadsTheOfficialLayoutOfEveryFixture) {
  Config c = parse_config(fixture_config("v41-tiny"), "v41-tiny");
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.n_mtp_layers, 2);
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(c.candidate_source_layer, 6);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{6126, 6332}));
  EXPECT_EQ(c.dtype, "fp8");
  EXPECT_EQ(c.expert_dtype.value_or(""), "fp4");
  EXPECT_EQ(c.vision.max_wh_ratio, std::nullopt);
  EXPECT_EQ(c.decoder_start(), 6);
  EXPECT_EQ(c.layer_kind(8), LayerKind::Reindex);
  EXPECT_EQ(parse_config(fixture_config("v41-tiny-bf16"), "bf16").dtype, "bf16");
  EXPECT_FALSE(parse_config(fixture_config("v41-tiny-noengram"), "noengram").has_engram());
}

TEST(Config, MissingOfficialKeysTakeTheReferenceDefaults) {
  json j = official("v41-tiny");
  j.erase("original_seq_len");  // ModelArgs default 0: no YaRN
  j.erase("route_scale");       // ModelArgs default 1.0
  Config c = parse_config(j.dump(), "config.json");
  EXPECT_EQ(c.original_seq_len, 0);
  EXPECT_EQ(c.route_scale, 1.0);
}

TEST(Config, ReadsTheHuggingFaceLayoutAsTheSameModel) {
  Config hf = parse_config(released_hf().dump(), "hf");
  Config released = preset("deepseek-v4.1-flash");
  EXPECT_EQ(to_official_json(hf), to_official_json(released));
}

TEST(Config, HuggingFaceOmissionsAreFilledAsTheHfPortFillsThem) {
  json j = released_hf();
  auto& t = j["text_config"];
  t.erase("kv_source_layer_ids");
  t.erase("index_source_layer_ids");
  t.erase("candidate_source_layer_id");
  t.erase("dspark_target_layer_ids");
  for (int i = 0; i < 3; ++i) t["compress_ratios"].erase(t["compress_ratios"].size() - 1);  // HF lets the DSpark zeros be left out
  Config c = parse_config(j.dump(), "hf");
  EXPECT_EQ(c.kv_source_layers, (std::vector<int>{2, 8, 14, 20}));
  EXPECT_EQ(c.index_source_layers, (std::vector<int>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.dspark_target_layer_ids, (std::vector<int>{37, 38, 39}));
  EXPECT_EQ(c.compress_ratios.size(), 43u);

  json no_quant = released_hf();
  no_quant.erase("quantization_config");
  EXPECT_EQ(parse_config(no_quant.dump(), "hf").dtype, "bf16");
}

TEST(Config, RefusesCompressRatiosOfTheWrongLength) {
  json j = official("v41-tiny");
  j["compress_ratios"].erase(13);
  expect_refused(j.dump(), {"compress_ratios", "14 entries", "n_layers 12", "n_mtp_layers 2", "found 13 entries"});
}

TEST(Config, RefusesWrongTypesAndRanges) {
  json j = official("v41-tiny");
  j["dim"] = "128";
  expect_refused(j.dump(), {"'dim'", "expected an integer", "found \"128\""});
  j = official("v41-tiny");
  j["n_heads"] = 0;
  expect_refused(j.dump(), {"'n_heads'", "found 0"});
  j = official("v41-tiny");
  j["score_func"] = "relu";
  expect_refused(j.dump(), {"'score_func'", "sqrtsoftplus", "found \"relu\""});
  j = official("v41-tiny");
  j["compress_ratios"][3] = -2;
  expect_refused(j.dump(), {"compress_ratios[3]'", "found -2"});
  expect_refused("{\"dim\": 12", {"valid JSON"});
  expect_refused("[1, 2]", {"a JSON object"});
  // Refused by their form before any field is read: a value nested 100,000 deep (an error message
  // used to dump it recursively and overflow the stack), a key given twice (the last one won).
  expect_refused("{\"dim\": " + std::string(100000, '[') + std::string(100000, ']') + "}", {"nested at most 64 levels deep"});
  j = official("v41-tiny");
  std::string twice = j.dump();
  twice.insert(1, "\"dim\": 7, ");
  expect_refused(twice, {"each key once", "key \"dim\" twice"});
}

// The ViT's 2D RoPE needs heads of a multiple of 4 channels (docs/vision.md §5): 72 / 4 = 18 is
// refused, the fixture's 64 / 4 = 16 accepted.
TEST(Config, RefusesVisionHeadsTheTwoDimensionalRopeCannotSplit) {
  json j = official("v41-tiny");
  j["vision_n_layers"] = 2;
  j["vision_dim"] = 72;
  j["vision_n_heads"] = 4;
  expect_refused(j.dump(), {"vision_dim / vision_n_heads", "a multiple of 4", "found 18"});
  j["vision_dim"] = 64;
  EXPECT_EQ(parse_config(j.dump(), "config.json").vision.dim, 64);
}

// Integers are checked in the type they are stored in: 2^32 + 8 is not 8 in an int, and 2^64 - 1
// is not -1 (both used to be read that way).
TEST(Config, RefusesIntegersBeyondTheirType) {
  json j = official("v41-tiny");
  j["index_topk"] = (uint64_t(1) << 32) + 8;
  expect_refused(j.dump(), {"'index_topk'", "found 4294967304"});
  j = official("v41-tiny");
  j["window_size"] = (uint64_t(1) << 32) + 16;
  expect_refused(j.dump(), {"'window_size'", "found 4294967312"});
  j = official("v41-tiny");
  j["candidate_source_layer"] = std::numeric_limits<uint64_t>::max();
  expect_refused(j.dump(), {"'candidate_source_layer'", "found 18446744073709551615"});
  j = official("v41-tiny");
  j["compress_ratios"][3] = (uint64_t(1) << 32) + 2;
  expect_refused(j.dump(), {"compress_ratios[3]'", "found 4294967298"});
}

// A model too large to list (1000 layers × 65,536 experts, each in range) is refused before the
// weights map is built; it used to build 2·10^8 tensor specs and run out of memory.
TEST(Config, RefusesAModelTooLargeToList) {
  json j = official("v41-tiny");
  const int mtp = j["n_mtp_layers"].get<int>();
  j["n_layers"] = 1000;
  j["n_routed_experts"] = 65536;
  j["compress_ratios"] = std::vector<int>(size_t(1000 + mtp), 0);
  expect_refused(j.dump(), {"'n_routed_experts'", "at most 16777216 expert tensors", "found 65536 experts"});
}

TEST(Config, RefusesUnknownFeaturesByName) {
  json j = official("v41-tiny");
  j["n_hash_layers"] = 3;  // V4's hash routing: not a V4.1 feature
  expect_refused(j.dump(), {"'n_hash_layers'", "unknown key"});
  json hf = released_hf();
  hf["text_config"]["num_key_value_heads"] = 8;
  expect_refused(hf.dump(), {"'num_key_value_heads'", "found 8"});
  hf = released_hf();
  hf["quantization_config"]["weight_block_size"] = {128, 128};
  expect_refused(hf.dump(), {"'weight_block_size'", "[32,32]", "found [128,128]"});
}

TEST(Config, RefusesSourceIdsInconsistentWithTheRatios) {
  json j = official("v41-tiny");
  j["kv_source_layers"] = {1, 4, 6};  // layer 1 has ratio 0
  expect_refused(j.dump(), {"kv_source_layers", "ratio 0"});
  j = official("v41-tiny");
  j["kv_source_layers"] = {2, 6};  // layer 4 would read layer 2's cache: ratio 2 vs its own ratio 2, but...
  j["index_source_layers"] = {2, 6, 8, 10};
  j["compress_ratios"][4] = 2;
  j["compress_ratios"][5] = 2;
  EXPECT_NO_THROW(parse_config(j.dump(), "config.json"));  // ...consistent: 4, 5 reuse layer 2
  j["compress_ratios"][5] = 1;  // layer 5 (ratio 1) would read layer 2's ratio-2 cache
  expect_refused(j.dump(), {"compress_ratios[5]", "kv-source layer 2"});
  j = official("v41-tiny");
  j["index_source_layers"] = {4, 6, 8, 10};  // kv source 2 owns index keys: must be an index source
  expect_refused(j.dump(), {"index_source_layers", "every kv-source"});
  j = official("v41-tiny");
  j["candidate_source_layer"] = 7;
  expect_refused(j.dump(), {"candidate_source_layer", "index_source_layers", "found 7"});
  j = official("v41-tiny");
  j["kv_source_layers"] = {2, 4, 6, 20};
  expect_refused(j.dump(), {"kv_source_layers[3]'", "[0, 12)", "found 20"});
  j = official("v41-tiny");
  j["compress_ratios"][12] = 2;  // a DSpark layer
  expect_refused(j.dump(), {"compress_ratios[12]", "DSpark"});
}

TEST(Config, EngramTableRowsAreSumsOfConsecutivePrimes) {
  Config c = preset("deepseek-v4.1-flash");
  const std::vector<std::vector<int64_t>> primes = engram_primes(c);
  ASSERT_EQ(primes.size(), 2u);
  const std::vector<int64_t>& p0 = primes[0], &p1 = primes[1];
  ASSERT_EQ(p0.size(), 24u);
  // components.md §2.2: the 48 primes above 16M, first 16000057, 16000079, 16000081, last 16000889.
  EXPECT_EQ(p0[0], 16000057);
  EXPECT_EQ(p0[1], 16000079);
  EXPECT_EQ(p0[2], 16000081);
  EXPECT_EQ(p1.back(), 16000889);
  EXPECT_EQ(engram_table_rows(c), (std::vector<int64_t>{384006168, 384016682}));

  // Near the limit of engram_vocab_size (2^40), over many layers: consecutive primes, each one
  // checked here by trial division (which the search used to do itself, taking a minute).
  c.engram_vocab_size = (int64_t(1) << 40) - 5000;
  c.engram_layer_ids.assign(64, 0);
  auto trial_division = [](int64_t n) {
    for (int64_t d = 2; d * d <= n; ++d)
      if (n % d == 0) return false;
    return n >= 2;
  };
  const std::vector<std::vector<int64_t>> far = engram_primes(c);
  ASSERT_EQ(far.size(), 64u);
  int64_t previous = c.engram_vocab_size - 1;
  for (size_t layer : {size_t(0), size_t(63)}) {
    if (layer == 63) previous = far[62].back();
    for (int64_t p : far[layer]) {
      for (int64_t n = previous + 1; n < p; ++n) ASSERT_FALSE(trial_division(n)) << n << " is prime, skipped";
      ASSERT_TRUE(trial_division(p)) << p;
      previous = p;
    }
  }

  json j = official("v41-tiny");
  j["engram_num_embeddings"] = {6126, 6333};
  expect_refused(j.dump(), {"engram_num_embeddings", "[6126, 6332]", "found [6126, 6333]"});
}
