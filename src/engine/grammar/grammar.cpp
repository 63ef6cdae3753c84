#include "engine/grammar/grammar.h"

#include <algorithm>
#include <deque>

#include "base/error.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace dsv41::grammar {

// ---------------------------------------------------------------- the vocabulary

Vocabulary::Vocabulary(const std::vector<std::string>& bytes, const std::vector<bool>& special, std::vector<int> end_tokens)
    : size_(int64_t(bytes.size())), bytes_(bytes), special_(special), end_tokens_(std::move(end_tokens)) {
  if (special.size() != bytes.size())
    fail("grammar vocabulary", std::to_string(bytes.size()) + " special flags, one per token", std::to_string(special.size()));
  for (int t : end_tokens_)
    if (t < 0 || t >= size_) fail("grammar vocabulary", "end tokens in [0, " + std::to_string(size_) + ")", std::to_string(t));
  // A trie of nodes with unsorted child lists first, then laid out flat, children by byte.
  struct Node {
    std::vector<std::pair<uint8_t, int>> children;
    std::vector<int> tokens;
  };
  std::vector<Node> nodes(1);
  for (int t = 0; t < int(size_); ++t) {
    if (bytes_[size_t(t)].empty()) continue;
    int n = 0;
    for (char c : bytes_[size_t(t)]) {
      auto& ch = nodes[size_t(n)].children;
      auto it = std::find_if(ch.begin(), ch.end(), [&](const auto& e) { return e.first == uint8_t(c); });
      if (it != ch.end()) {
        n = it->second;
      } else {
        ch.emplace_back(uint8_t(c), int(nodes.size()));
        n = int(nodes.size());
        nodes.emplace_back();
      }
    }
    nodes[size_t(n)].tokens.push_back(t);
  }
  first_child_.reserve(nodes.size() + 1);
  first_token_.reserve(nodes.size() + 1);
  for (Node& node : nodes) {
    std::sort(node.children.begin(), node.children.end());
    first_child_.push_back(int(child_.size()));
    for (const auto& [b, c] : node.children) child_.push_back({b, c});
    first_token_.push_back(int(token_.size()));
    token_.insert(token_.end(), node.tokens.begin(), node.tokens.end());
  }
  first_child_.push_back(int(child_.size()));
  first_token_.push_back(int(token_.size()));
}

int Vocabulary::special_id(std::string_view text) const {
  for (int t = 0; t < int(size_); ++t)
    if (special_[size_t(t)] && bytes_[size_t(t)] == text) return t;
  return -1;
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tokenizer, int64_t vocab, std::vector<int> end_tokens) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab));
  std::vector<bool> special(static_cast<size_t>(vocab));
  for (int t = 0; t < int(vocab); ++t) {
    if (t >= int(tokenizer.vocab_size())) continue;
    std::string token;
    try {
      token = tokenizer.id_to_token(t);
    } catch (const Error&) {
      continue;  // an id that names no token: never allowed
    }
    special[size_t(t)] = tokenizer.is_special(t);
    // A byte-level token's characters each stand for a byte; a token with any other character
    // (an added token) is its own UTF-8 text.
    std::string out;
    bool mapped = true;
    for (size_t i = 0; i < token.size() && mapped;) {
      char32_t cp;
      i += size_t(unicode::decode(token, i, cp));
      const int b = byte_level::byte_of(cp);
      if (b < 0) mapped = false;
      else out += char(b);
    }
    bytes[size_t(t)] = mapped && !special[size_t(t)] ? out : tokenizer.decode(std::vector<int>{t});
  }
  return std::make_shared<const Vocabulary>(bytes, special, std::move(end_tokens));
}

// ---------------------------------------------------------------- the grammar

Grammar::Grammar(Nfa nfa, Fragment whole, std::shared_ptr<const Vocabulary> vocabulary, std::vector<int> specials, bool closes)
    : nfa_(std::move(nfa)), accept_(whole.end), vocabulary_(std::move(vocabulary)),
      special_allowed_(static_cast<size_t>(vocabulary_->size())), closes_(closes) {
  for (int t : specials) special_allowed_.at(size_t(t)) = true;
  // Distances to the accept state: a breadth-first search backwards, ε-edges costing nothing
  // (0-1 BFS: a deque, free edges in front).
  const auto& states = nfa_.states();
  std::vector<std::vector<std::pair<int, int>>> into(states.size());  // (from, cost)
  for (int s = 0; s < int(states.size()); ++s) {
    for (int e : states[size_t(s)].eps) into[size_t(e)].emplace_back(s, 0);
    if (states[size_t(s)].next >= 0 && states[size_t(s)].bytes.any()) into[size_t(states[size_t(s)].next)].emplace_back(s, 1);
  }
  nfa_distance_.assign(states.size(), kNever);
  std::deque<int> queue{accept_};
  nfa_distance_[size_t(accept_)] = 0;
  while (!queue.empty()) {
    const int s = queue.front();
    queue.pop_front();
    for (const auto& [from, cost] : into[size_t(s)]) {
      if (nfa_distance_[size_t(s)] + cost >= nfa_distance_[size_t(from)]) continue;
      nfa_distance_[size_t(from)] = nfa_distance_[size_t(s)] + cost;
      cost ? queue.push_back(from) : queue.push_front(from);
    }
  }
  std::lock_guard lock(mutex_);
  start_ = state_of({whole.start});
  if (start_ == kDead) fail("grammar", "a grammar with at least one complete string", "none (the schema admits no value)");
}

