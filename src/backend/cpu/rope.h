#pragma once
// Rotary position embedding on interleaved pairs, with YaRN as model.py's precompute_freqs_cis
// enables it: on the layers that attend to compressed KV, when original_seq_len > 0.
#include <cstdint>
#include <vector>

namespace dsv41 {

class RopeTable {
 public:
  // `dim` rotated channels (pairs (2i, 2i+1) turn by frequency i).
  RopeTable(int dim, double base, int64_t original_seq_len, double factor, int beta_fast, int beta_slow);

  int dim() const { return dim_; }
  const std::vector<float>& frequencies() const { return freqs_; }

  // Rotates the `dim` channels at x by position `pos` (inverse: by -pos), rounding to bf16 as the
  // reference's in-place copy into a bf16 tensor does.
  void apply(float* x, int64_t pos, bool inverse = false) const;

 private:
  int dim_;
  std::vector<float> freqs_;  // fp32, as torch computes them
};

}  // namespace dsv41
