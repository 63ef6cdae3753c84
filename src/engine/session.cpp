#include "engine/session.h"

#include "base/error.h"
#include "model/engram_compress.h"

namespace dsv41 {

Session::Session(const Model& model, const Tokenizer* tokenizer) : model_(model), state_(model.config()) {
  const Config& c = model.config();
  if (!c.has_engram()) return;
  if (!tokenizer)
    fail(c.source, "a tokenizer.json beside a model with Engram (it defines the hashed vocabulary)", "none");
  EngramVocabulary vocab = engram_compress_vocabulary(*tokenizer);
  hasher_.emplace(c, std::move(vocab.token_map));
}

std::vector<float> Session::run(std::span<const int> tokens) {
  std::vector<int64_t> ids;
  if (hasher_) {
    ids.resize(tokens.size() * size_t(hasher_->n_layers() * hasher_->columns()));
    hasher_->hash(tokens, {}, history_, ids.data());
  }
  return forward(model_, state_, tokens, hasher_ ? ids.data() : nullptr);
}

}  // namespace dsv41
