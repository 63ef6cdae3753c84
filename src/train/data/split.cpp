#include "train/data/split.h"

#include <xxhash.h>

#include <string>

namespace dsv41::train {

uint64_t document_hash(std::string_view source, std::string_view key) {
  std::string id;
  id.reserve(source.size() + 1 + key.size());
  id.append(source);
  id.push_back('\0');
  id.append(key);
  return XXH3_64bits(id.data(), id.size());
}

Split split_of(std::string_view source, std::string_view key, double validation_fraction) {
  const double u = double(document_hash(source, key) >> 11) * 0x1p-53;
  return u < validation_fraction ? Split::validation : Split::train;
}

}  // namespace dsv41::train
