// The GEMV of cuda::linear over fp8/fp4 weights at one or two activation rows (decode at batch 1):
// y[m, n] = bf16(Σ_b sw[n, b]·sx[m, b]·Σ_{k ∈ b} x_q[m, k]·w_q[n, k]) over the 32-blocks b of K,
// on the tensor cores, the activation quantization folded in; and the same product as cuda::moe's
// expert GEMVs at one token (a job per kind of launch: a weight, the experts' up or down).
//
// The product. A warp multiplies a tile of 16 weight rows by x with mma.sync m16n8k16 (f16
// operands, fp32 accumulation). A, the weights: per k-tile of 128 (four 32-blocks) thread (g, t)
// of the warp loads 32-block t of rows g and g + 8 (32 bytes of e4m3 or 16 of e2m1 a row, in
// 16-byte loads of the weight's bytes in order) and gives from them its A fragments of the k-tile's
// 8 k16 steps: the four values a step takes from a row are four of block t, so each step spans the
// four blocks, one a thread of the quad. e4m3 codes become f16 by the hardware's conversion (the
// value, exactly), e2m1 by moving bits (the value × 2^-14, exactly; dequant.cuh's QFormat). B, x:
// its column n = 4m + b holds x row m's codes of block b (as f16, exact) at the k-columns of the
// threads that hold block b, and zeros elsewhere — a block-diagonal B, which lane g = 4m + t of
// the warp gives and the others give as zeros. So after the k-tile's 8 steps D[i, 4m + b] is
// exactly the sum of block b's products for weight row i and x row m, in the tensor core's order,
// and the promotion adds it times sw·sx (powers of two: exact) to an fp32 accumulator: only the
// order of the fp32 sums differs from the CPU op (backend/cpu/linear.cpp), as in the GEMM
// (gemm.cu). Thread (g, t) accumulates x row t / 2 and blocks 2(t % 2), 2(t % 2) + 1 of rows g and
// g + 8; the two threads of a row's blocks add their sums at the end.
//
// Against the CUDA-core GEMV this replaced (a decode and an FMA per weight value and x row): per
// k-tile a thread issues 4 loads, 32 conversions (e4m3) or ~64 bit moves (e2m1), 8 MMAs, 4 x
// loads and ~10 instructions of scaling — ~1 instruction per weight byte for e4m3, ~4 for e2m1,
// where decoding to fp32 and an FMA per value took ~4 and ~6 (docs/benchmarks.md).
//
// x: each block act-quantizes x into shared memory once (4 threads a 32-block: the CPU's
// power-of-two scale, the hardware's e4m3 rounding), the codes as f16 in the order the B fragments
// take them and the scales as fp32, for as much of K as fits (one slice at the model's shapes);
// the grid is at most what the GPU holds at once, its blocks looping over the tiles.
//
// The grid. A tile's 16 rows are split over KS warps of a block along K (KS = 1..16, the split
// whose busiest block has least work — wq_b's 2,048 tiles KS = 1, wo_b's 320 KS = 16 on 132 SMs,
// wkv's 32 KS = 16); the k-slices' sums meet in shared memory and are added in a fixed order. Each warp's next
// k-tile loads are in flight while it multiplies the current one, and its first go out before the
// block waits for x (and, launched early, for the kernel before it).
//
// Memory traffic: the weight's bytes and scales once, x (M·K·4 bytes) from L2 once per block, y
// M·N·4 bytes. Speed of light: the weight's bytes at the copy bandwidth (wq_b, fp8 32768 × 1280,
// 42 MB: 9.8 µs at the H200's 4.28 TB/s, 13.8 at the H100's 3.05).
#include "backend/cuda/qgemv.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/swiglu.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda::qgemv {

namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;
constexpr int kBlock = 32;                 // the quantization block along K
constexpr int kTileK = 4 * kBlock;         // a k-tile: one block per thread of a quad
constexpr int kSmemBytes = 48 * 1024;      // x's codes and scales, no opt-in needed

