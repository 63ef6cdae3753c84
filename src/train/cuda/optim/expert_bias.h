#pragma once
// Auxiliary-loss-free load balancing on the device: src/train/optim/expert_bias.h's loads and bias
// update, on the gate's choices where the gate ran (train_cuda's gate_forward), without a trip to
// the host. Integers throughout but for the bias's fp32 add, so the CPU's bits.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "train/cuda/pinned_uploads.h"

namespace dsv41::train_cuda::optim {

// loads [n_experts + 1] (device) ← the count of each expert among experts [rows · topk] (device);
// loads[n_experts] counts the ids outside [0, n_experts), which the CPU refuses: the caller reads it
// with the loads (it is 0 for the gate's own choices) and refuses a step where it is not.
void expert_loads(const int32_t* experts, int64_t rows, int topk, int64_t n_experts, int64_t* loads,
                  cudaStream_t stream = nullptr);

// bias [n_experts] ← bias + rate · sign(mean(loads) − loads), loads [n_experts] (device arrays).
void update_expert_bias(float* bias, const int64_t* loads, int64_t n_experts, float rate, cudaStream_t stream = nullptr);

// The same update from loads counted on the host (loads [n_experts]: the CUDA trainer's forward
// counts them where it groups the rows by expert): the loads copied to the device through
// `uploads`, which returns at once, then the update, both on the uploads' stream.
void update_expert_bias_by_host_loads(float* bias, std::span<const int64_t> loads, float rate, PinnedUploads& uploads);

}  // namespace dsv41::train_cuda::optim
