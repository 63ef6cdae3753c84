#pragma once
// The V4.1 network's training forward and backward over any Config the engine accepts
// (docs/training.md, "The model"): forward/network.h's layer loop — the same schedule as inference —
// run by the training op set (train_ops.h) on one packed sequence at once from position 0 (the
// reference's prefill at start_pos 0, exact mode: every layer on every position, no KV cache; or,
// with served calls, default mode's decoder bounded replay), then its recorded backward (tape.h)
// into the parameters' gradients.
//
// A step's objective is lm_weight · L_lm + indexer_weight · L_indexer: the mean next-token
// cross-entropy over the sequence, and the indexer's distillation loss (KL of its scores against the
// main attention of the chosen entries) averaged over the rows and summed over the index-source
// layers, which trains only the indexer's own weights. With draft anchors, also DSpark's loss
// (grad/dspark.h) of the drafter's blocks at those anchors, which trains only DSpark's own weights.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "forward/forward.h"
#include "train/grad/dspark.h"
#include "train/model/parameters.h"
#include "train/model/tape.h"

namespace dsv41::train {

// Quantization-aware training (docs/training.md, "Where quantization-aware training plugs in"): the
// serving caches' codecs applied as fake quantization with straight-through gradients.
struct TrainOptions {
  bool kv_fp4 = false;         // the compressed main KV entries, after their RoPE (KV-FP4)
  bool swa_fp8 = false;        // the window KV, after its RoPE (SWA-FP8)
  bool mxfp4_indexer = false;  // the index queries and keys, after their RoPE (MXFP4)
};

struct Losses {
  double lm = 0;       // mean next-token cross-entropy over the rows with a target
  double indexer = 0;  // Σ over index-source layers of the mean over rows of KL(p* ‖ softmax(I))
  double dspark = 0;   // DSpark's loss: 0.1 L_ce + 0.9 L_tv + L_conf over the draft blocks (0 without them)
  grad::DSparkLossParts dspark_parts;
};

// One forward call a sequence is served as (docs/training.md, "Bounded replay in training"): its
// rows, and its ForwardOptions::decoder_from — a prompt segment in default mode has its end minus
// min(W, rows) (engine/session.cpp), a decoded span 0. The calls of a sequence follow each other
// from position 0 and cover it; forward/call_plan.h's plan_item and advance, over the counters the
// calls leave, give each row's fate: cut at the decoder start, or run by the decoder with windows
// truncated at the decoder window floor. `decoded`: the span is a reply, decoded row by row
// (decoder_from 0), where serving drafts (DSpark's anchors under replay); else a prompt.
struct ServedCall {
  int64_t rows = 0;
  int64_t decoder_from = 0;
  bool decoded = false;
  bool operator==(const ServedCall&) const = default;
};

// One sequence of a training batch, as TrainModel::forward takes it: tokens [L + 1], the Engram
// hash ids of its inputs (nullptr without Engram), DSpark's anchors, its served calls (none: exact
// mode). Views: the caller keeps what they point to.
struct TrainSequence {
  std::span<const int64_t> tokens;
  const int64_t* engram_ids = nullptr;
  std::span<const int64_t> anchors;
  std::span<const ServedCall> calls;
};

// The draft blocks' anchors of a sequence of L inputs (docs/training.md, "DSpark"): min(blocks, n)
// distinct positions drawn uniformly from n candidates, ascending, a function of (seed, sequence,
// calls) alone — `sequence` the sequence's index in the data stream — so that a resumed run draws
// the same ones. The candidates: in exact mode (no calls) [1, L − γ] (a context before, γ targets
// after); under bounded replay the anchors a whose block a .. a + γ − 1 lies in one decoded call —
// serving drafts while decoding, its context ending at a prompt's last row or a decoded row, and
// the target's distribution over the block is what the decoder computed on those rows.
std::vector<int64_t> dspark_anchors(const Config& c, int64_t L, int64_t blocks, uint64_t seed, uint64_t sequence,
                                    std::span<const ServedCall> calls = {});

// The served calls of a sequence of L inputs under decoder bounded replay (docs/training.md,
// "Bounded replay in training"; docs/decisions.md): `turns` turns (at most L) starting at 0 and at
// distinct positions drawn uniformly from [1, L − 1]; turn [b, e) a prompt of P tokens, P uniform in
// [1, e − b], served as one default-mode prefill, then the rest of the turn decoded (one decoded call
// with decoder_from 0: decoding row by row is the same rows, bit for bit). A function of (seed,
// sequence) alone — `sequence` the sequence's index in the data stream — so a resumed run draws the
// same ones (mt19937_64 from a seed_seq, as dspark_anchors).
std::vector<ServedCall> replay_calls(const Config& c, int64_t L, int64_t turns, uint64_t seed, uint64_t sequence);

// Each row's fate when a sequence of L rows is served as `calls` (both trainers' op sets): forward/
// call_plan.h plans each call over the counters the calls before it left, as the serving forward
// does; a row is cut where its call's plan cuts it (it leaves at the decoder start), and the
// decoder's window floor of a row is its call's. Needs a model whose decoder starts at its last
// kv-source: only the decoder's first kv-source may compress (the later ones see only the decoder's
// rows in serving, at positions the training op sets do not model).
struct ReplayRows {
  std::vector<uint8_t> cut;    // [L] 1: cut at the decoder start
  std::vector<int64_t> floor;  // [L] the decoder window floor of the row's call
};
ReplayRows replay_rows(const Config& c, int64_t L, std::span<const ServedCall> calls);

// A trace made ready for a training forward (the CPU's and the CUDA trainer's): each backbone layer's
// block output, and each layer's experts and biased scores — DSpark's stages' too when it drafts —
// sized empty; no top-k yet.
void prepare_trace(const Config& c, Trace& trace, bool draft);

// How far the last forward stayed from the kinks a finite difference must not straddle (the
// gradient checks assert them): the smallest |dot| under Engram's signed root (floored at 1e-6) and
// under the indexer's relu (its chosen entries), the largest |pre-activation| of an expert (clamped
// at swiglu_limit) and |logit| of a gate (softplus is the identity above 20).
struct Margins {
  double engram_dot = INFINITY, indexer_dot = INFINITY, expert_preactivation = 0, gate_logit = 0;
};

template <class T>
class TrainOps;

template <class T>
class TrainModel {
 public:
  explicit TrainModel(Parameters<T>& params, TrainOptions options = {});
  ~TrainModel();

