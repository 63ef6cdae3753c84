// The device's op set for the network (network.h), each op as the CPU's (forward.cpp); the
// comments there say why each step is what it is, the comments here what differs on the device.
//
// Rows. A call's rows are the items' rows one after another ([T, ...] buffers, item b at rows
// [offset_b, offset_b + rows_b)); positions[T] tells each row its position. Per-row ops run once
// over all T rows, so a decode batch reads each weight once per step, not once per sequence.
//
// Windows. A sequence's window entries are SWA-FP8 as in its ring. A decode row (one row, not the
// first call) writes its own entry into the ring slot first — the slot it overwrites, position
// pos - W, is outside its window — and attends over the ring. A multi-row call attends over a
// window buffer [W ring slots | the call's rows], since its rows need entries their successors
// overwrite in the ring; the ring keeps the last W rows afterwards.
//
// The network's sub-layer boundaries (network.h) run as cuda::mega_mhc: the residual read and
// written once.
//
// Decode calls (one row per sequence, none replayed) read every per-step value from their plan
// (decode_plan.h) in device memory instead of uploading lists per layer, run the compressor for
// all sequences at once (compress_decode) and the indexer with entry counts read on the device;
// their launches are then the same at every position, which DecodeGraph captures.
//
// DSpark (forward/dspark.h): a call whose items ask for context features records them for all its
// rows (stream_mean, on the device) and hands each item its rows. A draft block runs the same op
// set over the drafter's stages (run_drafter): one item of γ rows at the positions after the
// sequence, its attention over a window buffer [W ring slots of the stage | the block's entries]
// with each row listing the stage's slots 0 .. min(W, start) − 1 then the whole block (the CPU's
// attend_draft order); nothing of the sequence changes.
//
// MoE: cuda::moe at every row count, its routing never leaving the device: the grouped GEMV for
// a few rows per expert, the grouped tensor-core GEMM for many.
#include "forward/device/device_forward.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <span>

#include "backend/cpu/moe.h"
#include "backend/cuda/check.h"
#include "backend/cuda/compressor.h"
#include "backend/cuda/engram.h"
#include "backend/cuda/indexer.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/mhc.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/op_times.h"
#include "backend/cuda/rope.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/sparse_attention.h"
#include "base/error.h"
#include "forward/call_plan.h"
#include "forward/device/decode_plan.h"
#include "forward/device/device_dspark.h"
#include "forward/network.h"
#include "backend/cuda/rows.h"
#include "forward/window.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

namespace {

using Floats = DeviceBuffer<float>;

// The most the indexer's per-call scratch may take; longer prompts run in chunks. It holds a
// float score and a candidate-mask byte per row and entry.
constexpr int64_t kIndexScratchBytes = int64_t(16) << 30;
constexpr int64_t kIndexBytesPerEntry = sizeof(float) + 1;

// Consecutive items whose index rows share one score buffer, rows `stride` apart.
struct IndexGroup {
  size_t first, last;  // items [first, last)
  int64_t stride;      // the group's most entries
};

// A general call's groups, from each item's rows and entries: an item joins the group before it
// while the padding to the group's longest row stays within twice the group's own scores or 64
// MiB, and the buffer within kIndexScratchBytes (one launch per op and group, not per item).
std::vector<IndexGroup> index_groups(std::span<const int64_t> rows, std::span<const int64_t> entries) {
  std::vector<IndexGroup> groups;
  int64_t group_rows = 0, exact = 0;  // of the current group
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t n = entries[i];
    const int64_t padded = (group_rows + rows[i]) * std::max(n, groups.empty() ? 0 : groups.back().stride) * kIndexBytesPerEntry;
    const bool wasteful = padded > 2 * (exact + rows[i] * n) * kIndexBytesPerEntry && padded > (int64_t(64) << 20);
    if (groups.empty() || wasteful || padded > kIndexScratchBytes) {
      groups.push_back({i, i, 0});
      group_rows = exact = 0;
    }
    groups.back().last = i + 1;
    groups.back().stride = std::max(groups.back().stride, n);
    group_rows += rows[i];
    exact += rows[i] * n;
  }
  return groups;
}

// One item during the call: its plan (call_plan.h), its rows (those still running) and where they
// sit in the batch.
struct Item {
  DeviceSequence* seq;
  const DeviceItem* in;
  ItemPlan plan;
  int64_t start, rows, offset;
  const int64_t* engram_ids;
  int64_t candidate_entries = 0;  // at the candidate source layer
  const float* const* spans = nullptr;  // ForwardOptions::span_embeddings, from the first running row
  bool first_call() const { return start == 0; }
  bool decode_in_ring() const { return rows == 1 && start > 0; }
};

class Call {
 public:
  // A decode call (one row per sequence, none replayed) comes with its plan (decode_plan.h) and the
  // plan's copy on the device; its kernels then read every per-step value there.
  Call(const DeviceModel& model, const std::vector<DeviceItem>& batch, cudaStream_t stream,
       const DecodePlan* plan = nullptr, uint8_t* plan_device = nullptr, OpTimes* times = nullptr)
      : m_(model), c_(model.config()), stream_(stream), plan_(plan), plan_d_(plan_device), times_(times) {
    int64_t offset = 0;
    if (plan_ && plan_->items.size() != batch.size())
      fail("cuda decode step", "a plan of the batch's sequences, one row each", std::to_string(plan_->items.size()) + " planned rows");
    for (const DeviceItem& in : batch) {
      const int64_t R = int64_t(in.tokens.size());
      if (R == 0) fail("cuda::forward_batch", "at least one token per item", "none");
      if (c_.has_engram() && !in.engram_ids) fail("cuda::forward_batch", "Engram hash ids for a model with Engram", "none");
      if (in.options.keep_replayed_rows) fail("cuda::forward_batch", "no keep_replayed_rows (a CPU measurement hook)", "set");
      if ((in.options.dspark_hidden || in.drafter_context) && !c_.has_dspark())
        fail("cuda::forward_batch", "a model with DSpark stages for dspark_hidden or the drafter's context", "none");
      records_ = records_ || in.options.dspark_hidden || in.drafter_context;
      if (in.options.span_embeddings && !model.host().has_vision())
        fail("cuda::forward_batch", "a model with a vision tower for rows of an image span", "a text-only model (" + c_.source + ")");
      if (in.options.trace && batch.size() != 1) fail("cuda::forward_batch", "a Trace on a batch of one item", std::to_string(batch.size()) + " items");
      DeviceSequence* s = in.sequence;
      for (const Item& other : items_)
        if (other.seq == s) fail("cuda::forward_batch", "each sequence once in a batch", "a sequence twice");
      if (s->length + R > s->capacity())
        fail("cuda::forward_batch", "at most " + std::to_string(s->capacity()) + " tokens in a sequence",
             std::to_string(s->length + R));
      // The indexer scores every row of a call against every entry: its grid takes 65,535 rows,
      // and its scratch (kIndexBytesPerEntry per row and entry) must fit.
      if (!c_.index_source_layers.empty()) {
        int64_t entries = 0;
        for (int l : c_.index_source_layers) entries = std::max<int64_t>(entries, (s->length + R) / c_.compress_ratios[size_t(l)]);
        if (R > 65535 || R * entries * kIndexBytesPerEntry > kIndexScratchBytes)
          fail("cuda::forward_batch", "a chunk the indexer can score at once (at most 65,535 rows, rows × entries × 5 bytes ≤ " +
                                          std::to_string(kIndexScratchBytes >> 30) + " GiB)",
               std::to_string(R) + " rows at " + std::to_string(entries) + " entries");
      }
      ItemPlan plan = plan_ ? plan_->items[items_.size()] : plan_item(c_, *s, R, in.options);
      items_.push_back(Item{s, &in, std::move(plan), s->length, R, offset, in.engram_ids, 0});
      items_.back().spans = in.options.span_embeddings;
      offset += R;
    }
    T_ = offset;
    if (plan_ && T_ != int64_t(items_.size()))
      fail("cuda decode step", "a plan of the batch's sequences, one row each", std::to_string(T_) + " rows");
    for (size_t i = 0; plan_ && i < items_.size(); ++i)
      if (plan_->sequences[i] != items_[i].seq) fail("cuda decode step", "the plan's sequences in the batch's order", "another sequence");
    trace_ = batch.size() == 1 ? batch[0].options.trace : nullptr;
  }

