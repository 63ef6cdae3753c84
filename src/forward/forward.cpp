#include "forward/forward.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/compressor.h"
#include "backend/cpu/engram.h"
#include "backend/cpu/indexer.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/mhc.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/norm.h"
#include "backend/cpu/sparse_attention.h"
#include "base/error.h"
#include "forward/call_plan.h"
#include "forward/comm.h"
#include "forward/dspark.h"
#include "forward/network.h"
#include "forward/window.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {

namespace {

using Rows = std::vector<float>;

// One forward call of one sequence, as its plan (call_plan.h) lays it out. Sources hand their
// results down the stack here (model.py SharedAttentionRuntime): the latest index source's top-k,
// and the candidate source's block mask.
struct Pass {
  const Model& model;
  const Config& c;
  SequenceState& state;
  const ItemPlan& plan;
  int64_t start, rows;  // the rows still running: decoder bounded replay drops the first ones
  Trace* trace;
  const float* const* spans;                     // ForwardOptions::span_embeddings, from the first running row
  std::vector<float>* hidden;                    // ForwardOptions::dspark_hidden
  bool draft;                                    // a DSpark draft block: the stages' attention
  std::vector<std::vector<int64_t>> topk;        // [row] compressed entries attended, -1 = none
  std::vector<std::vector<uint8_t>> candidates;  // [row] mask over compressed entries
  Comm* comm = nullptr;                          // a rank's collectives (ForwardOptions::comm)

