#pragma once
// A forward call's plan, made once per call before any arithmetic and executed alike by every
// executor (forward.cpp on the CPU, device_forward.cu on CUDA). Everything about a call that follows
// from its row counts, its options and the sequences' counters, not from the activations:
//  * where each item's rows sit, and which leave the call at the decoder start (the CED cut of
//    decoder bounded replay: the decoder runs on positions >= decoder_from only);
//  * which rows only regenerate SWA KV (a replay up to replay_until: the encoder's in default mode,
//    every layer's in exact mode);
//  * the window floors of the item's encoder and decoder layers;
//  * per kv-source layer, the positions its compressor runs on, the groups they close and where
//    their entries go;
//  * the rows that return logits;
// and the one rule by which a sequence's counters advance (advance()), for every executor's state.
// A state is any type with the counters of SequenceState (forward/sequence_state.h): length, the
// two window floors, and per kv-source layer in `compressed` its entries and open rows (pending).
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "base/error.h"
#include "forward/forward.h"
#include "model/config.h"

namespace dsv41 {

// One kv-source layer's compressor in one item of a call.
struct CompressorPlan {
  int ratio = 1;
  int64_t first_pos = 0, rows = 0;  // it runs on positions [first_pos, first_pos + rows)
  int pending_before = 0;           // rows of the open group before the call (ratio > 1)
  int pending_after = 0;            // and after it
  int64_t entries_before = 0;       // entries before the call: the new ones go from here on
  int64_t groups = 0;               // entries the call adds
  int64_t entries_after() const { return entries_before + groups; }
  // The position of new entry g: its group's first token.
  int64_t group_pos(int64_t g) const { return ratio == 1 ? first_pos + g : first_pos - pending_before + g * ratio; }
};

struct ItemPlan {
  int64_t start = 0, rows = 0;   // the call's positions [start, start + rows)
  int64_t replay_until = 0;      // encoder replay: positions before it regenerate SWA KV only; 0 = none
  int64_t decoder_from = 0;      // the decoder layers run on positions >= it
  int64_t cut = 0;               // rows that leave the call at the decoder start
  int64_t encoder_floor = 0;     // window floor of the encoder layers (positions below it are empty)
  int64_t decoder_floor = 0;     // and of the decoder layers
  int64_t logits_first = 0;      // the rows giving logits, counted from the decoder's first row
  int64_t logits_rows = 0;
  std::map<int, CompressorPlan> compressors;  // by kv-source layer

  int64_t decoder_rows() const { return rows - cut; }
  // Whether kv-source l's compressor ran at the CED cut (network.h), not in l's attention.
  bool compressed_at_cut(int l, int decoder_start) const { return l == decoder_start && cut > 0; }
  // The window floor of layer l's attention (decoder layers from decoder_start on).
  int64_t window_floor(int l, int decoder_start) const { return l >= decoder_start ? decoder_floor : encoder_floor; }
  int64_t end() const { return start + rows; }
};

// Where default mode's decoder starts in a prompt segment of n tokens ending at `end` (decoder
// bounded replay, DESIGN §3): its last min(W, n) positions. The engine's prompts and the trainer's
// simulated ones (src/train/model) both take it.
inline int64_t default_prompt_decoder_from(int64_t end, int64_t n, int64_t W) { return end - std::min(W, n); }

// The plan of `rows` tokens appended to `state` under `options`. Throws dsv41::Error, naming what
// it found, for options the state cannot take (a replay_until outside the call's positions).
template <class State>
ItemPlan plan_item(const Config& c, const State& state, int64_t rows, const ForwardOptions& options) {
  ItemPlan p;
  p.start = state.length;
  p.rows = rows;
  if (options.replay_until > 0) {
    if (options.replay_until <= p.start || options.replay_until > p.end())
      fail("forward", "replay_until inside the call's positions (" + std::to_string(p.start) + ", " + std::to_string(p.end()) + "]",
           std::to_string(options.replay_until));
    p.replay_until = options.replay_until;
  }
  if (options.exact_replay && (p.replay_until == 0 || options.decoder_from > 0 || options.keep_replayed_rows))
    fail("forward", "an exact replay with a replay_until, in exact mode (decoder_from 0, no keep_replayed_rows)",
         "replay_until " + std::to_string(options.replay_until) + ", decoder_from " + std::to_string(options.decoder_from));
  // A replay truncates the windows of the layers it reruns at the call's start, where the SWA KV
  // begins: the encoder's, and in exact mode the decoder's too.
  p.encoder_floor = p.replay_until > 0 ? p.start : state.encoder_window_floor;
  p.decoder_from = options.decoder_rows_from();
  p.decoder_floor = std::max(state.decoder_window_floor, options.exact_replay ? p.start : p.decoder_from);
  p.cut = options.keep_replayed_rows ? 0 : std::clamp<int64_t>(p.decoder_from - p.start, 0, rows);
  const int64_t left = p.decoder_rows();
  p.logits_rows = left == 0 ? 0 : options.all_logits ? left : 1;
  p.logits_first = left - p.logits_rows;

  const int ds = c.decoder_start();
  for (const auto& [layer, cache] : state.compressed) {
    CompressorPlan& g = p.compressors[layer];
    g.ratio = c.compress_ratios[size_t(layer)];
    // The encoder's kv-sources and the decoder's first (it compresses the stream entering the
    // decoder, the cut rows included) see every row from the replay's end; later decoder ones only
    // the rows the decoder runs, from the replay's end too.
    const int64_t from = std::max(layer > ds ? p.start + p.cut : p.start, p.replay_until);
    g.first_pos = std::min(from, p.end());
    g.rows = p.end() - g.first_pos;
    g.pending_before = cache.pending;
    g.entries_before = cache.entries;
    const int64_t staged = (g.ratio == 1 ? 0 : cache.pending) + g.rows;
    g.groups = g.ratio == 1 ? g.rows : staged / g.ratio;
    g.pending_after = g.ratio == 1 ? 0 : int(staged % g.ratio);
  }
  return p;
}

// The one rule by which a state's counters follow a call: the tokens run, the window floors, and
// each compressor's entries and open rows. Executors write the cache bytes; this, the counts.
template <class State>
void advance(State& state, const ItemPlan& p) {
  state.length = p.end();
  state.encoder_window_floor = p.encoder_floor;
  state.decoder_window_floor = p.decoder_floor;
  for (auto& [layer, cache] : state.compressed) {
    const CompressorPlan& g = p.compressors.at(layer);
    cache.entries = g.entries_after();
    cache.pending = g.pending_after;
  }
}

}  // namespace dsv41
