#pragma once
// The CPU's fp32 matrix product, in one summation order that depends on K alone: the same bits on
// every x86-64 CPU, whatever its vector width, for any M, N, tiling or thread count
// (docs/forward.md, "Summation order"). The reference leaves its GEMMs' order unspecified; we fix
// ours so that a result, and every test of it, is a property of the code and not of the machine.
#include <cstdint>

namespace dsv41 {

// y[m·ldy + n] = Σ_k x[m·K + k] · w[n·K + k] for m < M, n < N. Every sum runs in 16 lanes: lane
// l starts at +0 and accumulates, by fused multiply-add, the products k = l, l + 16, l + 32, … in
// increasing k (K padded with zeros to a multiple of 16); then the lanes are added pairwise, lane
// l + 8 into lane l, then l + 4, l + 2 and l + 1. Parallel over the outputs, never over K.
void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y, int64_t ldy);

// The code paths of gemm_f32; each computes the order above exactly, so all give the same bits.
enum class GemmIsa { Scalar, Avx2, Avx512 };

const char* isa_name(GemmIsa isa);
bool cpu_has(GemmIsa isa);
// The path in use: the widest the CPU has, or the one named by DSV41_CPU_ISA (scalar, avx2,
// avx512) when it is set — a machine-independence check, never a speed setting.
GemmIsa gemm_isa();
// Uses `isa` from now on (tests run every path against the others); fails if the CPU lacks it.
void set_gemm_isa(GemmIsa isa);

}  // namespace dsv41