// The DFA state of a set of NFA states: their ε-closure without the states that cannot reach
// the accept state (so that a DFA state is dead exactly when nothing it could still accept is
// left); kDead for the empty set.
int Grammar::state_of(std::vector<int> set) {
  const auto& states = nfa_.states();
  std::vector<bool> seen(states.size());
  std::vector<int> stack = set, closure;
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    if (seen[size_t(s)]) continue;
    seen[size_t(s)] = true;
    if (nfa_distance_[size_t(s)] == kNever) continue;
    closure.push_back(s);
    for (int e : states[size_t(s)].eps) stack.push_back(e);
  }
  if (closure.empty()) return kDead;
  std::sort(closure.begin(), closure.end());
  auto [it, fresh] = ids_.try_emplace(closure, int(dfa_.size()));
  if (!fresh) return it->second;
  State d;
  d.nfa = closure;
  for (int s : closure) d.distance = std::min(d.distance, nfa_distance_[size_t(s)]);
  d.accepting = d.distance == 0;
  d.next.assign(256, -2);
  dfa_.push_back(std::move(d));
  return it->second;
}

int Grammar::step(int state, uint8_t byte) {
  int& cached = dfa_[size_t(state)].next[byte];
  if (cached != -2) return cached;
  std::vector<int> targets;
  for (int s : dfa_[size_t(state)].nfa) {
    const Nfa::State& n = nfa_.states()[size_t(s)];
    if (n.next >= 0 && n.bytes.test(byte)) targets.push_back(n.next);
  }
  const int to = targets.empty() ? kDead : state_of(std::move(targets));
  dfa_[size_t(state)].next[byte] = to;  // (state_of may have grown dfa_: `cached` may dangle)
  return to;
}

int Grammar::next(int state, std::string_view bytes) {
  std::lock_guard lock(mutex_);
  for (char c : bytes) {
    if (state == kDead) break;
    state = step(state, uint8_t(c));
  }
  return state;
}

bool Grammar::accepting(int state) {
  std::lock_guard lock(mutex_);
  return dfa_[size_t(state)].accepting;
}

int64_t Grammar::distance(int state) {
  std::lock_guard lock(mutex_);
  return dfa_[size_t(state)].distance;
}

int Grammar::states() const {
  std::lock_guard lock(mutex_);
  return int(dfa_.size());
}

std::shared_ptr<const Grammar::Masks> Grammar::masks(int state) {
  std::lock_guard lock(mutex_);
  if (!dfa_[size_t(state)].masks) dfa_[size_t(state)].masks = build_masks(state);
  return dfa_[size_t(state)].masks;
}

// The trie walked depth first beside the DFA: a branch ends where the DFA dies; each token at a
// node reached is allowed, and closing when its state is nearer to complete than `state`.
std::shared_ptr<const Grammar::Masks> Grammar::build_masks(int state) {
  const Vocabulary& v = *vocabulary_;
  auto m = std::make_shared<Masks>();
  const size_t words = size_t((v.size() + 31) / 32);
  m->allowed.assign(words, 0);
  m->closing.assign(words, 0);
  const int64_t here = dfa_[size_t(state)].distance;
  auto set = [](TokenMask& mask, int t) { mask[size_t(t) / 32] |= 1u << (t % 32); };
  struct Item {
    int node, state;
  };
  std::vector<Item> stack{{0, state}};
  while (!stack.empty()) {
    const Item it = stack.back();
    stack.pop_back();
    if (it.node != 0) {
      const int64_t d = dfa_[size_t(it.state)].distance;
      for (int k = v.first_token_[size_t(it.node)]; k < v.first_token_[size_t(it.node) + 1]; ++k) {
        const int t = v.token_[size_t(k)];
        if (v.special(t) && !special_allowed_[size_t(t)]) continue;
        set(m->allowed, t);
        if (d < here) set(m->closing, t);
        m->farthest = std::max(m->farthest, d);
      }
    }
    for (int k = v.first_child_[size_t(it.node)]; k < v.first_child_[size_t(it.node) + 1]; ++k) {
      const int to = step(it.state, v.child_[size_t(k)].byte);
      if (to != kDead) stack.push_back({v.child_[size_t(k)].node, to});
    }
  }
  if (dfa_[size_t(state)].accepting)
    for (int t : v.end_tokens()) set(m->allowed, t), set(m->closing, t);
  return m;
}

