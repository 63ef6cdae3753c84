#pragma once
// The trainer's parameters on the device (docs/training.md, "The CUDA trainer"): the mirror of a
// host train::Parameters<float>. Every tensor's fp32 master and its gradient live in two device
// arenas, in the host's order, each tensor's start aligned to 64 elements (cuBLASLt's and vector
// loads' alignment); every matrix (a tensor of rank 2: the linears, experts, embedding, head,
// Engram table, mHC's fn) also has a bf16 copy, what linear.h's products read, made from the
// masters by cast_weights after each optimizer step: a third arena at the masters' offsets, cast
// whole in one launch (the other tensors' copies, a few thousand elements, are never read). The
// host Parameters stays the source of the names, shapes and the blocks' binding (LayerParams'
// pointers): a device array is found by its host tensor.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "train/cuda/linear.h"
#include "train/model/parameters.h"
#include "train/optim/optimizer.h"

namespace dsv41::train_cuda {

class DeviceParameters {
 public:
  // Allocates the arenas for `host`'s tensors (zero); `host` must outlive this.
  explicit DeviceParameters(train::Parameters<float>& host, cudaStream_t stream = nullptr);

  // The host masters copied to the device, then the bf16 copies cast from them.
  void upload();
  // The device masters copied into the host tensors' values (a checkpoint's; waits for the stream).
  void download();
  // The device gradients copied into the host tensors' gradients (waits for the stream).
  void download_grads();
  // Every gradient set to zero (a step's sequences then accumulate into them).
  void zero_grad();
  // Every matrix's bf16 copy from its master: round to nearest even, as cast_bf16 (one launch).
  void cast_weights();

  float* value(const train::Param<float>& p) { return values_.get() + slot(p).offset; }
  float* grad(const train::Param<float>& p) { return grads_.get() + slot(p).offset; }
  // A matrix's bf16 copy; throws dsv41::Error naming a tensor that is not a matrix.
  const bf16* weight_bf16(const train::Param<float>& p);

  // The optimizer's view (optim/optimizer.h): each tensor `keep` admits, in the host's order, with
  // its device value and gradient.
  std::vector<dsv41::optim::Parameter> optimizer_parameters(const std::function<bool(const std::string&)>& keep);

  int64_t elements() const { return elements_; }  // the arenas' length, padding included
  cudaStream_t stream() const { return stream_; }

 private:
  struct Slot {
    int64_t offset = 0;  // in every arena
    bool matrix = false;
  };
  const Slot& slot(const train::Param<float>& p) const;
  // Each tensor's part of `arena` into its host vector `host` (value or grad); waits for the stream.
  void download_into(const cuda::DeviceBuffer<float>& arena, std::vector<float> train::Param<float>::*host);

  train::Parameters<float>& host_;
  cudaStream_t stream_;
  std::map<const train::Param<float>*, Slot> slots_;
  int64_t elements_ = 0;
  cuda::DeviceBuffer<float> values_, grads_;
  cuda::DeviceBuffer<bf16> bf16_;
};

}  // namespace dsv41::train_cuda
