#pragma once
// A byte automaton built by Thompson's construction (docs/decisions.md, "Constrained decoding"):
// states joined by ε-edges and by at most one byte-set edge each. The regex and JSON-schema
// compilers build fragments of one Nfa; grammar.h runs it as a DFA built lazily.
#include <bitset>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

namespace dsv41::grammar {

using ByteSet = std::bitset<256>;

// A piece of automaton entered at `start`, left at `end` (which has no edges yet).
struct Fragment {
  int start = 0;
  int end = 0;
};

class Nfa {
 public:
  // Refuses (dsv41::Error naming the limit) a build that passes `max_states`.
  explicit Nfa(int max_states = 1 << 20) : max_states_(max_states) {}

  struct State {
    ByteSet bytes;        // the byte edge's labels (none: no byte edge)
    int next = -1;        // the byte edge's target
    std::vector<int> eps;  // ε-edges
  };

  int add_state();
  void epsilon(int from, int to) { states_[size_t(from)].eps.push_back(to); }

  Fragment empty();
  Fragment bytes(const ByteSet& set);
  Fragment byte(uint8_t b);
  Fragment literal(std::string_view text);
  Fragment seq(std::span<const Fragment> parts);
  Fragment seq(std::initializer_list<Fragment> parts) { return seq(std::span<const Fragment>(parts.begin(), parts.size())); }
  Fragment seq(Fragment a, Fragment b);
  Fragment alt(std::span<const Fragment> parts);
  Fragment alt(std::initializer_list<Fragment> parts) { return alt(std::span<const Fragment>(parts.begin(), parts.size())); }
  Fragment optional(Fragment f);
  Fragment star(Fragment f);
  // `make` repeated min..max times (max < 0: no bound); each repetition is a fresh copy.
  Fragment repeat(const std::function<Fragment()>& make, int64_t min, int64_t max);

  const std::vector<State>& states() const { return states_; }
  int size() const { return int(states_.size()); }

 private:
  std::vector<State> states_;
  int max_states_;
};

}  // namespace dsv41::grammar
