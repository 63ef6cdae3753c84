#include "base/error.h"

namespace dsv41 {

void fail(const std::string& where, const std::string& expected, const std::string& found) {
  throw Error(where + ": expected " + expected + ", found " + found);
}

}  // namespace dsv41