  int64_t pos(int64_t row) const { return start + row; }
  bool in_span(int64_t row) const { return spans && spans[row]; }
  float eps() const { return float(c.norm_eps); }
  const Partition& part() const { return model.partition(); }
  int heads() const { return c.n_heads / part().world; }  // the query heads this rank computes
  // model.py's dist.all_reduce: the ranks' x summed (nothing on a whole model).
  void all_reduce(Rows& x) const {
    if (comm) comm->all_reduce_sum(x);
  }
};

// The collectives a call on `model` meets the other ranks at: none on a whole model; on a rank's
// part, `comm`, which must be that rank's (dsv41::Error naming what `where` was given otherwise).
Comm* rank_comm(const Model& model, Comm* comm, const char* where) {
  const Partition& part = model.partition();
  if (part.whole()) return nullptr;
  if (!comm || comm->world() != part.world || comm->rank() != part.rank)
    fail(where, "the collectives of rank " + std::to_string(part.rank) + " of " + std::to_string(part.world) + " for a rank's part of the model",
         comm ? "rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->world()) : "none");
  return comm;
}

Rows linear_rows(const Rows& x, int64_t rows, const Weight& w) {
  Rows y(size_t(rows * w.rows));
  linear(x.data(), rows, w, y.data());
  return y;
}

Rows normed_linear(const Rows& x, int64_t rows, const Weight& w, const Weight& norm, float eps) {
  Rows y = linear_rows(x, rows, w);
  rms_norm(y.data(), rows, w.rows, &norm, eps, y.data());
  return y;
}

// --- CSA2: the compressor of a kv-source layer ------------------------------------------------------

// Runs the compressor over the positions its plan gives (call_plan.h: encoder bounded replay leaves
// out the rows whose global KV is already cached, to be read, never rewritten) and writes every
// group they close into the layer's cache: the index key (from the latent before RoPE) and the
// main KV entry (after RoPE), at the entries the plan places them. advance() counts them.
void compress(Pass& p, int l, const Rows& x) {
  const Config& c = p.c;
  const AttentionWeights& a = p.model.layer(l).attn;
  const RopeTable& rope = p.model.rope(l);
  const CompressorPlan& g = p.plan.compressors.at(l);
  const int ratio = g.ratio;
  const int64_t hd = c.head_dim, rd = c.rope_head_dim, ihd = c.index_head_dim, rows = g.rows;
  CompressedCache& cache = p.state.compressed.at(l);
  if (rows == 0) return;
  const int64_t first = g.first_pos - p.start;  // x's row of the first position
  const Rows xs(x.begin() + first * c.dim, x.begin() + (first + rows) * c.dim);

  // New latents (pre-RoPE, bf16 values), one per group the call closes.
  Rows latents;
  if (ratio == 1) {
    latents = normed_linear(xs, rows, a.compressor_wkv, a.compressor_norm, p.eps());
  } else {
    // Gated pooling in fp32 over each group of `ratio` tokens; the open group waits in the cache.
    Rows kv(size_t(rows * hd)), score(size_t(rows * hd));
    linear_f32(xs.data(), rows, a.compressor_wkv, kv.data());
    linear_f32(xs.data(), rows, a.compressor_wgate, score.data());
    cache.pending_kv.resize(size_t(ratio * hd));
    cache.pending_score.resize(size_t(ratio * hd));
    Rows pooled(static_cast<size_t>(hd));
    int open = g.pending_before;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(kv.data() + r * hd, hd, cache.pending_kv.data() + open * hd);
      std::copy_n(score.data() + r * hd, hd, cache.pending_score.data() + open * hd);
      if (++open < ratio) continue;
      pool_group(cache.pending_kv.data(), cache.pending_score.data(), ratio, int(hd), pooled.data());
      for (float& v : pooled) v = round_bf16(v);
      latents.resize(latents.size() + size_t(hd));
      rms_norm(pooled.data(), 1, hd, &a.compressor_norm, p.eps(), latents.data() + latents.size() - hd);
      open = 0;
    }
  }
  if (g.groups == 0) return;

  // Index keys: k = RoPE(k_norm(wk(latent))), stored MXFP4.
  Rows k = normed_linear(latents, g.groups, a.indexer_wk, a.indexer_k_norm, p.eps());
  const GlobalKvFormat format = p.state.global_kv;
  const size_t key_bytes = mxfp4::bytes(int(ihd)), entry_bytes = global_kv_entry_bytes(format, int(hd));
  cache.index_k.resize(size_t(g.entries_after()) * key_bytes);
  cache.kv.resize(size_t(g.entries_after()) * entry_bytes);
  for (int64_t e = 0; e < g.groups; ++e) {
    float* key = k.data() + e * ihd;
    rope.apply(key + ihd - rd, g.group_pos(e));
    mxfp4::encode(key, int(ihd), cache.index_k.data() + size_t(g.entries_before + e) * key_bytes);
    // Main KV: the latent, RoPE'd at its group's first position, stored KV-FP4 (or the state's format).
    float* latent = latents.data() + e * hd;
    rope.apply(latent + hd - rd, g.group_pos(e));
    encode_global_kv(format, latent, int(hd), cache.kv.data() + size_t(g.entries_before + e) * entry_bytes);
  }
}

// --- CSA2: the indexer of an index-source layer -----------------------------------------------------

void index(Pass& p, int l, const Rows& x, const Rows& qr) {
  const Config& c = p.c;
  const AttentionWeights& a = p.model.layer(l).attn;
  const RopeTable& rope = p.model.rope(l);
  const int ratio = c.compress_ratios[size_t(l)];
  const int heads = c.index_n_heads, ihd = c.index_head_dim, rd = c.rope_head_dim;
  const int local = heads / p.part().world;  // this rank's heads: its part of the score of each entry
  const CompressedCache& cache = p.state.compressed.at(c.kv_source_of(l));
  const int64_t n = p.plan.compressors.at(c.kv_source_of(l)).entries_after();  // every entry this call can see
  const bool candidate_source = l == c.candidate_source_layer;
  const bool uses_candidates = c.candidate_source_layer >= 0 && l > c.candidate_source_layer;

  Rows keys(size_t(n * ihd));
  for (int64_t t = 0; t < n; ++t) mxfp4::decode(cache.index_k.data() + t * mxfp4::bytes(ihd), ihd, keys.data() + t * ihd);
  Rows q = linear_rows(qr, p.rows, a.indexer_wq_b);
  Rows w = linear_rows(x, p.rows, a.indexer_weights_proj);
  const float weight_scale = float(std::pow(double(ihd), -0.5) * std::pow(double(heads), -0.5));

  p.topk.assign(size_t(p.rows), {});
  if (candidate_source) p.candidates.assign(size_t(p.rows), {});
  // The rows' scores a chunk at a time (16 MB of them), summed over the ranks' heads before any
  // row chooses (model.py: dist.all_reduce(index_score)), then rounded as the whole model's are.
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(n, 1));
  Rows scores;
  for (int64_t r0 = 0; r0 < p.rows; r0 += chunk) {
    const int64_t r1 = std::min(p.rows, r0 + chunk);
    scores.resize(size_t((r1 - r0) * n));
    for (int64_t r = r0; r < r1; ++r) {
      float* qh = q.data() + r * local * ihd;
      for (int h = 0; h < local; ++h) {
        rope.apply(qh + h * ihd + ihd - rd, p.pos(r));
        mxfp4::quantize_dequantize(qh + h * ihd, ihd);
      }
      float* wr = w.data() + r * local;
      for (int h = 0; h < local; ++h) wr[h] = round_bf16(wr[h] * weight_scale);
      index_scores(qh, wr, local, ihd, keys.data(), n, scores.data() + (r - r0) * n, /*round_sum=*/!p.comm);
    }
    if (p.comm) {
      p.all_reduce(scores);
      for (float& s : scores) s = round_bf16(s);
    }
    for (int64_t r = r0; r < r1; ++r) {
      float* row = scores.data() + (r - r0) * n;
      const int64_t visible = (p.pos(r) + 1) / ratio;
      for (int64_t t = visible; t < n; ++t) row[t] = -INFINITY;
      if (candidate_source) {
        p.candidates[r] = candidate_mask(row, n, visible, c.candidate_topk_blocks, c.candidate_block_size);
      } else if (uses_candidates) {
        for (int64_t t = 0; t < n; ++t)
          if (!p.candidates[r][t]) row[t] = -INFINITY;
      }
      std::vector<int64_t> chosen = top_positions(row, n, std::min<int64_t>(c.index_topk, n));
      for (int64_t& t : chosen)
        if (t >= visible) t = -1;  // not yet visible to this query: an empty slot (sorted last)
      if (p.trace && p.trace->forced_topk && p.trace->forced_topk->count(l)) chosen = p.trace->forced_topk->at(l).at(r);
      p.topk[r] = std::move(chosen);
    }
  }
  if (p.trace) p.trace->topk[l] = p.topk;
}

