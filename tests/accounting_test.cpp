// The accounting rules (docs/accounting.md), checked against counts written out by hand here and
// against the report's figures for the released model.
#include <gtest/gtest.h>

#include <type_traits>

#include "fixture.h"
#include "forward/model.h"
#include "model/accounting.h"
#include "model/config.h"
#include "model/layer_weights.h"
#include "model/weights.h"

using namespace dsv41;

// Active parameters of one decode token on `tiny`, counted from the reference's module shapes
// (model.py: Attention, Compressor, Indexer, MoE, Block, Engram, ParallelHead).
TEST(Accounting, ActiveParametersOfTinyByHand) {
  Config c = preset("tiny");
  const int64_t dim = 128, ql = 32, H = 4, hd = 64, og = 2, olr = 32, inter = 64, E = 8, k = 2, hc = 4;
  const int64_t ih = 8, ihd = 32, V = 1024;
  int64_t attention = dim * ql + ql + ql * H * hd + dim * hd + hd + (og * olr) * (H * hd / og) + dim * og * olr + H;
  int64_t compressor_m2 = 2 * hd * dim + hd, compressor_m1 = hd * dim + hd;
  int64_t indexer = ih * ihd * ql + ih * dim, index_keys = ihd * hd + ihd;
  int64_t moe_active = E * dim + k * 3 * dim * inter + 3 * dim * inter;
  int64_t block = 2 * dim + 2 * ((2 + hc) * hc * hc * dim + (2 + hc) * hc + 3);
  int64_t engram = (dim * (hc + 1)) * (3 * 2 * 32) + 2 * hc * dim;
  int64_t layer = attention + moe_active + block;
  // layers 0-7: SWA SWA Full(m=2) Reuse Full(m=1) Reuse Reindex Reuse; Engram on layer 1
  int64_t decode = 8 * layer + (compressor_m2 + indexer + index_keys) + (compressor_m1 + indexer + index_keys) + indexer +
                   engram + V * dim;
  // prefill (default): layers 0-3 and the decoder kv-source's compressor, index keys and attn_norm
  int64_t prefill = 4 * layer + (compressor_m2 + indexer + index_keys) + engram + compressor_m1 + index_keys + dim;

  Accounting a = account(c, 64);
  EXPECT_EQ(a.params.active_decode, decode);
  EXPECT_EQ(a.params.active_prefill, prefill);
  EXPECT_EQ(a.params.active_prefill_exact, decode - V * dim);
}

TEST(Accounting, KvBytesPerToken) {
  // Report: 890 B/token. Three m=2 encoder Full layers and one m=1 decoder Full layer, each
  // storing a 288 B KV-FP4 main entry and a 68 B MXFP4 index key per compressed entry.
  for (const char* name : {"deepseek-v4.1-flash", "bench-1gpu"}) {
    Accounting a = account(preset(name), 1024);
    EXPECT_EQ(a.kv.main_entry_bytes, 288);
    EXPECT_EQ(a.kv.index_entry_bytes, 68);
    EXPECT_EQ(a.kv.global_bytes_per_token, 890.0) << name;
    EXPECT_EQ(a.kv.swa_bytes_per_sequence, 528 * 128 * 43) << name;  // 43 layers' rings of 128
  }
  Accounting tiny = account(preset("tiny"), 64);
  EXPECT_EQ(tiny.kv.global_bytes_per_token, (36.0 + 17.0) / 2 + (36.0 + 17.0));
}

TEST(Accounting, ReleasedModelMatchesTheReport) {
  Accounting a = account(preset("deepseek-v4.1-flash"), 32768);
  // Report §1 / §4.2.1: 552B backbone, 196B Engram, 8B active in prefill, 16B in decode.
  EXPECT_NEAR(double(a.params.backbone), 552e9, 0.5e9);
  EXPECT_NEAR(double(a.params.engram), 196.5e9, 0.5e9);
  EXPECT_NEAR(double(a.params.active_prefill), 8e9, 0.5e9);
  EXPECT_NEAR(double(a.params.active_decode), 16e9, 0.5e9);
  // "prefill ≈ halved" by decoder bounded replay.
  EXPECT_NEAR(a.prefill.default_over_exact(), 0.5, 0.05);
  // Decode FLOPs from 4K to 1M: report "increases by only 1/4".
  EXPECT_NEAR(a.decode_ratio_1m_4k, 1.25, 0.03);
}

TEST(Accounting, ShortPromptsReplayEveryDecoderPosition) {
  // With N <= W the decoder replays the whole prompt, so default mode saves nothing: it does the
  // exact work plus, once more, the decoder kv-source's projection (layer 4 of tiny: compressor
  // wkv 64x128 and norm 64, index keys wk 32x64 and k_norm 32, attn_norm 128; all bf16, 2 FLOPs
  // per weight element).
  Config c = preset("tiny");
  Accounting a = account(c, c.window_size);
  const double projection = 2.0 * (64 * 128 + 64 + 32 * 64 + 32 + 128);
  EXPECT_NEAR(a.prefill.default_flops - a.prefill.exact_flops, c.window_size * projection, 1e-6 * a.prefill.exact_flops);
  // Longer prompts: the decoder runs on W positions only.
  Accounting longer = account(c, 64 * c.window_size);
  EXPECT_LT(longer.prefill.default_over_exact(), 0.6);
}