size_t trigger_matched(const std::string& trigger, size_t matched, std::string_view bytes, size_t* complete_at) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::string seen = trigger.substr(0, matched) + bytes[i];
    matched = 0;
    for (size_t k = std::min(seen.size(), trigger.size()); k > 0; --k)
      if (seen.compare(seen.size() - k, k, trigger, 0, k) == 0) {
        matched = k;
        break;
      }
    if (matched == trigger.size()) {
      if (complete_at) *complete_at = i;
      return matched;
    }
  }
  return matched;
}

std::shared_ptr<const TokenMask> Grammar::before_trigger(const std::string& trigger, size_t matched) {
  std::lock_guard lock(mutex_);
  auto& cached = before_trigger_[{trigger, matched}];
  if (cached) return cached;
  const Vocabulary& v = *vocabulary_;
  auto mask = std::make_shared<TokenMask>(size_t((v.size() + 31) / 32), ~0u);
  auto clear = [&](int t) { (*mask)[size_t(t) / 32] &= ~(1u << (t % 32)); };
  for (int t : v.end_tokens()) clear(t);
  for (int t = 0; t < int(v.size()); ++t) {
    size_t at = 0;
    if (v.bytes(t).empty()) clear(t);
    else if (trigger_matched(trigger, matched, v.bytes(t), &at) == trigger.size() && at + 1 < v.bytes(t).size()) clear(t);
  }
  for (int64_t t = v.size(); t < int64_t(mask->size()) * 32; ++t) clear(int(t));
  cached = mask;
  return cached;
}

// ---------------------------------------------------------------- one request's constraint

GrammarConstraint::GrammarConstraint(std::shared_ptr<Grammar> grammar, int64_t max_tokens, std::string trigger)
    : grammar_(std::move(grammar)), left_(max_tokens), trigger_(std::move(trigger)), started_(trigger_.empty()),
      state_(grammar_->start()) {}

std::shared_ptr<const TokenMask> GrammarConstraint::trigger_mask() const {
  const Vocabulary& v = grammar_->vocabulary();
  const std::string_view rest = std::string_view(trigger_).substr(matched_);
  auto mask = std::make_shared<TokenMask>(size_t((v.size() + 31) / 32), 0u);
  for (int t = 0; t < int(v.size()); ++t)
    if (!v.bytes(t).empty() && rest.substr(0, v.bytes(t).size()) == v.bytes(t)) (*mask)[size_t(t) / 32] |= 1u << (t % 32);
  return mask;
}

std::shared_ptr<const TokenMask> GrammarConstraint::allowed() {
  if (!started_) {
    if (!grammar_->closes()) return nullptr;
    // All of the trigger (a free token may undo what was spelled of it), then the shortest
    // string, then an end token must still fit after a free token.
    if (left_ <= int64_t(trigger_.size()) + grammar_->distance(state_) + 1) return trigger_mask();
    return grammar_->before_trigger(trigger_, matched_);
  }
  if (state_ == Grammar::kDead) fail("grammar", "a token the grammar's mask allowed", "one it did not");
  auto m = grammar_->masks(state_);
  // After this token, left_ − 1 tokens must hold the rest and an end token: any allowed token
  // leaves at most `farthest` bytes to go, a closing one at most distance − 1.
  if (!grammar_->closes() || left_ - 1 >= m->farthest + 1) return std::shared_ptr<const TokenMask>(m, &m->allowed);
  return std::shared_ptr<const TokenMask>(m, &m->closing);
}

void GrammarConstraint::advance(int token) {
  --left_;
  const std::string& bytes = grammar_->vocabulary().bytes(token);
  if (!started_) {
    matched_ = trigger_matched(trigger_, matched_, bytes);
    started_ = matched_ == trigger_.size();  // (at the token's end: before_trigger allows no other)
    return;
  }
  const auto& ends = grammar_->vocabulary().end_tokens();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) return;  // the reply ends
  state_ = grammar_->after_token(state_, token);
}

bool GrammarConstraint::complete() const { return started_ && state_ != Grammar::kDead && grammar_->accepting(state_); }

}  // namespace dsv41::grammar
