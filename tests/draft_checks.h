#pragma once
// Checks shared by the DSpark and speculative-decoding tests (CPU and device): a row's deviation
// from another with that row's top-2 margin (what tells a flipped near-tie from a wrong token),
// drafts' logits laid end to end, and the near-tie check of drafts against a fixture's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forward/dspark.h"
#include "forward/executor.h"
#include "forward/forward.h"
#include "numerics/codecs.h"
#include "forward_fixture.h"

namespace dsv41::test {

// How far row a parts from row b (the largest difference) and b's top-1 over top-2 margin.
struct RowGap {
  double deviation = 0, margin = 0;
};
inline RowGap row_gap(const float* a, const float* b, int64_t width) {
  double deviation = 0, top = -INFINITY, second = -INFINITY;
  for (int64_t v = 0; v < width; ++v) {
    deviation = std::max(deviation, std::fabs(double(a[v]) - double(b[v])));
    if (b[v] > top) second = top, top = b[v];
    else second = std::max(second, double(b[v]));
  }
  return {deviation, top - second};
}

inline std::vector<float> logits_of(const std::vector<Draft>& drafts) {
  std::vector<float> out;
  for (const Draft& d : drafts) out.insert(out.end(), d.logits.begin(), d.logits.end());
  return out;
}

// Every draft that parts from the reference's does so first at a near-tie: the reference's top-1
// over top-2 margin on the logits row that chose the first differing token is within twice our
// largest deviation on that row. (After it, the Markov head reads another token: the rest of the
// block may differ freely.)
inline void expect_tokens_differ_at_near_ties(const Fixture& f, int prompt, const std::vector<Draft>& ours, const std::string& what) {
  const int64_t V = f.config().vocab_size, G = f.config().dspark_block_size;
  const std::vector<int64_t> tokens = f.ex.ints(f.prefix(prompt) + "decode.spec_tokens");
  const std::vector<float> logits = f.ex.floats(f.prefix(prompt) + "decode.spec_logits");
  for (size_t k = 0; k < ours.size(); ++k) {
    EXPECT_EQ(ours[k].tokens[0], tokens[k * (G + 1)]) << what << " step " << k << ": the anchor";
    for (int64_t i = 1; i <= G; ++i) {
      if (ours[k].tokens[size_t(i)] == tokens[k * (G + 1) + i]) continue;
      const RowGap gap = row_gap(ours[k].logits.data() + (i - 1) * V, logits.data() + (int64_t(k) * G + i - 1) * V, V);
      EXPECT_LE(gap.margin, 2 * gap.deviation) << what << " step " << k << " draft " << i << ": not a near-tie";
      break;
    }
  }
}

// The decoder-floor tests' sequence (DraftsReadNoSlotBelowTheDecoderFloor, CPU and device): a
// fixture's prompt 1, lengthened to 2W + 3 tokens (the stages' rings wrapped), run and ingested on
// the CPU executor's forward. The fixture must take tokens without Engram hash ids.
inline SequenceState floor_test_state(const Fixture& f) {
  const Config& c = f.config();
  SequenceState state(c);
  std::vector<float> hidden;
  ForwardOptions opt;
  opt.dspark_hidden = &hidden;
  std::vector<int> tokens = f.tokens(1);
  while (int64_t(tokens.size()) < 2 * c.window_size + 3) tokens.push_back(int((tokens[tokens.size() % 7] + 1) % c.vocab_size));
  forward(*f.model, state, tokens, nullptr, opt);
  dspark_ingest(*f.model, state, 0, hidden, int64_t(tokens.size()));
  return state;
}

// `state` with every stage slot that holds a position in [length − W, below) overwritten by the
// last position's entry, and its decoder window floor set to `floor`.
inline SequenceState scribbled(const Config& c, const SequenceState& state, int64_t below, int64_t floor) {
  SequenceState s = state;
  const int64_t W = c.window_size, end = state.length;
  const size_t bytes = swa_fp8::bytes(int(c.head_dim));
  for (int l = c.n_layers; l < c.n_total_layers(); ++l)
    for (int64_t p = end - W; p < below; ++p)
      std::copy_n(state.window[size_t(l)].begin() + int64_t(((end - 1) % W) * bytes), bytes, s.window[size_t(l)].begin() + int64_t((p % W) * bytes));
  s.decoder_window_floor = floor;
  return s;
}

// A prompt's drafts on `executor` after each decode step, the target's choices the reference's
// (force) or its own: the prefill in chunks of `chunk` tokens (0: at once), then the
// teacher-forced decode tokens, each call's context features ingested (as a session with drafting
// on does), each draft greedy. `final_state`, when set, receives the sequence's host state.
inline std::vector<Draft> run_drafts(Executor& executor, const Fixture& f, int prompt, bool force, int64_t chunk = 0,
                                     SequenceState* final_state = nullptr) {
  const std::string p = f.prefix(prompt);
  const std::vector<int> tokens = f.tokens(prompt);
  const std::vector<int64_t> prefill_ids = f.hashes(prompt), decode_ids = f.hashes(prompt, true);
  std::unique_ptr<Sequence> sequence = executor.new_sequence();
  std::vector<float> hidden;
  auto call = [&](std::span<const int> t, const int64_t* ids, bool decode, int64_t first) {
    Trace trace;
    Choices choices;
    ForwardOptions opt;
    opt.dspark_hidden = &hidden;
    if (force) {
      choices = f.recorded(prompt, decode, first, int64_t(t.size()));
      trace.forced_topk = &choices.topk;
      trace.forced_experts = &choices.experts;
      opt.trace = &trace;
    }
    const int64_t at = sequence->length();
    executor.forward_batch({BatchItem{sequence.get(), t, ids, opt}});
    executor.dspark_ingest(*sequence, at, hidden, int64_t(t.size()));
  };
  const int64_t P = int64_t(tokens.size()), step = chunk > 0 ? chunk : P;
  for (int64_t s = 0; s < P; s += step) {
    const int64_t n = std::min(step, P - s);
    call(std::span<const int>(tokens).subspan(size_t(s), size_t(n)), f.ids(prefill_ids, s), false, s);
  }
  const std::vector<int64_t> decode = f.ex.ints(p + "decode.tokens"), next = f.ex.ints(p + "decode.next_tokens");
  std::vector<Draft> out;
  for (size_t k = 0; k < decode.size(); ++k) {
    const int t = int(decode[k]);
    call(std::span<const int>(&t, 1), f.ids(decode_ids, int64_t(k)), true, int64_t(k));
    out.push_back(executor.dspark_draft(*sequence, int(next[k]), draft_argmax));
  }
  if (final_state) *final_state = sequence->host();
  return out;
}

}  // namespace dsv41::test