// Four e4m3 codes (a word) → two f16 pairs (bytes 0, 1 and 2, 3; the lower byte in the lower half).
__device__ __forceinline__ void e4m3x4_f16(uint32_t word, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
}

// Two floats → the f16 pair of their e4m3 roundings (a in the lower half): exact.
__device__ __forceinline__ uint32_t e4m3_f16x2(float a, float b) {
  const uint16_t codes = e4m3x2_codes(a, b);
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(codes));
  return h;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// D += A·B, m16n8k16, f16 operands, fp32 accumulator.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A format's block of a row as A fragments, and the order of x's codes that matches them. A
// fragment of step s is {row g's pair at k-columns 2t, 2t + 1; row g + 8's; row g's at 2t + 8,
// 2t + 9; row g + 8's}; B's pairs at those k-columns are x's codes `pair(s, 0)` and `pair(s, 1)`.
template <WeightFormat F>
struct Mma;
template <>
struct Mma<WeightFormat::FP8> {
  static constexpr int kChunks = 2;        // 16-byte loads a row and block
  static constexpr float kUnscale = 1.0f;  // the conversion gives the values themselves
  // Step s takes word s of the block: bytes (0, 1) and (2, 3), so x's codes are in their order.
  __device__ static void fragment(const uint4 (&r)[2], const uint4 (&r8)[2], int s, uint32_t (&a)[4]) {
    e4m3x4_f16(word_of(r[s / 4], s % 4), a[0], a[2]);
    e4m3x4_f16(word_of(r8[s / 4], s % 4), a[1], a[3]);
  }
  // A quantizing lane's 8 values (k offsets 8q..8q+7 of a block) as the 4 pairs in B's order.
  __device__ static void order(const float (&v)[8], float inv, uint32_t (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = e4m3_f16x2(v[2 * i] * inv, v[2 * i + 1] * inv);
  }
};
template <>
struct Mma<WeightFormat::FP4> {
  static constexpr int kChunks = 1;
  static constexpr float kUnscale = kE2m1Unscale;  // the bit moves give the values × 2^-14
  // Steps 2j and 2j + 1 take word j of the block (nibbles n0..n7, n0 lowest): (n0, n4), (n1, n5),
  // then (n2, n6), (n3, n7) — each pair one shift apart, 16 bits, as QFormat<FP4> decodes them.
  __device__ static void pairs(uint32_t w, int odd, uint32_t& a, uint32_t& b) {
    if (odd == 0) {
      a = ((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u);
      b = ((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u);
    } else {
      a = ((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u);
      b = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);
    }
  }
  __device__ static void fragment(const uint4 (&r)[1], const uint4 (&r8)[1], int s, uint32_t (&a)[4]) {
    pairs(word_of(r[0], s / 2), s % 2, a[0], a[2]);
    pairs(word_of(r8[0], s / 2), s % 2, a[1], a[3]);
  }
  __device__ static void order(const float (&v)[8], float inv, uint32_t (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = e4m3_f16x2(v[i] * inv, v[i + 4] * inv);
  }
};

// act_quant of rows[m][k0 .. k0 + kn) for m < M into the slice's shared memory (padded with zeros to
// `slice`, a multiple of kTileK): xs [MT][slice] codes as f16 in B's order, sx [MT][slice / 32]
// scales. 4 threads a block, 8 values each; every thread runs the same trip count (the amax
// shuffles stay whole).
template <WeightFormat F, int MT>
__device__ void quantize(const float* const (&rows)[MT], int M, int64_t k0, int kn, int slice, uint4* xs, float* sx) {
  const int per_row = slice / 8, items = MT * per_row;
  for (int base = 0; base < items; base += kThreads) {
    const int i = base + int(threadIdx.x);
    const bool on = i < items;
    const int m = on ? i / per_row : 0, k = on ? i % per_row * 8 : 0;
    const float* row = rows[0];  // rows[m] by selects (an indexed array would go to local memory)
#pragma unroll
    for (int j = 1; j < MT; ++j) row = m == j ? rows[j] : row;
    float v[8];
    const float amax = load8_block_amax(row + k0 + k, on && m < M && k < kn, v);
    if (!on) continue;
    const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
    uint32_t p[4];
    Mma<F>::order(v, inv, p);
    xs[(m * slice + k) / 8] = make_uint4(p[0], p[1], p[2], p[3]);
    if (k % kBlock == 0) sx[(m * slice + k) / kBlock] = m < M && k < kn ? scale : 0.0f;
  }
}

// ---- what a launch multiplies: a weight, or the experts of cuda::moe's one-token tiles ----------
//
// A job names the CTA's x rows (begin), the weight row behind each A row of an output tile (row),
// and where a tile's sums go (store). kOut outputs a 16-row tile: 16, or 8 for the experts' up
// product, whose tile is 8 rows of w1 over 8 rows of w3 for the same 8 outputs (so an output's g
// and u meet in one thread's reduction, and SwiGLU follows at once). kEarly: the rows are known
// before the kernel ahead has finished (a weight's; the experts' come from the route).

struct RowRef {
  const uint8_t* data;   // the row's codes
  const uint8_t* scale;  // its matrix's block scales
  int64_t n;             // the row in its matrix
  bool live;
};

__device__ __forceinline__ int64_t scale_index(WeightFormat f, int64_t n, int64_t b, int64_t blocks) {
  return f == WeightFormat::FP8 ? (n / kBlock) * blocks + b : n * blocks + b;
}

struct DenseJob {
  static constexpr int kOut = 16;
  static constexpr bool kEarly = true;
  const float* x;
  int64_t N, K;
  const uint8_t* w;
  const uint8_t* scale;
  float* y;
  int64_t row_bytes;
  template <int MT>
  __device__ int begin(const float* (&rows)[MT]) const {
#pragma unroll
    for (int m = 0; m < MT; ++m) rows[m] = x + m * K;
    return MT;
  }
  __device__ RowRef row(int64_t tile, int r) const {
    const int64_t n = tile * kOut + r;
    const bool live = n < N;
    return {w + (live ? n : 0) * row_bytes, scale, n, live};
  }
  __device__ void store(int64_t tile, int r, int m, float sum, float) const {
    const int64_t n = tile * kOut + r;
    if (n < N) y[m * N + n] = round_bf16(sum);
  }
};

// The MoE's expert GEMVs at one token (GroupedArgs, qgemv.cuh): the CTA's entry is tile
// blockIdx.y's (routed) or row blockIdx.y (the shared expert, tiles == nullptr).
template <bool kUp>
struct ExpertJob {
  static constexpr int kOut = kUp ? 8 : 16;
  static constexpr bool kEarly = false;
  GroupedArgs a;
  int64_t row_bytes;
  ExpertPointers ep;
  int64_t out_row;  // up: h's row (the entry's list position); down: ye's (the entry)
  float weight;     // up: the entry's routing weight (1 for the shared expert)
  template <int MT>
  __device__ int begin(const float* (&rows)[MT]) {
    int64_t pos;
    int expert = 0;
    if (a.tiles) {
      if (int(blockIdx.y) >= *a.tile_count) return 0;
      const int4 t = a.tiles[blockIdx.y];
      if (t.z < 1) return 0;
      expert = t.x, pos = t.y;
    } else {
      pos = blockIdx.y;
    }
    const int64_t entry = a.tiles ? a.list[pos] : pos;
    ep = a.table ? a.table[expert] : a.fixed;
    if constexpr (kUp) {
      rows[0] = a.x + entry / a.k * a.K;
      weight = a.weights ? a.weights[entry] : 1.0f;
      out_row = pos;
    } else {
      rows[0] = a.x + pos * a.K;
      out_row = entry;
    }
    return 1;
  }
  __device__ RowRef row(int64_t tile, int r) const {
    const bool w3 = kUp && r >= 8;  // up: rows 0..7 of w1, 8..15 of w3; down: w2
    const uint8_t* data = !kUp ? ep.data[1] : w3 ? ep.data[2] : ep.data[0];
    const uint8_t* scale = !kUp ? ep.scale[1] : w3 ? ep.scale[2] : ep.scale[0];
    const int64_t n = tile * kOut + (kUp ? r % 8 : r);
    const bool live = n < a.N;
    return {data + (live ? n : 0) * row_bytes, scale, n, live};
  }
  __device__ void store(int64_t tile, int r, int, float sum, float sum8) const {
    const int64_t n = tile * kOut + r;
    if (n >= a.N) return;
    const float routing = weight;  // a local: the job itself stays in registers
    if constexpr (kUp) a.h[out_row * a.N + n] = swiglu(round_bf16(sum), round_bf16(sum8), a.limit, a.weights ? &routing : nullptr);
    else a.ye[out_row * a.N + n] = bf16_from_float(sum);
  }
};

// The kernel: see the top. Grid (blocks over the output tiles' rounds, the jobs' entries).
template <WeightFormat F, int MT, class Job>
__global__ void __launch_bounds__(kThreads, 1) qgemv_kernel(const Job job_in, int64_t N, int64_t K, int KS, int slice) {
  using Fmt = Mma<F>;
  constexpr int C = Fmt::kChunks;
  constexpr int kOut = Job::kOut;
  extern __shared__ uint4 xs[];  // [MT][slice] f16 codes, then sx [MT][slice / 32]
  float* sx = reinterpret_cast<float*>(xs + MT * slice / 8);
  __shared__ float partial[kWarps][kTileRows * MT];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int per_round = kWarps / KS, kslice = warp % KS;
  const int64_t blocks = K / kBlock, ktiles = (blocks + 3) / 4;
  const int64_t rounds = ((N + kOut - 1) / kOut + per_round - 1) / per_round;
  const bool b_lane = g % 4 == t && g / 4 < MT;    // gives x row g / 4's block t to B
  const int am = t / 2, ab = 2 * (t % 2);          // the accumulators' x row and first block
  const int sx_row = slice / kBlock;
  if constexpr (!Job::kEarly) wait_for_inputs();
  Job job = job_in;
  const float* xrow[MT];
  const int M = job.template begin<MT>(xrow);
  if (M == 0) return;  // block-uniform

  struct Loads {
    uint4 g[C], g8[C];  // block t of rows g and g + 8
    uint8_t s[4];       // the accumulators' blocks' scale codes, rows g (2) and g + 8 (2)
  };
  RowRef rg{}, rg8{};
  // The output tile's k-tile kt (none: zeros where kt ≥ end).
  auto fetch = [&](int64_t kt, int64_t end, Loads& L) {
    const int64_t b = kt * 4 + t, sb = kt * 4 + ab;
    const bool in = kt < end, ok = in && b < blocks;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      L.g[c] = ok && rg.live ? load_stream(reinterpret_cast<const uint4*>(rg.data) + b * C + c) : make_uint4(0, 0, 0, 0);
      L.g8[c] = ok && rg8.live ? load_stream(reinterpret_cast<const uint4*>(rg8.data) + b * C + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool sok = in && sb + i < blocks;
      L.s[i] = sok && rg.live ? rg.scale[scale_index(F, rg.n, sb + i, blocks)] : uint8_t(0);
      L.s[2 + i] = sok && rg8.live ? rg8.scale[scale_index(F, rg8.n, sb + i, blocks)] : uint8_t(0);
    }
  };

  for (int64_t round = blockIdx.x; round < rounds; round += gridDim.x) {
    const bool first = round == int64_t(blockIdx.x);
    const int64_t tile = round * per_round + warp / KS;
    rg = job.row(tile, g), rg8 = job.row(tile, g + 8);
    float acc_g = 0.0f, acc_g8 = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += slice) {
      const int64_t kt0 = k0 / kTileK, end = ktiles < kt0 + slice / kTileK ? ktiles : kt0 + slice / kTileK;
      Loads cur, next;
      fetch(kt0 + kslice, end, cur);
      if (first || slice < K) {  // block-uniform: the barriers are whole
        if (first && k0 == 0) {
          if constexpr (Job::kEarly) wait_for_inputs();
        } else {
          __syncthreads();  // every warp is done with the previous slice's x
        }
        quantize<F, MT>(xrow, M, k0, int(K - k0 < slice ? K - k0 : slice), slice, xs, sx);
        __syncthreads();
      }
      for (int64_t kt = kt0 + kslice; kt < end; kt += KS) {
        fetch(kt + KS, end, next);
        const int lt = int(kt - kt0);  // the k-tile within the slice
        uint32_t bx[16];
        const uint4* xb = xs + ((b_lane ? g / 4 : 0) * slice + (lt * 4 + t) * kBlock) / 8;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 v = b_lane ? xb[q] : make_uint4(0, 0, 0, 0);
          bx[4 * q] = v.x, bx[4 * q + 1] = v.y, bx[4 * q + 2] = v.z, bx[4 * q + 3] = v.w;
        }
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          uint32_t a[4];
          Fmt::fragment(cur.g, cur.g8, s, a);
          mma_f16(d, a, bx[2 * s], bx[2 * s + 1]);
        }
        // Block sums times sw·sx (exact: powers of two), fused into the accumulators.
        const float x0 = am < MT ? sx[am * sx_row + lt * 4 + ab] : 0.0f;
        const float x1 = am < MT ? sx[am * sx_row + lt * 4 + ab + 1] : 0.0f;
        acc_g = fmaf(d[0], e8m0_to_float(cur.s[0]) * Fmt::kUnscale * x0, acc_g);
        acc_g = fmaf(d[1], e8m0_to_float(cur.s[1]) * Fmt::kUnscale * x1, acc_g);
        acc_g8 = fmaf(d[2], e8m0_to_float(cur.s[2]) * Fmt::kUnscale * x0, acc_g8);
        acc_g8 = fmaf(d[3], e8m0_to_float(cur.s[3]) * Fmt::kUnscale * x1, acc_g8);
        cur = next;
      }
    }
    // The two threads of a row's blocks (t, t ^ 1), then the KS warps of the tile in order.
    acc_g += __shfl_xor_sync(0xFFFFFFFFu, acc_g, 1);
    acc_g8 += __shfl_xor_sync(0xFFFFFFFFu, acc_g8, 1);
    if (t % 2 == 0 && am < MT) partial[warp][g * MT + am] = acc_g, partial[warp][(g + 8) * MT + am] = acc_g8;
    __syncthreads();
    for (int i = int(threadIdx.x); i < per_round * kOut * MT; i += kThreads) {
      const int at = i / (kOut * MT), e = i % (kOut * MT), r = e / MT, m = e % MT;
      float sum = 0.0f, sum8 = 0.0f;
      for (int k = 0; k < KS; ++k) sum += partial[at * KS + k][e];
      if (kOut == 8)
        for (int k = 0; k < KS; ++k) sum8 += partial[at * KS + k][e + 8 * MT];
      if (m < M) job.store(round * per_round + at, r, m, sum, sum8);
    }
    __syncthreads();  // the partial sums are read before the next round writes them
  }
}

// The launch of a job over N outputs of K inputs, `entries` grid rows of it (the experts' tiles;
// 1 for a weight).
template <WeightFormat F, int MT, class Job>
void launch(const Job& job, int64_t N, int64_t K, int64_t entries, const char* where, cudaStream_t stream) {
  const int64_t ktiles = (K / kBlock + 3) / 4;
  // The slice: whole k-tiles of MT rows' f16 codes and fp32 block scales within kSmemBytes.
  const int64_t fit = int64_t(kSmemBytes) / (MT * (2 * kTileK + 4 * 4)) * kTileK;
  const int slice = int(std::min(ktiles * kTileK, fit));
  const size_t smem = size_t(MT) * slice * 2 + size_t(MT) * (slice / kBlock) * 4;
  static const int resident = resident_blocks(qgemv_kernel<F, MT, Job>, kThreads, kSmemBytes, where);
  // The blocks each entry gets (the GPU's resident blocks shared out), and KS: the split whose
  // busiest block has the fewest tile-rows of work (its rounds times the tiles of a round), the
  // smaller split on a tie; a k-slice gets at least one k-tile.
  const int64_t per_entry = std::max<int64_t>(1, resident / entries);
  const int64_t tiles = (N + Job::kOut - 1) / Job::kOut;
  auto rounds_of = [&](int ks) { return (tiles + kWarps / ks - 1) / (kWarps / ks); };
  auto cost = [&](int ks) { return (rounds_of(ks) + per_entry - 1) / per_entry * (kWarps / ks); };
  int KS = 1;
  for (int ks = 2; ks <= kWarps && ks <= ktiles; ks *= 2)
    if (cost(ks) < cost(KS)) KS = ks;
  const int64_t rounds = rounds_of(KS);
  if (entries > 65535) fail(where, "a grid within CUDA's limits", std::to_string(entries) + " entries");
  const dim3 grid{unsigned(slice < K ? rounds : std::min<int64_t>(rounds, per_entry)), unsigned(entries)};
  launch_early(where, qgemv_kernel<F, MT, Job>, grid, kThreads, smem, stream, job, N, K, KS, slice);
}

template <WeightFormat F>
void passes(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream) {
  const int64_t N = w.rows, K = w.cols, row_bytes = F == WeightFormat::FP8 ? K : K / 2;
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
    const DenseJob job{x + m0 * K, N, K, w.data, w.scale, y + m0 * N, row_bytes};
    if (M - m0 == 1) launch<F, 1>(job, N, K, 1, "cuda::linear", stream);
    else launch<F, 2>(job, N, K, 1, "cuda::linear", stream);
  }
}