  // DSpark draft blocks (run_drafter): blocks[i] at the positions after sequences[i], read only.
  Call(const DeviceModel& model, std::span<const DeviceSequence* const> sequences, std::span<const std::vector<int>> blocks,
       cudaStream_t stream)
      : m_(model), c_(model.config()), stream_(stream), plan_(nullptr), plan_d_(nullptr), times_(nullptr), draft_(true) {
    if (!c_.has_dspark()) fail("dspark_draft", "a model with DSpark stages", "none");
    if (sequences.size() != blocks.size())
      fail("dspark_draft", "a block per sequence", std::to_string(blocks.size()) + " blocks for " + std::to_string(sequences.size()));
    // A draft Call only reads its sequences (their rings, in window_entries; keep_window keeps
    // nothing, and nothing advances them), so the items' non-const pointers are never written through.
    draft_in_.reserve(sequences.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sequences.size(); ++i) {
      auto* s = const_cast<DeviceSequence*>(sequences[i]);
      const int64_t rows = int64_t(blocks[i].size());
      draft_in_.push_back(DeviceItem{s, blocks[i]});
      ItemPlan plan;
      plan.start = s->length;
      plan.rows = rows;
      items_.push_back(Item{s, &draft_in_.back(), std::move(plan), s->length, rows, offset, nullptr, 0});
      offset += rows;
    }
    T_ = offset;
  }
  // A draft Call's block through the stages (run_drafter): the base logits and the folded streams.
  DraftBlock draft() {
    run_drafter(c_, *this);
    return DraftBlock{std::move(logits_buffer_), std::move(folded_)};
  }

  // Every kernel of the call, in order on the stream; the logits rows end in `logits` [rows, V]
  // (scratch of the call's if null), and with `features` every row's DSpark context features in it
  // [rows, targets, dim] (else, for the items that ask, in the call's scratch). Changes no
  // sequence's counters, so a captured step replays; run() and DecodeGraph advance them
  // (call_plan.h).
  void enqueue(float* logits = nullptr, float* features = nullptr);
  // enqueue, then the host's side: the logits per item, and every sequence advanced by its plan.
  std::vector<std::vector<float>> run();

  // The op set run_network drives (network.h says what each does).
  int64_t rows() const { return T_; }
  bool cuts_rows() const {
    return std::any_of(items_.begin(), items_.end(), [](const Item& it) { return it.plan.cut > 0; });
  }
  void embed();
  void mix(int l, Sub s);
  void input(int l, Sub s);
  void write_back(Sub s);
  void boundary(int l, Sub from, Sub to);
  void engram(int l);
  void attention(int l) { dsv41::attention(c_, *this, l); }
  void moe(int l) { moe(l, y_.get()); }

  // The attention's ops (network.h attention()).
  using Tensor = Floats;
  const LayerWeights& layer(int l) const { return m_.layer(l); }
  const Floats& h() const { return h_; }
  Floats linear(const Floats& x, const Weight& w);
  void rms_norm(Floats& x, int64_t cols, const Weight& w) {
    const auto span = timed("rms_norm");
    cuda::rms_norm(x.get(), T_, cols, &w, eps(), x.get(), stream_);
  }
  void rope(Floats& x, int l, int heads, int64_t head_dim, bool inverse);
  void window_entries(int l, Floats& kv);
  void compress(int l);
  void index(int l, const Floats& qr);
  Floats attend(int l, const Floats& q, const Floats& kv);
  void keep_window(int l, const Floats& kv);
  Floats linear_grouped(const Floats& o, const Weight& wo_a);
  int heads() const { return c_.n_heads; }
  void output(const Floats& x, const Weight& wo_b) { y_ = linear(x, wo_b); }
  void compress_cut(int ds);
  void drop_cut();
  void impose_input(int l);
  void record_block(int l) { trace_->block_out[size_t(l)] = X_.download(stream_, T_ * c_.hc_mult * c_.dim); }
  bool records_targets() const { return records_; }
  void record_target(int l);
  void logits();
  void draft_head();

 private:
  struct Mix {
    Floats pre, post, comb;  // [T, hc], [T, hc], [T, hc, hc]
  };
  Mix& mixes(Sub s) { return mix_[size_t(s)]; }
  // The mix whose `pre` gives sub-layer s its input: the FFN's for attention, the attention's for the FFN.
  Mix& before(Sub s) { return mixes(s == Sub::Attention ? Sub::Ffn : Sub::Attention); }
  bool decode() const { return plan_ != nullptr; }
  // The span of an op in the call's op times, if it keeps them.
  OpTimes::Span timed(std::string_view name) const { return {times_, name, stream_}; }
  template <class T>
  T* planned(size_t offset) const { return plan_->at<T>(plan_d_, offset); }
  float eps() const { return float(c_.norm_eps); }
  int64_t pos(const Item& it, int64_t r) const { return it.start + r; }
  void upload_positions();
  void mark_image_rows();
  void window_lists(int l);
  void compress(Item& it, int l, const float* x);
  void compress_decode(int l, const float* x);
  template <class Dest>
  void store_entries(int l, float* latents, int64_t n, const int64_t* gpos, Dest index_dest, Dest kv_dest);
  void moe(int l, float* out);

  const DeviceModel& m_;
  const Config& c_;
  cudaStream_t stream_;
  std::vector<Item> items_;
  int64_t T_ = 0;
  Trace* trace_ = nullptr;
  const DecodePlan* plan_;
  uint8_t* plan_d_;
  OpTimes* times_;

  Floats X_, X2_, h_, y_;  // X [T, hc, dim] the residual streams (X2 the next ones); h a sub-layer's input; y its output
  Mix mix_[2];
  DeviceBuffer<int64_t> positions_buffer_;
  const int64_t* positions_ = nullptr;  // [T]
  // [T] 1 for a row of an image span (its gates rank with bias_vl, its Engram gate is shut), on the
  // host and the device; both empty when no row is.
  std::vector<uint8_t> image_rows_host_;
  DeviceBuffer<uint8_t> image_rows_;
  Floats logits_buffer_;
  float* logits_out_ = nullptr;
  DeviceBuffer<int32_t> topk_;  // [T, K] entries of the latest index source
  int K_ = 0;
  std::vector<DeviceBuffer<uint8_t>> candidates_;  // per row group of index(): [rows, stride] from the candidate source
  // The window slot lists of the current phase (encoder / decoder layers), item by item.
  int window_phase_ = -1;
  DeviceBuffer<int32_t> window_buffer_;
  const int32_t* window_ = nullptr;
  std::vector<int64_t> window_offset_;
  // The current layer's window entries (window_entries), for attend and keep_window.
  std::vector<DeviceBuffer<uint8_t>> window_buffers_;
  std::vector<uint8_t*> base_, ring_dest_;  // [T] each row's window buffer; where keep_window writes it
  DeviceBuffer<uint8_t> discard_;
  bool ring_update_ = false;
  // DSpark: the context features [rows, targets, dim] of the rows running at the first target layer
  // (each item's rows at hidden_items_[i]: offset, count); a draft block's item and head outputs.
  bool records_ = false;
  float* features_out_ = nullptr;  // enqueue's destination of the features, if given
  Floats hidden_;
  int64_t hidden_rows_ = 0;
  std::vector<std::pair<int64_t, int64_t>> hidden_items_;
  bool draft_ = false;
  std::vector<DeviceItem> draft_in_;
  Floats folded_;
  // The entries each of an item's rows lists in the window (window_lists; a draft block's rows: the
  // ring's first min(W, start) slots and the whole block).
  int64_t window_width(const Item& it) const {
    if (draft_) return std::min<int64_t>(c_.window_size, it.start) + it.rows;
    return it.first_call() ? std::min<int64_t>(it.rows, c_.window_size) : c_.window_size;
  }
};

