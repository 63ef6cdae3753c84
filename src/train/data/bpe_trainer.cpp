#include "train/data/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/unicode.h"
#include "train/data/tokenizer_json.h"

namespace dsv41::train {

WordCounter::WordCounter() : pre_tokenizer_(pre_tokenizer_from_json(pre_tokenizer_spec(), "pre_tokenizer_spec()")) {}

void WordCounter::add(std::string_view text) {
  // An added token in the text is one token, as in Tokenizer::encode: the text around it is cut.
  while (!text.empty()) {
    size_t at = text.size(), length = 0;
    for (const AddedToken& t : kAddedTokens)
      if (const size_t p = text.find(t.content); p < at || (p == at && t.content.size() > length)) {
        at = p;
        length = t.content.size();
      }
    add_piece(text.substr(0, at));
    text.remove_prefix(std::min(text.size(), at + length));
  }
}

void WordCounter::add_piece(std::string_view text) {
  if (text.empty()) return;
  scratch_.text.assign(text);
  scratch_.pieces.assign(1, {0, text.size(), true});
  pre_tokenizer_->pre_tokenize(scratch_);
  // Counted in the byte-level alphabet the pre-tokenizer writes; words() maps back to bytes.
  for (const Piece& p : scratch_.pieces) ++counts_[scratch_.text.substr(p.begin, p.end - p.begin)];
}

void WordCounter::merge(const WordCounter& other) {
  for (const auto& [word, count] : other.counts_) counts_[word] += count;
}

std::vector<std::pair<std::string, uint64_t>> WordCounter::words() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(counts_.size());
  for (const auto& [mapped, count] : counts_) {
    std::string bytes;
    for (size_t i = 0; i < mapped.size();) {
      char32_t cp;
      i += size_t(unicode::decode(mapped, i, cp));
      bytes += char(byte_level::byte_of(cp));
    }
    out.emplace_back(std::move(bytes), count);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

using PairKey = uint64_t;
PairKey pair_key(int left, int right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

struct Candidate {
  int64_t count;
  PairKey pair;
  // The priority queue's top is the largest: the highest count, then the smallest pair.
  bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
};

struct Word {
  std::vector<int> symbols;
  int64_t count;
};

}  // namespace

BpeModel train_bpe(const std::vector<std::pair<std::string, uint64_t>>& input, const BpeOptions& options) {
  BpeModel model;
  std::unordered_map<std::string, int> symbol_of;
  for (int b = 0; b < 256; ++b) {
    model.symbols.emplace_back(1, char(b));
    symbol_of[model.symbols.back()] = b;
  }

  std::vector<Word> words;
  words.reserve(input.size());
  for (const auto& [bytes, count] : input) {
    Word w{{}, int64_t(count)};
    for (unsigned char c : bytes) w.symbols.push_back(c);
    words.push_back(std::move(w));
  }

  // Every adjacent pair's count (weighted by the words' counts) and the words it occurs in
  // (a word may be listed twice, or no longer hold the pair: both are harmless).
  std::unordered_map<PairKey, int64_t> count;
  std::unordered_map<PairKey, std::vector<uint32_t>> where;
  for (uint32_t w = 0; w < words.size(); ++w) {
    const std::vector<int>& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const PairKey p = pair_key(s[i], s[i + 1]);
      count[p] += words[w].count;
      where[p].push_back(w);
    }
  }
  // Candidates carry the count they had when pushed; one whose count has changed since is
  // pushed again with its current count when it comes to the top.
  std::priority_queue<Candidate> queue;
  for (const auto& [p, c] : count) queue.push({c, p});

  std::unordered_set<PairKey> grown;
  while (model.symbols.size() < options.symbols && !queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int64_t current = count[top.pair];
    if (current != top.count) {
      if (current > 0) queue.push({current, top.pair});
      continue;
    }
    if (current < int64_t(options.min_count)) break;

    const int left = int(top.pair >> 32), right = int(uint32_t(top.pair));
    const std::string text = model.symbols[size_t(left)] + model.symbols[size_t(right)];
    auto [it, is_new] = symbol_of.try_emplace(text, int(model.symbols.size()));
    if (is_new) model.symbols.push_back(text);
    const int result = it->second;
    model.merges.push_back({left, right, result});

    std::vector<uint32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    grown.clear();
    for (uint32_t w : affected) {
      Word& word = words[w];
      std::vector<int>& s = word.symbols;
      std::vector<int> merged;
      merged.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          merged.push_back(result);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      if (merged.size() == s.size()) continue;  // a stale entry: the word lost the pair earlier
      for (size_t i = 0; i + 1 < s.size(); ++i) count[pair_key(s[i], s[i + 1])] -= word.count;
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        const PairKey p = pair_key(merged[i], merged[i + 1]);
        count[p] += word.count;
        if (merged[i] == result || merged[i + 1] == result) {
          where[p].push_back(w);
          grown.insert(p);
        }
      }
      s = std::move(merged);
    }
    for (PairKey p : grown) queue.push({count[p], p});
    if (options.progress && model.merges.size() % 256 == 0) options.progress(model.symbols.size(), options.symbols);
  }
  if (options.progress) options.progress(model.symbols.size(), options.symbols);
  return model;
}

}  // namespace dsv41::train
