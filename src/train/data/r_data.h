#pragma once
// The data sets of an installed R package, read without R: a lazy-load database (data/Rdata.rdx,
// the index, and data/Rdata.rdb, the objects) holds each object as a zlib block of R's
// serialization format (XDR, versions 2 and 3). Only what package data sets of text need is
// read: character, integer, logical and double vectors, lists, pairlists, symbols and references,
// with their attributes; any other type is refused by name. The format is R's own documentation
// ("R Internals", §1.8 "Serialization Formats") and src/main/serialize.c of R.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv41::train {

struct RObject {
  enum class Type { null, symbol, pairlist, character, logical, integer, real, list };
  Type type = Type::null;
  std::vector<std::string> strings;  // character vector (NA as ""), or a symbol's name
  std::vector<int32_t> ints;         // integer or logical vector
  std::vector<double> reals;
  std::vector<RObject> items;        // list or pairlist elements
  std::vector<std::string> tags;     // a pairlist's tags ("" where none)
  std::shared_ptr<RObject> attributes;  // a pairlist, or null

  // The attribute `name` (e.g. "names"), or null.
  const RObject* attribute(std::string_view name) const;
};

// One serialized object ("X\n" and the XDR stream), as R's unserialize() reads it.
RObject unserialize(std::string_view data, const std::string& where);

// The objects of a lazy-load database: (name, object) in the index's order. `rdx` and `rdb` are
// the two files' contents; `where` names the database in errors.
std::vector<std::pair<std::string, RObject>> read_lazy_load_db(std::string_view rdx, std::string_view rdb, const std::string& where);

}  // namespace dsv41::train
