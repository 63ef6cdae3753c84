// A model cut over ranks as model.py's world_size cuts it (model/partition.h), the collectives
// the ranks meet at (forward/comm.h), and the CPU executor over the ranks
// (forward/ranked_executor.h). Its logits against the reference: the parity suite's cpu_2ranks
// instances (forward_parity_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "engine/executors.h"
#include "error_of.h"
#include "fixture.h"
#include "forward_fixture.h"
#include "forward/comm.h"
#include "forward/dspark.h"
#include "forward/model.h"
#include "model/partition.h"
#include "ops_util.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Engram hash ids for `rows` rows, scattered over each layer's whole table (so that every rank's
// rows are read, not rank 0's alone).
std::vector<int64_t> scattered_ids(const Config& c, size_t rows) {
  const size_t layers = c.engram_layer_ids.size(), cols = size_t(c.engram_hash_columns());
  std::vector<int64_t> ids(rows * layers * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < layers; ++j)
      for (size_t k = 0; k < cols; ++k)
        ids[(r * layers + j) * cols + k] = int64_t((2654435761u * (r + 1) + 97 * j + 7919 * k) % uint64_t(c.engram_num_embeddings[j]));
  return ids;
}

// Every element of a slice is the whole weight's at the shifted index, in every stored format; the
// expected values are the codecs' dequantization of the whole matrix (OwnedWeight::values).
TEST(Partition, SlicesEveryFormatAtItsScaleBlocks) {
  const int rows = 96, cols = 128;
  const std::vector<float> w = bf16_normal(size_t(rows * cols), 0.5, 7);
  // An fp8 weight whose rows and columns end inside a scale block (scales [3, 4] for 80 × 100):
  // the cut reads them at the rounded-up stride.
  const std::vector<float> odd = bf16_normal(size_t(80 * 100), 0.5, 9);
  const OwnedWeight fp8 = make_weight(WeightFormat::FP8, odd, 80, 100);
  std::vector<uint8_t> kept;
  const Weight tail_rows = slice_rows(fp8.view(), 32, 32), tail_cols = slice_cols(fp8.view(), 64, 32, kept);
  for (int64_t i = 0; i < 32; ++i)
    for (int64_t j = 0; j < 100; ++j) ASSERT_EQ(tail_rows.at(i, j), float(fp8.at(i + 32, j))) << i << "," << j;
  for (int64_t i = 0; i < 80; ++i)
    for (int64_t j = 0; j < 32; ++j) ASSERT_EQ(tail_cols.at(i, j), float(fp8.at(i, j + 64))) << i << "," << j;
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8, WeightFormat::FP4}) {
    const OwnedWeight whole = make_weight(f, w, rows, cols);
    const Weight r = slice_rows(whole.view(), 32, 64);
    ASSERT_EQ(r.rows, 64);
    ASSERT_EQ(r.cols, cols);
    std::vector<uint8_t> owned;
    const Weight c = slice_cols(whole.view(), 64, 32, owned);
    ASSERT_EQ(c.rows, rows);
    ASSERT_EQ(c.cols, 32);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        if (i < 64) {
          ASSERT_EQ(r.at(i, j), float(whole.at(i + 32, j))) << int(f) << " row " << i << " col " << j;
        }
        if (j < 32) {
          ASSERT_EQ(c.at(i, j), float(whole.at(i, j + 64))) << int(f) << " row " << i << " col " << j;
        }
      }
  }
  // A 1-D tensor (an attention sink) is cut along its elements.
  const std::vector<float> sink = {1, 2, 3, 4, 5, 6};
  const Weight s = slice_rows(f32_view(sink, 1, 6), 3, 3);
  EXPECT_EQ(s.cols, 3);
  EXPECT_EQ(s.at(0, 0), 4.0f);
  EXPECT_EQ(s.at(0, 2), 6.0f);
}

TEST(Partition, RefusesACutInsideAScaleBlock) {
  const std::vector<float> w = bf16_normal(size_t(64 * 64), 0.5, 8);
  const OwnedWeight fp8 = make_weight(WeightFormat::FP8, w, 64, 64), fp4 = make_weight(WeightFormat::FP4, w, 64, 64);
  std::vector<uint8_t> owned;
  EXPECT_TRUE(contains(error_of([&] { slice_rows(fp8.view(), 16, 32); }), "32-wide scale blocks"));
  EXPECT_TRUE(contains(error_of([&] { slice_cols(fp8.view(), 0, 48, owned); }), "32-wide scale blocks"));
  EXPECT_TRUE(contains(error_of([&] { slice_cols(fp4.view(), 16, 32, owned); }), "32-wide scale blocks"));
  EXPECT_TRUE(contains(error_of([&] { slice_rows(fp8.view(), 32, 64); }), "a slice inside its 64 rows"));
  // fp4's scales run along a row: any row is a cut.
  EXPECT_EQ(error_of([&] { slice_rows(fp4.view(), 5, 7); }), "");
}