  // Runs one sequence: tokens [L + 1], the inputs the first L, each row's target the token after it;
  // engram_ids [L, engram layers, hash columns] of the inputs (forward.h's layout; nullptr for a model
  // without Engram). Records the backward. With a trace (forward.h), as the CPU forward: records each
  // index source's top-k, each layer's experts and biased gate scores and its output streams;
  // imposes its forced top-k and experts (the choices held, as the gradient checks and the parity
  // tests hold them) and its forced layer inputs (layer-local parity).
  //
  // With anchors (dspark_anchors), DSpark's drafter runs a block at each after the target (its
  // stages' experts recorded and imposed in the trace's layers n_layers .. n_total_layers − 1 when
  // its vectors reach them).
  //
  // With served calls (replay_calls), decoder bounded replay as default mode serves them: the rows
  // the calls' plans cut leave at the decoder start (after feeding its kv-source's compressor), the
  // decoder's windows stop at each row's decoder window floor, and L_lm is the mean over the rows the
  // decoder runs; the trace's decoder layers and logits() then hold those rows only. With both, the
  // drafter's context is what the decoder ran: features of the rows it ran, each block's window
  // without the slots below the decoder window floor at its anchor (forward/window.h
  // draft_window_slots); the anchors' blocks must be rows the decoder ran (dspark_anchors with the calls).
  Losses forward(std::span<const int64_t> tokens, const int64_t* engram_ids, Trace* trace = nullptr,
                 std::span<const int64_t> anchors = {}, std::span<const ServedCall> calls = {});
  // Adds the gradient of lm_weight · L_lm + indexer_weight · L_indexer + dspark_weight · L_dspark of
  // the last forward into the parameters' gradients (zeroed by the caller: sequences of a batch
  // accumulate).
  void backward(T lm_weight = T(1), T indexer_weight = T(1), T dspark_weight = T(1));
  // While held, forwards keep DSpark's labels (the signs of p − q and c*, grad/dspark.h) of the last
  // unheld forward: a gradient check's forwards are then one smooth function.
  void hold_dspark_labels(bool held) { labels_.held = held; }
  // The last forward's drafter outputs: the Markov-corrected logits [blocks · γ, vocab] and the
  // confidence logits [blocks · γ] (empty without anchors).
  std::vector<T> draft_logits() const;
  std::vector<T> draft_confidence() const;

  // The last forward's distances to kinks.
  const Margins& margins() const;
  // The last forward's logits [L, vocab] (the head over the final norm's output; with served calls,
  // the rows the decoder ran).
  std::vector<T> logits() const;
  // Rows routed to each expert of each block (the backbone's layers, then DSpark's stages) over the
  // forwards since the last reset ([layer][expert]): what the aux-loss-free update of the gate's
  // bias reads.
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }
  void reset_expert_load();

 private:
  Parameters<T>& params_;
  TrainOptions options_;
  Tape tape_;
  std::unique_ptr<TrainOps<T>> ops_, drafter_;
  grad::DSparkLabels labels_;
  Margins margins_;
  std::vector<std::vector<int64_t>> expert_load_;
};

}  // namespace dsv41::train
