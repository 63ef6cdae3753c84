// DSpark's drafter on the device (device_dspark.h), each step as forward.cpp's dspark_ingest and
// dspark_draft: the same ops in the same order and precision, on the CUDA ops (whose tests bound
// their fp32 summation orders against the CPU's).
#include "forward/device/device_dspark.h"

#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/compressor.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/rows.h"
#include "base/error.h"
#include "forward/device/device_forward.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

void dspark_ingest(const DeviceModel& model, DeviceSequence& sequence, int64_t first_pos, std::span<const float> hidden,
                   int64_t rows, cudaStream_t stream) {
  const Config& c = model.config();
  if (!c.has_dspark()) fail("dspark_ingest", "a model with DSpark stages", "none");
  const int64_t d = c.dim, hd = c.head_dim, W = c.window_size, T = int64_t(c.dspark_target_layer_ids.size());
  if (rows < 0 || int64_t(hidden.size()) != rows * T * d)
    fail("dspark_ingest", std::to_string(rows) + " rows of " + std::to_string(T * d) + " context features", std::to_string(hidden.size()) + " values");
  if (first_pos < 0 || first_pos + rows > sequence.capacity())
    fail("dspark_ingest", "positions within the sequence's " + std::to_string(sequence.capacity()) + " tokens",
         std::to_string(first_pos) + " + " + std::to_string(rows) + " rows");
  // Only the last W rows' entries stay in the rings; each row's entry depends on that row alone.
  const int64_t skip = std::max<int64_t>(0, rows - W), n = rows - skip;
  if (n == 0) return;
  const DSparkWeights& w = model.dspark();
  const float eps = float(c.norm_eps);
  DeviceBuffer<float> features = scratch_from(std::vector<float>(hidden.begin() + skip * T * d, hidden.end()), stream);
  DeviceBuffer<float> main_x = scratch<float>(n * d, stream), kv = scratch<float>(n * hd, stream);
  linear(features.get(), n, w.main_proj, main_x.get(), stream);
  rms_norm(main_x.get(), n, d, &w.main_norm, eps, main_x.get(), stream);
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < n; ++r) positions.push_back(first_pos + skip + r);
  DeviceBuffer<int64_t> positions_d = scratch_from(positions, stream);
  const size_t slot = swa_fp8::bytes(int(hd));
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    const AttentionWeights& a = model.layer(l).attn;
    linear(main_x.get(), n, a.wkv, kv.get(), stream);
    rms_norm(kv.get(), n, hd, &a.kv_norm, eps, kv.get(), stream);
    rope(kv.get() + hd - c.rope_head_dim, n, 1, hd, hd, c.rope_head_dim, positions_d.get(), model.rope_freqs(l), false, stream);
    std::vector<uint8_t*> dest;
    for (const int64_t pos : positions) dest.push_back(sequence.window[size_t(l)].get() + (pos % W) * int64_t(slot));
    swa_fp8_encode(kv.get(), n, int(hd), scratch_from(dest, stream).get(), stream);
  }
  // The host vectors above (and the scratch) outlive the copies and kernels only up to here.
  check(cudaStreamSynchronize(stream), "dspark_ingest");
}

Draft dspark_draft(const DeviceModel& model, const DeviceSequence& sequence, int anchor, const DraftChoice& choose,
                   cudaStream_t stream) {
  const Config& c = model.config();
  const std::vector<int> block = draft_block_tokens(c, sequence.length, anchor);
  const int64_t G = c.dspark_block_size, V = c.vocab_size, d = c.dim, rank = c.dspark_markov_rank;
  DraftBlock b = draft_block(model, sequence, block, stream);

  // Position by position: the Markov bias of the token before, W2 · W1[token] (fp32 over the bf16
  // embedding, on the device), added to the base logits row (fp32, here); the next token chosen
  // from the sum.
  Draft out;
  out.logits = b.logits.download(stream, G * V);
  out.tokens = {anchor};
  const DSparkWeights& w = model.dspark();
  DeviceBuffer<float> embeds = scratch<float>(G * rank, stream), bias = scratch<float>(V, stream);
  DeviceBuffer<int32_t> token = scratch<int32_t>(1, stream);
  for (int64_t i = 0; i < G; ++i) {
    const int32_t before = out.tokens[size_t(i)];
    check(cudaMemcpyAsync(token.get(), &before, sizeof(before), cudaMemcpyHostToDevice, stream), "dspark_draft");
    embed_rows(w.markov_embed, token.get(), 1, 1, rank, embeds.get() + i * rank, stream);
    linear_f32(embeds.get() + i * rank, 1, w.markov_head, bias.get(), stream);
    const std::vector<float> row_bias = bias.download(stream, V);
    float* row = out.logits.data() + i * V;
    for (int64_t v = 0; v < V; ++v) row[v] += row_bias[size_t(v)];
    out.tokens.push_back(choose(std::span<const float>(row, size_t(V))));
  }
  // Confidence logits: [x_i ; W1[token before]] through the confidence head, fp32.
  DeviceBuffer<float> joined = scratch<float>(G * (d + rank), stream), confidence = scratch<float>(G, stream);
  const size_t pitch = size_t(d + rank) * sizeof(float);
  check(cudaMemcpy2DAsync(joined.get(), pitch, b.folded.get(), size_t(d) * sizeof(float), size_t(d) * sizeof(float), size_t(G),
                          cudaMemcpyDeviceToDevice, stream), "dspark_draft");
  check(cudaMemcpy2DAsync(joined.get() + d, pitch, embeds.get(), size_t(rank) * sizeof(float), size_t(rank) * sizeof(float),
                          size_t(G), cudaMemcpyDeviceToDevice, stream), "dspark_draft");
  linear_f32(joined.get(), G, w.confidence, confidence.get(), stream);
  out.confidence = confidence.download(stream, G);
  return out;
}

}  // namespace dsv41::cuda
