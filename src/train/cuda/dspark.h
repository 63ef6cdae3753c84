#pragma once
// DSpark's heads and training loss on the CUDA trainer, the mirror of src/train/grad/dspark.h
// (fp32; the Markov head's product W2 e is linear.h's, its gather W1[prev] embedding.h's):
//
//   Markov head:      z_i = u_i + W2 e_i                       (elementwise.h's add_into: z += u; du += dz)
//   confidence head:  c_i = w · [x_i ; e_i]
//   loss, p_i = softmax(z_i), q_i the target's probabilities (a constant):
//     L = α_ce Σ ρ_i (−log p_i[next_i]) + α_tv Σ ρ_i ‖p_i − q_i‖₁ + α_conf Σ κ BCE(σ(c_i), c*_i),
//     c*_i = 1 − ½ ‖p_i − q_i‖₁, a label; the L1 norm's backward takes the held signs of p − q.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/cuda/elementwise.h"

namespace dsv41::train_cuda {

// c [rows] = w · [x_i ; e_i]: x [rows, d], e [rows, rank], w [d + rank]. Each row's sum in the
// CPU's order (one thread per row).
void confidence_forward(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* w, float* c,
                        cudaStream_t stream = nullptr);

// Adds into dx, de, dw (any may be nullptr); dw's sum over the rows in row order (one thread per
// column).
void confidence_backward(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* w, const float* dc,
                         float* dx, float* de, float* dw, cudaStream_t stream = nullptr);

// The labels the backward holds: the signs of p − q [rows, vocab] and c* [rows]. Written by the
// forward unless `held` (then read).
struct DSparkLabels {
  int8_t* signs;
  float* target;
  bool held;
};

// The loss of a batch of sequences: z, q [rows, vocab]; next [rows] (int64, in [0, vocab)); c, rho
// and κ [rows] (each row its sequence's κ); sequence s holds the rows begin[s] .. begin[s + 1] − 1
// (begin [sequences + 1], device, ascending from 0 to rows). Writes p [rows, vocab] (softmax(z))
// and parts [4 · sequences]: sequence s's Σ ρ·ce, Σ ρ·tv, Σ κ·BCE, Σ κ·c* at 4s .. 4s + 3, each
// summed over its rows in row order in double, as grad::DSparkLossParts.
void dspark_loss_forward(const float* z, const float* q, int64_t rows, int64_t vocab, const int64_t* next, const float* c,
                         const float* rho, const float* kappa, const int64_t* begin, int64_t sequences,
                         const DSparkLabels& labels, float* p, double* parts, cudaStream_t stream = nullptr);

// dz [rows, vocab] += ∂L/∂z, dc [rows] += ∂L/∂c, L = dloss · (α_ce ce + α_tv tv + α_conf conf)
// summed over the sequences (each row's terms are its own: no sequence's sum enters).
void dspark_loss_backward(const float* c, int64_t rows, int64_t vocab, const int64_t* next, const float* rho, const float* kappa,
                          const DSparkLabels& labels, const float* p, float alpha_ce, float alpha_tv, float alpha_conf,
                          float dloss, float* dz, float* dc, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
