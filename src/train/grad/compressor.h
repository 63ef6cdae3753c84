#pragma once
// CSA2's compressor pooling at ratio m > 1 (model.py Compressor, backend/cpu/compressor.h
// pool_group): the rows' KV projections are pooled m at a time into one latent, channel by
// channel, weighted by a softmax over the group of the gate projections' scores:
//
//   out_c = Σ_t p_tc kv_tc,  p_tc = exp(score_tc) / Σ_t' exp(score_t'c)
//   dkv_tc += p_tc dout_c,  dscore_tc += p_tc dout_c (kv_tc − out_c)
//
// The projections before it (wkv, wgate: fp32 linears) and the RMSNorm after it are linear.h's and
// rms_norm.h's; at ratio 1 the compressor is only those.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dsv41::grad {

// kv, score [rows, d]; out [rows / ratio, d], one latent per complete group (the rows of an open
// group at the end wait for the rest of it, as in the forward: they give no latent).
template <class T>
void compressor_pool_forward(const T* kv, const T* score, int64_t rows, int64_t d, int ratio, T* out) {
  for (int64_t g = 0; g < rows / ratio; ++g)
    for (int64_t c = 0; c < d; ++c) {
      const int64_t first = g * ratio * d + c;
      T mx = -INFINITY;
      for (int t = 0; t < ratio; ++t) mx = std::max(mx, score[first + t * d]);
      T sum = 0, acc = 0;
      for (int t = 0; t < ratio; ++t) {
        const T e = std::exp(score[first + t * d] - mx);
        sum += e;
        acc += e * kv[first + t * d];
      }
      out[g * d + c] = acc / sum;
    }
}

// out: the forward's output. Adds into dkv and dscore [rows, d].
template <class T>
void compressor_pool_backward(const T* kv, const T* score, int64_t rows, int64_t d, int ratio, const T* out, const T* dout,
                              T* dkv, T* dscore) {
  for (int64_t g = 0; g < rows / ratio; ++g)
    for (int64_t c = 0; c < d; ++c) {
      const int64_t first = g * ratio * d + c;
      T mx = -INFINITY;
      for (int t = 0; t < ratio; ++t) mx = std::max(mx, score[first + t * d]);
      T sum = 0;
      for (int t = 0; t < ratio; ++t) sum += std::exp(score[first + t * d] - mx);
      const T go = dout[g * d + c];
      for (int t = 0; t < ratio; ++t) {
        const int64_t i = first + t * d;
        const T p = std::exp(score[i] - mx) / sum;
        dkv[i] += p * go;
        dscore[i] += p * go * (kv[i] - out[g * d + c]);
      }
    }
}

}  // namespace dsv41::grad
