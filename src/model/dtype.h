#pragma once
// The element types a checkpoint tensor can hold, spelled as the safetensors format spells them.
#include <cstddef>
#include <optional>
#include <string_view>

namespace dsv41 {

enum class DType { F32, F16, BF16, F8_E4M3, F8_E8M0, I8, U8, I32, I64 };

// Bytes per element.
size_t dtype_size(DType dtype);

// The safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I32", "I64".
const char* dtype_name(DType dtype);

// The inverse of dtype_name; nullopt for a name we do not know.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace dsv41
