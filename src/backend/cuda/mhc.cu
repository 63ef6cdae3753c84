// mHC kernels.
//
// hc_mixes runs as two kernels. mix_partials: grid (rows, splits), each block takes a slice of a
// token's flattened streams (hc·d = 20480 in V4.1) and accumulates the sum of squares and the
// (2 + hc)·hc = 24 dot products with hc_fn's rows over it; traffic per token: hc·d·4 (X) plus
// 24·hc·d·4 (hc_fn, 2 MB, shared by all tokens through L2). mix_finish: one warp per token adds
// the slices in order, applies the RMS and runs split_sinkhorn's steps (backend/cpu/sinkhorn.h),
// one lane per element of comb (sinkhorn_warp). hc_pre and hc_post take one thread per token and
// column (hc_post's makes the column's hc outputs), with the CPU's operation order and no FMA
// contraction, so they match the CPU bit for bit; traffic (hc + 1)·d·4 read and d·4 written (pre),
// (hc + 1)·d·4 read and hc·d·4 written (post).
//
// mega_mhc fuses hc_post, hc_mixes, hc_pre and rms_norm (see mhc.h): one thread per column k of a
// token, 128 columns a block. A thread reads X[·][k] and f[k], writes Xo[·][k] (hc_post's
// operations), forms h[k] from those Xo values (hc_pre's) and writes it unnormalized, and adds
// Xo[·][k] into the 24 mix dot products, the sum of squares of Xo and that of h. The block's 26
// sums go to a scratch slot; a row's finish adds its slots (a fixed order), normalizes the row's
// 24 mixes, and then runs Sinkhorn on them in one warp (sinkhorn_warp: the next pre, post, comb)
// while the other warps rescale its h in place (2·d·4 bytes that L2 serves). Below 32 rows
// (decode) one launch, grid (d / 128, rows): the row's last block to arrive (an atomic counter per
// row) finishes it. From 32 rows a block takes 4 rows of its columns (16 from 512 rows: prefill)
// with their hc_fn values in registers, and a second launch finishes every row; every form computes
// every sum in the same order, so a row's results do not depend on the rows beside it in the call.
// HBM traffic per token: hc·d·4 read (X) + d·4 read (f) + hc·d·4 written (Xo) + d·4 written (h) =
// (2·hc + 2)·d·4, plus hc_fn (24·hc·d·4 = 1.97 MB in V4.1) once per call, from L2 when several rows
// or a warm cache share it.
#include "backend/cuda/mhc.h"

#include <string>
#include <type_traits>

#include "backend/cpu/sinkhorn.h"
#include "backend/cuda/check.h"
#include "backend/cuda/pdl.cuh"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHc = 4;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;  // 24
constexpr int kSlice = 1024;                    // elements of a token's streams per block
constexpr int kSums = kMaxMix + 1;              // the mixes, then the sum of squares
constexpr int kMixWarps = 2;                    // mix_finish: tokens (warps) per block

// One level of warp_totals: lane pairs (l, l ^ O) each carry 2·O values; each lane keeps the half
// its bit O names (the upper half if set) and adds its partner's partial of it, own + partner.
template <int O>
__device__ __forceinline__ void halve(float (&v)[32], int lane) {
  const bool upper = lane & O;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = upper ? v[i] : v[i + O], keep = upper ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
  }
}

// The warp's totals of each lane's acc[0..N), N ≤ 32: lane i returns total i. Each total is the
// shuffle tree's (xor 16, 8, 4, 2, 1; own + partner at each level) bit for bit, since the same pairs
// are added (a + b == b + a in IEEE arithmetic), but a level halves the values a lane carries:
// 31 shuffles instead of one tree per value (5·N).
template <int N>
__device__ __forceinline__ float warp_totals(const float (&acc)[N]) {
  static_assert(N <= 32, "one total per lane");
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = i < N ? acc[i] : 0.0f;
  const int lane = int(threadIdx.x) % 32;
  halve<16>(v, lane), halve<8>(v, lane), halve<4>(v, lane), halve<2>(v, lane), halve<1>(v, lane);
  return v[0];
}

