// DecodeGraph (decode_graph.h). The capture runs the same enqueue_decode that an uncaptured decode
// call runs (forward_batch), so a replayed step computes what that call computes, to the bit; the
// forward's scratch inside the capture becomes the graph's own memory (stream-ordered allocations
// captured as allocation nodes), at addresses fixed for every replay.
#include "forward/device/decode_graph.h"

#include <cstring>
#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"
#include "forward/call_plan.h"

namespace dsv41::cuda {

DecodeGraph::DecodeGraph(const DeviceModel& model, std::vector<DeviceSequence*> sequences, bool features)
    : model_(model), sequences_(std::move(sequences)) {
  if (sequences_.empty() || int64_t(sequences_.size()) > kDecodeGraphRows)
    fail("cuda::DecodeGraph", "1 to " + std::to_string(kDecodeGraphRows) + " sequences", std::to_string(sequences_.size()));
  const Config& c = model.config();
  if (features && !c.has_dspark()) fail("cuda::DecodeGraph", "a model with DSpark stages for context features", "none");
  logits_ = DeviceBuffer<float>(int64_t(sequences_.size()) * c.vocab_size);
  if (features) features_ = DeviceBuffer<float>(int64_t(sequences_.size()) * int64_t(c.dspark_target_layer_ids.size()) * c.dim);
  // A blocking stream: it waits for work on the legacy default stream (sequence uploads, prefills).
  check(cudaStreamCreate(&stream_), "cuda::DecodeGraph");
}

DecodeGraph::~DecodeGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (plan_host_) cudaFreeHost(plan_host_);
  cudaStreamDestroy(stream_);
}

void DecodeGraph::launch(std::span<const int32_t> tokens, std::span<const int64_t* const> engram_ids,
                         std::span<const int64_t> decoder_from) {
  const size_t B = sequences_.size();
  if (tokens.size() != B) fail("cuda::DecodeGraph::step", std::to_string(B) + " tokens, one per sequence", std::to_string(tokens.size()));
  if (!engram_ids.empty() && engram_ids.size() != B)
    fail("cuda::DecodeGraph::step", std::to_string(B) + " Engram id lists or none", std::to_string(engram_ids.size()));
  if (!decoder_from.empty() && decoder_from.size() != B)
    fail("cuda::DecodeGraph::step", std::to_string(B) + " decoder starts or none", std::to_string(decoder_from.size()));
  // (The plan's layout does not depend on decoder_from: the captured graph holds for any.)
  std::vector<DecodeRow> rows;
  for (size_t b = 0; b < B; ++b)
    rows.push_back(DecodeRow{sequences_[b], tokens[b], engram_ids.empty() ? nullptr : engram_ids[b],
                             decoder_from.empty() ? 0 : decoder_from[b]});
  plan_decode(model_.config(), rows, plan_);
  const DecodePlan& plan = plan_;

  if (!exec_) {
    if (!plan_host_) {  // a capture that failed before keeps its buffers
      plan_bytes_ = plan.block.size();
      check(cudaMallocHost(reinterpret_cast<void**>(&plan_host_), plan_bytes_), "cuda::DecodeGraph");
      plan_device_ = DeviceBuffer<uint8_t>(int64_t(plan_bytes_));
    }
    std::memcpy(plan_host_, plan.block.data(), plan_bytes_);
    std::vector<DeviceItem> items;
    for (size_t b = 0; b < B; ++b) items.push_back(DeviceItem{sequences_[b], std::span<const int>(&tokens[b], 1), rows[b].engram_ids});
    check(cudaStreamSynchronize(stream_), "cuda::DecodeGraph");
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cuda::DecodeGraph capture");
    cudaGraph_t graph = nullptr;
    try {
      check(cudaMemcpyAsync(plan_device_.get(), plan_host_, plan_bytes_, cudaMemcpyHostToDevice, stream_), "cuda::DecodeGraph plan");
      enqueue_decode(model_, items, plan, plan_device_.get(), logits_.get(), stream_, features_.get());
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "cuda::DecodeGraph capture");
    check(cudaGraphGetNodes(graph, nullptr, &nodes_), "cuda::DecodeGraph");
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    check(made, "cuda::DecodeGraph instantiate");
  } else {
    // Same sequences, same config: the same layout, new values (decode_plan.cu).
    if (plan.block.size() != plan_bytes_)
      fail("cuda::DecodeGraph::step", "a plan of " + std::to_string(plan_bytes_) + " bytes", std::to_string(plan.block.size()));
    std::memcpy(plan_host_, plan.block.data(), plan_bytes_);
  }
  check(cudaGraphLaunch(exec_, stream_), "cuda::DecodeGraph launch");
  for (size_t b = 0; b < B; ++b) advance(*sequences_[b], plan.items[b]);
}

std::vector<std::vector<float>> DecodeGraph::step(std::span<const int32_t> tokens, std::span<const int64_t* const> engram_ids) {
  launch(tokens, engram_ids);
  const size_t B = sequences_.size();
  const int64_t V = model_.config().vocab_size;
  const std::vector<float> all = logits_.download(stream_);
  std::vector<std::vector<float>> out(B);
  for (size_t b = 0; b < B; ++b) out[b].assign(all.begin() + int64_t(b) * V, all.begin() + int64_t(b + 1) * V);
  return out;
}

}  // namespace dsv41::cuda