// --- attention: what is the CPU's own (the rest is the network's, network.h) -----------------------

// Entries of earlier calls, from the ring (slot = position mod W); this call's from kv, already
// SWA-FP8 values (window_entries); and the compressed entries the rows chose. Returns o [rows, H, hd].
Rows attend(Pass& p, int l, const Rows& q, const Rows& kv) {
  const Config& c = p.c;
  const AttentionWeights& a = p.model.layer(l).attn;
  const int64_t H = p.heads(), hd = c.head_dim, W = c.window_size, R = p.rows;
  const int ratio = c.compress_ratios[size_t(l)];
  const std::vector<uint8_t>& ring = p.state.window[size_t(l)];
  const size_t slot_bytes = swa_fp8::bytes(int(hd));
  Rows ring_kv;
  if (p.start > 0) {
    ring_kv.resize(size_t(W * hd));
    for (int64_t s = 0; s < W; ++s) swa_fp8::decode(ring.data() + s * slot_bytes, int(hd), ring_kv.data() + s * hd);
  }

  // Decode only the entries some row attends to: at most rows × top-k of them, not the whole
  // (context-long) cache, and not once more for every Reuse layer than the top-k requires.
  Rows compressed_kv;
  if (ratio > 0) {
    const CompressedCache& cache = p.state.compressed.at(c.kv_source_of(l));
    const int64_t entries = p.plan.compressors.at(c.kv_source_of(l)).entries_after();
    compressed_kv.resize(size_t(entries * hd));
    std::vector<uint8_t> decoded(size_t(entries), 0);
    for (const std::vector<int64_t>& row : p.topk)
      for (int64_t t : row)
        if (t >= 0 && !decoded[size_t(t)]) {
          decoded[size_t(t)] = 1;
          decode_global_kv(p.state.global_kv, cache.kv.data() + t * global_kv_entry_bytes(p.state.global_kv, int(hd)), int(hd),
                           compressed_kv.data() + t * hd);
        }
  }

  const int64_t floor = p.plan.window_floor(l, c.decoder_start());
  Rows sink(static_cast<size_t>(H)), o(size_t(R * H * hd));
  a.attn_sink.row(0, sink.data());
  const float scale = float(std::pow(double(hd), -0.5));
  // Rows are independent here: each thread lists its own row's entries.
#pragma omp parallel for schedule(dynamic, 1) if (R > 1)
  for (int64_t r = 0; r < R; ++r) {
    thread_local std::vector<const float*> entries;
    thread_local std::vector<int64_t> slots;
    entries.clear();
    window_positions(p.pos(r), p.start, R, W, floor, slots);
    for (int64_t t : slots)
      entries.push_back(t == kEmptySlot ? nullptr
                        : t < p.start   ? ring_kv.data() + (t % W) * hd
                                        : kv.data() + (t - p.start) * hd);
    if (ratio > 0)
      for (int64_t t : p.topk[r]) entries.push_back(t < 0 ? nullptr : compressed_kv.data() + t * hd);
    sparse_attention(q.data() + r * H * hd, int(H), int(hd), entries, sink.data(), scale, o.data() + r * H * hd);
  }
  return o;
}

// DSpark's attention (model.py DSparkAttention): each row of the draft block attends to the
// stage's window of context KV — slots 0 .. min(W, p.start) − 1 in slot order (the reference's
// list; p.start is the block's first position, one past the last context token), none below the
// decoder window floor (forward/window.h draft_window_slots) — and then to every row of the
// block, both ways.
Rows attend_draft(Pass& p, int l, const Rows& q, const Rows& kv) {
  const Config& c = p.c;
  const int64_t H = p.heads(), hd = c.head_dim, W = c.window_size, R = p.rows;
  const std::vector<uint8_t>& ring = p.state.window[size_t(l)];
  std::vector<int64_t> slots;
  draft_window_slots(p.start, W, p.state.decoder_window_floor, slots);
  Rows context(size_t(int64_t(slots.size()) * hd)), sink(static_cast<size_t>(H)), o(size_t(R * H * hd));
  std::vector<const float*> entries;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] == kEmptySlot) continue;
    swa_fp8::decode(ring.data() + slots[i] * swa_fp8::bytes(int(hd)), int(hd), context.data() + int64_t(i) * hd);
    entries.push_back(context.data() + int64_t(i) * hd);
  }
  for (int64_t r = 0; r < R; ++r) entries.push_back(kv.data() + r * hd);
  p.model.layer(l).attn.attn_sink.row(0, sink.data());
  const float scale = float(std::pow(double(hd), -0.5));
  for (int64_t r = 0; r < R; ++r) sparse_attention(q.data() + r * H * hd, int(H), int(hd), entries, sink.data(), scale, o.data() + r * H * hd);
  return o;
}

