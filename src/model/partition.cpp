#include "model/partition.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"

namespace dsv41 {

int64_t Partition::count(int64_t n, Shard shard) const {
  const int64_t p = part(n, shard), begin = rank * p;
  return std::clamp<int64_t>(n - begin, 0, p);
}

void check_partition(const Config& c, const Partition& p) {
  const std::string where = "a partition over " + std::to_string(p.world) + " ranks";
  if (p.world < 1 || p.rank < 0 || p.rank >= p.world)
    fail(where, "a rank in [0, world) and world >= 1", "rank " + std::to_string(p.rank));
  auto divides = [&](int64_t n, const std::string& what) {
    if (n % p.world != 0) fail(where, what + " divisible by the world size", std::to_string(n));
  };
  divides(c.n_heads, "n_heads");
  divides(c.o_groups, "o_groups");
  divides(c.vocab_size, "vocab_size");
  if (!c.index_source_layers.empty()) divides(c.index_n_heads, "index_n_heads");
  for (int l = 0; l < c.n_total_layers(); ++l) divides(c.routed_experts(l), "layer " + std::to_string(l) + "'s routed experts");
}

namespace {

int64_t element_bytes(WeightFormat f) { return f == WeightFormat::F32 ? 4 : f == WeightFormat::BF16 ? 2 : 1; }

void check_cut(const char* what, int64_t first, int64_t count, int64_t block) {
  if (first % block != 0 || count % block != 0)
    fail(std::string("a weight's ") + what + " [" + std::to_string(first) + ", " + std::to_string(first + count) + ")",
         "cuts at its " + std::to_string(block) + "-wide scale blocks", "a cut inside one");
}

}  // namespace

int64_t cut_rows(const Weight& w) { return w.rows == 1 && !w.quantized() ? w.cols : w.rows; }

Weight slice_rows(const Weight& w, int64_t first, int64_t count) {
  const int64_t n = cut_rows(w);
  if (first < 0 || count < 0 || first + count > n)
    fail("a weight's rows", "a slice inside its " + std::to_string(n) + " rows", "[" + std::to_string(first) + ", +" + std::to_string(count) + ")");
  Weight s = w;
  if (n != w.rows) {  // a 1-D tensor: its elements
    s.cols = count;
    s.data = w.data + first * element_bytes(w.format);
    return s;
  }
  s.rows = count;
  switch (w.format) {
    case WeightFormat::F32:
    case WeightFormat::BF16: s.data = w.data + first * w.cols * element_bytes(w.format); break;
    case WeightFormat::FP8:
      check_cut("rows", first, count, 32);
      s.data = w.data + first * w.cols;
      s.scale = w.scale + (first / 32) * ((w.cols + 31) / 32);
      break;
    case WeightFormat::FP4:
      s.data = w.data + first * w.cols / 2;
      s.scale = w.scale + first * (w.cols / 32);
      break;
  }
  return s;
}

Weight slice_cols(const Weight& w, int64_t first, int64_t count, std::vector<uint8_t>& owned) {
  if (first < 0 || count < 0 || first + count > w.cols)
    fail("a weight's columns", "a slice inside its " + std::to_string(w.cols) + " columns", "[" + std::to_string(first) + ", +" + std::to_string(count) + ")");
  if (w.quantized()) check_cut("columns", first, count, 32);
  Weight s = w;
  s.cols = count;
  // Each row's bytes [first, first + count) in the stored units, then the scales' columns alike.
  auto copy = [](const uint8_t* from, int64_t rows, int64_t row_bytes, int64_t begin, int64_t bytes, uint8_t* to) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(to + r * bytes, from + r * row_bytes + begin, size_t(bytes));
  };
  const int64_t num = w.format == WeightFormat::FP4 ? 1 : element_bytes(w.format), den = w.format == WeightFormat::FP4 ? 2 : 1;
  const int64_t data_bytes = w.rows * count * num / den;
  int64_t scale_rows = 0, scale_cols = 0;
  if (w.format == WeightFormat::FP8) scale_rows = (w.rows + 31) / 32, scale_cols = (w.cols + 31) / 32;
  if (w.format == WeightFormat::FP4) scale_rows = w.rows, scale_cols = w.cols / 32;
  owned.resize(size_t(data_bytes + scale_rows * (count / 32)));
  copy(w.data, w.rows, w.cols * num / den, first * num / den, count * num / den, owned.data());
  s.data = owned.data();
  if (w.quantized()) {
    copy(w.scale, scale_rows, scale_cols, first / 32, count / 32, owned.data() + data_bytes);
    s.scale = owned.data() + data_bytes;
  }
  return s;
}

}  // namespace dsv41
