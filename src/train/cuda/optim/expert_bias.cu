// The expert loads and the bias update on the device (expert_bias.h). The loads by integer atomics
// (exact, so the same counts in any order); the update by one block: the total in int64, then each
// expert's sign(Σ c − n cᵢ) as the CPU's.
#include "train/cuda/optim/expert_bias.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"

namespace dsv41::train_cuda::optim {

namespace {

__global__ void count_kernel(const int32_t* experts, int64_t n, int64_t n_experts, unsigned long long* loads) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const int32_t e = experts[k];
  atomicAdd(&loads[e >= 0 && e < n_experts ? e : n_experts], 1ull);
}

constexpr int kBiasThreads = 1024;
__global__ void bias_kernel(float* bias, const int64_t* loads, int64_t n_experts, float rate) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  unsigned long long part = 0;
  for (int64_t e = threadIdx.x; e < n_experts; e += kBiasThreads) part += (unsigned long long)loads[e];
  atomicAdd(&total, part);
  __syncthreads();
  for (int64_t e = threadIdx.x; e < n_experts; e += kBiasThreads) {
    const int64_t diff = int64_t(total) - n_experts * loads[e];
    bias[e] += diff > 0 ? rate : diff < 0 ? -rate : 0.0f;
  }
}

}  // namespace

void expert_loads(const int32_t* experts, int64_t rows, int topk, int64_t n_experts, int64_t* loads, cudaStream_t stream) {
  const char* where = "train_cuda::optim::expert_loads";
  if (n_experts < 1 || rows < 0 || topk < 1)
    fail(where, "at least one expert, rows ≥ 0, topk ≥ 1",
         std::to_string(n_experts) + " experts, " + std::to_string(rows) + " rows, topk " + std::to_string(topk));
  static_assert(sizeof(int64_t) == sizeof(unsigned long long));
  cuda::check(cudaMemsetAsync(loads, 0, size_t(n_experts + 1) * sizeof(int64_t), stream), where);
  const int64_t n = rows * topk;
  if (n == 0) return;
  count_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(experts, n, n_experts, reinterpret_cast<unsigned long long*>(loads));
  cuda::check_launch(where);
}

void update_expert_bias(float* bias, const int64_t* loads, int64_t n_experts, float rate, cudaStream_t stream) {
  if (n_experts <= 0) return;
  bias_kernel<<<1, kBiasThreads, 0, stream>>>(bias, loads, n_experts, rate);
  cuda::check_launch("train_cuda::optim::update_expert_bias");
}

void update_expert_bias_by_host_loads(float* bias, std::span<const int64_t> loads, float rate, PinnedUploads& uploads) {
  if (loads.empty()) return;
  const cuda::DeviceBuffer<int64_t> device = cuda::scratch<int64_t>(int64_t(loads.size()), uploads.stream());
  uploads.copy(device.get(), loads.data(), loads.size_bytes());
  update_expert_bias(bias, device.get(), int64_t(loads.size()), rate, uploads.stream());
}

}  // namespace dsv41::train_cuda::optim
