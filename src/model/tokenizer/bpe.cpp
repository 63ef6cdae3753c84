#include "model/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/tokenizer/json_fields.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

using namespace json_fields;

namespace {

// Words longer than this are not cached: they are rare, and would crowd out common ones.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kCacheCapacity = 1 << 16;
// Single characters below this code point get a direct id table (covers every byte-level symbol).
constexpr char32_t kCharTableSize = 0x800;

}  // namespace

// Merge (left id, right id) -> (rank, merged id), open addressing with linear probing. The
// table is at most half full, so a miss ends after a probe or two.
struct BpeModel::MergeTable {
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  std::vector<Entry> slots;
  uint64_t mask = 0;
  int shift = 0;

  explicit MergeTable(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots.resize(capacity);
    mask = capacity - 1;
    shift = 64 - __builtin_ctzll(capacity);
  }
  static uint64_t key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t home(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift); }

  // A later duplicate of a merge replaces the earlier one, as in HF's map of merges.
  void insert(int a, int b, uint32_t rank, int id) {
    uint64_t k = key(a, b);
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == kEmpty || slots[i].key == k) {
        slots[i] = {k, rank, id};
        return;
      }
    }
  }
  const Entry* find(int a, int b) const {
    uint64_t k = key(a, b);
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Word -> ids. Bounded: once full it stops growing (as HF's cache does). Look-ups and inserts
// only try the lock, so threads never wait on each other: a busy cache is simply a miss.
class BpeModel::WordCache {
 public:
  bool get(std::string_view word, std::vector<int>& out) const {
    std::shared_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    auto it = map_.find(word);
    if (it == map_.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, const int* ids, size_t n) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || map_.size() >= kCacheCapacity) return;
    map_.emplace(std::string(word), std::vector<int>(ids, ids + n));
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>> map_;
};

BpeModel::BpeModel() : merges_(nullptr), cache_(std::make_unique<WordCache>()) {}
BpeModel::~BpeModel() = default;

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& spec, const std::string& where) {
  std::string type = optional_string(spec, "type", "BPE", where);
  if (type != "BPE") unsupported_type(where, "model", type, "BPE");
  std::unique_ptr<BpeModel> m(new BpeModel());

  auto dropout = spec.find("dropout");
  if (dropout != spec.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0))
    fail(where + ".dropout", "null (dropout makes encoding random)", dropout->dump());

  const json& vocab = required(spec, "vocab", where);
  if (!vocab.is_object()) fail(where + ".vocab", "an object of token: id", vocab.type_name());
  // Each id once, and below a bound the file's own size accounts for, since id -> token is a table
  // (one vocab id of 2^30 - 1 asked for 32 GiB).
  const int64_t id_limit = token_id_limit(int64_t(vocab.size()));
  const std::string expected = "a token id in [0, " + std::to_string(id_limit) + ") (" + kTokenIdLimitRule + ")";
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string at = where + ".vocab['" + it.key() + "']";
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= id_limit)
      fail(at, expected, it.value().dump());
    int id = it.value().get<int>();
    m->vocab_[it.key()] = id;
    if (size_t(id) >= m->tokens_.size()) {
      m->tokens_.resize(size_t(id) + 1);
      m->has_id_.resize(size_t(id) + 1, false);
    }
    if (m->has_id_[size_t(id)]) fail(at, "an id no other token has", "id " + std::to_string(id) + ", also '" + m->tokens_[size_t(id)] + "'");
    m->tokens_[size_t(id)] = it.key();
    m->has_id_[size_t(id)] = true;
  }

  m->char_id_.assign(kCharTableSize, -1);
  for (const auto& [token, id] : m->vocab_) {
    char32_t cp;
    if (!token.empty() && size_t(unicode::decode(token, 0, cp)) == token.size() && cp < kCharTableSize)
      m->char_id_[cp] = id;
  }

  std::string unk = optional_string(spec, "unk_token", "", where);
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    if (it == m->vocab_.end()) fail(where + ".unk_token", "a token of the vocabulary", "'" + unk + "'");
    m->unk_id_ = it->second;
  }
  m->fuse_unk_ = optional_bool(spec, "fuse_unk", false, where);
  m->byte_fallback_ = optional_bool(spec, "byte_fallback", false, where);
  m->ignore_merges_ = optional_bool(spec, "ignore_merges", false, where);
  m->prefix_ = optional_string(spec, "continuing_subword_prefix", "", where);
  m->suffix_ = optional_string(spec, "end_of_word_suffix", "", where);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = m->vocab_.find(std::string_view(name));
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }

  const json& merges = required(spec, "merges", where);
  if (!merges.is_array()) fail(where + ".merges", "an array", merges.type_name());
  m->merges_ = std::make_unique<MergeTable>(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& entry = merges[rank];
    std::string left, right;
    // Two forms: "a b" (older files; tokens never contain a space there) and ["a", "b"].
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos)
        fail(where + ".merges[" + std::to_string(rank) + "]", "\"left right\"", entry.dump());
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      fail(where + ".merges[" + std::to_string(rank) + "]", "\"left right\" or [\"left\", \"right\"]", entry.dump());
    }
    // The merged token drops the right part's continuing-subword prefix.
    std::string merged = left + (right.compare(0, m->prefix_.size(), m->prefix_) == 0 ? right.substr(m->prefix_.size()) : right);
    auto a = m->vocab_.find(left), b = m->vocab_.find(right), c = m->vocab_.find(merged);
    if (a == m->vocab_.end() || b == m->vocab_.end() || c == m->vocab_.end())
      fail(where + ".merges[" + std::to_string(rank) + "]", "a merge of vocabulary tokens into a vocabulary token",
           entry.dump());
    m->merges_->insert(a->second, b->second, uint32_t(rank), c->second);
  }
  return m;
}