void Call::upload_positions() {
  if (decode()) {
    positions_ = planned<int64_t>(plan_->positions);
    return;
  }
  std::vector<int64_t> p;
  for (const Item& it : items_)
    for (int64_t r = 0; r < it.rows; ++r) p.push_back(pos(it, r));
  positions_buffer_ = scratch_from(p, stream_);
  positions_ = positions_buffer_.get();
}

// The rows of image spans among the running ones (forward.cpp's in_span): a decode call has none.
void Call::mark_image_rows() {
  image_rows_host_.clear();
  image_rows_ = DeviceBuffer<uint8_t>();
  if (std::none_of(items_.begin(), items_.end(), [](const Item& it) { return it.spans != nullptr; })) return;
  for (const Item& it : items_)
    for (int64_t r = 0; r < it.rows; ++r) image_rows_host_.push_back(it.spans && it.spans[r] ? 1 : 0);
  image_rows_ = scratch_from(image_rows_host_, stream_);
}

void Call::mix(int l, Sub s) {
  const auto span = timed("mhc mix");
  const HcWeights& w = s == Sub::Attention ? m_.layer(l).hc_attn : m_.layer(l).hc_ffn;
  Mix& m = mixes(s);
  hc_mixes(X_.get(), T_, c_.hc_mult, c_.dim, w, eps(), c_.hc_sinkhorn_iters, float(c_.hc_eps), m.pre.get(), m.post.get(),
           m.comb.get(), stream_);
}

void Call::input(int l, Sub s) {
  const auto span = timed("mhc input");
  const LayerWeights& L = m_.layer(l);
  hc_pre(X_.get(), before(s).pre.get(), T_, c_.hc_mult, c_.dim, h_.get(), stream_);
  cuda::rms_norm(h_.get(), T_, c_.dim, s == Sub::Attention ? &L.attn_norm : &L.ffn_norm, eps(), h_.get(), stream_);
}

void Call::write_back(Sub s) {
  const auto span = timed("mhc write_back");
  const Mix& m = mixes(s);
  hc_post(y_.get(), X_.get(), m.post.get(), m.comb.get(), T_, c_.hc_mult, c_.dim, X2_.get(), stream_);
  std::swap(X_, X2_);
}

void Call::boundary(int l, Sub from, Sub to) {
  const auto span = timed("mhc boundary (mega_mhc)");
  const LayerWeights& L = m_.layer(l);
  const Mix& f = mixes(from);
  Mix& t = mixes(to);
  const bool attn = to == Sub::Attention;
  const HcWeights& w = attn ? L.hc_attn : L.hc_ffn;
  mega_mhc(y_.get(), X_.get(), f.post.get(), f.comb.get(), before(to).pre.get(), T_, c_.hc_mult, c_.dim, w,
           attn ? &L.attn_norm : &L.ffn_norm, eps(), c_.hc_sinkhorn_iters, float(c_.hc_eps), X2_.get(), h_.get(),
           t.pre.get(), t.post.get(), t.comb.get(), stream_);
  std::swap(X_, X2_);
}

void Call::impose_input(int l) {
  if (!trace_->forced_pre_mix) fail("forward", "imposed input mixes with the imposed streams", "none");
  const std::vector<float>& streams = trace_->forced_streams->at(size_t(l - 1));
  const std::vector<float>& mix = trace_->forced_pre_mix->at(size_t(l - 1));
  if (int64_t(streams.size()) != T_ * c_.hc_mult * c_.dim || int64_t(mix.size()) != T_ * c_.hc_mult)
    fail("forward", "imposed inputs of layer " + std::to_string(l) + " for " + std::to_string(T_) + " rows",
         std::to_string(streams.size()) + " stream and " + std::to_string(mix.size()) + " mix values");
  X_ = scratch_from(streams, stream_);
  mixes(Sub::Ffn).pre = scratch_from(mix, stream_);
}

std::vector<std::vector<float>> Call::run() {
  enqueue();
  std::vector<int64_t> counts;
  std::vector<const SampleRequest*> sample;
  std::vector<TokenChoice*> choice;
  for (const Item& it : items_) {
    counts.push_back(it.plan.logits_rows);
    sample.push_back(it.in->sample);
    choice.push_back(it.in->choice);
  }
  std::vector<std::vector<float>> out = deliver_logits(logits_buffer_.get(), c_.vocab_size, counts, sample, choice, stream_);
  // Each item's context features, as forward() leaves them (none when no target layer ran).
  const int64_t width = int64_t(c_.dspark_target_layer_ids.size()) * c_.dim;
  for (size_t i = 0; i < items_.size(); ++i) {
    std::vector<float>* hidden = items_[i].in->options.dspark_hidden;
    if (!hidden) continue;
    hidden->clear();
    if (hidden_.get() && hidden_items_[i].second > 0)
      *hidden = hidden_.download(stream_, hidden_items_[i].second * width, hidden_items_[i].first * width);
  }
  for (Item& it : items_) advance(*it.seq, it.plan);
  // The drafter's context of the items that ask, from the features on the device, in one call.
  std::vector<DraftContextRow> context;
  for (size_t i = 0; i < items_.size(); ++i)
    if (items_[i].in->drafter_context && hidden_.get() && hidden_items_[i].second > 0)
      add_context_rows(c_, *items_[i].seq, items_[i].seq->length, hidden_items_[i].second, hidden_items_[i].first, context);
  dspark_ingest_rows(m_, context, hidden_.get(), stream_);
  return out;
}

void Call::enqueue(float* logits_out, float* features_out) {
  logits_out_ = logits_out;
  features_out_ = features_out;
  records_ = records_ || features_out;
  if (trace_) {
    trace_->block_out.assign(size_t(c_.n_layers), {});
    trace_->route_experts.assign(size_t(c_.n_layers), {});
    trace_->route_scores.assign(size_t(c_.n_layers), {});
    trace_->topk.clear();
  }
  run_network(c_, *this, trace_);
}

