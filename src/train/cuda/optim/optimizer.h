#pragma once
// The optimizer on the device: src/train/optim/optimizer.h's, over parameters whose values and
// gradients are device arrays. The same parameter table and checks (plan_parameters), the same
// schedule and per-group rate, multiplier and decay, the same state file (state_file.h: the buffers
// are copied to the host and written by the CPU's code, read back the same way), so a run moves
// between the CPU and the GPU through its checkpoint and this file.
//
// Device state: per parameter, in the table's order, one fp32 device array per buffer of its update
// (Muon and Sinkhorn: the momentum; AdamW: m, v), each of the parameter's elements, zero at the
// start: the layout of the state file's buffers. The gate's bias is not a parameter here either:
// expert_bias.h moves it by its loads.
//
// Muon's Newton–Schulz runs once per batch of same-shape blocks, not once per matrix: the Muon
// slots are grouped by their blocks' shape (a head-wise matrix is row_blocks blocks), each group's
// Ĝ written side by side into one scratch array and orthogonalized as one strided batch. The
// iteration is the same map block by block; the launches a step fall from ~35 per matrix to ~35
// per shape (the experts of every layer share a handful of shapes).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "model/config.h"
#include "train/cuda/linear.h"
#include "train/cuda/optim/newton_schulz.h"
#include "train/optim/optimizer.h"

namespace dsv41::train_cuda::optim {

class Optimizer {
 public:
  // params: value and grad are device pointers. Throws as dsv41::optim::plan_parameters does.
  // Muon's Newton–Schulz runs at ns_precision (fp32: the CPU's arithmetic; docs/training.md says
  // when bf16). Every step runs on `stream`.
  Optimizer(const Config& config, std::vector<dsv41::optim::Parameter> params, dsv41::optim::OptimizerOptions options,
            NsPrecision ns_precision = NsPrecision::Fp32, cudaStream_t stream = nullptr);

  // Updates every parameter from its gradient (enqueued on the stream, no host synchronization):
  // step `steps()` of the schedule, then steps() + 1.
  void step();
  int64_t steps() const { return int64_t(steps_); }

  // Waits for the stream, copies the state to the host and writes the CPU's state file.
  void save(const std::string& path) const;
  // Reads a state file (the CPU's or this class's), checks it against these parameters
  // (dsv41::optim::check_state_matches) and copies it to the device.
  void load(const std::string& path);

 private:
  // Muon slots whose blocks are [block_rows, cols], in the table's order; blocks: their sum.
  struct MuonBatch {
    int64_t block_rows, cols, blocks = 0;
    std::vector<size_t> slots;
  };

  std::vector<dsv41::optim::ParamSlot> slots_;
  std::vector<MuonBatch> muon_batches_;
  dsv41::optim::OptimizerOptions options_;
  cudaStream_t stream_;
  std::vector<std::vector<cuda::DeviceBuffer<float>>> state_;  // state_[i]: slots_[i]'s buffers
  uint64_t steps_ = 0;
  NsPrecision ns_precision_;
  Blas blas_;
};

}  // namespace dsv41::train_cuda::optim
