#include "eval/passkey.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "base/counter_random.h"
#include "base/error.h"

namespace dsv41::eval {

std::string passkey_needle(const std::string& key) { return " The pass key is " + key + ". Remember it. " + key + " is the pass key."; }

PasskeyTrial passkey_trial(uint64_t seed, int64_t length, int trial) {
  const uint64_t base = splitmix64(splitmix64(seed) ^ splitmix64(uint64_t(length) * 0x9E3779B97F4A7C15ull + uint64_t(trial)));
  const uint64_t a = splitmix64(base), b = splitmix64(base + 1);
  return {std::to_string(10000 + a % 90000), double(b >> 11) * 0x1p-53};
}

namespace {

struct Parts {
  std::vector<int> head, needle, question;
  int64_t fixed() const { return int64_t(head.size() + needle.size() + question.size()); }
};

Parts parts(const Tokenizer& tokenizer, const std::string& key) {
  return {tokenizer.encode(kPasskeyHead, /*add_special_tokens=*/true), tokenizer.encode(passkey_needle(key), false),
          tokenizer.encode(kPasskeyQuestion, false)};
}

bool ends_sentence(const Tokenizer& tokenizer, int id) {
  const std::string text = tokenizer.decode(std::span(&id, 1));
  return !text.empty() && (text.back() == '.' || text.back() == '!' || text.back() == '?' || text.back() == '\n');
}

}  // namespace

int64_t passkey_min_length(const Tokenizer& tokenizer, const std::string& key) { return parts(tokenizer, key).fixed() + 1; }

PasskeyPrompt passkey_prompt(const Tokenizer& tokenizer, std::span<const int> filler, int64_t length, const std::string& key,
                             double depth) {
  if (filler.empty()) fail("passkey filler", "at least one token of filler text", "none");
  if (!(depth >= 0 && depth <= 1)) fail("passkey depth", "a depth in [0, 1]", std::to_string(depth));
  const Parts p = parts(tokenizer, key);
  const int64_t F = length - p.fixed();
  if (F < 1)
    fail("passkey length", "at least " + std::to_string(p.fixed() + 1) + " tokens (the template and one filler token)",
         std::to_string(length));
  auto fill = [&](int64_t i) { return filler[size_t(i) % filler.size()]; };
  int64_t k = std::llround(depth * double(F));
  for (int64_t j = k; j <= std::min(F, k + 64); ++j)
    if (j == 0 || j == F || ends_sentence(tokenizer, fill(j - 1))) {
      k = j;
      break;
    }
  PasskeyPrompt out;
  out.ids = p.head;
  for (int64_t i = 0; i < k; ++i) out.ids.push_back(fill(i));
  out.needle_begin = int64_t(out.ids.size());
  out.ids.insert(out.ids.end(), p.needle.begin(), p.needle.end());
  out.needle_end = int64_t(out.ids.size());
  for (int64_t i = k; i < F; ++i) out.ids.push_back(fill(i));
  out.ids.insert(out.ids.end(), p.question.begin(), p.question.end());
  out.filler_tokens = F;
  out.filler_before = k;
  return out;
}

bool passkey_correct(std::string_view reply, std::string_view key) {
  size_t i = 0;
  while (i < reply.size() && !std::isdigit(static_cast<unsigned char>(reply[i]))) ++i;
  size_t j = i;
  while (j < reply.size() && std::isdigit(static_cast<unsigned char>(reply[j]))) ++j;
  return j > i && reply.substr(i, j - i) == key;
}

PasskeyReply passkey_reply(Executor& executor, std::shared_ptr<const EngramHasher> hasher, const Tokenizer& tokenizer, Mode mode,
                           std::span<const int> prompt, int max_tokens, std::span<const int> stop) {
  const int64_t vocab = sampling_vocab(executor.model().config(), &tokenizer);
  Session session(executor, std::move(hasher), mode);
  std::vector<float> logits = session.prefill(prompt);
  PasskeyReply reply;
  while (true) {
    const int next = int(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
    reply.ids.push_back(next);
    if (int(reply.ids.size()) == max_tokens) break;
    logits = session.decode(next);
  }
  reply.text = tokenizer.decode(reply.ids, /*skip_special_tokens=*/true);
  return reply;
}

}  // namespace dsv41::eval