// The residual: hc copies of each embedding row; the first input mix is e0.
void Call::embed() {
  const auto span = timed("embed");
  const int64_t d = c_.dim, hc = c_.hc_mult;
  X_ = scratch<float>(T_ * hc * d, stream_);
  X2_ = scratch<float>(T_ * hc * d, stream_);
  Floats& e0 = mixes(Sub::Ffn).pre;
  if (decode()) {
    embed_rows(m_.embed(), planned<int32_t>(plan_->tokens), T_, int(hc), d, X_.get(), stream_);
    e0 = scratch<float>(T_ * hc, stream_);
    check(cudaMemcpyAsync(e0.get(), planned<float>(plan_->pre_mix), size_t(T_ * hc) * sizeof(float), cudaMemcpyDeviceToDevice,
                          stream_), "forward");
  } else {
    std::vector<int32_t> tokens;
    std::vector<float> pre_mix(size_t(T_ * hc), 0.0f);
    for (const Item& it : items_)
      for (int t : it.in->tokens) {
        if (t < 0 || t >= c_.vocab_size)
          fail("forward", "token ids in [0, " + std::to_string(c_.vocab_size) + ")", std::to_string(t));
        pre_mix[tokens.size() * hc] = 1.0f;
        tokens.push_back(t);
      }
    embed_rows(m_.embed(), scratch_from(tokens, stream_).get(), T_, int(hc), d, X_.get(), stream_);
    e0 = scratch_from(pre_mix, stream_);
    // merge_image_embeddings: a row of an image span takes its aligner row or delimiter instead.
    std::vector<int32_t> span_rows;
    std::vector<float> span_embeddings;
    for (const Item& it : items_)
      for (int64_t r = 0; it.spans && r < it.rows; ++r)
        if (it.spans[r]) {
          span_rows.push_back(int32_t(it.offset + r));
          span_embeddings.insert(span_embeddings.end(), it.spans[r], it.spans[r] + d);
        }
    embed_span_rows(scratch_from(span_embeddings, stream_).get(), scratch_from(span_rows, stream_).get(), int64_t(span_rows.size()),
                    int(hc), d, X_.get(), stream_);
  }
  mark_image_rows();
  h_ = scratch<float>(T_ * d, stream_);
  y_ = scratch<float>(T_ * d, stream_);
  for (Floats* b : {&mixes(Sub::Attention).pre, &mixes(Sub::Attention).post, &mixes(Sub::Ffn).post}) *b = scratch<float>(T_ * hc, stream_);
  for (Sub s : {Sub::Attention, Sub::Ffn}) mixes(s).comb = scratch<float>(T_ * hc * hc, stream_);
  upload_positions();
}

// Decoder bounded replay (network.h), for each item on its own: its cut rows' compressor at the
// decoder start, on the stream entering it (h_).
void Call::compress_cut(int ds) {
  const auto span = timed("compress (cut rows)");
  for (Item& it : items_)
    if (it.plan.cut > 0) compress(it, ds, h_.get() + it.offset * c_.dim);
}

// Then those rows leave: the others are gathered to the front, with the `pre` of their next input.
void Call::drop_cut() {
  const auto span = timed("drop cut rows");
  const int64_t hc = c_.hc_mult;
  std::vector<int32_t> keep;
  int64_t offset = 0;
  for (Item& it : items_) {
    const int64_t cut = it.plan.cut;
    for (int64_t r = cut; r < it.rows; ++r) keep.push_back(int32_t(it.offset + r));
    if (it.engram_ids) it.engram_ids += cut * int64_t(c_.engram_layer_ids.size()) * c_.engram_hash_columns();
    if (it.spans) it.spans += cut;
    it.start += cut;
    it.rows -= cut;
    it.offset = offset;
    offset += it.rows;
  }
  T_ = offset;
  mark_image_rows();
  if (T_ == 0) return;
  DeviceBuffer<int32_t> index = scratch_from(keep, stream_);
  gather_rows(X_.get(), index.get(), T_, hc * c_.dim, X2_.get(), stream_);
  std::swap(X_, X2_);
  Floats pre = scratch<float>(T_ * hc, stream_);
  gather_rows(mixes(Sub::Ffn).pre.get(), index.get(), T_, hc, pre.get(), stream_);
  mixes(Sub::Ffn).pre = std::move(pre);
  upload_positions();
  window_phase_ = -1;
}

void Call::engram(int l) {
  const auto span = timed("engram");
  const EngramWeights& g = *m_.layer(l).engram;
  const int n_engram = int(c_.engram_layer_ids.size()), cols = c_.engram_hash_columns();
  const int e = c_.engram_index(l);
  const int64_t hd = c_.engram_head_dim, d = c_.dim, hc = c_.hc_mult;
  DeviceBuffer<int64_t> ids_buffer;
  const int64_t* ids = nullptr;
  if (decode()) {
    ids = planned<int64_t>(plan_->engram_ids[size_t(e)]);
  } else {
    std::vector<int64_t> host;
    for (const Item& it : items_)
      for (int64_t r = 0; r < it.rows; ++r)
        host.insert(host.end(), it.engram_ids + (r * n_engram + e) * cols, it.engram_ids + (r * n_engram + e + 1) * cols);
    ids_buffer = scratch_from(host, stream_);
    ids = ids_buffer.get();
  }
  Floats emb = scratch<float>(T_ * cols * hd, stream_), kv = scratch<float>(T_ * (hc + 1) * d, stream_);
  engram_gather(g.table, g.table_scale, hd, ids, T_, cols, emb.get(), stream_);
  cuda::linear(emb.get(), T_, g.wkv, kv.get(), stream_);
  // A row of an image span keeps its streams: the reference shuts its gate (h + 0 · value).
  engram_gate(X_.get(), kv.get(), m_.engram_qk(l), T_, int(hc), d, eps(), stream_, image_rows_.get());
}

// The window slots of every row (forward/window.h), as indices into its item's window buffer:
// ring slot t mod W for t before the call, W + (t - start) for the call's own rows (the ring
// itself, t mod W throughout, for a decode row). Each item's rows list as many slots as the CPU's
// do — min(rows, W) in a first call, else W — so that the compressed entries after them fall into
// the same 64-entry softmax tiles; items of one width sit next to each other in `window_`, item b's
// block at window_offset_[b]. Depends only on the phase (window floor).
void Call::window_lists(int l) {
  const int phase = l >= c_.decoder_start() ? 1 : 0;
  if (phase == window_phase_) return;
  window_phase_ = phase;
  const int64_t W = c_.window_size;
  if (decode()) {
    window_ = planned<int32_t>(plan_->window[phase]);
    window_offset_.clear();
    for (const Item& it : items_) window_offset_.push_back(it.offset * W);
    return;
  }
  std::vector<int32_t> list;
  std::vector<int64_t> slots;
  window_offset_.clear();
  for (const Item& it : items_) {
    const int64_t floor = it.plan.window_floor(l, c_.decoder_start()), width = window_width(it);
    window_offset_.push_back(int64_t(list.size()));
    for (int64_t r = 0; r < it.rows; ++r) {
      window_positions(pos(it, r), it.start, it.rows, W, floor, slots);
      for (int64_t j = 0; j < width; ++j) {
        const int64_t t = j < int64_t(slots.size()) ? slots[size_t(j)] : kEmptySlot;
        list.push_back(int32_t(t == kEmptySlot ? -1 : it.decode_in_ring() || t < it.start ? t % W : W + t - it.start));
      }
    }
  }
  window_buffer_ = scratch_from(list, stream_);
  window_ = window_buffer_.get();
}

// --- CSA2: the compressor of a kv-source layer ------------------------------------------------------