// v41-tiny: 4 heads, 2 output groups, 8 heads of the indexer, 8 routed experts (6 in DSpark's
// stages), a vocabulary of 600.
TEST(Partition, RefusesAWorldThatDoesNotDivideTheModel) {
  const std::string dir = fixture_dir("v41-tiny");
  const Config c = Model::load(dir)->config();
  EXPECT_TRUE(contains(error_of([&] { check_partition(c, {0, 3}); }), "n_heads divisible by the world size, found 4"))
      << error_of([&] { check_partition(c, {0, 3}); });
  EXPECT_TRUE(contains(error_of([&] { check_partition(c, {0, 4}); }), "o_groups divisible by the world size, found 2"));
  EXPECT_TRUE(contains(error_of([&] { check_partition(c, {2, 2}); }), "a rank in [0, world)"));
  EXPECT_EQ(error_of([&] { check_partition(c, {1, 2}); }), "");
  EXPECT_TRUE(contains(error_of([&] { Model::load(dir, {0, 3}); }), "n_heads"));
  EXPECT_TRUE(contains(error_of([&] { make_executor(*Model::load(dir), Device::Cpu, std::nullopt, 3); }), "n_heads"));
  EXPECT_TRUE(contains(error_of([&] { make_executor(*Model::load(dir), Device::Cpu, std::nullopt, 0); }), "--ranks"));
}

// Rank 1 of 2 holds the second half of each cut tensor, the same values as the whole model's, and
// only its own routed experts.
TEST(Partition, ARankHoldsItsPartOfEachCutTensor) {
  const std::string dir = fixture_dir("v41-tiny");
  const auto whole = Model::load(dir);
  const auto rank = Model::load(dir, {1, 2});
  const Config& c = whole->config();
  auto same_rows = [](const Weight& part, const Weight& all, int64_t first, const char* what) {
    ASSERT_EQ(part.cols, all.cols) << what;
    for (int64_t r = 0; r < part.rows; ++r)
      for (int64_t k = 0; k < part.cols; ++k) ASSERT_EQ(part.at(r, k), all.at(first + r, k)) << what << " " << r << "," << k;
  };
  EXPECT_EQ(rank->embed().rows, 300);
  same_rows(rank->embed(), whole->embed(), 300, "embed");
  EXPECT_EQ(rank->head().rows, 300);
  same_rows(rank->head(), whole->head(), 300, "head");
  for (int l : {0, c.n_layers - 1, c.n_layers}) {  // a backbone layer, the last, a DSpark stage
    const LayerWeights& p = rank->layer(l);
    const LayerWeights& w = whole->layer(l);
    EXPECT_EQ(p.attn.wq_b.rows, w.attn.wq_b.rows / 2);
    same_rows(p.attn.wq_b, w.attn.wq_b, w.attn.wq_b.rows / 2, "wq_b");
    same_rows(p.attn.wo_a, w.attn.wo_a, w.attn.wo_a.rows / 2, "wo_a");
    ASSERT_EQ(p.attn.wo_b.cols, w.attn.wo_b.cols / 2);
    for (int64_t r = 0; r < p.attn.wo_b.rows; ++r)
      for (int64_t k = 0; k < p.attn.wo_b.cols; ++k) ASSERT_EQ(p.attn.wo_b.at(r, k), w.attn.wo_b.at(r, k + p.attn.wo_b.cols));
    ASSERT_EQ(p.attn.attn_sink.cols, c.n_heads / 2);
    EXPECT_EQ(p.attn.attn_sink.at(0, 0), w.attn.attn_sink.at(0, c.n_heads / 2));
    same_rows(p.attn.wq_a, w.attn.wq_a, 0, "wq_a (whole on every rank)");
    const int E = c.routed_experts(l);
    ASSERT_EQ(int(p.experts.size()), E);
    for (int e = 0; e < E; ++e) EXPECT_EQ(p.experts[size_t(e)].w1.data != nullptr, e >= E / 2) << "layer " << l << " expert " << e;
    same_rows(p.experts[size_t(E - 1)].w2, w.experts[size_t(E - 1)].w2, 0, "an expert of its own");
  }
  const int l = c.engram_layer_ids.at(0);
  const EngramWeights& g = *rank->layer(l).engram;
  const int64_t rows = c.engram_num_embeddings.at(0), part = (rows + 1) / 2;
  EXPECT_EQ(g.table_first, part);
  EXPECT_EQ(g.table_rows, rows - part);
  // Its first and last rows are the whole table's rows `part` and rows − 1 (each rank maps the file
  // itself: the bytes are compared, not the addresses).
  const EngramWeights& all = *whole->layer(l).engram;
  const int64_t hd = c.engram_head_dim;
  for (int64_t r : {int64_t(0), g.table_rows - 1}) {
    EXPECT_EQ(std::memcmp(g.table + r * hd, all.table + (part + r) * hd, size_t(hd)), 0) << "row " << r;
    EXPECT_EQ(std::memcmp(g.table_scale + r * hd / 32, all.table_scale + (part + r) * hd / 32, size_t(hd / 32)), 0) << "row " << r;
  }
}

