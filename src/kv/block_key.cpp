#include "kv/block_key.h"

#include <cstdio>

namespace dsv41 {

std::string to_hex(const BlockKey& key) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(key.hi),
                static_cast<unsigned long long>(key.lo));
  return std::string(text, 32);
}

}  // namespace dsv41
