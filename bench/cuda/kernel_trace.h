#pragma once
// Each kernel's device time inside replayed CUDA graphs, from CUPTI's activity records: what
// Nsight Systems would show, which the GPU machine does not have (its nsys makes no report). The
// op times of forward_bench (events around each op of an eager call) cost ~3 µs an op and see no
// graph; this sees the graph as it runs, side streams and programmatic launches included.
//
// Between start() and stop() every kernel the process runs is recorded (CONCURRENT_KERNEL
// activity: kernels keep their overlap); table(steps) folds the records into one row per kernel
// name, per step: launches; device time (start to end: a kernel launched early by programmatic
// dependent launch counts its wait for the kernel before it); the time it extends the step past
// every kernel that started before it — the timeline's union split among the kernels, so that a
// kernel beside others on a side stream, or waiting inside its predecessor, counts only what it
// adds; and the GPU's idle time just before its start (no kernel running since the latest end
// before it): the dependency and launch gaps the step pays, charged to the kernel that waited.
#include <cstdint>
#include <string>

namespace dsv41::bench {

class KernelTrace {
 public:
  // Whether this build can trace (CUPTI linked); the others fail with a message saying so.
  static bool available();
  void start();
  void stop();
  // The Markdown table of the records since start(), each figure divided by `steps`, and the
  // step's totals: span (first start to last end), busy (the union of the kernels' intervals)
  // and the sum of the kernels' times (above busy where kernels overlap).
  std::string table(int steps) const;
};

}  // namespace dsv41::bench