// The block's totals of each thread's acc[0..N): warp_totals in each warp, then the warps in
// order (a fixed order: the same bits on every run); thread i < N writes total i to out[i]. Every
// thread of the block calls it; it may be called again at once (it ends on a barrier).
template <int N, int Threads>
__device__ void block_sums(const float (&acc)[N], float* out) {
  __shared__ float sums[Threads / 32][N];
  const float total = warp_totals(acc);
  if (int(threadIdx.x) % 32 < N) sums[threadIdx.x / 32][threadIdx.x % 32] = total;
  __syncthreads();
  if (threadIdx.x < N) {
    float s = 0;
    for (int w = 0; w < Threads / 32; ++w) s += sums[w][threadIdx.x];
    out[threadIdx.x] = s;
  }
  __syncthreads();
}

template <int HC>
__global__ void __launch_bounds__(kThreads) mix_partials(const float* X, int64_t n, const float* fn, float* partials) {
  constexpr int n_mix = (2 + HC) * HC;
  const int64_t row = blockIdx.x, slice = blockIdx.y;
  const float* x = X + row * n;
  float acc[kSums];
#pragma unroll
  for (int k = 0; k < kSums; ++k) acc[k] = 0;
  const int64_t end = (slice + 1) * kSlice < n ? (slice + 1) * kSlice : n;
  for (int64_t i = slice * kSlice + threadIdx.x; i < end; i += kThreads) {
    const float v = x[i];
#pragma unroll
    for (int k = 0; k < n_mix; ++k) acc[k] = fmaf(v, fn[k * n + i], acc[k]);
    acc[kMaxMix] = fmaf(v, v, acc[kMaxMix]);
  }
  block_sums<kSums, kThreads>(acc, partials + (row * gridDim.y + slice) * kSums);
}

// split_sinkhorn by one warp, one element of comb a lane: lane l < hc·hc holds comb[l / hc][l % hc]
// in a register and gathers its row (column) by shuffles, then adds it in index order and divides
// as sinkhorn.h's steps do, so the results are theirs bit for bit; lanes j < hc make pre[j] and
// post[j] by sinkhorn::pre_post. A step is a few shuffles, adds and one division on the critical
// path: with one lane per row and column and the matrix in shared memory a call took 17.7 µs in the
// decode step (H100), most of it not hidden beside the next sub-layer. m: the token's normalized mixes
// (global or shared memory). Every lane of the warp calls it.
__device__ void sinkhorn_warp(const float* m, const float* scale, const float* base, int hc, int iters, float hc_eps,
                              float* pre, float* post, float* comb) {
  const int lane = threadIdx.x % 32, i = lane / hc, j = lane % hc;
  const bool mine = lane < hc * hc;
  if (lane < hc) sinkhorn::pre_post(m, scale, base, hc, hc_eps, lane, pre, post);
  // Lanes past hc·hc compute garbage from in-range lanes (their shuffles' sources wrap mod 32).
  auto sum_of = [&](float v, int first, int stride) {
    float sum = 0;
    for (int k = 0; k < hc; ++k) sum += __shfl_sync(0xFFFFFFFFu, v, first + k * stride);
    return sum;
  };
  // softmax_row: the row's max and sum of exponentials, in index order.
  const float z = mine ? m[2 * hc + lane] * scale[2] + base[2 * hc + lane] : 0.0f;
  float mx = -INFINITY;
  for (int k = 0; k < hc; ++k) {
    const float r = __shfl_sync(0xFFFFFFFFu, z, i * hc + k);
    mx = r > mx ? r : mx;
  }
  const float e = expf(z - mx);
  float c = e / sum_of(e, i * hc, 1) + hc_eps;
  c /= sum_of(c, j, hc) + hc_eps;  // normalize_column
  for (int t = 0; t < iters - 1; ++t) {
    c /= sum_of(c, i * hc, 1) + hc_eps;  // normalize_row
    c /= sum_of(c, j, hc) + hc_eps;      // normalize_column
  }
  if (mine) comb[lane] = c;
}

