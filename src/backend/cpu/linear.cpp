#include "backend/cpu/linear.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/gemm.h"
#include "base/error.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {

namespace {

constexpr int kBlock = 32;
// Below this many multiply-adds a product runs on one thread: waking the other core costs more.
constexpr int64_t kParallelWork = int64_t(1) << 20;

// The 32-term dot product of one K block, in fp32. Eight lanes, summed pairwise: a fixed order
// the compiler can vectorize (the reference's order inside a block is its GEMM's, unspecified).
inline float dot32(const float* a, const float* b) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < kBlock; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

struct Tables {
  float e4m3[256];
  float e2m1[16];
  Tables() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_float(uint8_t(i));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// set_summation_variant: 0, or the variant whose permutation of K the products run in.
int variant = 0;

// Rotates each of the `n / span` spans of v left by `by` elements: a permutation of K that leaves
// every product's value unchanged and changes the order its terms are summed in.
void rotate_spans(float* v, int64_t n, int64_t span, int64_t by) {
  for (int64_t s = 0; s < n; s += span) std::rotate(v + s, v + s + by % span, v + s + span);
}

// Row n of a quantized weight as unscaled element values, and its per-block scales.
void quantized_row(const Weight& w, int64_t n, float* values, float* scales) {
  const Tables& t = tables();
  const int64_t K = w.cols, blocks = K / kBlock;
  if (w.format == WeightFormat::FP8) {
    const uint8_t* q = w.data + n * K;
    for (int64_t k = 0; k < K; ++k) values[k] = t.e4m3[q[k]];
    const uint8_t* s = w.scale + (n / kBlock) * ((K + kBlock - 1) / kBlock);
    for (int64_t b = 0; b < blocks; ++b) scales[b] = e8m0_to_float(s[b]);
  } else {
    const uint8_t* q = w.data + n * K / 2;
    for (int64_t k = 0; k < K / 2; ++k) {
      values[2 * k] = t.e2m1[q[k] & 0x0F];
      values[2 * k + 1] = t.e2m1[q[k] >> 4];
    }
    const uint8_t* s = w.scale + n * blocks;
    for (int64_t b = 0; b < blocks; ++b) scales[b] = e8m0_to_float(s[b]);
  }
}

void quantized_linear(const float* x, int64_t M, const Weight& w, float* y, bool round) {
  const int64_t N = w.rows, K = w.cols, blocks = K / kBlock;
  if (K % kBlock != 0) fail("linear", "K a multiple of 32 for a quantized weight", std::to_string(K));
  // act_quant: e4m3 values times their power-of-two block scale. Keeping the product (exact) lets
  // the block partial carry the activation scale, as `partial * a_s` does in the reference.
  std::vector<float> xq(x, x + M * K);
  for (int64_t m = 0; m < M; ++m) act_quant_fp8(xq.data() + m * K, int(K), kBlock);
  if (variant) rotate_spans(xq.data(), M * K, kBlock, 9 * variant);

#pragma omp parallel if (M * N * K >= kParallelWork)
  {
    std::vector<float> values(K), scales(blocks);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      quantized_row(w, n, values.data(), scales.data());
      if (variant) rotate_spans(values.data(), K, kBlock, 9 * variant);
      for (int64_t m = 0; m < M; ++m) {
        const float* a = xq.data() + m * K;
        float acc = 0;
        for (int64_t b = 0; b < blocks; ++b) acc += dot32(a + b * kBlock, values.data() + b * kBlock) * scales[b];
        y[m * N + n] = round ? round_bf16(acc) : acc;
      }
    }
  }
}

// The fp32 product (gemm.h: one summation order on every CPU), dequantizing the weight to fp32 a
// slab of rows at a time so that a large matrix (the LM head) never exists in fp32 all at once. A
// slab of 1 MB stays in cache and costs no page faults; a 64 MB one made a 129K-row head's decode
// step 30x slower than its GEMV.
void float_linear(const float* x, int64_t M, const Weight& w, float* y) {
  const int64_t N = w.rows, K = w.cols;
  const int64_t slab = std::max<int64_t>(1, std::min<int64_t>(N, (int64_t(1) << 18) / std::max<int64_t>(K, 1)));
  std::vector<float> wf(size_t(slab * K)), xr;
  if (variant) {
    xr.assign(x, x + M * K);
    for (int64_t m = 0; m < M; ++m) rotate_spans(xr.data() + m * K, K, K, 17 * variant);
    x = xr.data();
  }
  for (int64_t n0 = 0; n0 < N; n0 += slab) {
    const int64_t rows = std::min(slab, N - n0);
#pragma omp parallel for schedule(static) if (rows * K >= kParallelWork)
    for (int64_t r = 0; r < rows; ++r) {
      w.row(n0 + r, wf.data() + r * K);
      if (variant) rotate_spans(wf.data() + r * K, K, K, 17 * variant);
    }
    gemm_f32(x, M, wf.data(), rows, K, y + n0, N);
  }
}

}  // namespace

void linear(const float* x, int64_t M, const Weight& w, float* y) {
  if (w.quantized()) return quantized_linear(x, M, w, y, true);
  float_linear(x, M, w, y);
  for (int64_t i = 0; i < M * w.rows; ++i) y[i] = round_bf16(y[i]);
}

void linear_unrounded(const float* x, int64_t M, const Weight& w, float* y) {
  if (w.quantized()) return quantized_linear(x, M, w, y, false);
  float_linear(x, M, w, y);
}

void linear_f32(const float* x, int64_t M, const Weight& w, float* y) { float_linear(x, M, w, y); }

void set_summation_variant(int v) {
  if (v < 0) fail("set_summation_variant", "a variant >= 0", std::to_string(v));
  variant = v;
}

}  // namespace dsv41
