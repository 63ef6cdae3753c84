#pragma once
// What every fuzz target shares: the input as text, and the rule that a dsv41::Error (bad input,
// refused with a message) is a correct outcome; anything else — a crash, a sanitizer report, an
// exception of another type escaping — is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"

namespace dsv41::fuzz {

inline std::string_view text(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

template <class F>
void refused_or_ok(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace dsv41::fuzz
