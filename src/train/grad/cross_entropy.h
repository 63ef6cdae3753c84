#pragma once
// The language-model loss over the head (model.py ParallelHead: logits = W h in fp32, h the final
// norm's output): the mean over the counted rows of the cross-entropy of the next token,
//
//   L = (1/n) Σ_r (logsumexp(z_r) − z_r[target_r]),  z_r = W h_r
//   dz_r = dL/n · (softmax(z_r) − onehot(target_r)),  dh += dz W,  dW += dzᵀ h
//
// A row with target −1 (padding, or a position whose next token is not in the batch) is not
// counted and passes no gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/grad/linear.h"

namespace dsv41::grad {

template <class T>
struct CrossEntropySaved {
  std::vector<T> probs;  // [rows, vocab] softmax of the logits
  int64_t counted = 0;   // rows with a target
};

// h [rows, d]; W [vocab, d]; targets [rows] in [0, vocab) or −1. Returns L (0 when no row counts).
template <class T>
T head_cross_entropy_forward(const T* h, int64_t rows, int64_t d, const T* W, int64_t vocab, const int64_t* targets,
                             CrossEntropySaved<T>& saved) {
  saved.probs.resize(size_t(rows * vocab));
  linear_forward(h, rows, d, W, vocab, saved.probs.data());
  saved.counted = 0;
  T total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < -1 || targets[r] >= vocab)
      fail("head_cross_entropy", "targets in [0, " + std::to_string(vocab) + ") or -1", std::to_string(targets[r]));
    T* z = saved.probs.data() + r * vocab;
    const T mx = *std::max_element(z, z + vocab);
    T sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] - mx);
    if (targets[r] >= 0) {
      total += mx + std::log(sum) - z[targets[r]];
      ++saved.counted;
    }
    for (int64_t v = 0; v < vocab; ++v) z[v] = std::exp(z[v] - mx) / sum;
  }
  return saved.counted ? total / T(saved.counted) : T(0);
}

// dloss: the loss's own gradient (1 when L is the objective). Adds into dh [rows, d], dW [vocab, d].
template <class T>
void head_cross_entropy_backward(const T* h, int64_t rows, int64_t d, const T* W, int64_t vocab, const int64_t* targets,
                                 const CrossEntropySaved<T>& saved, T dloss, T* dh, T* dW) {
  if (saved.counted == 0) return;
  const T share = dloss / T(saved.counted);
  std::vector<T> dz(size_t(rows * vocab), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    for (int64_t v = 0; v < vocab; ++v) dz[size_t(r * vocab + v)] = share * saved.probs[size_t(r * vocab + v)];
    dz[size_t(r * vocab + targets[r])] -= share;
  }
  linear_backward(h, rows, d, W, vocab, dz.data(), dh, dW);
}

}  // namespace dsv41::grad
