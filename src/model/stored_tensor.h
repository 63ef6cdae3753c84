#pragma once
// A weight's stored bytes from its values, in the format the weights map gives it (F32, BF16,
// F8_E4M3 with 32×32 ue8m0 block scales or, for the Engram table, SWA-FP8's per-row scales, I8 as
// fp4 pairs with ue8m0 scales per 32): the one encoder of the checkpoints this project writes (the
// random ones, random_weights.h, and the trainer's release, train/trainer/release_checkpoint.h).
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace dsv41 {

// A weight being encoded: its stored bytes and its scale tensor's (empty for F32 and BF16), sized
// for the whole tensor; its logical [rows, width] (an fp4 byte holds two values of a row; a
// vector is one row).
struct StoredTensor {
  explicit StoredTensor(const TensorSpec& t);
  // Encodes rows [r0, r0 + n) from their values (n · width floats). r0 a multiple of 32: the fp8
  // block scales cover 32 rows.
  void encode_rows(const float* values, int64_t r0, int64_t n);

  const TensorSpec& spec;
  int64_t rows = 1, width = 1;
  std::vector<uint8_t> bytes, scales;
};

}  // namespace dsv41