// Sums in rank order, not arrival order: 1 + 2⁻³⁰ rounds to 1 in fp32, so rank order gives
// (1 + 2⁻³⁰) − 1 = 0 where another order would give 2⁻³⁰; every rank gets those bits.
TEST(LocalGroup, SumsInRankOrderAndGivesEveryRankTheSameBits) {
  LocalGroup group(3);
  const float values[3] = {1.0f, 0x1p-30f, -1.0f};
  std::vector<std::vector<float>> sums(3), gathered(3);
  auto rank = [&](int r) {
    sums[size_t(r)] = {values[r], float(r)};
    group.comm(r).all_reduce_sum(sums[size_t(r)]);
    const std::vector<float> part = {float(10 * r), float(10 * r + 1)};
    gathered[size_t(r)].resize(6);
    group.comm(r).all_gather(part, gathered[size_t(r)]);
  };
  std::thread a(rank, 2), b(rank, 1);
  rank(0);
  a.join();
  b.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sums[size_t(r)][0], 0.0f) << "rank " << r;
    EXPECT_FALSE(std::signbit(sums[size_t(r)][0])) << "rank " << r;
    EXPECT_EQ(sums[size_t(r)][1], 3.0f);
    EXPECT_EQ(gathered[size_t(r)], (std::vector<float>{0, 1, 10, 11, 20, 21})) << "rank " << r;
  }
}

// A rank that fails does not leave the others waiting: they throw, and the group serves again
// once reset.
TEST(LocalGroup, AbortReleasesTheRanksWaiting) {
  LocalGroup group(2);
  std::string waited;
  std::thread other([&] {
    std::vector<float> x = {1};
    waited = error_of([&] { group.comm(1).all_reduce_sum(x); });
  });
  group.abort();
  other.join();
  EXPECT_TRUE(contains(waited, "a rank that failed")) << waited;
  std::vector<float> late = {1};
  EXPECT_TRUE(contains(error_of([&] { group.comm(0).all_reduce_sum(late); }), "a rank that failed"));
  group.reset();
  std::vector<float> x0 = {1}, x1 = {2};
  std::thread again([&] { group.comm(1).all_reduce_sum(x1); });
  group.comm(0).all_reduce_sum(x0);
  again.join();
  EXPECT_EQ(x0[0], 3.0f);
  EXPECT_EQ(x1[0], 3.0f);
}

// A call that one rank refuses (the same on all: a token outside the vocabulary) fails with the
// rank's error, not a hang, and the executor serves the next call as a fresh one would.
TEST(RankedCpuExecutor, ABadCallFailsClearlyAndTheNextIsServed) {
  const auto model = Model::load(fixture_dir("v41-tiny-noengram"));
  const auto ranks = make_executor(*model, Device::Cpu, std::nullopt, 2);
  EXPECT_EQ(ranks->name(), "cpu:2");
  const std::vector<int> bad = {5, 600, 7}, good = {5, 6, 7};
  auto sequence = ranks->new_sequence();
  const std::string e = error_of([&] { ranks->forward_batch({BatchItem{sequence.get(), bad}}); });
  EXPECT_TRUE(contains(e, "token ids in [0, 600)")) << e;
  EXPECT_EQ(sequence->length(), 0);
  const std::vector<float> after = ranks->forward_batch({BatchItem{sequence.get(), good}}).front();
  auto fresh = ranks->new_sequence();
  EXPECT_EQ(after, ranks->forward_batch({BatchItem{fresh.get(), good}}).front());
  EXPECT_EQ(sequence->length(), 3);
}

