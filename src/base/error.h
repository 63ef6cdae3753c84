#pragma once
// The one exception type of dsv41. Every message names what was expected and what was found,
// and where (file, key, tensor), so that a user can fix the input without reading the code.
#include <stdexcept>
#include <string>

namespace dsv41 {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "where: expected E, found F"
[[noreturn]] void fail(const std::string& where, const std::string& expected, const std::string& found);

}  // namespace dsv41
