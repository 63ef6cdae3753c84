#pragma once
// Deduplication of corpus documents (docs/training-data.md, "Deduplication"). Documents are
// offered one at a time, in the corpus's fixed order; the first of a group of duplicates is kept.
//
// Both tests compare *fingerprints*: text in lower case (ASCII letters), every ASCII character
// that is not a letter or digit a space, runs of spaces one space, no spaces at the ends; other
// characters kept. So "The Lord's house." and "the lords house" agree; a change of wording does not.
//
// * exact duplicate: the fingerprint of the whole document (its lines joined) was seen in a
//   kept document (compared by a 128-bit XXH3 hash);
// * near duplicate: most of its text is lines already seen in kept documents. Each line whose
//   fingerprint has at least kMinLineChars characters counts with that many characters (shorter
//   lines, such as "Amen." or "CHAPTER I", say nothing about the document); the document is a
//   near duplicate when the lines seen before make up at least `near_fraction` of the counted
//   characters (and at least one line counts).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace dsv41::train {

std::string fingerprint(std::string_view text);

enum class Verdict { kept, exact_duplicate, near_duplicate };

class Deduplicator {
 public:
  static constexpr size_t kMinLineChars = 20;
  explicit Deduplicator(double near_fraction = 0.8) : near_fraction_(near_fraction) {}

  // The verdict on `text`; a kept document's hashes are remembered for the documents after it.
  Verdict offer(std::string_view text);

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const { return size_t(p.first ^ (p.second * 0x9E3779B97F4A7C15ull)); }
  };
  double near_fraction_;
  std::unordered_set<std::pair<uint64_t, uint64_t>, PairHash> documents_;
  std::unordered_set<uint64_t> lines_;
};

}  // namespace dsv41::train
