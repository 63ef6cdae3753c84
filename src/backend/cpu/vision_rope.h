#pragma once
// The ViT's 2D rotary embedding (vision.py get_vision_cos_sin and apply_rotary; docs/vision.md §5).
// A head of head_dim channels is split in halves, channel j turning with channel j + head_dim/2
// ("rotate half", not the text layers' interleaved pairs). The angles of the patch at grid row y,
// column x are [y·f_0 .. y·f_{n-1}, x·f_0 .. x·f_{n-1}] with n = head_dim/4 and
// f_i = 1 / theta^(2i / (head_dim/2)): the first half of the channel pairs encodes the row, the
// second the column. Positions are the patch's place in its own image's grid.
#include <vector>

namespace dsv41 {

class VisionRope {
 public:
  // head_dim must be a positive multiple of 4 (two axes, each with whole pairs).
  VisionRope(int head_dim, double theta);

  int head_dim() const { return head_dim_; }
  const std::vector<float>& frequencies() const { return freqs_; }  // f_0 .. f_{head_dim/4 - 1}, fp32

  // Rotates `heads` consecutive heads of head_dim channels at x, for the patch at (row, col): fp32
  // arithmetic on the bf16 inputs, results rounded to bf16 as the reference's cast back does.
  void apply(float* x, int heads, int row, int col) const;

 private:
  int head_dim_;
  std::vector<float> freqs_;
};

}  // namespace dsv41
