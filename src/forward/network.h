#pragma once
// The V4.1 network, written once (DESIGN §3): the layer loop of model.py's Transformer.forward with
// single-pass mHC, the CED cut of decoder bounded replay, the trace, and the head. Each executor
// runs it over its own op set (`Ops`: forward.cpp's on the CPU, device_forward.cu's on CUDA; the
// trainer's, src/train/model/train_ops.h, records each op's backward as it runs), whose
// rows are one call's (its items' rows one after another) and whose state is the call's plan
// (call_plan.h). What an op set must offer:
//
//   rows()                     rows still running (bounded replay drops some at the decoder start)
//   embed()                    the residual X: hc copies of each token's embedding; the FFN mix slot
//                              holds the one-hot e0 as the first attention input's `pre`
//   mix(l, s)                  sub-layer s's mixes (pre, post, comb) of X, from layer l's hc weights
//   input(l, s)                h = norm_s(hc_pre(X, pre)), pre being the mix of the sub-layer before
//                              s (the FFN's for attention, the attention's for the FFN)
//   write_back(s)              X = hc_post(y, X, post_s, comb_s)
//   boundary(l, from, to)      write_back(from); mix(l, to); input(l, to) — one op, so that an
//                              executor may fuse it (CUDA's Mega-mHC: the residual read and written once)
//   engram(l), attention(l), moe(l)   the sub-layers (y from h; Engram updates X itself); an op
//                              set's attention(l) is attention() below over its attention ops
//   cuts_rows(), compress_cut(l), drop_cut()   decoder bounded replay at the decoder start (below)
//   impose_input(l), record_block(l)  the Trace's layer inputs and block outputs
//   records_targets(), record_target(l)  DSpark's context feature: the residual entering target
//                              layer l, averaged over the streams (ForwardOptions::dspark_hidden)
//   logits()                   the plan's logits rows through hc_pre, the final norm and the head
//   draft_head()               (run_drafter) a draft block's rows through hc_pre, DSpark's norm and
//                              the head: the base logits before the Markov steps (forward/dspark.h)
#include "forward/forward.h"
#include "model/config.h"

namespace dsv41 {

// The two sub-layers of a block, each with its own mHC mixes.
enum class Sub { Attention, Ffn };

// Attention (model.py Attention.forward), y from h. The op set brings the tensors (Ops::Tensor,
// [rows, ...]) and the ops on them; what reads a sequence's own KV is its own (the executors'
// backend-specific attention): the window entries of the call and the ring, the compressor, the
// indexer, and sparse attention over both kinds of entries.
//   heads()                 the query heads this op set computes: n_heads, or a rank's part of
//                           them (model/partition.h), whose weights hold only those heads' rows
//   linear(x, w), rms_norm(x, cols, w), rope(x, l, heads, head_dim, inverse)   per row, at its position
//   window_entries(l, kv)   this call's SWA-FP8 window entries, from kv (its values become theirs)
//   compress(l), index(l, qr)   CSA2: a kv-source's new entries; an index source's top-k per row
//   attend(l, q, kv)        o: each row over its window and the compressed entries chosen, with the sink
//   keep_window(l, kv)      the ring keeps the call's last W entries
//   linear_grouped(o, wo_a) the grouped low-rank output of the heads' groups
//   output(x, wo_b)         y = wo_b(x): on a rank, over its columns, summed over the ranks, then rounded
template <class Ops>
void attention(const Config& c, Ops& ops, int l) {
  const auto& a = ops.layer(l).attn;  // AttentionWeights, or the trainer's parameters of the same fields
  const int H = ops.heads();
  const int64_t hd = c.head_dim;
  // The query through its low-rank path, RoPE'd on each head's last rope_head_dim values.
  typename Ops::Tensor qr = ops.linear(ops.h(), a.wq_a);
  ops.rms_norm(qr, c.q_lora_rank, a.q_norm);
  typename Ops::Tensor q = ops.linear(qr, a.wq_b);
  ops.rope(q, l, H, hd, false);
  // This call's window entries: kv_norm(wkv(h)), RoPE'd, SWA-FP8.
  typename Ops::Tensor kv = ops.linear(ops.h(), a.wkv);
  ops.rms_norm(kv, hd, a.kv_norm);
  ops.rope(kv, l, 1, hd, false);
  ops.window_entries(l, kv);
  if (c.compress_ratios[size_t(l)] > 0) {
    if (c.is_kv_source(l)) ops.compress(l);
    if (c.is_index_source(l)) ops.index(l, qr);
  }
  typename Ops::Tensor o = ops.attend(l, q, kv);
  ops.rope(o, l, H, hd, /*inverse=*/true);
  ops.keep_window(l, kv);
  // Grouped low-rank output: wo_a per head group, then wo_b.
  ops.output(ops.linear_grouped(o, a.wo_a), a.wo_b);
}

// A block's two sub-layers, its input ready (single-pass mHC: the attention reads the streams with
// the `pre` the block before computed; the FFN with the `pre` the attention computed).
template <class Ops>
void block(Ops& ops, int l) {
  ops.attention(l);
  ops.boundary(l, Sub::Attention, Sub::Ffn);
  ops.moe(l);
}

template <class Ops>
void run_network(const Config& c, Ops& ops, const Trace* trace) {
  const int ds = c.decoder_start();
  const auto imposed = [&](int l) { return l > 0 && trace && trace->forced_streams; };
  // Where a boundary may run as one op: not before a layer with Engram (which updates the streams
  // first), nor at the decoder's start (where bounded replay drops rows), nor before imposed inputs.
  const auto fusable = [&](int l) { return l < c.n_layers && l != ds && !c.is_engram_layer(l) && !imposed(l); };

  ops.embed();
  bool entered = false;  // this layer's attention input is ready (the previous boundary made it)
  for (int l = 0; l < c.n_layers; ++l) {
    if (l == ds && ops.cuts_rows()) {
      // Decoder bounded replay (DESIGN §3): the cut rows run the encoder and the decoder's KV
      // projection only — the decoder's first kv-source compresses the collapsed stream entering
      // it, the cut rows included — then leave the call.
      ops.input(ds, Sub::Attention);
      ops.compress_cut(ds);
      ops.drop_cut();
      if (ops.rows() == 0) break;
    }
    if (!entered) {
      if (imposed(l)) ops.impose_input(l);
      if (c.is_engram_layer(l)) ops.engram(l);
      ops.mix(l, Sub::Attention);
      ops.input(l, Sub::Attention);
    }
    if (ops.records_targets() && c.dspark_target_index(l) >= 0) ops.record_target(l);
    block(ops, l);
    entered = fusable(l + 1);
    if (entered) ops.boundary(l + 1, Sub::Ffn, Sub::Attention);
    else ops.write_back(Sub::Ffn);
    if (trace) ops.record_block(l);
  }
  ops.logits();
}

// DSpark's draft (model.py forward_spec after the first call, forward/dspark.h): the block's rows
// [anchor, noise × (γ − 1)] through the stages (mtp.<j>, layer ids n_layers + j), blocks as the
// backbone's with no Engram, compression or cut, whose attention is the op set's DSpark attention;
// then the op set's draft head.
template <class Ops>
void run_drafter(const Config& c, Ops& ops) {
  ops.embed();
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    ops.mix(l, Sub::Attention);
    ops.input(l, Sub::Attention);
    block(ops, l);
    ops.write_back(Sub::Ffn);
  }
  ops.draft_head();
}

}  // namespace dsv41
