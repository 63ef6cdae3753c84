#pragma once
// The device tests' view of the golden fixtures (forward_fixture.h): their sequences on the CUDA
// executor, and the CPU forward's choices from its traces, imposed on the device to compare the
// two forwards under the same discrete choices.
#include <memory>
#include <span>
#include <vector>

#include "../forward_fixture.h"
#include "forward/device/cuda_executor.h"
#include "forward/device/device_forward.h"

namespace dsv41::test {

inline NewSequence device_sequences() {
  return executor_sequences([](const Model& model) { return cuda::make_executor(model); });
}

// The CPU forward's choices, from its traces of one run (prefill call 0, then the decode calls).
inline ChoiceSource choices_of(const std::vector<Trace>& traces, int k) {
  return [&traces, k](bool decode, int64_t first, int64_t n) {
    const Trace& t = traces[decode ? size_t(1 + first) : 0];
    const int64_t r0 = decode ? 0 : first;
    Choices ch;
    for (auto& [l, rows] : t.topk) ch.topk[l].assign(rows.begin() + r0, rows.begin() + r0 + n);
    for (auto& e : t.route_experts) ch.experts.emplace_back(e.begin() + r0 * k, e.begin() + (r0 + n) * k);
    return ch;
  };
}

// Sequences prefilled in pairs (a graphed one and its twin) with the first `lengths[i]` tokens of
// `tokens`: a DecodeGraph steps the graphed ones, forward_batch their twins, to compare the two.
struct GraphTwins {
  std::vector<std::unique_ptr<cuda::DeviceSequence>> graphed, twins;
  std::vector<cuda::DeviceSequence*> graphed_ptrs;

  GraphTwins(const cuda::DeviceModel& dm, const Config& c, const std::vector<int>& tokens, const int64_t* ids,
             const std::vector<int64_t>& lengths) {
    for (int64_t n : lengths) {
      for (auto* list : {&graphed, &twins}) {
        list->push_back(std::make_unique<cuda::DeviceSequence>(c, c.max_seq_len));
        cuda::forward_batch(dm, {cuda::DeviceItem{list->back().get(), std::span<const int>(tokens).first(size_t(n)), ids}});
      }
      graphed_ptrs.push_back(graphed.back().get());
    }
  }
};

}  // namespace dsv41::test
