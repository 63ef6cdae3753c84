#include "eval/dspark_acceptance.h"

#include <algorithm>

#include "forward/dspark.h"

namespace dsv41::eval {

void Acceptance::add(const Acceptance& o) {
  steps += o.steps, accepted += o.accepted, emitted += o.emitted;
  if (accepted_at.size() < o.accepted_at.size()) accepted_at.resize(o.accepted_at.size(), 0);
  for (size_t k = 0; k < o.accepted_at.size(); ++k) accepted_at[k] += o.accepted_at[k];
}

Acceptance dspark_acceptance(Executor& executor, std::shared_ptr<const EngramHasher> hasher, int64_t vocab, Mode mode,
                             std::span<const int> prompt, int64_t tokens, std::span<const int> stop) {
  const Config& c = executor.model().config();
  Session session(executor, std::move(hasher), mode);
  session.enable_drafting();
  GreedyVerifier verifier(c.vocab_size, vocab);
  const std::vector<float> logits = session.prefill(prompt);
  int next = draft_argmax(std::span(logits).first(size_t(vocab)));
  auto stops = [&](int id) { return std::find(stop.begin(), stop.end(), id) != stop.end(); };
  Acceptance a;
  a.accepted_at.assign(size_t(c.dspark_block_size), 0);
  while (a.emitted < tokens && !stops(next)) {
    const Session::Speculation s = session.speculate(next, verifier);
    a.steps += 1;
    a.accepted += s.accepted;
    a.emitted += int64_t(s.emitted.size());
    for (int k = 0; k < s.accepted; ++k) a.accepted_at[size_t(k)] += 1;
    if (std::any_of(s.emitted.begin(), s.emitted.end(), stops)) break;
    next = s.emitted.back();
  }
  return a;
}

}  // namespace dsv41::eval
