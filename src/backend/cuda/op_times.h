#pragma once
// Device time per named op of a call: a CUDA event pair around each op on its stream, summed by
// name once the stream is done (cuda_forward_bench's prefill breakdown). The time between two
// spans — the GPU idle while the host plans, allocates or waits — is in no span; total_ms() minus
// the spans' sum is that. Only the outermost span of a nest records (an op's own inner ops count
// as the op). Costs two event records per op: for measurement, not for serving.
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"

namespace dsv41::cuda {

class OpTimes {
 public:
  // Records from construction to destruction on `stream`, unless a span is already open.
  class Span {
   public:
    Span(OpTimes* times, std::string_view name, cudaStream_t stream) : times_(times) {
      if (times_ && times_->depth_++ == 0) times_->open(std::string(name), stream);
    }
    ~Span() {
      if (times_ && --times_->depth_ == 0) times_->close();
    }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    OpTimes* times_;
  };

  OpTimes() = default;
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;
  ~OpTimes() {
    for (Record& r : records_) cudaEventDestroy(r.start), cudaEventDestroy(r.end);
  }

  struct Total {
    std::string name;
    int calls = 0;
    double ms = 0;
  };
  // After the stream has finished: each name's calls and milliseconds, in the order first seen.
  std::vector<Total> totals() const {
    std::vector<Total> out;
    for (const Record& r : records_) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, r.start, r.end), "op times");
      auto it = out.begin();
      while (it != out.end() && it->name != r.name) ++it;
      if (it == out.end()) it = out.insert(out.end(), Total{r.name});
      ++it->calls, it->ms += ms;
    }
    return out;
  }
  // From the first span's start to the last span's end.
  double total_ms() const {
    float ms = 0;
    if (!records_.empty()) check(cudaEventElapsedTime(&ms, records_.front().start, records_.back().end), "op times");
    return ms;
  }

 private:
  struct Record {
    std::string name;
    cudaEvent_t start, end;
    cudaStream_t stream;
  };
  void open(std::string name, cudaStream_t stream) {
    Record r{std::move(name), nullptr, nullptr, stream};
    check(cudaEventCreate(&r.start), "op times");
    check(cudaEventCreate(&r.end), "op times");
    check(cudaEventRecord(r.start, stream), "op times");
    records_.push_back(std::move(r));
  }
  void close() {
    check(cudaEventRecord(records_.back().end, records_.back().stream), "op times");
  }

  std::vector<Record> records_;
  int depth_ = 0;
};

}  // namespace dsv41::cuda
