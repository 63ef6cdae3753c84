#pragma once
// DSpark, V4.1's speculative drafter (model.py DSparkBlock, forward_spec; reference notes
// components.md §6), on the CPU executor (forward.cpp runs it over its op set; the stages' network
// is network.h's run_drafter).
//
// A sequence's drafter keeps, per stage, a sliding window of context KV (SequenceState::
// draft_window, SWA-FP8, slot = position mod W): for every token the target runs, the stage's
// kv_norm(wkv(main_x)) RoPE'd at the token's position, main_x = main_norm(main_proj(h)) and h the
// target layers' inputs averaged over the hc streams (ForwardOptions::dspark_hidden). A draft after
// the token at position p: the block [anchor, noise × (γ − 1)] at positions p + 1 .. p + γ runs
// the stages, each query attending to the window (slots in slot order) and to the whole block;
// base logits from the last stage's norm and the target's head, then position by position the
// Markov head's bias of the token before and the token chosen; confidence logits from the
// collapsed hidden and the Markov embedding.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "forward/model.h"
#include "forward/sequence_state.h"

namespace dsv41 {

class Comm;  // forward/comm.h

// The drafter's context KV for rows at positions first_pos, first_pos + 1, ... from their context
// features [rows, targets, dim] (ForwardOptions::dspark_hidden of the target's call): the last W
// rows' entries into each stage's window (model.py forward_spec at start_pos 0, and the main_kv
// step of DSparkAttention at every later one).
void dspark_ingest(const Model& model, SequenceState& state, int64_t first_pos, std::span<const float> hidden, int64_t rows);

// A draft block: tokens [anchor, d_1 .. d_γ], logits [γ, vocab] (base logits plus the Markov bias,
// fp32), confidence [γ] (raw logits: c_k = σ(confidence_k)).
struct Draft {
  std::vector<int> tokens;
  std::vector<float> logits, confidence;
};

// Picks a draft token from a row of logits (greedy: the first maximum, as torch's argmax).
using DraftChoice = std::function<int(std::span<const float> logits)>;
int draft_argmax(std::span<const float> logits);

// A draft block's tokens, [anchor, noise × (γ − 1)], for a sequence of `length` tokens run: refused
// by name without DSpark stages, before the first token, or with an anchor off the vocabulary.
// Both executors' dspark_draft start from it.
std::vector<int> draft_block_tokens(const Config& c, int64_t length, int anchor);

// The draft after the state's last token (position state.length - 1, ingested), `anchor` the
// token the target chose for position state.length. Reads the state's drafter windows; changes
// nothing in it. A rank's part of a model (model/partition.h) drafts with the other ranks at its
// collectives `comm`; rank 0 chooses each token (`choose` is called there only) and hands it out.
Draft dspark_draft(const Model& model, SequenceState& state, int anchor, const DraftChoice& choose = draft_argmax,
                   Comm* comm = nullptr);

}  // namespace dsv41