// One warp per token: lane k < n_mix adds mix k over the slices in order, every lane the sum of
// squares (the RMS), then Sinkhorn on the normalized mixes.
__global__ void mix_finish(const float* partials, int64_t rows, int slices, int64_t n, int hc, const float* scale,
                           const float* base, float norm_eps, int iters, float hc_eps, float* pre, float* post,
                           float* comb) {
  __shared__ float ms[kMixWarps][kMaxMix];
  const int64_t row = int64_t(blockIdx.x) * kMixWarps + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave
  const int n_mix = (2 + hc) * hc, lane = int(threadIdx.x) % 32;
  const float* slots = partials + row * slices * kSums;
  float mix = 0, squares = 0;
  for (int s = 0; s < slices; ++s) {
    if (lane < n_mix) mix += slots[s * kSums + lane];
    squares += slots[s * kSums + kMaxMix];
  }
  float* mw = ms[threadIdx.x / 32];
  if (lane < n_mix) mw[lane] = mix * (1.0f / sqrtf(squares / float(n) + norm_eps));  // rms_inverse
  __syncwarp();
  sinkhorn_warp(mw, scale, base, hc, iters, hc_eps, pre + row * hc, post + row * hc, comb + row * hc * hc);
}

// hc_post of one token's column: xo[j] = bf16(post[j]·f + Σ_i comb[i·hc + j]·x[i]), the CPU's
// operations in its order, each product rounded (hc_post_kernel's and Mega-mHC's).
template <int HC>
__device__ __forceinline__ void hc_post_column(const float (&x)[HC], float fk, const float* comb, const float* post,
                                               float (&xo)[HC]) {
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    float mix = 0;
#pragma unroll
    for (int i = 0; i < HC; ++i) mix = __fadd_rn(mix, __fmul_rn(comb[i * HC + j], x[i]));
    xo[j] = round_bf16(__fadd_rn(__fmul_rn(post[j], fk), mix));
  }
}

// One token's column k (one thread) of the streams X [rows, hc, d] and of f [rows, d]: its loads,
// issued together (zeros past d). hc_post_kernel's and Mega-mHC's.
template <int HC>
__device__ __forceinline__ void load_column(const float* X, const float* f, int64_t d, int64_t row, int64_t k,
                                            float (&x)[HC], float& fk) {
#pragma unroll
  for (int i = 0; i < HC; ++i) x[i] = 0.0f;
  fk = 0.0f;
  if (k < d) {
#pragma unroll
    for (int i = 0; i < HC; ++i) x[i] = X[(row * HC + i) * d + k];
    fk = f[row * d + k];
  }
}

// One thread per (token, column), hc a constant: the column's hc loads go out together.
template <int HC>
__global__ void hc_pre_kernel(const float* X, const float* pre, int64_t rows, int64_t d, float* y) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * d) return;
  const int64_t r = id / d, k = id % d;
  const float* x = X + r * HC * d + k;
  float sum = 0;
#pragma unroll
  for (int i = 0; i < HC; ++i) sum = __fadd_rn(sum, __fmul_rn(pre[r * HC + i], x[i * d]));
  y[id] = round_bf16(sum);
}

// One thread per (token, column): its hc stream values read once for all hc outputs (one thread
// per output read each of them hc times, one load at a time: 953 µs a call at 4K rows on an H100,
// ~38% of the copy bandwidth).
template <int HC>
__global__ void hc_post_kernel(const float* f, const float* X, const float* post, const float* comb, int64_t rows,
                               int64_t d, float* out) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * d) return;
  const int64_t r = id / d, k = id % d;
  float x[HC], fk, xo[HC];
  load_column<HC>(X, f, d, r, k, x, fk);
  hc_post_column<HC>(x, fk, comb + r * HC * HC, post + r * HC, xo);
#pragma unroll
  for (int j = 0; j < HC; ++j) out[(r * HC + j) * d + k] = xo[j];
}

