#pragma once
// Work that runs beside a stream's: Branch(stream) makes this thread's side stream wait for what
// `stream` has queued so far; what goes on side() then runs concurrently with what goes on
// `stream`, until join() makes `stream` wait for it. Under a stream capture the two become
// parallel branches of the graph (cuda::moe's shared expert beside the routed experts: small,
// latency-bound launches that need not wait in line).
//
// One side stream and two events per thread, made on the thread's first branch with the capture
// mode relaxed for their creation (the first branch may come inside a decode step's capture).
// The side stream does not synchronize with the legacy default stream: the events order it.
#include <cuda_runtime_api.h>

#include "backend/cuda/check.h"

namespace dsv41::cuda {

class Branch {
 public:
  explicit Branch(cudaStream_t stream) : stream_(stream) {
    check(cudaEventRecord(side_.fork, stream), "cuda side stream");
    check(cudaStreamWaitEvent(side_.stream, side_.fork, 0), "cuda side stream");
  }
  Branch(const Branch&) = delete;
  Branch& operator=(const Branch&) = delete;

  cudaStream_t side() const { return side_.stream; }
  void join() {
    check(cudaEventRecord(side_.join, side_.stream), "cuda side stream");
    check(cudaStreamWaitEvent(stream_, side_.join, 0), "cuda side stream");
  }

 private:
  struct Side {
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    Side() {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cuda side stream");
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cuda side stream");
      check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cuda side stream");
      check(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "cuda side stream");
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cuda side stream");
    }
  };
  static Side& side_of_thread() {
    thread_local Side side;
    return side;
  }

  cudaStream_t stream_;
  Side& side_ = side_of_thread();
};

}  // namespace dsv41::cuda
