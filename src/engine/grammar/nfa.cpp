#include "engine/grammar/nfa.h"

#include <string>

#include "base/error.h"

namespace dsv41::grammar {

int Nfa::add_state() {
  if (int(states_.size()) >= max_states_)
    fail("grammar", "an automaton of at most " + std::to_string(max_states_) + " states", "a larger one (simplify the schema)");
  states_.emplace_back();
  return int(states_.size()) - 1;
}

Fragment Nfa::empty() {
  const int s = add_state();
  return {s, s};
}

Fragment Nfa::bytes(const ByteSet& set) {
  const int s = add_state(), e = add_state();
  states_[size_t(s)].bytes = set;
  states_[size_t(s)].next = e;
  return {s, e};
}

Fragment Nfa::byte(uint8_t b) {
  ByteSet set;
  set.set(b);
  return bytes(set);
}

Fragment Nfa::literal(std::string_view text) {
  Fragment f = empty();
  for (char c : text) f = seq(f, byte(uint8_t(c)));
  return f;
}

Fragment Nfa::seq(Fragment a, Fragment b) {
  epsilon(a.end, b.start);
  return {a.start, b.end};
}

Fragment Nfa::seq(std::span<const Fragment> parts) {
  if (parts.empty()) return empty();
  Fragment f = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) f = seq(f, parts[i]);
  return f;
}

Fragment Nfa::alt(std::span<const Fragment> parts) {
  const int s = add_state(), e = add_state();
  for (const Fragment& p : parts) epsilon(s, p.start), epsilon(p.end, e);
  return {s, e};
}

Fragment Nfa::optional(Fragment f) {
  // A fresh entry: an ε-edge from f's own start would also skip f from any loop back to it.
  const int s = add_state(), e = add_state();
  epsilon(s, f.start);
  epsilon(s, e);
  epsilon(f.end, e);
  return {s, e};
}

Fragment Nfa::star(Fragment f) {
  // A fresh entry and exit keep the loop from reaching into the fragments around it.
  const int s = add_state(), e = add_state();
  epsilon(s, f.start);
  epsilon(s, e);
  epsilon(f.end, s);
  return {s, e};
}

Fragment Nfa::repeat(const std::function<Fragment()>& make, int64_t min, int64_t max) {
  Fragment f = empty();
  for (int64_t i = 0; i < min; ++i) f = seq(f, make());
  if (max < 0) return seq(f, star(make()));
  // The optional copies nest (a(b(c)?)?)?, so that each is taken only after the one before it.
  Fragment tail = empty();
  for (int64_t i = max; i > min; --i) tail = optional(seq(make(), tail));
  return seq(f, tail);
}

}  // namespace dsv41::grammar