// Grouped low-rank output: group g's heads (o [rows, G, in_g]) through wo_a's rows [g·r, (g+1)·r)
// (a rank's groups: its heads').
Rows linear_grouped(const Pass& p, const Rows& o, const Weight& wo_a) {
  const int64_t G = p.c.o_groups / p.part().world, olr = p.c.o_lora_rank, in_g = p.c.n_heads * p.c.head_dim / p.c.o_groups,
                R = p.rows;
  Rows og(size_t(R * in_g)), yg(size_t(R * olr)), ya(size_t(R * G * olr));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = 0; r < R; ++r) std::copy_n(o.data() + r * G * in_g + g * in_g, in_g, og.data() + r * in_g);
    Weight wg = wo_a;
    wg.rows = olr;
    wg.data = wo_a.data + g * olr * in_g * 2;  // bf16 rows
    linear(og.data(), R, wg, yg.data());
    for (int64_t r = 0; r < R; ++r) std::copy_n(yg.data() + r * olr, olr, ya.data() + (r * G + g) * olr);
  }
  return ya;
}

// --- MoE --------------------------------------------------------------------------------------------

void moe(Pass& p, int l, const Rows& x, Rows& out) {
  const Config& c = p.c;
  const LayerWeights& L = p.model.layer(l);
  const int64_t R = p.rows, d = c.dim;
  const GateOptions opt = gate_options(c, l);
  const int k = opt.topk;
  std::vector<int32_t> experts(size_t(R * k));
  Rows weights(size_t(R * k));
  Rows* scores = p.trace ? &p.trace->route_scores[size_t(l)] : nullptr;
  if (scores) scores->resize(size_t(R) * L.experts.size());
  // Rows of an image span choose with bias_vl (the drafter's blocks are text).
  std::vector<uint8_t> image_rows;
  if (p.spans) {
    image_rows.resize(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) image_rows[size_t(r)] = p.in_span(r);
  }
  const Weight* bias_vl = p.spans ? &L.gate_bias_vl : nullptr;
  const uint8_t* vl_rows = p.spans ? image_rows.data() : nullptr;
  route(x.data(), R, L.gate, L.gate_bias, opt, experts.data(), weights.data(), scores ? scores->data() : nullptr, nullptr,
        bias_vl, vl_rows);
  if (p.trace) p.trace->route_experts[size_t(l)] = experts;
  if (p.trace && p.trace->forced_experts) {
    route(x.data(), R, L.gate, L.gate_bias, opt, experts.data(), weights.data(), nullptr,
          p.trace->forced_experts->at(static_cast<size_t>(l)).data(), bias_vl, vl_rows);
  }

  // Each expert runs on the rows routed to it; outputs are added in expert order, in fp32 (a
  // rank: its own experts', then the ranks' sums added, as model.py's dist.all_reduce(y)).
  Rows y(size_t(R * d), 0.0f), xe, ye, we;
  std::vector<int64_t> rows_of;
  const float limit = float(c.swiglu_limit);
  const int64_t E = int64_t(L.experts.size()), first = p.part().first(E);
  for (int e = int(first); e < int(first + p.part().count(E)); ++e) {
    rows_of.clear();
    we.clear();
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < k; ++j)
        if (experts[r * k + j] == e) {
          rows_of.push_back(r);
          we.push_back(weights[r * k + j]);
        }
    if (rows_of.empty()) continue;
    const int64_t n = int64_t(rows_of.size());
    xe.resize(size_t(n * d));
    ye.resize(size_t(n * d));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.data() + rows_of[i] * d, d, xe.data() + i * d);
    const ExpertWeights& ew = L.experts[size_t(e)];
    expert_ffn(xe.data(), n, ew.w1, ew.w2, ew.w3, limit, we.data(), ye.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) y[rows_of[i] * d + j] += ye[i * d + j];
  }
  p.all_reduce(y);
  ye.resize(size_t(R * d));
  expert_ffn(x.data(), R, L.shared.w1, L.shared.w2, L.shared.w3, limit, nullptr, ye.data());
  out.resize(size_t(R * d));
  for (int64_t i = 0; i < R * d; ++i) out[i] = round_bf16(y[i] + ye[i]);
}

// --- Engram -----------------------------------------------------------------------------------------

void engram(Pass& p, int l, const int64_t* ids, Rows& X) {
  const Config& c = p.c;
  const EngramWeights& g = *p.model.layer(l).engram;
  const int n_engram = int(c.engram_layer_ids.size()), cols = c.engram_hash_columns();
  const int e = c.engram_index(l);
  const int64_t hd = c.engram_head_dim, d = c.dim, hc = c.hc_mult, R = p.rows;
  // A rank holds rows [table_first, + table_rows): the others' ids read zeros, and the ranks' rows
  // added give each id its one row (model.py ParallelEngramEmbedding).
  Rows emb(size_t(R * cols * hd), 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < cols; ++j) {
      const int64_t id = ids[(r * n_engram + e) * cols + j] - g.table_first;
      if (id >= 0 && id < g.table_rows) engram_gather(g.table, g.table_scale, hd, &id, 1, emb.data() + (r * cols + j) * hd);
    }
  p.all_reduce(emb);
  Rows kv = linear_rows(emb, R, g.wkv);
  // A row of an image span keeps its streams: the reference shuts its gate (h + 0 · value).
  for (int64_t r = 0; r < R; ++r)
    if (!p.in_span(r)) engram_gate(X.data() + r * hc * d, kv.data() + r * (hc + 1) * d, g.qk.data(), int(hc), d, p.eps());
}