void Call::compress(Item& it, int l, const float* x) {
  const AttentionWeights& a = m_.layer(l).attn;
  const CompressorPlan& g = it.plan.compressors.at(l);
  const int ratio = g.ratio;
  const int64_t hd = c_.head_dim, ihd = c_.index_head_dim, rows = g.rows;
  DeviceCompressed& cache = it.seq->compressed.at(l);
  if (rows == 0) return;
  const float* xs = x + (g.first_pos - it.start) * c_.dim;

  if (g.entries_after() > it.seq->entry_capacity(l))
    fail("cuda::forward_batch", "a compressed cache within its capacity (" + std::to_string(it.seq->entry_capacity(l)) + ")",
         std::to_string(g.entries_after()) + " entries");
  Floats latents;
  if (ratio == 1) {
    latents = scratch<float>(rows * hd, stream_);
    cuda::linear(xs, rows, a.compressor_wkv, latents.get(), stream_);
  } else {
    // The open group's rows, then this call's: every complete group is pooled, the rest waits.
    const int64_t staged = g.pending_before + rows;
    Floats kv = scratch<float>(staged * hd, stream_), score = scratch<float>(staged * hd, stream_);
    const size_t pending_bytes = size_t(g.pending_before * hd) * sizeof(float);
    check(cudaMemcpyAsync(kv.get(), cache.pending_kv.get(), pending_bytes, cudaMemcpyDeviceToDevice, stream_), "compress");
    check(cudaMemcpyAsync(score.get(), cache.pending_score.get(), pending_bytes, cudaMemcpyDeviceToDevice, stream_), "compress");
    linear_f32(xs, rows, a.compressor_wkv, kv.get() + g.pending_before * hd, stream_);
    linear_f32(xs, rows, a.compressor_wgate, score.get() + g.pending_before * hd, stream_);
    const size_t left_bytes = size_t(g.pending_after * hd) * sizeof(float);
    check(cudaMemcpyAsync(cache.pending_kv.get(), kv.get() + g.groups * ratio * hd, left_bytes, cudaMemcpyDeviceToDevice, stream_), "compress");
    check(cudaMemcpyAsync(cache.pending_score.get(), score.get() + g.groups * ratio * hd, left_bytes, cudaMemcpyDeviceToDevice, stream_), "compress");
    if (g.groups == 0) return;
    latents = scratch<float>(g.groups * hd, stream_);
    pool_groups(kv.get(), score.get(), g.groups, ratio, int(hd), /*round=*/true, latents.get(), stream_);
  }
  std::vector<int64_t> group_pos;
  for (int64_t e = 0; e < g.groups; ++e) group_pos.push_back(g.group_pos(e));
  DeviceBuffer<int64_t> gpos = scratch_from(group_pos, stream_);
  store_entries(l, latents.get(), g.groups, gpos.get(), cache.index_k.get() + g.entries_before * int64_t(mxfp4::bytes(int(ihd))),
                cache.kv.get() + g.entries_before * int64_t(kv_fp4::bytes(int(hd))));
}

// The entries of n latents [n, head_dim] (projected or pooled, not yet normed) at positions gpos:
// the compressor's norm, then the index key from the latent before RoPE and the KV-FP4 entry after
// it, each to its destination: the cache's end (uint8_t*), or one listed place per entry
// (uint8_t* const*, null for none).
template <class Dest>
void Call::store_entries(int l, float* latents, int64_t n, const int64_t* gpos, Dest index_dest, Dest kv_dest) {
  const AttentionWeights& a = m_.layer(l).attn;
  const float* freqs = m_.rope_freqs(l);
  const int64_t hd = c_.head_dim, rd = c_.rope_head_dim, ihd = c_.index_head_dim;
  cuda::rms_norm(latents, n, hd, &a.compressor_norm, eps(), latents, stream_);
  Floats k = scratch<float>(n * ihd, stream_);
  cuda::linear(latents, n, a.indexer_wk, k.get(), stream_);
  cuda::rms_norm(k.get(), n, ihd, &a.indexer_k_norm, eps(), k.get(), stream_);
  cuda::rope(k.get() + ihd - rd, n, 1, ihd, ihd, int(rd), gpos, freqs, false, stream_);
  mxfp4_encode(k.get(), n, int(ihd), index_dest, stream_);
  cuda::rope(latents + hd - rd, n, 1, hd, hd, int(rd), gpos, freqs, false, stream_);
  kv_fp4_encode(latents, n, int(hd), kv_dest, stream_);
}

// A decode call's compressor: one row per sequence, all sequences at once. Each row joins its
// sequence's open group; the groups it closes are pooled, and their entries go where the plan says
// (nowhere for a group still open, whose pooled row is a zero the encoders skip). At ratio 1 every
// row is an entry.
void Call::compress_decode(int l, const float* x) {
  const AttentionWeights& a = m_.layer(l).attn;
  const int ratio = c_.compress_ratios[size_t(l)];
  const int64_t hd = c_.head_dim, B = T_;
  const DecodePlan::Compressed& f = plan_->compressed.at(l);
  Floats latents = scratch<float>(B * hd, stream_);
  if (ratio == 1) {
    cuda::linear(x, B, a.compressor_wkv, latents.get(), stream_);
  } else {
    Floats kv = scratch<float>(B * hd, stream_), score = scratch<float>(B * hd, stream_);
    linear_f32(x, B, a.compressor_wkv, kv.get(), stream_);
    linear_f32(x, B, a.compressor_wgate, score.get(), stream_);
    append_pool(kv.get(), score.get(), B, planned<float*>(f.open_kv), planned<float*>(f.open_score),
                planned<int32_t>(f.open_rows), ratio, int(hd), /*round=*/true, latents.get(), stream_);
  }
  store_entries(l, latents.get(), B, planned<int64_t>(f.group_pos), planned<uint8_t*>(f.index_dest),
                planned<uint8_t*>(f.kv_dest));
}

// --- CSA2: the indexer of an index-source layer -----------------------------------------------------

