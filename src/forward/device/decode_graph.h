#pragma once
// Decode under a CUDA graph: a batch of sequences' decode step, captured once and replayed at every
// later step while their contexts grow. What changes from step to step (tokens, positions, window
// slots, where new cache entries go, entry counts) lives in the step's plan (decode_plan.h); the
// graph's first node copies it from pinned host memory, every kernel reads it on the device, and
// the launches themselves (grids sized for each cache's capacity) never change. A step costs one
// plan build on the host, one graph launch and the logits' copy back.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "forward/device/decode_plan.h"
#include "forward/device/device_forward.h"

namespace dsv41::cuda {

class DecodeGraph {
 public:
  // The step of `sequences` (each already prefilled, at most kDecodeGraphRows). They must outlive
  // the graph (their caches' places are in it); other calls on them between steps are fine, since
  // each step's plan is made from their state at that step. With `features`, a step also records
  // every row's DSpark context features (ForwardOptions::dspark_hidden) at features().
  DecodeGraph(const DeviceModel& model, std::vector<DeviceSequence*> sequences, bool features = false);
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;

  // Appends tokens[b] to sequence b (with its Engram ids, host [engram layers, hash columns], for a
  // model with Engram; under its decoder_from, at most its length, if given): launches the step on
  // stream() and advances the sequences. Its logits [B, V] are at logits() on the device until the
  // next launch.
  void launch(std::span<const int32_t> tokens, std::span<const int64_t* const> engram_ids = {},
              std::span<const int64_t> decoder_from = {});
  float* logits() const { return logits_.get(); }
  // [B, targets, dim] on the device until the next launch (a graph made with `features`), else null.
  float* features() const { return features_.get(); }
  cudaStream_t stream() const { return stream_; }
  // launch, then each sequence's logits to the host, as forward_batch returns them.
  std::vector<std::vector<float>> step(std::span<const int32_t> tokens, std::span<const int64_t* const> engram_ids = {});

  // Graph nodes (kernels, copies, allocations) of one step; 0 before the first.
  size_t nodes() const { return nodes_; }

 private:
  const DeviceModel& model_;
  std::vector<DeviceSequence*> sequences_;
  cudaStream_t stream_ = nullptr;
  DecodePlan plan_;               // the last step's, its buffers reused by the next
  uint8_t* plan_host_ = nullptr;  // pinned, the plan block the graph's first node copies
  size_t plan_bytes_ = 0;
  DeviceBuffer<uint8_t> plan_device_;
  DeviceBuffer<float> logits_;  // [B, V]
  DeviceBuffer<float> features_;  // [B, targets, dim] when the step records them
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
};

}  // namespace dsv41::cuda