// The CPU's op set for the network (network.h): one sequence's rows in host memory.
class CpuOps {
 public:
  CpuOps(Pass& p, std::span<const int> tokens, const int64_t* engram_ids)
      : p_(p), c_(p.c), model_(p.model), tokens_(tokens), engram_ids_(engram_ids) {}

  int64_t rows() const { return p_.rows; }
  bool cuts_rows() const { return p_.plan.cut > 0; }

  void embed() {
    const int64_t d = c_.dim, hc = c_.hc_mult, R = p_.rows;
    X_.resize(size_t(R * hc * d));
    for (int64_t r = 0; r < R; ++r) {
      const int t = tokens_[size_t(r)];
      if (t < 0 || t >= c_.vocab_size) fail("forward", "token ids in [0, " + std::to_string(c_.vocab_size) + ")", std::to_string(t));
    }
    // A rank holds its part of the vocabulary: the ranks' rows added give each token its one row
    // (model.py ParallelEmbedding).
    const int64_t v0 = p_.part().first(c_.vocab_size), vn = p_.part().count(c_.vocab_size);
    Rows emb(size_t(R * d), 0.0f);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = tokens_[size_t(r)] - v0;
      if (!p_.in_span(r) && t >= 0 && t < vn) model_.embed().row(t, emb.data() + r * d);
    }
    p_.all_reduce(emb);
    for (int64_t r = 0; r < R; ++r) {
      // merge_image_embeddings: an image span's row takes its aligner row or delimiter instead.
      const float* row = p_.in_span(r) ? p_.spans[r] : emb.data() + r * d;
      for (int64_t m = 0; m < hc; ++m) std::copy_n(row, d, X_.data() + (r * hc + m) * d);
    }
    for (Mix& m : mix_) m = Mix{Rows(size_t(R * hc)), Rows(size_t(R * hc)), Rows(size_t(R * hc * hc))};
    for (int64_t r = 0; r < R; ++r) ffn().pre[r * hc] = 1.0f;
    h_.resize(size_t(R * d));
    mixed_.resize(size_t(hc * d));
  }

  void mix(int l, Sub s) {
    const LayerWeights& L = model_.layer(l);
    Mix& m = mix_[size_t(s)];
    hc_mixes(X_.data(), p_.rows, int(c_.hc_mult), c_.dim, s == Sub::Attention ? L.hc_attn : L.hc_ffn, p_.eps(),
             c_.hc_sinkhorn_iters, float(c_.hc_eps), m.pre.data(), m.post.data(), m.comb.data());
  }

  void input(int l, Sub s) {
    const int64_t hc = c_.hc_mult, d = c_.dim;
    const Rows& pre = (s == Sub::Attention ? ffn() : attn()).pre;
    for (int64_t r = 0; r < p_.rows; ++r) hc_pre(X_.data() + r * hc * d, pre.data() + r * hc, int(hc), d, h_.data() + r * d);
    const LayerWeights& L = model_.layer(l);
    dsv41::rms_norm(h_.data(), p_.rows, d, s == Sub::Attention ? &L.attn_norm : &L.ffn_norm, p_.eps(), h_.data());
  }

  // X_r ← hc_post(y_r, X_r): the streams are rewritten from themselves, so through a scratch row.
  void write_back(Sub s) {
    const int64_t hc = c_.hc_mult, d = c_.dim;
    const Mix& m = mix_[size_t(s)];
    for (int64_t r = 0; r < p_.rows; ++r) {
      hc_post(y_.data() + r * d, X_.data() + r * hc * d, m.post.data() + r * hc, m.comb.data() + r * hc * hc, int(hc), d,
              mixed_.data());
      std::copy(mixed_.begin(), mixed_.end(), X_.begin() + r * hc * d);
    }
  }

  void boundary(int l, Sub from, Sub to) {
    write_back(from);
    mix(l, to);
    input(l, to);
  }

  void engram(int l) { dsv41::engram(p_, l, engram_ids_, X_); }
  void attention(int l) { dsv41::attention(c_, *this, l); }
  void moe(int l) { dsv41::moe(p_, l, h_, y_); }

  // The attention's ops (network.h attention()).
  using Tensor = Rows;
  const LayerWeights& layer(int l) const { return model_.layer(l); }
  const Rows& h() const { return h_; }
  int heads() const { return p_.heads(); }
  Rows linear(const Rows& x, const Weight& w) const { return linear_rows(x, p_.rows, w); }
  void rms_norm(Rows& x, int64_t cols, const Weight& w) const { dsv41::rms_norm(x.data(), p_.rows, cols, &w, p_.eps(), x.data()); }
  void rope(Rows& x, int l, int heads, int64_t head_dim, bool inverse) const {
    const RopeTable& rope = model_.rope(l);
    const int64_t rd = c_.rope_head_dim;
    for (int64_t r = 0; r < p_.rows; ++r)
      for (int64_t h = 0; h < heads; ++h) rope.apply(x.data() + (r * heads + h) * head_dim + head_dim - rd, p_.pos(r), inverse);
  }
  // This call's window entries take their SWA-FP8 values (the ring gets them in keep_window).
  void window_entries(int, Rows& kv) const {
    for (int64_t r = 0; r < p_.rows; ++r) swa_fp8::quantize_dequantize(kv.data() + r * c_.head_dim, int(c_.head_dim));
  }
  // (The decoder's first kv-source ran at the cut when rows left there.)
  void compress(int l) {
    if (!p_.plan.compressed_at_cut(l, c_.decoder_start())) dsv41::compress(p_, l, h_);
  }
  void index(int l, const Rows& qr) { dsv41::index(p_, l, h_, qr); }
  Rows attend(int l, const Rows& q, const Rows& kv) { return p_.draft ? attend_draft(p_, l, q, kv) : dsv41::attend(p_, l, q, kv); }
  // The ring keeps the last W entries for the calls to come (a draft block's entries are not kept:
  // the stages' rings hold the target's context, dspark_ingest).
  void keep_window(int l, const Rows& kv) {
    if (p_.draft) return;
    const int64_t hd = c_.head_dim, W = c_.window_size;
    std::vector<uint8_t>& ring = p_.state.window[size_t(l)];
    for (int64_t r = std::max<int64_t>(0, p_.rows - W); r < p_.rows; ++r)
      swa_fp8::encode(kv.data() + r * hd, int(hd), ring.data() + (p_.pos(r) % W) * swa_fp8::bytes(int(hd)));
  }
  Rows linear_grouped(const Rows& o, const Weight& wo_a) const { return dsv41::linear_grouped(p_, o, wo_a); }
  // wo_b over the rank's columns, the ranks' fp32 sums added, then rounded (a whole model: linear()).
  void output(const Rows& x, const Weight& wo_b) {
    y_.resize(size_t(p_.rows * wo_b.rows));
    linear_unrounded(x.data(), p_.rows, wo_b, y_.data());
    p_.all_reduce(y_);
    for (float& v : y_) v = round_bf16(v);
  }

  void compress_cut(int l) { dsv41::compress(p_, l, h_); }

  void drop_cut() {
    const int64_t hc = c_.hc_mult, d = c_.dim, cut = p_.plan.cut;
    // The streams and the `pre` of their next input; the other mixes are made anew before they are read.
    X_.erase(X_.begin(), X_.begin() + cut * hc * d);
    ffn().pre.erase(ffn().pre.begin(), ffn().pre.begin() + cut * hc);
    h_.resize(size_t((p_.rows - cut) * d));
    if (engram_ids_) engram_ids_ += cut * int64_t(c_.engram_layer_ids.size()) * c_.engram_hash_columns();
    if (p_.spans) p_.spans += cut;
    p_.start += cut;
    p_.rows -= cut;
  }

  // Layer-local parity: layer l starts from the imposed streams and mix (Trace::forced_streams).
  void impose_input(int l) {
    const Trace& t = *p_.trace;
    if (!t.forced_pre_mix) fail("forward", "imposed input mixes with the imposed streams", "none");
    const Rows& streams = t.forced_streams->at(size_t(l - 1));
    const Rows& mix = t.forced_pre_mix->at(size_t(l - 1));
    if (streams.size() != X_.size() || mix.size() != ffn().pre.size())
      fail("forward", "imposed inputs of layer " + std::to_string(l) + " for " + std::to_string(p_.rows) + " rows",
           std::to_string(streams.size()) + " stream and " + std::to_string(mix.size()) + " mix values");
    X_ = streams;
    ffn().pre = mix;
  }

  void record_block(int l) { p_.trace->block_out[size_t(l)] = X_; }

  // DSpark's context feature: the residual entering target layer l averaged over the streams,
  // rounded to bf16 as torch's mean of the bf16 streams is (their fp32 sum is exact, the division
  // by hc too for hc a power of two), into its block of the call's [rows, targets, dim].
  bool records_targets() const { return p_.hidden != nullptr; }
  void record_target(int l) {
    const int64_t hc = c_.hc_mult, d = c_.dim, T = int64_t(c_.dspark_target_layer_ids.size()), R = p_.rows;
    std::vector<float>& out = *p_.hidden;
    if (out.empty()) out.assign(size_t(R * T * d), 0.0f);
    if (int64_t(out.size()) != R * T * d)
      fail("forward", "DSpark target layers that all run on the same rows (none before the decoder start when rows leave there)",
           "layer " + std::to_string(l) + " on " + std::to_string(R) + " rows");
    const int64_t t = c_.dspark_target_index(l);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < d; ++k) {
        float sum = 0;
        for (int64_t m = 0; m < hc; ++m) sum += X_[size_t((r * hc + m) * d + k)];
        out[size_t((r * T + t) * d + k)] = round_bf16(sum / float(hc));
      }
  }

  // The last FFN's `pre` folds the streams; then the final norm and the fp32 head.
  void logits() {
    const int64_t hc = c_.hc_mult, d = c_.dim, first = p_.plan.logits_first, n = p_.plan.logits_rows;
    if (n == 0) return;
    Rows last(size_t(n * d));
    for (int64_t r = first; r < first + n; ++r)
      hc_pre(X_.data() + r * hc * d, ffn().pre.data() + r * hc, int(hc), d, last.data() + (r - first) * d);
    dsv41::rms_norm(last.data(), n, d, &model_.norm(), p_.eps(), last.data());
    head(last, n);
  }
  // The fp32 head; a rank's part of the vocabulary, gathered (model.py ParallelHead).
  void head(const Rows& x, int64_t n) {
    const int64_t V = c_.vocab_size, part = model_.head().rows;
    logits_.resize(size_t(n * V));
    if (!p_.comm) return linear_f32(x.data(), n, model_.head(), logits_.data());
    Rows mine(size_t(n * part)), all(size_t(n * V));
    linear_f32(x.data(), n, model_.head(), mine.data());
    p_.comm->all_gather(mine, all);  // [rank][row][part]
    for (int64_t k = 0; k < V / part; ++k)
      for (int64_t r = 0; r < n; ++r) std::copy_n(all.data() + (k * n + r) * part, part, logits_.data() + r * V + k * part);
  }
  Rows take_logits() { return std::move(logits_); }

  // DSpark's head before its Markov steps (forward/dspark.h): the last stage's `pre` folds the
  // streams into x (bf16, kept for the confidence head), and x through the stage's norm and the
  // target's head gives the base logits, fp32.
  void draft_head() {
    const int64_t hc = c_.hc_mult, d = c_.dim, R = p_.rows;
    folded_.resize(size_t(R * d));
    for (int64_t r = 0; r < R; ++r) hc_pre(X_.data() + r * hc * d, ffn().pre.data() + r * hc, int(hc), d, folded_.data() + r * d);
    Rows normed(size_t(R * d));
    dsv41::rms_norm(folded_.data(), R, d, &model_.dspark().norm, p_.eps(), normed.data());
    head(normed, R);
  }
  Rows take_folded() { return std::move(folded_); }

 private:
  struct Mix {
    Rows pre, post, comb;  // [rows, hc], [rows, hc], [rows, hc, hc]
  };
  Mix& attn() { return mix_[size_t(Sub::Attention)]; }
  Mix& ffn() { return mix_[size_t(Sub::Ffn)]; }

  Pass& p_;
  const Config& c_;
  const Model& model_;
  std::span<const int> tokens_;
  const int64_t* engram_ids_;
  Rows X_, h_, y_, logits_;  // X [rows, hc, dim] the residual streams; h the sub-layer input; y its output
  Rows folded_;              // a draft block's collapsed streams (draft_head)
  Rows mixed_;               // one row's streams being rewritten (write_back)
  Mix mix_[2];
};

}  // namespace

