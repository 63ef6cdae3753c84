#pragma once
// The message of a dsv41::Error: what the tests of bad input compare. A header of its own so that
// the core-only test binaries (tests/train) share it without test_util.h's dsv41-command helpers.
#include <string>

#include "base/error.h"

namespace dsv41::test {

// The message of the dsv41::Error that `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dsv41::test
