// Packed token files (src/train/data/packed_tokens.h): the layout written and read back, damaged
// files refused, and the sequence iterator: sequences where the layout says, every sequence once
// per epoch, a uniform shuffle, and resuming from a saved position.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "base/error.h"
#include "test_util.h"
#include "train/data/packed_tokens.h"

namespace dsv41::train {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;

using test::error_of;

std::string write(const fs::path& path, uint32_t vocab, const std::vector<std::vector<int>>& docs) {
  PackedTokenWriter w(path.string(), vocab, 1);
  for (const auto& d : docs) w.add_document(d);
  w.finish();
  return test::read_text(path);
}

TEST(TrainDataPacked, DocumentsAreWrittenWithEosAndReadBack) {
  test::TempDir dir("packed");
  fs::create_directories(dir.path());
  const std::string bytes = write(dir / "a.tokens", 100, {{0, 10, 11}, {0, 12}, {0}});
  // 48 header bytes, then 9 two-byte tokens: 0 10 11 EOS 0 12 EOS 0 EOS.
  ASSERT_EQ(bytes.size(), 48u + 18u);
  EXPECT_EQ(bytes.substr(0, 8), "DSV41TOK");
  EXPECT_EQ(bytes[12], 2);                         // bytes per token
  EXPECT_EQ(uint8_t(bytes[16]), 100);              // vocab size
  EXPECT_EQ(bytes[24], 9);                         // tokens
  EXPECT_EQ(bytes[32], 3);                         // documents
  EXPECT_EQ(bytes.substr(48 + 2, 2), "\x0a\x00"s);  // little-endian 10
  EXPECT_FALSE(fs::exists(dir / "a.tokens.partial"));

  const PackedTokens t = PackedTokens::read((dir / "a.tokens").string());
  EXPECT_EQ(std::vector<uint32_t>(t.tokens().begin(), t.tokens().end()), (std::vector<uint32_t>{0, 10, 11, 1, 0, 12, 1, 0, 1}));
  EXPECT_EQ(t.documents(), 3u);
  EXPECT_EQ(t.vocab_size(), 100u);
  EXPECT_EQ(t.eos_id(), 1u);

  // A vocabulary over 65,536 ids takes 4 bytes a token.
  const std::string wide = write(dir / "w.tokens", 70000, {{0, 69999}});
  ASSERT_EQ(wide.size(), 48u + 12u);
  EXPECT_EQ(PackedTokens::read((dir / "w.tokens").string()).tokens()[1], 69999u);
}

TEST(TrainDataPacked, BadInputIsRefusedByName) {
  test::TempDir dir("packed_bad");
  fs::create_directories(dir.path());
  const fs::path p = dir / "a.tokens";
  EXPECT_EQ(error_of([&] { write(p, 100, {{0, 100}}); }), p.string() + ": expected token ids below 100, found 100");
  const std::string good = write(p, 100, {{0, 10, 11}});

  std::string damaged = good;
  damaged[48 + 2] = 12;
  std::ofstream(p, std::ios::binary | std::ios::trunc) << damaged;
  EXPECT_EQ(error_of([&] { PackedTokens::read(p.string()); }), p.string() + ": expected tokens that match the header's checksum, found other bytes");
  std::ofstream(p, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 1);
  EXPECT_EQ(error_of([&] { PackedTokens::read(p.string()); }),
            p.string() + ": expected 4 tokens of 2 bytes after the header, found 7 bytes");
  std::ofstream(p, std::ios::binary | std::ios::trunc) << "not a token file at all, but long enough for a header.";
  EXPECT_EQ(error_of([&] { PackedTokens::read(p.string()); }), p.string() + ": expected a packed token file (magic DSV41TOK), found other data");
  EXPECT_EQ(error_of([&] { PackedTokens::read((dir / "none").string()); }),
            (dir / "none").string() + ": expected a packed token file, found no readable file");
}

// One document of 41 ids (2..42) and EOS: 42 tokens, token i is i + 2 but the last, 1.
PackedTokens sample(const test::TempDir& dir) {
  fs::create_directories(dir.path());
  std::vector<int> doc;
  for (int i = 2; i <= 42; ++i) doc.push_back(i);
  write(dir / "s.tokens", 100, {doc});
  return PackedTokens::read((dir / "s.tokens").string());
}

TEST(TrainDataPacked, SequencesAreWhereTheLayoutSays) {
  test::TempDir dir("packed_seq");
  const PackedTokens t = sample(dir);
  // Length 5: (42 - 1) / 5 = 8 sequences; sequence k is tokens [5k, 5k + 6).
  const SequenceIterator it(t, 5, 0);
  ASSERT_EQ(it.sequences_per_epoch(), 8u);
  auto seq = [&](uint64_t k) { return std::vector<uint32_t>(it.sequence(k).begin(), it.sequence(k).end()); };
  EXPECT_EQ(seq(0), (std::vector<uint32_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(seq(1), (std::vector<uint32_t>{7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(seq(7), (std::vector<uint32_t>{37, 38, 39, 40, 41, 42}));
  EXPECT_EQ(error_of([&] { it.sequence(8); }), "sequence 8: expected an index below 8, found 8");
  EXPECT_EQ(SequenceIterator(t, 41, 0).sequences_per_epoch(), 1u);  // 41 + 1 tokens: exactly one
  EXPECT_EQ(error_of([&] { SequenceIterator(t, 42, 0); }), "packed tokens: expected at least one sequence of 42 + 1 tokens, found 42 tokens");
  EXPECT_EQ(SequenceIterator(t, 40, 0).sequences_per_epoch(), 1u);
}

TEST(TrainDataPacked, EachEpochVisitsEverySequenceOnce) {
  test::TempDir dir("packed_epoch");
  const PackedTokens t = sample(dir);
  SequenceIterator it(t, 5, 42);
  std::vector<std::vector<uint32_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<uint32_t> firsts;
    for (int i = 0; i < 8; ++i) firsts.push_back(it.next()[0]);
    EXPECT_EQ(std::set<uint32_t>(firsts.begin(), firsts.end()), (std::set<uint32_t>{2, 7, 12, 17, 22, 27, 32, 37})) << e;
    epochs.push_back(firsts);
  }
  EXPECT_EQ(it.position(), 24u);
  EXPECT_EQ(it.epoch(), 3u);
  EXPECT_NE(epochs[0], epochs[1]);  // a new permutation each epoch
  SequenceIterator other(t, 5, 43);
  std::vector<uint32_t> firsts;
  for (int i = 0; i < 8; ++i) firsts.push_back(other.next()[0]);
  EXPECT_NE(firsts, epochs[0]);  // another seed, another order
}

TEST(TrainDataPacked, TheShuffleIsUniform) {
  // The first sequence of each of 4,000 epochs: each of the 8 is expected 500 times; the count
  // is binomial with sd sqrt(4000 * 1/8 * 7/8) = 20.9, and 100 is almost 5 sd.
  test::TempDir dir("packed_uniform");
  const PackedTokens t = sample(dir);
  SequenceIterator it(t, 5, 1);
  std::map<uint32_t, int> first;
  for (int e = 0; e < 4000; ++e) {
    first[it.next()[0]] += 1;
    for (int i = 1; i < 8; ++i) it.next();
  }
  ASSERT_EQ(first.size(), 8u);
  for (auto [token, count] : first) EXPECT_NEAR(count, 500, 100) << token;
}

TEST(TrainDataPacked, ResumingFromAPositionContinuesExactly) {
  test::TempDir dir("packed_resume");
  const PackedTokens t = sample(dir);
  SequenceIterator it(t, 5, 9);
  std::vector<std::vector<uint32_t>> seen;
  for (int i = 0; i < 21; ++i) {
    auto s = it.next();
    seen.emplace_back(s.begin(), s.end());
  }
  // Saved at 5 (epoch 0) and at 13 (epoch 1): the same sequences follow.
  for (uint64_t saved : {5u, 13u}) {
    SequenceIterator resumed(t, 5, 9, saved);
    for (uint64_t i = saved; i < 21; ++i) {
      auto s = resumed.next();
      EXPECT_EQ(std::vector<uint32_t>(s.begin(), s.end()), seen[i]) << "from " << saved << ", sequence " << i;
    }
    EXPECT_EQ(resumed.position(), 21u);
  }
}

}  // namespace
}  // namespace dsv41::train