constexpr int kMegaThreads = 128;           // columns of a token per block
constexpr int kMegaSums = kMaxMix + 2;        // the mixes, Σ Xo², Σ h²
// Calls of fewer than kMegaMidRows rows run mega_mhc_kernel, more mega_rows_kernel in blocks of
// kMegaMidRowsPerBlock rows, and from kMegaFusedRows on in blocks of kMegaRowsPerBlock, each then
// mega_finish_kernel. Measured on the H200 (docs/benchmarks.md): at 64 rows the one-launch form was
// faster than blocks of 16 rows (44 against 61 µs a call: its grid is 16× larger), at 8,192 rows
// the blocks of 16 (1.8 against 2.4 ms). The one-launch form with 2 or 4 rows a block (the
// group's last block finishing its rows in turn) was slower at 8 and 64 rows (be24a57: 32 and
// 58 µs at 8, 50 and 72 at 64, against 19 and 43): the finishes in turn cost more than hc_fn's
// reads saved. Blocks of 4 rows with the finishes in a second launch, one block a row, take both:
// at 64 rows 640 blocks read hc_fn (48 KB a block from L2) where the one-launch form's 2,560 read
// 123 MB, and every row finishes at once (BM_MegaMhc/64 on an H100: 35.8 → 23.0 µs). The bound of
// 32 rows is not measured yet: between 8 rows (one launch, the finish's latency is the call's) and
// 64 (hc_fn's reads are); BM_MegaMhc/16, /31 and /32 straddle it.
constexpr int64_t kMegaMidRows = 32;
constexpr int64_t kMegaFusedRows = 512;
constexpr int kMegaMidRowsPerBlock = 4;
constexpr int kMegaRowsPerBlock = 16;
__device__ unsigned mega_arrivals[kMegaMidRows];  // zero at load; the last block resets its row's

// Where a Mega-mHC call reads and writes (mhc.h mega_mhc), its rows from 0.
struct MegaArgs {
  const float *f, *X, *post, *comb, *pre_in;
  int64_t d;
  const float* fn;
  const uint8_t* norm;
  WeightFormat norm_format;
  float eps;
  float* partials;  // [rows][slices][kMegaSums]
  float *Xo, *h;
  const float *scale, *base;  // hc_scale, hc_base
  int iters;
  float hc_eps;
  float *pre_out, *post_out, *comb_out;  // the next coefficients
};

// Column k's hc_fn values, fn[t][j] = hc_fn[t, j·d + k]: loaded once per block, for all its rows.
template <int HC>
__device__ void load_fn_column(const float* fn, int64_t d, int64_t k, float (&fnk)[(2 + HC) * HC][HC]) {
#pragma unroll
  for (int t = 0; t < (2 + HC) * HC; ++t)
#pragma unroll
    for (int j = 0; j < HC; ++j) fnk[t][j] = k < d ? fn[t * HC * d + j * d + k] : 0.0f;
}

// Rows first .. first + n − 1's comb, post and pre_in into coef[r] (kCoefficients values a row), by
// the block's threads in one round trip; the caller syncs before reading them.
template <int HC>
constexpr int kCoefficients = HC * HC + 2 * HC;
template <int HC>
__device__ void load_coefficients(const MegaArgs& a, int64_t first, int n, float (*coef)[kCoefficients<HC>]) {
  constexpr int C = kCoefficients<HC>;
  for (int i = int(threadIdx.x); i < n * C; i += int(blockDim.x)) {
    const int r = i / C, t = i % C;
    const int64_t row = first + r;
    coef[r][t] = t < HC * HC        ? a.comb[row * HC * HC + t]
                 : t < HC * HC + HC ? a.post[row * HC + t - HC * HC]
                                    : a.pre_in[row * HC + t - HC * HC - HC];
  }
}