std::vector<float> forward(const Model& model, SequenceState& state, std::span<const int> tokens, const int64_t* engram_ids,
                           const ForwardOptions& options) {
  const Config& c = model.config();
  const int64_t R = int64_t(tokens.size());
  if (R == 0) fail("forward", "at least one token", "none");
  if (c.has_engram() && !engram_ids) fail("forward", "Engram hash ids for a model with Engram", "none");
  const ItemPlan plan = plan_item(c, state, R, options);
  if (options.span_embeddings && !model.has_vision())
    fail("forward", "a model with a vision tower for rows of an image span", "a text-only model (" + c.source + ")");
  Pass p{model, c, state, plan, state.length, R, options.trace, options.span_embeddings, options.dspark_hidden, false, {}, {}};
  p.comm = rank_comm(model, options.comm, "forward");
  if (p.hidden) p.hidden->clear();
  if (p.trace) {
    p.trace->block_out.assign(size_t(c.n_layers), {});
    p.trace->route_experts.assign(size_t(c.n_layers), {});
    p.trace->route_scores.assign(size_t(c.n_layers), {});
    p.trace->topk.clear();
  }
  CpuOps ops(p, tokens, engram_ids);
  run_network(c, ops, options.trace);
  advance(state, plan);
  return ops.take_logits();
}