TEST(Accounting, AttentionWorkOfSlidingWindowLayersStopsGrowingAtTheWindow) {
  Config c = preset("tiny");
  // Layers 0-1 are SWA-only: their cost at positions W-1 and 10 W is the same.
  EXPECT_EQ(layer_flops(c, 0, 2, c.window_size - 1), layer_flops(c, 0, 2, 10 * c.window_size));
  EXPECT_LT(layer_flops(c, 0, 2, 0), layer_flops(c, 0, 2, c.window_size - 1));
  // A Full layer keeps growing: its indexer scores every compressed entry.
  EXPECT_LT(layer_flops(c, 2, 3, c.window_size), layer_flops(c, 2, 3, 10 * c.window_size));
}

// What a rank holds, two ways: the weights map's shards (rank_weight_bytes) and the bytes its
// Model binds when loaded as that rank (Model::load's slicing), walked field by field; an Engram
// table's rows by hand (⌈N / 2⌉ on rank 0, the rest on rank 1), and an fp8 wo_a (widened to bf16
// once loaded) at its stored bytes: values and 32 × 32 scale blocks.
class RankBytesOf : public testing::TestWithParam<std::string> {};

TEST_P(RankBytesOf, ARanksWeightBytesAreWhatItsModelBinds) {
  const std::string dir = test::fixture_dir(GetParam());
  const bool fp8 = load_config(dir).quantized();
  for (int world : {1, 2}) {
    int64_t all = 0;
    for (int rank = 0; rank < world; ++rank) {
      const auto m = Model::load(dir, {rank, world});
      const Config& c = m->config();
      int64_t bound = 0;
      auto add = [&](const Weight& w) {
        if (w.data) bound += w.data_bytes() + w.scale_bytes();
      };
      add(m->embed());
      add(m->norm());
      add(m->head());
      for (int l = 0; l < c.n_total_layers(); ++l) {
        const LayerWeights& L = m->layer(l);
        const std::string prefix = l < c.n_layers ? "layers." + std::to_string(l) + "." : "mtp." + std::to_string(l - c.n_layers) + ".";
        for_each_block_tensor(
            c, prefix, l,
            [&](const BlockTensor& t, const auto& field) {
              if constexpr (std::is_same_v<std::decay_t<decltype(field)>, Weight>) {
                if (fp8 && &field == &L.attn.wo_a) {
                  bound += field.rows * field.cols + ((field.rows + 31) / 32) * ((field.cols + 31) / 32);
                  return;
                }
                add(field);
              } else {  // the table and its scales: rows by hand
                const int64_t n = t.shape[0], first = (n + 1) / 2;
                bound += (world == 1 ? n : rank == 0 ? first : n - first) * t.shape[1] * int64_t(dtype_size(t.dtype));
              }
            },
            L);
      }
      for (int j = 0; j < c.n_mtp_layers; ++j) for_each_dspark_tensor(c, j, [&](const BlockTensor&, const Weight& w) { add(w); }, m->dspark());
      const RankBytes b = rank_weight_bytes(c, {rank, world});
      EXPECT_EQ(b.total(), bound) << "rank " << rank << " of " << world;
      all += b.total();
    }
    // The cut tensors once over the ranks, the whole ones on each: at world 2 the ranks together
    // hold more than the model by exactly its whole tensors.
    const Config c = load_config(dir);
    int64_t whole = 0, replicated = 0;
    for (const TensorSpec& t : expected_tensors(c)) {
      whole += t.nbytes();
      if (t.shard == Shard::Whole) replicated += t.nbytes();
    }
    EXPECT_EQ(all, whole + (world - 1) * replicated) << world;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RankBytesOf, testing::Values("v41-tiny", "v41-tiny-bf16"), test::FixtureName());

// The released model over 8 ranks: each holds 1/8 of the routed experts and of the cut attention
// tensors, the Engram tables' rows in eighths, and the rest whole (docs/parallel.md's figures).
TEST(Accounting, TheReleasedModelPerRank) {
  const Config c = preset("deepseek-v4.1-flash");
  const RankBytes one = rank_weight_bytes(c, {0, 1}), eighth = rank_weight_bytes(c, {0, 8});
  // Engram by hand: each table's ceil(rows / 8) rows of e4m3 values and ue8m0 scales per 32, and
  // whole on every rank each layer's fp8 wkv (32 × 32 scale blocks) and bf16 q and k weights.
  int64_t engram = 0;
  const int64_t hd = c.engram_head_dim, out = int64_t(c.dim) * (c.hc_mult + 1), in = int64_t(c.engram_hash_columns()) * hd;
  for (int64_t rows : c.engram_num_embeddings)
    engram += (rows + 7) / 8 * (hd + hd / 32) + out * in + ((out + 31) / 32) * ((in + 31) / 32) + 2 * 2 * int64_t(c.hc_mult) * c.dim;
  EXPECT_EQ(eighth.engram, engram);
  EXPECT_LT(eighth.engram, one.engram / 7);
  EXPECT_LT(eighth.backbone, one.backbone / 7);
  EXPECT_GT(eighth.backbone, one.backbone / 8);
  EXPECT_EQ(rank_weight_bytes(c, {7, 8}).backbone, eighth.backbone);
}
