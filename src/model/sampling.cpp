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

}  // namespace dsv41