// --- DSpark -------------------------------------------------------------------------------------

int draft_argmax(std::span<const float> logits) {
  return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void dspark_ingest(const Model& model, SequenceState& state, int64_t first_pos, std::span<const float> hidden, int64_t rows) {
  const Config& c = model.config();
  if (!c.has_dspark()) fail("dspark_ingest", "a model with DSpark stages", "none");
  const int64_t d = c.dim, hd = c.head_dim, W = c.window_size, T = int64_t(c.dspark_target_layer_ids.size());
  if (rows < 0 || int64_t(hidden.size()) != rows * T * d)
    fail("dspark_ingest", std::to_string(rows) + " rows of " + std::to_string(T * d) + " context features", std::to_string(hidden.size()) + " values");
  // Only the last W rows' entries stay in the rings; each row's entry depends on that row alone.
  const int64_t skip = std::max<int64_t>(0, rows - W), n = rows - skip;
  if (n == 0) return;
  const DSparkWeights& w = model.dspark();
  Rows features(hidden.begin() + skip * T * d, hidden.end());
  const Rows main_x = normed_linear(features, n, w.main_proj, w.main_norm, float(c.norm_eps));
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    const AttentionWeights& a = model.layer(l).attn;
    Rows kv = normed_linear(main_x, n, a.wkv, a.kv_norm, float(c.norm_eps));
    std::vector<uint8_t>& ring = state.window[size_t(l)];
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pos = first_pos + skip + r;
      model.rope(l).apply(kv.data() + r * hd + hd - c.rope_head_dim, pos, false);
      swa_fp8::quantize_dequantize(kv.data() + r * hd, int(hd));
      swa_fp8::encode(kv.data() + r * hd, int(hd), ring.data() + (pos % W) * swa_fp8::bytes(int(hd)));
    }
  }
}

