#include "model/dtype.h"

#include <iterator>

namespace dsv41 {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};

// One row per DType, in enum order, so that a DType indexes its own row.
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},           {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
};

constexpr bool rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(rows_in_enum_order());

const DTypeInfo& info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }

const char* dtype_name(DType dtype) { return info(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& row : kDTypes)
    if (name == row.name) return row.dtype;
  return std::nullopt;
}

}  // namespace dsv41