// One token's column k from its loads and its row's coefficients (load_coefficients' row): Xo[·][k]
// (hc_post's operations), h[k] unnormalized (hc_pre's), and this column's part of the row's sums in
// acc: the mixes, Σ Xo², Σ h² (zeros past d).
template <int HC>
__device__ void mega_column(const MegaArgs& a, int64_t row, int64_t k, const float (&x)[HC], float fk,
                            const float (&coef)[kCoefficients<HC>], const float (&fnk)[(2 + HC) * HC][HC],
                            float (&acc)[kMegaSums]) {
  const float *comb = coef, *post = coef + HC * HC, *pre = coef + HC * HC + HC;
  constexpr int hc = HC, n_mix = (2 + HC) * HC;
  const int64_t d = a.d;
#pragma unroll
  for (int t = 0; t < kMegaSums; ++t) acc[t] = 0;
  if (k < d) {
    // hc_post, then hc_pre on its outputs: the CPU's operations in its order, each rounded.
    float xo[HC];
    hc_post_column<HC>(x, fk, comb, post, xo);
    float hk = 0;
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      a.Xo[(row * hc + j) * d + k] = xo[j];
      hk = __fadd_rn(hk, __fmul_rn(pre[j], xo[j]));
      acc[kMaxMix] = fmaf(xo[j], xo[j], acc[kMaxMix]);
    }
    hk = round_bf16(hk);
    a.h[row * d + k] = hk;
    acc[kMaxMix + 1] = hk * hk;
#pragma unroll
    for (int t = 0; t < n_mix; ++t)
#pragma unroll
      for (int j = 0; j < HC; ++j) acc[t] = fmaf(fnk[t][j], xo[j], acc[t]);
  }
}

// rms_norm of a row's h in place, h[i] = round_bf16(g(i) · (h[i] · inv)), by the block's threads
// from `first` on, `stride` of them; g(i) is the norm weight's value i in its format (one instance
// per format, chosen once: with the format tested per element, each load sat behind its branch and
// the loads went out one round trip at a time — from HBM in the decode step, 29 µs a call).
// kBatch loads of each in flight per thread: V4.1's d = 5120 over 96 threads in two round trips.
template <class G>
__device__ void normalize_h(float* hr, int64_t d, float inv, G g, int first, int stride) {
  constexpr int kBatch = 27;
  for (int64_t i0 = first; i0 < d; i0 += int64_t(kBatch) * stride) {
    float v[kBatch], w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + int64_t(j) * stride;
      v[j] = i < d ? __ldcg(hr + i) : 0.0f;
      w[j] = i < d ? g(i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + int64_t(j) * stride;
      if (i < d) hr[i] = round_bf16(__fmul_rn(w[j], __fmul_rn(v[j], inv)));
    }
  }
}

// A row's end, by one block of kMegaThreads once every slot of its partials is written: the
// totals over the slots and the row's normalized mixes, then at once split_sinkhorn of those
// (warp 0: the next coefficients pre, post, comb) and the rms_norm of h (the other warps), so that
// Sinkhorn's ~40 dependent steps overlap h's round trips through L2.
__device__ void mega_finish_row(const MegaArgs& a, int64_t row, int slices, int hc) {
  const int64_t d = a.d, n = hc * d;
  const int n_mix = (2 + hc) * hc;
  __shared__ float totals[kMegaSums], mix[kMaxMix];
  // Warp w adds sums w, w + 4, ... over the slots (lane l: slots l, l + 32, ...; every sum's
  // loads of a pass in flight together), then a fixed shuffle tree: the same bits on every run.
  constexpr int kWarps = kMegaThreads / 32, kPerWarp = (kMegaSums + kWarps - 1) / kWarps;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  float s[kPerWarp];
#pragma unroll
  for (int q = 0; q < kPerWarp; ++q) s[q] = 0;
  for (int b = lane; b < slices; b += 32)
#pragma unroll
    for (int q = 0; q < kPerWarp; ++q)
      if (warp + q * kWarps < kMegaSums) s[q] += __ldcg(a.partials + (row * slices + b) * kMegaSums + warp + q * kWarps);
#pragma unroll
  for (int q = 0; q < kPerWarp; ++q) {
    for (int o = 16; o > 0; o /= 2) s[q] += __shfl_xor_sync(0xFFFFFFFFu, s[q], o);
    if (lane == 0 && warp + q * kWarps < kMegaSums) totals[warp + q * kWarps] = s[q];
  }
  __syncthreads();
  if (warp == 0) {
    if (lane < n_mix) {
      const float inv = 1.0f / sqrtf(totals[kMaxMix] / float(n) + a.eps);  // rms_inverse over hc·d
      mix[lane] = totals[lane] * inv;
    }
    __syncwarp();
    sinkhorn_warp(mix, a.scale, a.base, hc, a.iters, a.hc_eps, a.pre_out + row * hc, a.post_out + row * hc,
                  a.comb_out + row * hc * hc);
    return;
  }
  const float inv_h = 1.0f / sqrtf(totals[kMaxMix + 1] / float(d) + a.eps);  // rms_norm's, as norm.cu
  float* hr = a.h + row * d;
  const int first = int(threadIdx.x) - 32, stride = kMegaThreads - 32;
  if (!a.norm) {
    normalize_h(hr, d, inv_h, [](int64_t) { return 1.0f; }, first, stride);
  } else if (a.norm_format == WeightFormat::BF16) {
    const uint16_t* g = reinterpret_cast<const uint16_t*>(a.norm);
    normalize_h(hr, d, inv_h, [g](int64_t i) { return bf16_to_float(__ldg(g + i)); }, first, stride);
  } else {
    const float* g = reinterpret_cast<const float*>(a.norm);
    normalize_h(hr, d, inv_h, [g](int64_t i) { return __ldg(g + i); }, first, stride);
  }
}

