#include "engine/session.h"

#include <algorithm>

#include "base/error.h"
#include "model/engram_compress.h"

namespace dsv41 {

Session::Session(const Model& model, const Tokenizer* tokenizer, Mode mode)
    : model_(model), mode_(mode), state_(model.config()) {
  const Config& c = model.config();
  if (!c.has_engram()) return;
  if (!tokenizer)
    fail(c.source, "a tokenizer.json beside a model with Engram (it defines the hashed vocabulary)", "none");
  EngramVocabulary vocab = engram_compress_vocabulary(*tokenizer);
  hasher_.emplace(c, std::move(vocab.token_map));
}

std::vector<float> Session::prefill(std::span<const int> tokens) {
  const int64_t end = state_.length + int64_t(tokens.size());
  const int64_t replayed = std::min<int64_t>(model_.config().window_size, int64_t(tokens.size()));
  return run(tokens, mode_ == Mode::Default ? end - replayed : 0);
}

std::vector<float> Session::decode(int token) { return run(std::span<const int>(&token, 1), 0); }

void Session::resume(std::span<const int> tokens, SequenceState state) {
  if (state.length != int64_t(tokens.size()))
    fail("resume", "the tokens of the restored state (" + std::to_string(state.length) + ")",
         std::to_string(tokens.size()) + " tokens");
  state_ = std::move(state);
  if (hasher_) history_ = hasher_->history_after(tokens, {});
}

std::vector<float> Session::run(std::span<const int> tokens, int64_t decoder_from) {
  std::vector<int64_t> ids;
  if (hasher_) {
    ids.resize(tokens.size() * size_t(hasher_->n_layers() * hasher_->columns()));
    hasher_->hash(tokens, {}, history_, ids.data());
  }
  const int64_t start = state_.length, n = int64_t(tokens.size());
  ForwardOptions options;
  options.decoder_from = decoder_from;
  std::vector<float> logits = forward(model_, state_, tokens, hasher_ ? ids.data() : nullptr, options);
  work_.encoder_tokens += n;
  work_.decoder_tokens += start + n - std::max(start, decoder_from);
  return logits;
}

}  // namespace dsv41
