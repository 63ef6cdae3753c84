#pragma once
// The V4.1 network on the device: forward.cpp's computation over the CUDA op set, for a batch of
// sequences whose rows run together through every per-row op (projections, norms, mHC, MoE) and
// apart only where a sequence's own state is read (its window, compressor and indexer). The
// contract is forward()'s (forward/forward.h): the same options (exact mode, decoder bounded
// replay, encoder bounded replay), the same Trace, the same logits up to the fp32 summation
// orders of the kernels (each op's test states how far).
#include <cuda_runtime_api.h>

#include <span>
#include <vector>

#include "backend/cuda/op_times.h"
#include "forward/device/decode_plan.h"
#include "forward/device/device_model.h"
#include "forward/device/device_sequence.h"
#include "forward/forward.h"
#include "model/sampling.h"

namespace dsv41::cuda {

// The most sequences of a decode step that DecodeGraph captures (the scheduler's largest batch in
// docs/benchmarks.md); a bigger step runs through forward_batch directly.
inline constexpr int64_t kDecodeGraphRows = 64;

struct DeviceItem {
  DeviceSequence* sequence;
  std::span<const int> tokens;
  const int64_t* engram_ids = nullptr;  // host [rows, engram layers, hash columns], as forward()'s
  ForwardOptions options = {};
  const SampleRequest* sample = nullptr;  // as BatchItem's (forward/executor.h): the token, chosen on the device
  TokenChoice* choice = nullptr;
  bool drafter_context = false;  // as BatchItem's: the call's context features into the drafter windows, on the device
};

// Advances each item's sequence by its tokens; returns each item's logits as forward() does, or
// writes the token it asks for (DeviceItem::sample, checked by the caller: check_sample).
// A Trace (options.trace) is supported for a batch of one item; keep_replayed_rows is not. Every
// input is checked before any sequence changes (docs/cuda.md lists the limits). Calls on
// different streams must not overlap: Mega-mHC's arrival counters are shared. With `times`, each
// op's device time goes there (op_times.h).
std::vector<std::vector<float>> forward_batch(const DeviceModel& model, const std::vector<DeviceItem>& batch,
                                              cudaStream_t stream = nullptr, OpTimes* times = nullptr);

// Whether an item is a decode row (one token on a prefilled sequence, none replayed, the decoder
// not starting past it, not in an image span): what plan_decode plans and a DecodeGraph replays.
bool decode_row(const DeviceSequence& sequence, size_t tokens, const ForwardOptions& options);

// A call's logits rows on the device (logits [rows, V], item i's counts[i] rows one after another)
// for the host: for each item with a sample request, the token of each of its rows chosen on the
// device (cuda::choose) into choice[i][0 .. counts[i]) and no rows; for the others their rows.
std::vector<std::vector<float>> deliver_logits(float* logits, int64_t V, std::span<const int64_t> counts,
                                               std::span<const SampleRequest* const> sample, std::span<TokenChoice* const> choice,
                                               cudaStream_t stream);

// DSpark's draft blocks (forward/dspark.h) of several sequences through the drafter's stages and its
// head in one call, on `stream`: blocks[i] ([anchor, noise × (γ − 1)]) at the positions after
// sequences[i]'s, each stage attending to that sequence's window of context KV and to its own
// block; the sequences are only read. Returns the base logits [Σ γ, V] (fp32, before the Markov
// steps; the blocks' rows one after another) and the last stage's collapsed streams [Σ γ, dim]
// (bf16 values, the confidence head's input), in device memory, ready once the stream is.
struct DraftBlock {
  DeviceBuffer<float> logits, folded;
};
DraftBlock draft_blocks(const DeviceModel& model, std::span<const DeviceSequence* const> sequences,
                        std::span<const std::vector<int>> blocks, cudaStream_t stream = nullptr);

// The kernels of a decode step (one token per item, none replayed: the calls forward_batch plans
// with plan_decode) on `stream`, every per-step value read from the plan's copy at plan_device,
// the logits into `logits` [items, V], and with `features` every item's DSpark context features
// into it ([items, targets, dim], ForwardOptions::dspark_hidden's rows). Changes no host state: the
// caller advances the sequences (advance(), with the plan's items). `plan` must be plan_decode's
// of the same sequences in the batch's order. The launches depend on the items and their caches'
// capacities alone, so DecodeGraph captures them once.
void enqueue_decode(const DeviceModel& model, const std::vector<DeviceItem>& batch, const DecodePlan& plan,
                    uint8_t* plan_device, float* logits, cudaStream_t stream, float* features = nullptr);

}  // namespace dsv41::cuda