// Fewer than kMegaMidRows rows (decode): grid (slices, rows), one launch. Each block publishes its
// sums and counts itself in at the row's arrival counter; the row's last block finishes it.
template <int HC>
__global__ void __launch_bounds__(kMegaThreads) mega_mhc_kernel(const MegaArgs a) {
  const int64_t row = blockIdx.y, k = int64_t(blockIdx.x) * kMegaThreads + threadIdx.x;
  float fnk[(2 + HC) * HC][HC];
  load_fn_column<HC>(a.fn, a.d, k, fnk);  // a weight: read while the kernel before this one ends
  wait_for_inputs();
  float x[HC], fk, acc[kMegaSums];
  load_column<HC>(a.X, a.f, a.d, row, k, x, fk);
  __shared__ float coef[1][kCoefficients<HC>];  // the row's comb, post, pre_in
  load_coefficients<HC>(a, row, 1, coef);
  __syncthreads();
  mega_column<HC>(a, row, k, x, fk, coef[0], fnk, acc);
  block_sums<kMegaSums, kMegaThreads>(acc, a.partials + (row * gridDim.x + blockIdx.x) * kMegaSums);
  // Publish this block's sums, Xo and h, then count it in; the last block of the row goes on.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&mega_arrivals[row], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) mega_arrivals[row] = 0;
  mega_finish_row(a, row, int(gridDim.x), HC);
}