void Call::index(int l, const Floats& qr) {
  const auto span = timed("indexer");
  const AttentionWeights& a = m_.layer(l).attn;
  if (topk_.size() == 0) {
    K_ = c_.index_topk;
    topk_ = scratch<int32_t>(T_ * K_, stream_);
  }
  const int ratio = c_.compress_ratios[size_t(l)];
  const int heads = c_.index_n_heads, ihd = c_.index_head_dim, rd = c_.rope_head_dim;
  const bool candidate_source = l == c_.candidate_source_layer;
  const bool uses_candidates = c_.candidate_source_layer >= 0 && l > c_.candidate_source_layer;
  const int src = c_.kv_source_of(l);

  Floats q = scratch<float>(T_ * heads * ihd, stream_), w = scratch<float>(T_ * heads, stream_);
  cuda::linear(qr.get(), T_, a.indexer_wq_b, q.get(), stream_);
  cuda::rope(q.get() + ihd - rd, T_, heads, int64_t(heads) * ihd, ihd, rd, positions_, m_.rope_freqs(l), false, stream_);
  cuda::linear(h_.get(), T_, a.indexer_weights_proj, w.get(), stream_);
  scale_round(w.get(), T_ * heads, float(std::pow(double(ihd), -0.5) * std::pow(double(heads), -0.5)), stream_);

  // A decode call reads its entry counts and visible counts from its plan, and sizes the scores
  // for the cache's capacity (the same launches at every position); a general call's are here.
  DeviceBuffer<int64_t> visible_buffer;
  const int64_t* visible = nullptr;
  if (decode()) {
    visible = planned<int64_t>(plan_->compressed.at(src).visible);  // the source's ratio is l's (Config)
  } else {
    std::vector<int64_t> host;
    for (const Item& it : items_)
      for (int64_t r = 0; r < it.rows; ++r) host.push_back((pos(it, r) + 1) / ratio);
    visible_buffer = scratch_from(host, stream_);
    visible = visible_buffer.get();
  }
  const auto* forced = trace_ && trace_->forced_topk && trace_->forced_topk->count(l) ? &trace_->forced_topk->at(l) : nullptr;
  if (trace_) trace_->topk[l].clear();

  // Each row reads its key cache and entry count from device arrays (the plan's, or uploaded
  // here), its rows in groups sharing one score buffer: a decode step's rows all together (the
  // stride the largest capacity, so that a captured step replays while the contexts grow), a
  // general call's as index_groups makes them.
  const auto entries = [&](const Item& it) { return it.plan.compressors.at(src).entries_after(); };
  const uint8_t* const* caches = nullptr;
  const int64_t* counts = nullptr;
  DeviceBuffer<const uint8_t*> caches_buffer;
  DeviceBuffer<int64_t> counts_buffer;
  std::vector<IndexGroup> groups;
  if (decode()) {
    caches = planned<const uint8_t*>(plan_->compressed.at(src).index_caches);
    counts = planned<int64_t>(plan_->compressed.at(src).entries);
    int64_t stride = 0;
    for (const Item& it : items_) stride = std::max(stride, it.seq->entry_capacity(src));
    groups.push_back({0, items_.size(), stride});
  } else {
    std::vector<const uint8_t*> caches_host;
    std::vector<int64_t> counts_host, item_rows, item_entries;
    for (const Item& it : items_) {
      item_rows.push_back(it.rows);
      item_entries.push_back(entries(it));
      caches_host.insert(caches_host.end(), size_t(it.rows), it.seq->compressed.at(src).index_k.get());
      counts_host.insert(counts_host.end(), size_t(it.rows), entries(it));
    }
    groups = index_groups(item_rows, item_entries);
    caches_buffer = scratch_from(caches_host, stream_);
    counts_buffer = scratch_from(counts_host, stream_);
    caches = caches_buffer.get();
    counts = counts_buffer.get();
  }
  if (candidate_source) candidates_.clear();
  if (uses_candidates) {
    for (const Item& it : items_)
      if (it.candidate_entries != entries(it))
        fail("cuda::forward_batch", "the candidate source's entry count (" + std::to_string(it.candidate_entries) + ")",
             std::to_string(entries(it)) + " entries at layer " + std::to_string(l));
    if (candidates_.size() != groups.size())
      fail("cuda::forward_batch", "the candidate source's row groups", "other groups at layer " + std::to_string(l));
  }

  for (size_t g = 0; g < groups.size(); ++g) {
    const IndexGroup& group = groups[g];
    const int64_t row = items_[group.first].offset, stride = group.stride;
    const int64_t rows = items_[group.last - 1].offset + items_[group.last - 1].rows - row;
    Floats scores = scratch<float>(rows * std::max<int64_t>(stride, 1), stream_);
    index_scores(q.get() + row * heads * ihd, w.get() + row * heads, rows, heads, ihd, caches + row, counts + row, stride,
                 visible + row, scores.get(), stream_);
    if (candidate_source) {
      candidates_.push_back(scratch<uint8_t>(rows * stride, stream_));
      candidate_mask(scores.get(), rows, counts + row, stride, visible + row, c_.candidate_topk_blocks,
                     c_.candidate_block_size, candidates_.back().get(), stream_);
      for (size_t i = group.first; i < group.last; ++i) items_[i].candidate_entries = entries(items_[i]);
    } else if (uses_candidates) {
      if (candidates_[g].size() != rows * stride)
        fail("cuda::forward_batch", "the candidate source's row groups", "another stride at layer " + std::to_string(l));
      mask_scores(scores.get(), candidates_[g].get(), rows * stride, stream_);
    }
    DeviceBuffer<int32_t> chosen = scratch<int32_t>(rows * K_, stream_);
    top_positions(scores.get(), rows, counts + row, stride, K_, chosen.get(), stream_);
    finish_topk(chosen.get(), rows, K_, visible + row, K_, topk_.get() + row * K_, stream_);
  }

  for (const Item& it : items_) {
    if (forced) {
      std::vector<int32_t> rows(size_t(it.rows * K_), -1);
      for (int64_t r = 0; r < it.rows; ++r)
        for (size_t j = 0; j < forced->at(size_t(r)).size() && j < size_t(K_); ++j) rows[size_t(r * K_) + j] = int32_t(forced->at(size_t(r))[j]);
      check(cudaMemcpyAsync(topk_.get() + it.offset * K_, rows.data(), rows.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                            stream_), "index");
    }
    if (trace_) {
      // As forward.cpp records them: the entries attended (the imposed ones when forced).
      const std::vector<int32_t> t = topk_.download(stream_, it.rows * K_, it.offset * K_);
      for (int64_t r = 0; r < it.rows; ++r) {
        const size_t width = forced ? forced->at(size_t(r)).size() : size_t(std::min<int64_t>(c_.index_topk, entries(it)));
        trace_->topk[l].emplace_back(t.begin() + r * K_, t.begin() + r * K_ + int64_t(std::min<size_t>(width, size_t(K_))));
      }
    }
  }
}

// --- attention --------------------------------------------------------------------------------------

// This call's window entries, SWA-FP8 into each item's window buffer (or ring), and the window
// lists that index them.
void Call::window_entries(int l, Floats& kv) {
  const auto span = timed("window entries");
  const int64_t hd = c_.head_dim, W = c_.window_size, T = T_;
  const size_t slot = swa_fp8::bytes(int(hd));
  if (draft_) {
    // Each item's buffer: the stage's ring, then its block's entries; each of its rows lists the
    // ring's first min(W, start) slots, those below the decoder window floor empty
    // (draft_window_slots), and every row of its block (window_width).
    window_buffers_.clear();
    std::vector<uint8_t*> dest;
    std::vector<int32_t> list;
    std::vector<int64_t> slots;
    base_.clear();
    window_offset_.clear();
    for (const Item& it : items_) {
      uint8_t* buffer = window_buffers_.emplace_back(scratch<uint8_t>((W + it.rows) * int64_t(slot), stream_)).get();
      check(cudaMemcpyAsync(buffer, it.seq->window[size_t(l)].get(), W * slot, cudaMemcpyDeviceToDevice, stream_), "draft window");
      window_offset_.push_back(int64_t(list.size()));
      draft_window_slots(it.start, W, it.seq->decoder_window_floor, slots);
      for (int64_t r = 0; r < it.rows; ++r) {
        dest.push_back(buffer + (W + r) * slot);
        base_.push_back(buffer);
        for (const int64_t s : slots) list.push_back(int32_t(s));  // kEmptySlot is -1: the kernel skips it
        for (int64_t j = 0; j < it.rows; ++j) list.push_back(int32_t(W + j));
      }
    }
    swa_fp8_encode(kv.get(), T, int(hd), scratch_from(dest, stream_).get(), stream_);
    window_buffer_ = scratch_from(list, stream_);
    window_ = window_buffer_.get();
    return;
  }
  window_buffers_.clear();
  std::vector<uint8_t*> dest(static_cast<size_t>(T));
  base_.assign(size_t(T), nullptr);
  ring_dest_.assign(size_t(T), nullptr);
  // A multi-row item's ring gets its last W rows after attention; the other rows of that second
  // encode go to a scratch slot. A batch of decodes needs neither.
  ring_update_ = std::any_of(items_.begin(), items_.end(), [](const Item& it) { return it.rows > 0 && !it.decode_in_ring(); });
  discard_ = ring_update_ ? scratch<uint8_t>(int64_t(slot), stream_) : DeviceBuffer<uint8_t>();
  for (Item& it : items_) {
    if (it.rows == 0 || decode()) continue;  // a decode call's destinations are in its plan
    uint8_t* ring = it.seq->window[size_t(l)].get();
    uint8_t* buffer = ring;
    if (!it.decode_in_ring()) {
      buffer = window_buffers_.emplace_back(scratch<uint8_t>((W + it.rows) * int64_t(slot), stream_)).get();
      if (!it.first_call())
        check(cudaMemcpyAsync(buffer, ring, W * slot, cudaMemcpyDeviceToDevice, stream_), "attention window");
    }
    for (int64_t r = 0; r < it.rows; ++r) {
      const int64_t row = it.offset + r, p = pos(it, r);
      base_[size_t(row)] = buffer;
      dest[size_t(row)] = it.decode_in_ring() ? ring + (p % W) * slot : buffer + (W + r) * slot;
      ring_dest_[size_t(row)] = !it.decode_in_ring() && r >= it.rows - W ? ring + (p % W) * slot : discard_.get();
    }
  }
  DeviceBuffer<uint8_t*> dest_d;
  if (!decode()) dest_d = scratch_from(dest, stream_);
  swa_fp8_encode(kv.get(), T, int(hd), decode() ? planned<uint8_t*>(plan_->swa_dest[size_t(l)]) : dest_d.get(), stream_);
  window_lists(l);
}

