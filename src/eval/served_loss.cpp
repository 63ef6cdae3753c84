#include "eval/served_loss.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace dsv41::eval {

double token_nll(std::span<const float> logits, int target) {
  if (target < 0 || size_t(target) >= logits.size())
    fail("token_nll", "a target in [0, " + std::to_string(logits.size()) + ")", std::to_string(target));
  double top = -INFINITY;
  for (float v : logits) top = std::max(top, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - top);
  return top + std::log(sum) - double(logits[size_t(target)]);
}

ServedNll served_nll(Executor& executor, std::shared_ptr<const EngramHasher> hasher, Mode mode, std::span<const int> seq,
                     int64_t prompt) {
  const int64_t L = int64_t(seq.size()) - 1;
  if (prompt < 1 || prompt > L)
    fail("served loss", "a prompt of 1 to " + std::to_string(L) + " tokens (the sequence's inputs)", std::to_string(prompt));
  Session session(executor, std::move(hasher), mode);
  ServedNll out;
  std::vector<float> logits = session.prefill(seq.first(size_t(prompt)));
  out.decoder_prompt_tokens = session.work().decoder_tokens;
  for (int64_t i = prompt;; ++i) {
    out.nll.push_back(token_nll(logits, seq[size_t(i)]));
    if (i == L) break;
    logits = session.decode(seq[size_t(i)]);
  }
  return out;
}

std::vector<double> one_pass_nll(Executor& executor, std::shared_ptr<const EngramHasher> hasher, std::span<const int> seq) {
  const int64_t L = int64_t(seq.size()) - 1;
  if (L < 1) fail("one-pass loss", "a sequence of at least 2 tokens", std::to_string(seq.size()));
  Session session(executor, std::move(hasher), Mode::Exact);
  const std::span<const int> inputs = seq.first(size_t(L));
  session.begin_prompt(inputs, nullptr, std::nullopt, /*prompt_logits=*/true);
  const int64_t V = executor.model().config().vocab_size;
  std::vector<double> nll;
  while (session.prompt_left() > 0) {
    Session* s = &session;
    const std::vector<float> logits = run_batch(std::span(&s, 1), {session.next_chunk(L)}).front();
    session.ran();
    for (size_t r = 0; r * size_t(V) < logits.size(); ++r)
      nll.push_back(token_nll(std::span(logits).subspan(r * size_t(V), size_t(V)), seq[nll.size() + 1]));
  }
  if (int64_t(nll.size()) != L) fail("one-pass loss", std::to_string(L) + " rows of logits", std::to_string(nll.size()));
  return nll;
}

}  // namespace dsv41::eval
