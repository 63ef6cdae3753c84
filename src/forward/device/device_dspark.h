#pragma once
// DSpark's drafter on the device (forward/dspark.h says what it computes; forward.cpp's
// dspark_ingest and dspark_draft are the reference, step for step): the context KV of a call's
// features into each stage's ring of a DeviceSequence, and a draft after the sequence's last token.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "forward/device/device_model.h"
#include "forward/device/device_sequence.h"
#include "forward/dspark.h"

namespace dsv41::cuda {

// dsv41::dspark_ingest on the device for rows of many sequences at once: row r of `features`
// ([rows, targets, dim], device memory) is the context of `sequence` at `position`; each through
// main_proj and main_norm, then per stage kv_norm(wkv), RoPE at its position, SWA-FP8 into the
// stage's ring. No two rows may share a sequence's ring slot (a caller keeps each sequence's last
// W rows). Launches the same kernels whatever the count of sequences: a decode step's contexts in
// one call, from the features the step left on the device.
struct DraftContextRow {
  DeviceSequence* sequence;
  int64_t position;
  int64_t feature_row;  // its row of `features`
};
void dspark_ingest_rows(const DeviceModel& model, std::span<const DraftContextRow> rows, const float* features, cudaStream_t stream);

// A call's kept rows: the last W of `rows` rows ending at position `end` (exclusive), the first of
// them at features row `first_row`.
void add_context_rows(const Config& config, DeviceSequence& sequence, int64_t end, int64_t rows, int64_t first_row,
                      std::vector<DraftContextRow>& out);

// The same from host memory: the features of rows at first_pos, first_pos + 1, ... of one sequence
// (the last W rows kept).
void dspark_ingest(const DeviceModel& model, DeviceSequence& sequence, int64_t first_pos, std::span<const float> hidden,
                   int64_t rows, cudaStream_t stream = nullptr);

// dsv41::dspark_draft on the device for several sequences at once (each request's sequence only
// read; a sequence may appear twice): the blocks through the stages and the draft head in one call
// (draft_blocks), then position by position for every draft together the Markov bias
// W2 · W1[token before] (fp32) added to the base logits row on the device, and the next token
// chosen — greedy requests (no `choose`) by cuda::choose's first maximum on the device, their
// Draft without logits; the others by their `choose` on the row brought back (a sampling verifier
// draws from its own generator), their Draft with its γ rows; then the confidence logits
// [x_i ; W1[token before]] through the confidence head (fp32). Per position one small upload and
// one choice's download, whatever the batch.
struct DeviceDraftRequest {
  const DeviceSequence* sequence;
  int anchor;
  const DraftChoice* choose = nullptr;
};
std::vector<Draft> dspark_drafts(const DeviceModel& model, std::span<const DeviceDraftRequest> requests, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