void Call::compress(int l) {
  const auto span = timed("compressor");
  if (draft_) fail("dspark_draft", "DSpark stages without compressed KV", "compress ratio " + std::to_string(c_.compress_ratios[size_t(l)]));
  if (decode()) {
    compress_decode(l, h_.get());
    return;
  }
  for (Item& it : items_)
    if (!it.plan.compressed_at_cut(l, c_.decoder_start())) compress(it, l, h_.get() + it.offset * c_.dim);
}

// Sparse attention over each row's window (window_entries) and chosen compressed entries.
Floats Call::attend(int l, const Floats& q, const Floats&) {
  const auto span = timed("sparse attention");
  const int64_t H = c_.n_heads, hd = c_.head_dim, T = T_;
  const int ratio = c_.compress_ratios[size_t(l)];
  DeviceBuffer<uint8_t*> base_d;
  DeviceBuffer<const uint8_t*> caches_d;
  const uint8_t* const* rings = nullptr;
  const uint8_t* const* caches = nullptr;
  if (decode()) {
    rings = planned<const uint8_t*>(plan_->rings[size_t(l)]);
    if (ratio > 0) caches = planned<const uint8_t*>(plan_->compressed.at(c_.kv_source_of(l)).caches);
  } else {
    base_d = scratch_from(base_, stream_);
    rings = base_d.get();
    if (ratio > 0) {
      std::vector<const uint8_t*> host_caches(static_cast<size_t>(T));
      for (const Item& it : items_)
        std::fill_n(host_caches.begin() + it.offset, it.rows, it.seq->compressed.at(c_.kv_source_of(l)).kv.get());
      caches_d = scratch_from(host_caches, stream_);
      caches = caches_d.get();
    }
  }
  Floats o = scratch<float>(T * H * hd, stream_);
  // One launch per run of consecutive items with the same window width (a decode batch: one).
  for (size_t first = 0, last; first < items_.size(); first = last) {
    const int64_t width = window_width(items_[first]);
    for (last = first + 1; last < items_.size() && window_width(items_[last]) == width; ++last) {
    }
    const int64_t row = items_[first].offset, rows = items_[last - 1].offset + items_[last - 1].rows - row;
    if (rows == 0) continue;
    SparseAttentionBatch batch;
    batch.tokens = rows;
    batch.heads = int(H);
    batch.dim = int(hd);
    batch.rings = rings + row;
    batch.window = window_ + window_offset_[first];
    batch.W = int(width);
    batch.caches = caches + row;
    batch.topk = ratio > 0 ? topk_.get() + row * K_ : nullptr;
    batch.K = ratio > 0 ? K_ : 0;
    sparse_attention(batch, q.get() + row * H * hd, m_.attn_sink(l), float(std::pow(double(hd), -0.5)), o.get() + row * H * hd,
                     stream_);
  }
  return o;
}

// The ring keeps the last W entries of a multi-row call (a decode row is there already).
void Call::keep_window(int, const Floats& kv) {
  const auto span = timed("window entries");
  if (!draft_ && ring_update_) swa_fp8_encode(kv.get(), T_, int(c_.head_dim), scratch_from(ring_dest_, stream_).get(), stream_);
}

// A projection's name in the op times: its shape and format (the shapes of V4.1's projections differ).
std::string linear_name(const Weight& w) {
  static const char* formats[] = {"f32", "bf16", "fp8", "fp4"};
  return "linear " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " " + formats[int(w.format)];
}

Floats Call::linear(const Floats& x, const Weight& w) {
  const auto span = timed(times_ ? linear_name(w) : std::string());
  Floats y = scratch<float>(T_ * w.rows, stream_);
  cuda::linear(x.get(), T_, w, y.get(), stream_);
  return y;
}

void Call::rope(Floats& x, int l, int heads, int64_t head_dim, bool inverse) {
  const auto span = timed("rope");
  const int rd = c_.rope_head_dim;
  cuda::rope(x.get() + head_dim - rd, T_, heads, heads * head_dim, head_dim, rd, positions_, m_.rope_freqs(l), inverse, stream_);
}

// Grouped low-rank output: group g's heads (o [T, G, in_g]) through wo_a's rows [g·r, (g+1)·r),
// into ya [T, G, r]. An fp8 wo_a on the device is the checkpoint's codes of the bf16 weight the
// model multiplies (DeviceModel), widened as they are read.
Floats Call::linear_grouped(const Floats& o, const Weight& wo_a) {
  const auto span = timed("linear wo_a (grouped)");
  Floats ya = scratch<float>(T_ * c_.o_groups * c_.o_lora_rank, stream_);
  if (wo_a.format == WeightFormat::FP8) cuda::linear_grouped_widened(o.get(), T_, c_.o_groups, wo_a, ya.get(), stream_);
  else cuda::linear_grouped(o.get(), T_, c_.o_groups, wo_a, ya.get(), stream_);
  return ya;
}

// --- MoE --------------------------------------------------------------------------------------------

void Call::moe(int l, float* out) {
  const LayerWeights& L = m_.layer(l);
  const int64_t T = T_, d = c_.dim;
  const GateOptions opt = gate_options(c_, l);
  const int k = opt.topk;
  const float limit = float(c_.swiglu_limit);
  DeviceBuffer<int32_t> experts_d = scratch<int32_t>(T * k, stream_), forced_d;
  Floats weights_d = scratch<float>(T * k, stream_);
  const int32_t* forced = nullptr;
  // Rows of an image span choose with bias_vl (the drafter's blocks are text).
  const uint8_t* image_rows = image_rows_.get();
  const Weight* bias_vl = image_rows ? &L.gate_bias_vl : nullptr;
  if (trace_) {
    // The engine's own choice, and the biased scores it ranked (the CPU gate on our input).
    cuda::route(h_.get(), T, L.gate, L.gate_bias, opt, experts_d.get(), weights_d.get(), stream_, nullptr, bias_vl, image_rows);
    trace_->route_experts[size_t(l)] = experts_d.download(stream_);
    const Model& host = m_.host();
    const std::vector<float> x = h_.download(stream_, T * d);
    std::vector<int32_t> e(size_t(T * k));
    std::vector<float> w(size_t(T * k));
    std::vector<float>& scores = trace_->route_scores[size_t(l)];
    scores.resize(size_t(T) * host.layer(l).experts.size());
    dsv41::route(x.data(), T, host.layer(l).gate, host.layer(l).gate_bias, opt, e.data(), w.data(), scores.data(), nullptr,
                 image_rows ? &host.layer(l).gate_bias_vl : nullptr, image_rows ? image_rows_host_.data() : nullptr);
    if (trace_->forced_experts) {
      forced_d = scratch_from(trace_->forced_experts->at(size_t(l)), stream_);
      forced = forced_d.get();
    }
  }

  // One op, the routing never leaving the device (cuda::moe picks the GEMV or the tensor cores).
  const auto span = timed("moe (cuda::moe)");
  cuda::moe(h_.get(), T, L.gate, L.gate_bias, opt, m_.experts(l), L.shared.w1, L.shared.w2, L.shared.w3, limit, forced,
            experts_d.get(), weights_d.get(), out, stream_, MoePath::automatic, bias_vl, image_rows);
}