template <bool kUp>
void experts(WeightFormat f, const GroupedArgs& a, int64_t entries, cudaStream_t stream) {
  if (a.K % kBlock != 0) fail("cuda::moe", "expert inputs a multiple of 32", std::to_string(a.K));
  if (entries <= 0 || a.N <= 0) return;
  const int64_t row_bytes = f == WeightFormat::FP8 ? a.K : a.K / 2;
  const ExpertJob<kUp> job{a, row_bytes, {}, 0, 1.0f};
  if (f == WeightFormat::FP8) launch<WeightFormat::FP8, 1>(job, a.N, a.K, entries, "cuda::moe", stream);
  else if (f == WeightFormat::FP4) launch<WeightFormat::FP4, 1>(job, a.N, a.K, entries, "cuda::moe", stream);
  else fail("cuda::moe", "fp8 or fp4 experts for the quantized GEMV", "another format");
}

}  // namespace

void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream) {
  if (w.cols % kBlock != 0)
    fail("cuda::linear", "K a multiple of 32 for a quantized weight", "K = " + std::to_string(w.cols));
  if (M <= 0 || w.rows <= 0) return;
  if (w.format == WeightFormat::FP8) passes<WeightFormat::FP8>(x, M, w, y, stream);
  else if (w.format == WeightFormat::FP4) passes<WeightFormat::FP4>(x, M, w, y, stream);
  else fail("cuda::linear", "an fp8 or fp4 weight for the quantized GEMV", "another format");
}

void experts_up(WeightFormat f, const GroupedArgs& a, int64_t entries, cudaStream_t stream) {
  experts<true>(f, a, entries, stream);
}

void experts_down(WeightFormat f, const GroupedArgs& a, int64_t entries, cudaStream_t stream) {
  experts<false>(f, a, entries, stream);
}

}  // namespace dsv41::cuda::qgemv
