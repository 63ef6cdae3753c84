#include "train/data/r_data.h"

#include <bit>
#include <cstring>

#include "base/error.h"
#include "train/data/inflate.h"

namespace dsv41::train {

namespace {

// SEXP type codes and the pseudo-types of the stream (R's Rinternals.h and serialize.c).
enum : int {
  kSymSxp = 1, kListSxp = 2, kCharSxp = 9, kLglSxp = 10, kIntSxp = 13, kRealSxp = 14, kStrSxp = 16, kVecSxp = 19,
  kRefSxp = 255, kNilValueSxp = 254,
};
constexpr int kHasAttr = 1 << 9, kHasTag = 1 << 10;

class Reader {
 public:
  Reader(std::string_view data, const std::string& where) : data_(data), where_(where) {}

  RObject read_document() {
    if (data_.substr(0, 2) != "X\n") fail(where_, "R's XDR serialization (\"X\\n\")", "other data");
    pos_ = 2;
    const int version = read_int();
    if (version != 2 && version != 3) fail(where_, "serialization version 2 or 3", std::to_string(version));
    read_int();  // the writer's R version
    read_int();  // the oldest R that reads it
    if (version == 3) take(size_t(read_length()));  // the native encoding's name
    return read_item();
  }

 private:
  std::string_view take(size_t n) {
    if (data_.size() - pos_ < n) fail(where_, "more serialized data", "the end of the object");
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  int32_t read_int() {
    uint32_t v;
    std::memcpy(&v, take(4).data(), 4);
    return int32_t(__builtin_bswap32(v));  // XDR is big-endian
  }
  double read_real() {
    uint64_t v;
    std::memcpy(&v, take(8).data(), 8);
    return std::bit_cast<double>(__builtin_bswap64(v));
  }
  // A vector length: -1 announces a long length as two ints (upper, lower).
  int64_t read_length() {
    const int32_t n = read_int();
    if (n >= 0) return n;
    if (n != -1) fail(where_, "a length", std::to_string(n));
    const int64_t hi = read_int(), lo = uint32_t(read_int());
    return (hi << 32) | lo;
  }
  // A CHARSXP's bytes (NA, length -1, as the empty string).
  std::string read_charsxp() {
    const int flags = read_int();
    if ((flags & 0xFF) != kCharSxp) fail(where_, "a string (CHARSXP)", "type " + std::to_string(flags & 0xFF));
    const int32_t n = read_int();
    return n < 0 ? std::string() : std::string(take(size_t(n)));
  }

  RObject read_item() {
    const int flags = read_int();
    const int type = flags & 0xFF;
    RObject o;
    switch (type) {
      case kNilValueSxp:
        return o;
      case kRefSxp: {
        int index = flags >> 8;
        if (index == 0) index = read_int();
        if (index < 1 || size_t(index) > refs_.size())
          fail(where_, "a reference to one of the " + std::to_string(refs_.size()) + " symbols read", std::to_string(index));
        return refs_[size_t(index) - 1];
      }
      case kSymSxp:
        o.type = RObject::Type::symbol;
        o.strings.push_back(read_charsxp());
        refs_.push_back(o);
        return o;
      case kListSxp: {
        o.type = RObject::Type::pairlist;
        // A pairlist is a chain of cells; read iteratively, the CDR being the next cell.
        int cell = flags;
        while (true) {
          if (cell & kHasAttr) read_item();  // a cell's own attributes: not kept
          o.tags.push_back((cell & kHasTag) ? read_item().strings.at(0) : std::string());
          o.items.push_back(read_item());
          cell = read_int();
          if ((cell & 0xFF) == kNilValueSxp) return o;
          if ((cell & 0xFF) != kListSxp) fail(where_, "a pairlist cell or its end", "type " + std::to_string(cell & 0xFF));
        }
      }
      case kStrSxp: {
        o.type = RObject::Type::character;
        const int64_t n = read_length();
        o.strings.reserve(size_t(n));
        for (int64_t i = 0; i < n; ++i) o.strings.push_back(read_charsxp());
        break;
      }
      case kLglSxp:
      case kIntSxp: {
        o.type = type == kLglSxp ? RObject::Type::logical : RObject::Type::integer;
        const int64_t n = read_length();
        for (int64_t i = 0; i < n; ++i) o.ints.push_back(read_int());
        break;
      }
      case kRealSxp: {
        o.type = RObject::Type::real;
        const int64_t n = read_length();
        for (int64_t i = 0; i < n; ++i) o.reals.push_back(read_real());
        break;
      }
      case kVecSxp: {
        o.type = RObject::Type::list;
        const int64_t n = read_length();
        for (int64_t i = 0; i < n; ++i) o.items.push_back(read_item());
        break;
      }
      default:
        fail(where_, "an R object of type character, integer, logical, double, list, pairlist or symbol",
             "SEXP type " + std::to_string(type));
    }
    if (flags & kHasAttr) o.attributes = std::make_shared<RObject>(read_item());
    return o;
  }

  std::string_view data_;
  const std::string& where_;
  size_t pos_ = 0;
  std::vector<RObject> refs_;  // symbols in the order read: REFSXP n names the n-th
};

// A list's element names (its "names" attribute), checked to match its length.
std::vector<std::string> names_of(const RObject& list, const std::string& where) {
  const RObject* names = list.attribute("names");
  if (!names || names->type != RObject::Type::character || names->strings.size() != list.items.size())
    fail(where, "a list with a name for each element", "a list without them");
  return names->strings;
}

}  // namespace

const RObject* RObject::attribute(std::string_view name) const {
  if (!attributes) return nullptr;
  for (size_t i = 0; i < attributes->tags.size(); ++i)
    if (attributes->tags[i] == name) return &attributes->items[i];
  return nullptr;
}

RObject unserialize(std::string_view data, const std::string& where) { return Reader(data, where).read_document(); }

std::vector<std::pair<std::string, RObject>> read_lazy_load_db(std::string_view rdx, std::string_view rdb, const std::string& where) {
  // The index: list(variables = list(name = c(offset, length), ...), references, compressed).
  const RObject index = unserialize(inflate(rdx, where + " (index)"), where + " (index)");
  const std::vector<std::string> parts = names_of(index, where + " (index)");
  const RObject* variables = nullptr;
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i] == "variables") variables = &index.items[i];
  if (!variables || variables->type != RObject::Type::list) fail(where + " (index)", "a list `variables`", "none");
  const std::vector<std::string> names = names_of(*variables, where + " (index)");

  std::vector<std::pair<std::string, RObject>> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string what = where + ": " + names[i];
    const RObject& at = variables->items[i];
    if (at.type != RObject::Type::integer || at.ints.size() != 2) fail(what, "an (offset, length) pair", "something else");
    const size_t offset = size_t(uint32_t(at.ints[0])), length = size_t(uint32_t(at.ints[1]));
    if (offset + length > rdb.size() || length < 5)
      fail(what, "a block inside the " + std::to_string(rdb.size()) + "-byte database", "bytes " + std::to_string(offset) + "+" + std::to_string(length));
    // A block is the uncompressed length (4 bytes, big-endian) and a zlib stream.
    const std::string data = inflate(rdb.substr(offset + 4, length - 4), what);
    out.emplace_back(names[i], unserialize(data, what));
  }
  return out;
}

}  // namespace dsv41::train
