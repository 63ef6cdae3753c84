#pragma once
// The train/validation split, by document (docs/training-data.md, "Split"). A document's split
// follows from its identity alone — XXH3-64 (seed 0) of its source name, a zero byte and its key
// — so adding a source, or changing the cleaning, moves no document of another source from one
// split to the other.
#include <cstdint>
#include <string_view>

namespace dsv41::train {

enum class Split { train, validation };

uint64_t document_hash(std::string_view source, std::string_view key);

// Validation when the hash's top 53 bits, read as a fraction of 2^53, are below
// `validation_fraction` (in [0, 1]); train otherwise.
Split split_of(std::string_view source, std::string_view key, double validation_fraction);

}  // namespace dsv41::train