std::vector<int> draft_block_tokens(const Config& c, int64_t length, int anchor) {
  if (!c.has_dspark()) fail("dspark_draft", "a model with DSpark stages", "none");
  if (length < 1) fail("dspark_draft", "a sequence with at least one token run (its context)", "an empty one");
  if (anchor < 0 || anchor >= c.vocab_size)
    fail("dspark_draft", "an anchor token in [0, " + std::to_string(c.vocab_size) + ")", std::to_string(anchor));
  std::vector<int> block(size_t(c.dspark_block_size), int(c.dspark_noise_token_id));
  block[0] = anchor;
  return block;
}

Draft dspark_draft(const Model& model, SequenceState& state, int anchor, const DraftChoice& choose, Comm* comm) {
  const Config& c = model.config();
  const Partition& part = model.partition();
  comm = rank_comm(model, comm, "dspark_draft");
  std::vector<int> block = draft_block_tokens(c, state.length, anchor);
  const int64_t G = c.dspark_block_size, V = c.vocab_size, d = c.dim, rank = c.dspark_markov_rank;
  ItemPlan plan;
  plan.start = state.length;
  plan.rows = G;
  Pass p{model, c, state, plan, state.length, G, nullptr, nullptr, nullptr, true, {}, {}};
  p.comm = comm;
  CpuOps ops(p, block, nullptr);
  run_drafter(c, ops);

  // Position by position: the Markov bias of the token before, W2 · W1[token] (fp32 over the bf16
  // embedding), added to the base logits; the next token chosen from the sum. On a rank, W1 and W2
  // hold its vocabulary rows: the embedding row is the ranks' sum (one holds it), the bias their
  // parts gathered; the token is rank 0's choice, handed to the others as a sum with their zeros.
  Draft out;
  out.logits = ops.take_logits();
  out.tokens = {anchor};
  const DSparkWeights& w = model.dspark();
  const int64_t v0 = part.first(V), vn = part.count(V);
  Rows embeds(size_t(G * rank), 0.0f), bias(static_cast<size_t>(V)), mine(static_cast<size_t>(vn));
  for (int64_t i = 0; i < G; ++i) {
    Rows e(static_cast<size_t>(rank), 0.0f);
    const int64_t t = out.tokens[size_t(i)] - v0;
    if (t >= 0 && t < vn) w.markov_embed.row(t, e.data());
    p.all_reduce(e);
    std::copy(e.begin(), e.end(), embeds.begin() + i * rank);
    linear_f32(e.data(), 1, w.markov_head, mine.data());
    if (comm) comm->all_gather(mine, bias);
    else bias = mine;
    float* row = out.logits.data() + i * V;
    for (int64_t v = 0; v < V; ++v) row[v] += bias[size_t(v)];
    Rows chosen = {part.rank == 0 ? float(choose(std::span<const float>(row, size_t(V)))) : 0.0f};  // ids < 2^24: exact
    p.all_reduce(chosen);
    out.tokens.push_back(int(chosen[0]));
  }
  // Confidence logits: [x_i ; W1[token before]] through the confidence head, fp32.
  const Rows x = ops.take_folded();
  Rows joined(size_t(G * (d + rank)));
  for (int64_t i = 0; i < G; ++i) {
    std::copy_n(x.data() + i * d, d, joined.data() + i * (d + rank));
    std::copy_n(embeds.data() + i * rank, rank, joined.data() + i * (d + rank) + d);
  }
  out.confidence.resize(size_t(G));
  linear_f32(joined.data(), G, w.confidence, out.confidence.data());
  return out;
}

}  // namespace dsv41
