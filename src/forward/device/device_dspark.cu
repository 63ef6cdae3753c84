// DSpark's drafter on the device (device_dspark.h), each step as forward.cpp's dspark_ingest and
// dspark_draft: the same ops in the same order and precision, on the CUDA ops (whose tests bound
// their fp32 summation orders against the CPU's), the drafts of many sequences in one pass.
#include "forward/device/device_dspark.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/compressor.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/rows.h"
#include "backend/cuda/sampling.h"
#include "base/error.h"
#include "forward/device/device_forward.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

void dspark_ingest_rows(const DeviceModel& model, std::span<const DraftContextRow> rows, const float* features, cudaStream_t stream) {
  const Config& c = model.config();
  const int64_t n = int64_t(rows.size()), d = c.dim, hd = c.head_dim, W = c.window_size, T = int64_t(c.dspark_target_layer_ids.size());
  if (n == 0) return;  // (every call of a model without DSpark comes here with none)
  if (!c.has_dspark()) fail("dspark_ingest", "a model with DSpark stages", "none");
  std::vector<int32_t> index;
  std::vector<int64_t> positions;
  bool in_order = true;
  for (int64_t r = 0; r < n; ++r) {
    const DraftContextRow& row = rows[size_t(r)];
    if (row.position < 0 || row.position >= row.sequence->capacity())
      fail("dspark_ingest", "positions within the sequence's " + std::to_string(row.sequence->capacity()) + " tokens",
           std::to_string(row.position));
    index.push_back(int32_t(row.feature_row));
    positions.push_back(row.position);
    in_order = in_order && row.feature_row == r;
  }
  const DSparkWeights& w = model.dspark();
  const float eps = float(c.norm_eps);
  // The kept rows side by side (a decode step's are already: row r is feature row r).
  DeviceBuffer<float> gathered;
  if (!in_order) {
    gathered = scratch<float>(n * T * d, stream);
    gather_rows(features, scratch_from(index, stream).get(), n, T * d, gathered.get(), stream);
    features = gathered.get();
  }
  DeviceBuffer<float> main_x = scratch<float>(n * d, stream), kv = scratch<float>(n * hd, stream);
  linear(features, n, w.main_proj, main_x.get(), stream);
  rms_norm(main_x.get(), n, d, &w.main_norm, eps, main_x.get(), stream);
  DeviceBuffer<int64_t> positions_d = scratch_from(positions, stream);
  const size_t slot = swa_fp8::bytes(int(hd));
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    const AttentionWeights& a = model.layer(l).attn;
    linear(main_x.get(), n, a.wkv, kv.get(), stream);
    rms_norm(kv.get(), n, hd, &a.kv_norm, eps, kv.get(), stream);
    rope(kv.get() + hd - c.rope_head_dim, n, 1, hd, hd, c.rope_head_dim, positions_d.get(), model.rope_freqs(l), false, stream);
    std::vector<uint8_t*> dest;
    for (const DraftContextRow& row : rows) dest.push_back(row.sequence->window[size_t(l)].get() + (row.position % W) * int64_t(slot));
    swa_fp8_encode(kv.get(), n, int(hd), scratch_from(dest, stream).get(), stream);
  }
  // The host vectors above (and the scratch) outlive the copies and kernels only up to here.
  check(cudaStreamSynchronize(stream), "dspark_ingest");
}

void add_context_rows(const Config& config, DeviceSequence& sequence, int64_t end, int64_t rows, int64_t first_row,
                      std::vector<DraftContextRow>& out) {
  // Only the last W rows' entries stay in the rings; each row's entry depends on that row alone.
  const int64_t skip = std::max<int64_t>(0, rows - int64_t(config.window_size));
  for (int64_t r = skip; r < rows; ++r) out.push_back({&sequence, end - rows + r, first_row + r});
}

void dspark_ingest(const DeviceModel& model, DeviceSequence& sequence, int64_t first_pos, std::span<const float> hidden,
                   int64_t rows, cudaStream_t stream) {
  const Config& c = model.config();
  const int64_t T = int64_t(c.dspark_target_layer_ids.size()), d = c.dim;
  if (rows < 0 || int64_t(hidden.size()) != rows * T * d)
    fail("dspark_ingest", std::to_string(rows) + " rows of " + std::to_string(T * d) + " context features", std::to_string(hidden.size()) + " values");
  if (first_pos < 0 || first_pos + rows > sequence.capacity())
    fail("dspark_ingest", "positions within the sequence's " + std::to_string(sequence.capacity()) + " tokens",
         std::to_string(first_pos) + " + " + std::to_string(rows) + " rows");
  // Only the last W rows reach the rings: those go up, and are the rows of the call.
  const int64_t n = std::min<int64_t>(rows, c.window_size);
  if (n == 0) return;
  std::vector<DraftContextRow> kept;
  add_context_rows(c, sequence, first_pos + rows, n, 0, kept);
  DeviceBuffer<float> features = scratch_from(std::vector<float>(hidden.end() - n * T * d, hidden.end()), stream);
  dspark_ingest_rows(model, kept, features.get(), stream);
}

