#include "model/sampling.h"

#include <string>

#include "base/error.h"

namespace dsv41 {

void check_edits(std::span<const LogitEdit> edits, int64_t vocab) {
  for (size_t i = 0; i < edits.size(); ++i)
    if (edits[i].token < 0 || edits[i].token >= vocab || (i > 0 && edits[i].token <= edits[i - 1].token))
      fail("sampling", "logit edits of tokens in [0, " + std::to_string(vocab) + "), ascending",
           "token " + std::to_string(edits[i].token) + " at edit " + std::to_string(i));
}

void check_mask(const TokenMask& mask, int64_t vocab) {
  if (int64_t(mask.size()) * 32 < vocab)
    fail("sampling", "a token mask of " + std::to_string((vocab + 31) / 32) + " words (" + std::to_string(vocab) + " tokens)",
         std::to_string(mask.size()) + " words");
  for (int64_t w = 0; w < vocab / 32; ++w)
    if (mask[size_t(w)] != 0) return;
  for (int64_t t = vocab / 32 * 32; t < vocab; ++t)
    if (allows(mask, int(t))) return;
  fail("sampling", "a token mask that allows at least one token", "none allowed");
}

}  // namespace dsv41
