#pragma once
// The V4.1 network over the op set, exact mode: every layer on every position, as the official
// inference/model.py computes it (DESIGN §3). Prefill of any length in chunks of any size, then
// incremental decode of one sequence and its SequenceState; the CPU executor (executor.h) runs a
// batch of them through it.
#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "forward/model.h"
#include "forward/sequence_state.h"

namespace dsv41 {

class Comm;  // forward/comm.h

// What a test may observe of one forward call, and the discrete choices it may impose (the
// fixtures' recorded indexer top-k and experts), so that the arithmetic can be compared with the
// reference's without near-tie flips cascading.
struct Trace {
  // Recorded, per backbone layer, for every row of the call. The experts are the engine's own
  // choice, also when others are imposed, with the scores they were made on, so that a test can
  // tell a near-tie from a real disagreement; top-k is the entries attended (imposed ones when
  // forced: per-pick near-ties are no test on MXFP4 index scores, docs/forward.md).
  std::vector<std::vector<float>> block_out;        // [layer][row, hc, dim] streams after the block
  std::vector<std::vector<int32_t>> route_experts;  // [layer][row, topk] in gate order
  std::vector<std::vector<float>> route_scores;     // [layer][row, experts] gate scores + bias (bias_vl on image rows)
  std::map<int, std::vector<std::vector<int64_t>>> topk;  // index source -> [row] attended entries, -1 padded

  // Imposed, when set: per index-source layer the entries each row attends to (-1 = none), and per
  // layer the experts of each row.
  const std::map<int, std::vector<std::vector<int64_t>>>* forced_topk = nullptr;
  const std::vector<std::vector<int32_t>>* forced_experts = nullptr;
  // Imposed layer inputs (layer-local parity), when set: every layer l > 0 starts from
  // forced_streams[l - 1] [row, hc, dim] and forced_pre_mix[l - 1] [row, hc] — the reference's
  // block output and next input mix — instead of what layer l - 1 computed, so that each layer's
  // output depends on the reference's input and its own arithmetic only. Exact mode.
  const std::vector<std::vector<float>>* forced_streams = nullptr;
  const std::vector<std::vector<float>>* forced_pre_mix = nullptr;
};

struct ForwardOptions {
  bool all_logits = false;  // logits of every row, not only the last
  Trace* trace = nullptr;
  // Decoder bounded replay (DESIGN §3, default mode): decoder layers run only on positions >=
  // decoder_from, and their sliding windows never reach before it (the sequence remembers the
  // truncation). Earlier positions run the encoder and the decoder's KV projection only.
  // 0 = exact mode.
  int64_t decoder_from = 0;
  // Measurement hook: keep the truncation but run the decoder on every row, so that the effect of
  // truncating the window can be told apart from that of dropping rows.
  bool keep_replayed_rows = false;
  // Encoder bounded replay (DESIGN §3, on a global-KV hit at H with an SWA miss): the call starts
  // at s = H - W on a state that holds the global KV up to H = replay_until but no SWA KV; the rows
  // before H run the encoder only, with its windows truncated at s, to regenerate the SWA rings,
  // reading the cached global KV and never rewriting it. 0 = no replay.
  int64_t replay_until = 0;
  // Exact mode's replay (with replay_until): every layer, the decoder's too, reruns the rows before
  // H, its windows truncated at the call's start s. A row's KV at layer j is a cold run's once the
  // row is j(W - 1) past s, so from s = H - exact_replay_rows(config) every ring at H is the cold
  // run's, bit for bit, and the call continues exactly.
  bool exact_replay = false;

  // Image spans (docs/vision.md §7-§9), when set: per row of the call, null for a text row, or
  // the embedding [dim] (bf16 values: an aligner row, or a learned delimiter) that replaces the
  // token's. Such a row is in an image span: its MoE gates choose with bias_vl, and Engram leaves
  // it unchanged (its gate is shut; its hash ids, DEAD look-back, are the caller's). The CPU and
  // CUDA executors' (Executor::takes_images).
  const float* const* span_embeddings = nullptr;

  // DSpark's context features, when set: for every row the decoder runs, the residual entering
  // each target layer averaged over the hc streams (bf16 values), [rows, targets, dim] with the
  // targets in layer order (model.py Transformer.forward's main_hidden). The CPU and CUDA executors'.
  std::vector<float>* dspark_hidden = nullptr;

  // A rank's part of a model (Model::partition, model/partition.h): the collectives it meets the
  // other ranks at, each rank running the same call. Unused on a whole model.
  Comm* comm = nullptr;

  // The first position the decoder layers run on: default mode's replay runs the encoder alone
  // below H.
  int64_t decoder_rows_from() const { return exact_replay ? decoder_from : std::max(decoder_from, replay_until); }
};

// The rows exact mode's replay reruns below a hit (ForwardOptions::exact_replay): the last layer's
// ring of W positions, plus W - 1 per layer beneath it for the truncation to wear off.
inline int64_t exact_replay_rows(const Config& c) { return c.window_size + int64_t(c.n_layers - 1) * (c.window_size - 1); }

// Runs `tokens` at positions state.length, state.length + 1, ... and advances the state. Returns
// the logits [rows, vocab] (fp32): every row with all_logits, else the last one (rows dropped by
// bounded replay have none; a call whose rows all precede decoder_from returns none). `engram_ids`
// [rows, engram layers, hash columns] holds the Engram hash rows of the tokens when the model has
// Engram (nullptr otherwise).
std::vector<float> forward(const Model& model, SequenceState& state, std::span<const int> tokens,
                           const int64_t* engram_ids, const ForwardOptions& options = {});

}  // namespace dsv41