std::vector<Draft> dspark_drafts(const DeviceModel& model, std::span<const DeviceDraftRequest> requests, cudaStream_t stream) {
  const Config& c = model.config();
  const int64_t n = int64_t(requests.size()), G = c.dspark_block_size, V = c.vocab_size, d = c.dim, rank = c.dspark_markov_rank;
  if (n == 0) return {};
  std::vector<const DeviceSequence*> sequences;
  std::vector<std::vector<int>> blocks;
  for (const DeviceDraftRequest& r : requests) {
    sequences.push_back(r.sequence);
    blocks.push_back(draft_block_tokens(c, r.sequence->length, r.anchor));
  }
  DraftBlock b = draft_blocks(model, sequences, blocks, stream);  // draft s's rows at s·G .. s·G + G − 1

  std::vector<Draft> out(static_cast<size_t>(n));
  std::vector<int64_t> greedy, chosen;  // the requests chosen on the device / on the host
  for (int64_t s = 0; s < n; ++s) {
    out[size_t(s)].tokens = {requests[size_t(s)].anchor};
    (requests[size_t(s)].choose ? chosen : greedy).push_back(s);
  }
  SampleRequest argmax;  // temperature 0: the first maximum over the whole row, as draft_argmax
  argmax.vocab = V;
  const std::vector<SampleRequest> argmax_requests(greedy.size(), argmax);
  std::vector<int64_t> greedy_rows(greedy.size());

  // Position by position: the Markov bias of each draft's token before, W2 · W1[token] (fp32 over
  // the bf16 embedding), added to its row; the next tokens chosen from the sums. The embeddings
  // go to the confidence head's input [x_i ; W1[token before]] (row s·G + i, after x's d values).
  const DSparkWeights& w = model.dspark();
  const int64_t width = d + rank;
  DeviceBuffer<float> joined = scratch<float>(n * G * width, stream), embeds = scratch<float>(n * rank, stream),
                      bias = scratch<float>(n * V, stream);
  DeviceBuffer<int32_t> before = scratch<int32_t>(n, stream);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < G; ++i) {
    for (int64_t s = 0; s < n; ++s) tokens[size_t(s)] = out[size_t(s)].tokens[size_t(i)];
    check(cudaMemcpyAsync(before.get(), tokens.data(), size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream), "dspark_draft");
    embed_rows(w.markov_embed, before.get(), n, 1, rank, embeds.get(), stream);
    linear_f32(embeds.get(), n, w.markov_head, bias.get(), stream);
    add_rows(b.logits.get() + i * V, G * V, bias.get(), n, V, stream);
    check(cudaMemcpy2DAsync(joined.get() + i * width + d, size_t(G * width) * sizeof(float), embeds.get(), size_t(rank) * sizeof(float),
                            size_t(rank) * sizeof(float), size_t(n), cudaMemcpyDeviceToDevice, stream), "dspark_draft");
    for (size_t k = 0; k < greedy.size(); ++k) greedy_rows[k] = greedy[k] * G + i;
    const std::vector<TokenChoice> picks = choose(b.logits.get(), V, greedy_rows, argmax_requests, stream);
    for (size_t k = 0; k < greedy.size(); ++k) out[size_t(greedy[k])].tokens.push_back(picks[k].token);
    // A host-chosen draft keeps its rows, Markov bias included, as dspark_draft returns them.
    for (const int64_t s : chosen) {
      const std::vector<float> row = b.logits.download(stream, V, (s * G + i) * V);
      out[size_t(s)].tokens.push_back((*requests[size_t(s)].choose)(row));
      out[size_t(s)].logits.insert(out[size_t(s)].logits.end(), row.begin(), row.end());
    }
  }

  // Confidence logits: [x_i ; W1[token before]] through the confidence head, fp32.
  DeviceBuffer<float> confidence = scratch<float>(n * G, stream);
  check(cudaMemcpy2DAsync(joined.get(), size_t(width) * sizeof(float), b.folded.get(), size_t(d) * sizeof(float), size_t(d) * sizeof(float),
                          size_t(n * G), cudaMemcpyDeviceToDevice, stream), "dspark_draft");
  linear_f32(joined.get(), n * G, w.confidence, confidence.get(), stream);
  const std::vector<float> conf = confidence.download(stream, n * G);
  for (int64_t s = 0; s < n; ++s) out[size_t(s)].confidence.assign(conf.begin() + s * G, conf.begin() + (s + 1) * G);
  return out;
}

}  // namespace dsv41::cuda