// kMegaMidRows rows or more: grid (slices, row groups of Rows). A block keeps its column's hc_fn
// values in registers for all its rows, so hc_fn comes from L2 once per group instead of once per
// row (2 MB a row in V4.1: at 8K rows, 16 GB of L2 reads). Its rows' coefficients go to shared
// memory in one round trip, and their columns' loads go out kRowBatch rows at a time (a row at a
// time, each row's loads waited for the row before: 583 µs a call at 4K rows on an H100, ~47% of
// the copy bandwidth, at 3 blocks an SM). Every row's sums are those of mega_mhc_kernel, bit for
// bit; mega_finish_kernel ends the rows.
template <int HC, int Rows>
__global__ void __launch_bounds__(kMegaThreads) mega_rows_kernel(const MegaArgs a, int64_t rows) {
  constexpr int kRowBatch = 4;
  const int64_t k = int64_t(blockIdx.x) * kMegaThreads + threadIdx.x;
  float fnk[(2 + HC) * HC][HC];
  load_fn_column<HC>(a.fn, a.d, k, fnk);
  wait_for_inputs();
  const int64_t first = int64_t(blockIdx.y) * Rows;
  const int n = int(rows - first < Rows ? rows - first : Rows);
  __shared__ float coef[Rows][kCoefficients<HC>];  // comb, post, pre_in of each row
  load_coefficients<HC>(a, first, n, coef);
  __syncthreads();
  // Each row's warp totals wait here, and the warps' sums (block_sums' order) are taken once for all
  // rows after one barrier, instead of two barriers a row.
  __shared__ float part[Rows][kMegaThreads / 32][kMegaSums];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int r0 = 0; r0 < n; r0 += kRowBatch) {
    float x[kRowBatch][HC], fk[kRowBatch];
#pragma unroll
    for (int b = 0; b < kRowBatch; ++b)
      load_column<HC>(a.X, a.f, a.d, first + (r0 + b < n ? r0 + b : r0), k, x[b], fk[b]);
#pragma unroll
    for (int b = 0; b < kRowBatch; ++b) {
      const int r = r0 + b;
      if (r >= n) break;  // block-uniform: the shuffles stay whole
      float acc[kMegaSums];
      mega_column<HC>(a, first + r, k, x[b], fk[b], coef[r], fnk, acc);
      const float total = warp_totals(acc);
      if (lane < kMegaSums) part[r][warp][lane] = total;
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < n * kMegaSums; i += kMegaThreads) {
    const int r = i / kMegaSums, t = i % kMegaSums;
    float s = 0;
    for (int w = 0; w < kMegaThreads / 32; ++w) s += part[r][w][t];
    a.partials[((first + r) * gridDim.x + blockIdx.x) * kMegaSums + t] = s;
  }
}

template <int HC>
__global__ void __launch_bounds__(kMegaThreads) mega_finish_kernel(const MegaArgs a, int slices) {
  wait_for_inputs();
  mega_finish_row(a, blockIdx.x, slices, HC);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// The entry points' check of hc before for_hc.
void check_hc(const char* where, int hc) {
  if (hc < 1 || hc > kMaxHc) fail(where, "hc_mult from 1 to 4", std::to_string(hc));
}

// make(std::integral_constant<int, hc>) for hc from 1 to kMaxHc (callers check_hc first): the
// kernels take hc as a constant, so that their loops over the streams and the 24 mixes unroll
// with no guards and every hc_fn load is issued ahead of its use. With hc at run time each load
// sat behind its guard and waited for the one before (Mega-mHC: 68 µs at one row, Nsight Compute
// on the H200, 72% of it stalled on those loads).
template <class Make>
auto for_hc(int hc, Make make) {
  switch (hc) {
    case 1: return make(std::integral_constant<int, 1>{});
    case 2: return make(std::integral_constant<int, 2>{});
    case 3: return make(std::integral_constant<int, 3>{});
    default: return make(std::integral_constant<int, 4>{});
  }
}

}  // namespace