// Several sequences in one call: each gets what it gets alone (the ranks meet at each item's
// collectives in the same order), and the sequence a call advanced is restored to another.
TEST(RankedCpuExecutor, ABatchIsItsItemsAlone) {
  const auto model = Model::load(fixture_dir("v41-tiny-noengram"));
  const auto ranks = make_executor(*model, Device::Cpu, std::nullopt, 2);
  const std::vector<int> a = {3, 1, 4, 1, 5}, b = {9, 2, 6};
  auto s1 = ranks->new_sequence(), s2 = ranks->new_sequence(), t1 = ranks->new_sequence(), t2 = ranks->new_sequence();
  const auto both = ranks->forward_batch({BatchItem{s1.get(), a}, BatchItem{s2.get(), b}});
  EXPECT_EQ(both[0], ranks->forward_batch({BatchItem{t1.get(), a}}).front());
  EXPECT_EQ(both[1], ranks->forward_batch({BatchItem{t2.get(), b}}).front());
  // A state handed to a sequence reaches every rank: the next token continues the same way.
  auto copy = ranks->new_sequence();
  copy->assign(s1->host());
  const std::vector<int> next = {2};
  EXPECT_EQ(ranks->forward_batch({BatchItem{copy.get(), next}}).front(), ranks->forward_batch({BatchItem{s1.get(), next}}).front());
}

// DSpark over two ranks: the drafts of the whole model up to summation order — its logits within
// the spread of the whole model's own summation orders (kVariants of them), the same greedy tokens
// on v41-tiny's prompt — with the caller's choice called once a token, on rank 0 alone.
TEST(RankedCpuExecutor, DraftsAreTheWholeModelsAndChooseOnce) {
  const auto model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  const auto whole = make_executor(*model, Device::Cpu), ranks = make_executor(*model, Device::Cpu, std::nullopt, 2);
  ASSERT_TRUE(ranks->speculates());
  const std::vector<int> prompt = {0, 476, 506, 265, 84};
  const std::vector<int64_t> ids = scattered_ids(c, prompt.size());
  int calls = 0;
  const DraftChoice counted = [&](std::span<const float> logits) {
    ++calls;
    return draft_argmax(logits);
  };
  auto draft = [&](Executor& e) {
    auto s = e.new_sequence();
    BatchItem item{s.get(), prompt, ids.data()};
    item.drafter_context = true;
    e.forward_batch({item});
    calls = 0;
    Draft d = std::move(e.dspark_drafts({DraftRequest{s.get(), 188, &counted}}).front());
    EXPECT_EQ(calls, c.dspark_block_size) << e.name();
    return d;
  };
  auto apart = [](const Draft& a, const Draft& b) {
    double worst = 0;
    for (size_t i = 0; i < a.logits.size(); ++i) worst = std::max(worst, double(std::fabs(a.logits[i] - b.logits[i])));
    return worst;
  };
  std::vector<Draft> orders;
  for (int v = 0; v < kVariants; ++v) {
    VariantScope scope(v);
    orders.push_back(draft(*whole));
  }
  double spread = 0;
  for (const Draft& a : orders)
    for (const Draft& b : orders) spread = std::max(spread, apart(a, b));
  const Draft cut = draft(*ranks);
  ASSERT_EQ(cut.logits.size(), orders[0].logits.size());
  EXPECT_EQ(cut.tokens, orders[0].tokens);
  EXPECT_LE(apart(cut, orders[0]), std::max(kHeadroom * spread, 1e-5));
  std::printf("draft logits: two ranks against the whole model %.3g, the whole model's orders apart %.3g\n", apart(cut, orders[0]),
              spread);
}

// Calls from two threads at once (a scheduler's and a session's) take turns at the ranks'
// collectives: each gets what it gets alone.
TEST(RankedCpuExecutor, CallsFromTwoThreadsGetWhatTheyGetAlone) {
  const auto model = Model::load(fixture_dir("v41-tiny"));
  const auto ranks = make_executor(*model, Device::Cpu, std::nullopt, 2);
  const std::vector<int> a = {3, 1, 4, 1, 5, 9, 2, 6}, b = {2, 7, 1, 8};
  const std::vector<int64_t> ids_a = scattered_ids(model->config(), a.size()), ids_b = scattered_ids(model->config(), b.size());
  auto alone = [&](const std::vector<int>& t, const std::vector<int64_t>& ids) {
    auto s = ranks->new_sequence();
    return ranks->forward_batch({BatchItem{s.get(), t, ids.data()}}).front();
  };
  const std::vector<float> want_a = alone(a, ids_a), want_b = alone(b, ids_b);
  for (int round = 0; round < 4; ++round) {
    std::vector<float> got_b;
    std::thread other([&] { got_b = alone(b, ids_b); });
    const std::vector<float> got_a = alone(a, ids_a);
    other.join();
    EXPECT_EQ(got_a, want_a) << "round " << round;
    EXPECT_EQ(got_b, want_b) << "round " << round;
  }
}

}  // namespace