// --- DSpark -----------------------------------------------------------------------------------------

// The residual entering target layer l averaged over the streams (forward.cpp record_target), into
// its block of the call's [rows, targets, dim]; every target layer must run on the same rows.
void Call::record_target(int l) {
  const auto span = timed("dspark features");
  const int64_t d = c_.dim, targets = int64_t(c_.dspark_target_layer_ids.size());
  if (hidden_items_.empty()) {
    if (!features_out_) hidden_ = scratch<float>(std::max<int64_t>(T_, 1) * targets * d, stream_);
    hidden_rows_ = T_;
    hidden_items_.clear();
    for (const Item& it : items_) hidden_items_.emplace_back(it.offset, it.rows);
  } else if (T_ != hidden_rows_) {
    fail("forward", "DSpark target layers that all run on the same rows (none before the decoder start when rows leave there)",
         "layer " + std::to_string(l) + " on " + std::to_string(T_) + " rows");
  }
  float* out = features_out_ ? features_out_ : hidden_.get();
  stream_mean(X_.get(), T_, int(c_.hc_mult), d, out + c_.dspark_target_index(l) * d, targets * d, stream_);
}

// DSpark's head before its Markov steps (forward.cpp draft_head): the last stage's `pre` folds the
// streams (kept), the stage's norm, the target's head in fp32.
void Call::draft_head() {
  const auto span = timed("dspark head");
  const int64_t d = c_.dim;
  folded_ = scratch<float>(T_ * d, stream_);
  Floats normed = scratch<float>(T_ * d, stream_);
  hc_pre(X_.get(), mixes(Sub::Ffn).pre.get(), T_, c_.hc_mult, d, folded_.get(), stream_);
  cuda::rms_norm(folded_.get(), T_, d, &m_.dspark().norm, eps(), normed.get(), stream_);
  logits_buffer_ = scratch<float>(T_ * c_.vocab_size, stream_);
  linear_f32(normed.get(), T_, m_.head(), logits_buffer_.get(), stream_);
}

// --- the head ---------------------------------------------------------------------------------------

// The plan's logits rows of every item, into logits_out_ [n, V] (the call's scratch if null).
void Call::logits() {
  const auto span = timed("head");
  const int64_t d = c_.dim, hc = c_.hc_mult, V = c_.vocab_size;
  std::vector<int32_t> rows;
  for (const Item& it : items_)
    for (int64_t r = it.plan.logits_first; r < it.plan.logits_first + it.plan.logits_rows; ++r) rows.push_back(int32_t(it.offset + r));
  const int64_t n = int64_t(rows.size());
  if (n == 0) return;
  float* out = logits_out_;
  if (!out) {
    logits_buffer_ = scratch<float>(n * V, stream_);
    out = logits_buffer_.get();
  }
  // Every row gives logits (a decode call): no gather, the rows being 0 … T - 1 in order.
  Floats Xr, pre, last = scratch<float>(n * d, stream_);
  const float *X = X_.get(), *mix = mixes(Sub::Ffn).pre.get();
  if (n < T_) {
    DeviceBuffer<int32_t> rows_d = scratch_from(rows, stream_);
    Xr = scratch<float>(n * hc * d, stream_), pre = scratch<float>(n * hc, stream_);
    gather_rows(X_.get(), rows_d.get(), n, hc * d, Xr.get(), stream_);
    gather_rows(mix, rows_d.get(), n, hc, pre.get(), stream_);
    X = Xr.get(), mix = pre.get();
  }
  hc_pre(X, mix, n, int(hc), d, last.get(), stream_);
  cuda::rms_norm(last.get(), n, d, &m_.norm(), eps(), last.get(), stream_);
  linear_f32(last.get(), n, m_.head(), out, stream_);
}

}  // namespace

bool decode_row(const DeviceSequence& s, size_t tokens, const ForwardOptions& o) {
  return tokens == 1 && s.length > 0 && o.replay_until == 0 && o.decoder_from <= s.length && !o.keep_replayed_rows &&
         !o.span_embeddings;
}

std::vector<std::vector<float>> deliver_logits(float* logits, int64_t V, std::span<const int64_t> counts,
                                               std::span<const SampleRequest* const> sample, std::span<TokenChoice* const> choice,
                                               cudaStream_t stream) {
  std::vector<int64_t> rows;
  std::vector<SampleRequest> requests;
  std::vector<TokenChoice*> into;
  int64_t at = 0;
  bool rows_back = false;
  const auto on_device = [&](size_t i) { return sample[i] != nullptr; };
  for (size_t i = 0; i < counts.size(); ++i) {
    for (int64_t r = 0; on_device(i) && r < counts[i]; ++r) {
      rows.push_back(at + r);
      requests.push_back(*sample[i]);
      into.push_back(choice[i] + r);
    }
    rows_back = rows_back || (!on_device(i) && counts[i] > 0);
    at += counts[i];
  }
  const std::vector<TokenChoice> chosen = choose(logits, V, rows, requests, stream);
  for (size_t k = 0; k < into.size(); ++k) *into[k] = chosen[k];
  std::vector<std::vector<float>> out(counts.size());
  if (!rows_back) return out;
  std::vector<float> all(size_t(at * V));
  check(cudaMemcpyAsync(all.data(), logits, all.size() * sizeof(float), cudaMemcpyDeviceToHost, stream), "logits");
  check(cudaStreamSynchronize(stream), "logits");
  at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (!on_device(i)) out[i].assign(all.begin() + at * V, all.begin() + (at + counts[i]) * V);
    at += counts[i];
  }
  return out;
}

void enqueue_decode(const DeviceModel& model, const std::vector<DeviceItem>& batch, const DecodePlan& plan,
                    uint8_t* plan_device, float* logits, cudaStream_t stream, float* features) {
  Call(model, batch, stream, &plan, plan_device).enqueue(logits, features);
}

DraftBlock draft_blocks(const DeviceModel& model, std::span<const DeviceSequence* const> sequences,
                        std::span<const std::vector<int>> blocks, cudaStream_t stream) {
  return Call(model, sequences, blocks, stream).draft();
}

std::vector<std::vector<float>> forward_batch(const DeviceModel& model, const std::vector<DeviceItem>& batch,
                                              cudaStream_t stream, OpTimes* times) {
  if (batch.empty()) return {};
  std::vector<DecodeRow> rows;
  for (const DeviceItem& in : batch) {
    if (!decode_row(*in.sequence, in.tokens.size(), in.options)) return Call(model, batch, stream, nullptr, nullptr, times).run();
    rows.push_back(DecodeRow{in.sequence, in.tokens[0], in.engram_ids, in.options.decoder_from});
  }
  // A decode call: its plan on the device in one copy, then the same kernels a DecodeGraph replays.
  const DecodePlan plan = plan_decode(model.config(), rows);
  DeviceBuffer<uint8_t> plan_d = scratch_from(plan.block, stream);
  return Call(model, batch, stream, &plan, plan_d.get(), times).run();
}

}  // namespace dsv41::cuda