void mega_mhc(const float* f, const float* X, const float* post, const float* comb, const float* pre_in, int64_t rows,
              int hc, int64_t d, const HcWeights& w, const Weight* norm, float eps, int sinkhorn_iters, float hc_eps,
              float* Xo, float* h, float* pre_out, float* post_out, float* comb_out, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  check_hc("cuda::mega_mhc", hc);
  if (w.fn.format != WeightFormat::F32 || w.base.format != WeightFormat::F32 || w.scale.format != WeightFormat::F32)
    fail("cuda::mega_mhc", "F32 hc_fn, hc_base and hc_scale", "another format");
  if (norm && norm->format != WeightFormat::F32 && norm->format != WeightFormat::BF16)
    fail("cuda::mega_mhc", "an F32 or BF16 norm weight", "a quantized one");
  const int slices = int((d + kMegaThreads - 1) / kMegaThreads);
  MegaArgs a{f, X, post, comb, pre_in, d, reinterpret_cast<const float*>(w.fn.data), norm ? norm->data : nullptr,
             norm ? norm->format : WeightFormat::F32, eps, nullptr, Xo, h,
             reinterpret_cast<const float*>(w.scale.data), reinterpret_cast<const float*>(w.base.data),
             sinkhorn_iters, hc_eps, pre_out, post_out, comb_out};
  keep_scratch_pool();
  check(cudaMallocAsync(reinterpret_cast<void**>(&a.partials), size_t(rows * slices * kMegaSums) * sizeof(float),
                        stream),
        "cuda::mega_mhc");
  if (rows < kMegaMidRows) {
    launch_early("cuda::mega_mhc", for_hc(hc, [](auto HC) { return &mega_mhc_kernel<decltype(HC)::value>; }),
                 dim3(unsigned(slices), unsigned(rows)), kMegaThreads, 0, stream, a);
  } else {
    const bool mid = rows < kMegaFusedRows;
    const int per_block = mid ? kMegaMidRowsPerBlock : kMegaRowsPerBlock;
    const dim3 grid(unsigned(slices), unsigned((rows + per_block - 1) / per_block));
    const auto kernel = for_hc(hc, [mid](auto HC) {
      constexpr int H = decltype(HC)::value;
      return mid ? &mega_rows_kernel<H, kMegaMidRowsPerBlock> : &mega_rows_kernel<H, kMegaRowsPerBlock>;
    });
    launch_early("cuda::mega_mhc rows", kernel, grid, kMegaThreads, 0, stream, a, rows);
    launch_early("cuda::mega_mhc finish", for_hc(hc, [](auto HC) { return &mega_finish_kernel<decltype(HC)::value>; }),
                 unsigned(rows), kMegaThreads, 0, stream, a, slices);
  }
  check(cudaFreeAsync(a.partials, stream), "cuda::mega_mhc");
}

void hc_mixes(const float* X, int64_t rows, int hc, int64_t d, const HcWeights& w, float norm_eps, int sinkhorn_iters,
              float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream) {
  if (rows <= 0) return;
  check_hc("cuda::hc_mixes", hc);
  if (w.fn.format != WeightFormat::F32 || w.base.format != WeightFormat::F32 || w.scale.format != WeightFormat::F32)
    fail("cuda::hc_mixes", "F32 hc_fn, hc_base and hc_scale", "another format");
  const int64_t n = hc * d;
  const int slices = int((n + kSlice - 1) / kSlice);
  float* partials = nullptr;
  keep_scratch_pool();
  check(cudaMallocAsync(reinterpret_cast<void**>(&partials), size_t(rows * slices * kSums) * sizeof(float), stream),
        "cuda::hc_mixes");
  const auto partials_kernel = for_hc(hc, [](auto HC) { return &mix_partials<decltype(HC)::value>; });
  partials_kernel<<<dim3(unsigned(rows), unsigned(slices)), kThreads, 0, stream>>>(
      X, n, reinterpret_cast<const float*>(w.fn.data), partials);
  check_launch("cuda::hc_mixes partials");
  mix_finish<<<unsigned((rows + kMixWarps - 1) / kMixWarps), 32 * kMixWarps, 0, stream>>>(
      partials, rows, slices, n, hc, reinterpret_cast<const float*>(w.scale.data),
      reinterpret_cast<const float*>(w.base.data), norm_eps, sinkhorn_iters, hc_eps, pre, post, comb);
  check_launch("cuda::hc_mixes finish");
  check(cudaFreeAsync(partials, stream), "cuda::hc_mixes");
}

void hc_pre(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y, cudaStream_t stream) {
  if (rows * d <= 0) return;
  check_hc("cuda::hc_pre", hc);
  for_hc(hc, [&](auto HC) {
    hc_pre_kernel<decltype(HC)::value><<<blocks_for(rows * d), kThreads, 0, stream>>>(X, pre, rows, d, y);
    return 0;
  });
  check_launch("cuda::hc_pre");
}

void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
             float* out, cudaStream_t stream) {
  if (rows * d <= 0) return;
  check_hc("cuda::hc_post", hc);
  for_hc(hc, [&](auto HC) {
    hc_post_kernel<decltype(HC)::value><<<blocks_for(rows * d), kThreads, 0, stream>>>(f, X, post, comb, rows, d, out);
    return 0;
  });
  check_launch("cuda::hc_post");
}

}  // namespace dsv41::cuda