std::optional<int> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int id) const {
  if (id < 0 || size_t(id) >= tokens_.size() || !has_id_[size_t(id)]) return nullptr;
  return &tokens_[size_t(id)];
}

int BpeModel::symbol_id(std::string_view s) const {
  auto it = vocab_.find(s);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable && cache_->get(word, out)) return;
  size_t start = out.size();
  int whole = ignore_merges_ ? symbol_id(word) : -1;
  if (whole >= 0)
    out.push_back(whole);
  else
    merge_word(word, out);
  if (cacheable) cache_->put(word, out.data() + start, out.size() - start);
}

namespace {

struct Symbol {
  int id;
  int prev, next;  // neighbours in the word, -1 at the ends
};

// A possible merge of the symbol at `pos` with its right neighbour, valid while both still
// hold the ids it was made from.
struct Candidate {
  uint32_t rank;
  int pos;
  int left, right, merged;
  // std::push_heap builds a max-heap: "less" means later, so the top is the lowest rank,
  // then the leftmost position.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::merge_word(std::string_view word, std::vector<int>& out) const {
  // Scratch space kept per thread, so that a word costs no allocation.
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  thread_local std::string piece;
  symbols.clear();
  heap.clear();
  auto add = [](int id) { symbols.push_back({id, int(symbols.size()) - 1, -1}); };

  // 1. One symbol per character; characters missing from the vocabulary become their bytes
  //    (byte_fallback) or the unknown token (consecutive ones fused into one if fuse_unk).
  bool affixes = !prefix_.empty() || !suffix_.empty();
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    char32_t cp;
    size_t n = size_t(unicode::decode(word, i, cp));
    int id;
    std::string_view s = word.substr(i, n);
    if (!affixes && cp < kCharTableSize) {
      id = char_id_[cp];
    } else {
      piece.clear();
      if (i > 0) piece += prefix_;
      piece.append(s);
      if (i + n == word.size()) piece += suffix_;
      s = piece;
      id = symbol_id(s);
    }
    i += n;
    if (id >= 0) {
      if (pending_unk) add(*unk_id_);
      pending_unk = false;
      add(id);
      continue;
    }
    if (byte_fallback_ && std::all_of(s.begin(), s.end(), [&](char c) { return byte_ids_[uint8_t(c)] >= 0; })) {
      for (char c : s) add(byte_ids_[uint8_t(c)]);
      continue;
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id_);
  for (size_t i = 0; i + 1 < symbols.size(); ++i) symbols[i].next = int(i) + 1;

  // 2. Merge the lowest-ranked adjacent pair, leftmost first, until none is in the table.
  auto consider = [&](int pos) {
    int next = symbols[size_t(pos)].next;
    if (next < 0) return;
    const MergeTable::Entry* e = merges_->find(symbols[size_t(pos)].id, symbols[size_t(next)].id);
    if (!e) return;
    heap.push_back({e->rank, pos, symbols[size_t(pos)].id, symbols[size_t(next)].id, e->id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int i = 0; i + 1 < int(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[size_t(c.pos)];
    if (left.id != c.left || left.next < 0 || symbols[size_t(left.next)].id != c.right) continue;  // stale
    Symbol& right = symbols[size_t(left.next)];
    left.id = c.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = c.pos;
    right.id = -1;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

}  // namespace dsv41
