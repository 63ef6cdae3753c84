#pragma once
// A compiled grammar over the vocabulary's tokens (docs/decisions.md, "Constrained decoding").
// The byte automaton (nfa.h) runs as a DFA whose states are built when first reached; each
// state's token mask (the tokens whose bytes it accepts) is computed once, by walking a trie of
// the vocabulary's byte strings and pruning where the automaton dies, and kept. No state
// depends on a stack (nesting is unrolled into the automaton), so every mask is cacheable and a
// step's cost at any batch is one table lookup per row once its states have been seen.
//
// A Grammar is shared by the requests that use its schema (structured.h's GrammarCache) and may be used from
// several threads: its tables grow under a lock.
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/nfa.h"
#include "model/sampling.h"

namespace dsv41 {
class Tokenizer;
}

namespace dsv41::grammar {

// The vocabulary as byte strings, in a trie. Special tokens are in it but never allowed unless
// a grammar names them (a tool call's markers); the end tokens are allowed where a grammar is
// complete, and only there.
class Vocabulary {
 public:
  // bytes[t]: token t's bytes (empty: never allowed); special[t]: token t is special.
  Vocabulary(const std::vector<std::string>& bytes, const std::vector<bool>& special, std::vector<int> end_tokens);
  // The first `vocab` ids of `tokenizer`: each id's bytes decoded once (a byte-level token's
  // characters back to bytes; an added token's own text).
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tokenizer, int64_t vocab, std::vector<int> end_tokens);

  int64_t size() const { return size_; }
  const std::vector<int>& end_tokens() const { return end_tokens_; }
  bool special(int token) const { return special_[size_t(token)]; }
  const std::string& bytes(int token) const { return bytes_[size_t(token)]; }
  // The id of the special token whose text is `text`, or -1.
  int special_id(std::string_view text) const;

  // The trie: node 0 is the root; node n's children are child_[first_child_[n] .. first_child_[n+1]),
  // its tokens token_[first_token_[n] .. first_token_[n+1]).
  struct Child {
    uint8_t byte;
    int node;
  };
  std::vector<int> first_child_, first_token_;
  std::vector<Child> child_;
  std::vector<int> token_;

 private:
  int64_t size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
  std::vector<int> end_tokens_;
};

class Grammar {
 public:
  static constexpr int kDead = -1;
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // The strings of `whole` (a fragment of `nfa`), over `vocabulary`; `specials`: special tokens
  // the grammar may produce (by their text, which the automaton must also accept). `closes`:
  // whether a reply must be complete by max_tokens (GrammarConstraint); a grammar every prefix
  // of whose strings is complete has nothing to close.
  Grammar(Nfa nfa, Fragment whole, std::shared_ptr<const Vocabulary> vocabulary, std::vector<int> specials = {},
          bool closes = true);
  bool closes() const { return closes_; }

  const Vocabulary& vocabulary() const { return *vocabulary_; }
  int start() const { return start_; }
  // The state after `bytes` from `state`; kDead where no accepted string continues so.
  int next(int state, std::string_view bytes);
  int after_token(int state, int token) { return next(state, vocabulary_->bytes(token)); }
  bool accepting(int state);
  // The fewest bytes from `state` to a complete string (0 when it is complete).
  int64_t distance(int state);

  struct Masks {
    TokenMask allowed;    // tokens that keep the string completable; the end tokens when complete
    TokenMask closing;    // of them, those that bring it closer to complete (end tokens when complete)
    int64_t farthest = 0;  // the largest distance an allowed token leads to
  };
  // The state's masks, built on first use.
  std::shared_ptr<const Masks> masks(int state);

  // Before the grammar starts (GrammarConstraint's trigger, `matched` of whose bytes end the
  // reply so far): every token but the end tokens and those that would complete the trigger
  // before their last byte (the grammar starts at a token's boundary). Built on first use.
  std::shared_ptr<const TokenMask> before_trigger(const std::string& trigger, size_t matched);

  // DFA states built so far (for the benchmark's and tests' curiosity).
  int states() const;

 private:
  int state_of(std::vector<int> set);  // under mutex_
  int step(int state, uint8_t byte);   // under mutex_
  std::shared_ptr<const Masks> build_masks(int state);  // under mutex_

  Nfa nfa_;
  int accept_ = 0;
  std::shared_ptr<const Vocabulary> vocabulary_;
  std::vector<bool> special_allowed_;  // by token id
  std::vector<int64_t> nfa_distance_;  // fewest bytes from each NFA state to the accept state
  bool closes_;

  mutable std::mutex mutex_;
  int start_ = kDead;
  std::map<std::vector<int>, int> ids_;  // DFA state by its NFA states (their ε-closure)
  struct State {
    std::vector<int> nfa;
    bool accepting = false;
    int64_t distance = kNever;
    std::vector<int> next;  // [256], -2 until computed
    std::shared_ptr<const Masks> masks;
  };
  std::vector<State> dfa_;
  std::map<std::pair<std::string, size_t>, std::shared_ptr<const TokenMask>> before_trigger_;
};

// The length of the longest end of `text` that begins `trigger`, `text` being the trigger's
// first `matched` bytes followed by `bytes` (how far a reply has spelled the trigger).
size_t trigger_matched(const std::string& trigger, size_t matched, std::string_view bytes, size_t* complete_at = nullptr);

// One request's place in a grammar (model/sampling.h's TokenConstraint). With a trigger (the
// text that ends thinking's reasoning, "</think>"), the grammar starts after it; until then any
// token but an end token goes (Grammar::before_trigger), except that the trigger is forced, token
// by token, once the tokens left are only just enough for all of it and the grammar's shortest
// string.
//
// Termination: while the tokens left (max_tokens less those generated) could all be needed, only
// tokens that bring the string closer to complete are allowed, so that a complete string and
// its end token fit in max_tokens whenever the trigger and the grammar's shortest string do.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<Grammar> grammar, int64_t max_tokens, std::string trigger = {});
  std::shared_ptr<const TokenMask> allowed() override;
  void advance(int token) override;
  bool complete() const override;
  // Where the grammar is (Grammar::kDead only after a token the mask did not allow).
  int state() const { return state_; }
  bool started() const { return started_; }

 private:
  // The tokens that spell the trigger's next bytes.
  std::shared_ptr<const TokenMask> trigger_mask() const;

  std::shared_ptr<Grammar> grammar_;
  int64_t left_;
  std::string trigger_;
  size_t matched_ = 0;  // the trigger's bytes that end the reply so far
  bool started_;
  int state_;
};

}  // namespace dsv41::grammar
