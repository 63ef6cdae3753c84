#pragma once
// What the engine runs the network on (DESIGN §2): an executor holds each sequence's KV where it
// computes (host memory for the CPU, device memory for CUDA) and advances a batch of sequences per
// call, under forward()'s contract (forward.h: exact mode, decoder and encoder bounded replay, the
// logits it returns). The CPU executor is the reference; docs/forward.md says how the others are
// held to it.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "forward/dspark.h"
#include "forward/forward.h"
#include "forward/sequence_mark.h"
#include "forward/state_view.h"
#include "forward/vision_cpu.h"
#include "model/sampling.h"

namespace dsv41 {

// One sequence's KV as an executor holds it.
class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual int64_t length() const = 0;
  // The state in host memory, for the KV tiers (their blocks and tails are cut from it): the CPU
  // executor's own, a copy brought back from the device otherwise, valid until the next call that
  // runs this sequence.
  virtual const SequenceState& host() = 0;
  // The state as the KV tiers store it (Session::save): the counters, every ring, the open groups,
  // and the global KV from the entries of token `from_token` on (the blocks stored before it are
  // not read again). A view of the CPU executor's own state; of a copy brought back from the
  // device otherwise, valid until this thread's next call on the executor's sequences.
  virtual StateView saved(int64_t from_token) = 0;
  // Replaces the state: a host state (a fresh start, a test's), or the tiers' pieces copied
  // straight to where the executor holds it (StateView: a hit, with no host state made).
  virtual void assign(SequenceState state) = 0;
  virtual void restore(const StateView& view) = 0;
};

struct BatchItem {
  Sequence* sequence;
  std::span<const int> tokens;
  const int64_t* engram_ids = nullptr;  // [rows, engram layers, hash columns], as forward()'s
  ForwardOptions options = {};
  // When set, the token to choose from each of the item's logits rows: its one row, or with
  // all_logits every row (a verification pass; then only a greedy choice without logprobs, edits
  // or a mask, each row's edits depending on the rows before). The executor writes them to
  // choice[0 .. rows) and returns no logits for the item (CUDA chooses on the device, so the rows
  // never come back).
  const SampleRequest* sample = nullptr;
  TokenChoice* choice = nullptr;
  // When set, the call's DSpark context features (the rows ForwardOptions::dspark_hidden would
  // hand out) go into the sequence's drafter windows, as dspark_ingest would put them, on the
  // executor's side: a speculating session's every call, with no features coming back (CUDA
  // ingests a step's rows of every sequence in one call from the device).
  bool drafter_context = false;
};

// A draft after a sequence's last token (forward/dspark.h dspark_draft): the anchor, and how each
// draft token is chosen from its row of logits. Null `choose`: greedy (draft_argmax's first maximum),
// which an executor may take where the logits are and return the draft without them.
struct DraftRequest {
  Sequence* sequence;
  int anchor;
  const DraftChoice* choose = nullptr;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const Model& model() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // An empty sequence of this executor's.
  virtual std::unique_ptr<Sequence> new_sequence() = 0;
  // The KV bytes its sequences may hold together unless told otherwise (SchedulerOptions::
  // kv_budget_bytes); 0: no limit of its own.
  virtual int64_t default_kv_budget() const { return 0; }
  // The prompt tokens a Scheduler's step takes unless told otherwise (SchedulerOptions::step_tokens): what a
  // step of this executor's runs in a time decoding sequences can wait (the CPU's 256 rows).
  virtual int64_t default_step_tokens() const { return 256; }
  // Advances each item's sequence by its tokens under its options; returns each one's logits as
  // forward() does, or chooses its token (BatchItem::sample). Every item's sequence is one of this
  // executor's, each at most once.
  virtual std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) = 0;

  // Speculative decoding on a sequence of this executor's (forward/dspark.h, sequence_mark.h):
  // the drafter's context from a call's features (BatchItem::drafter_context; or dspark_ingest of
  // the features ForwardOptions::dspark_hidden handed out), the drafts of
  // many sequences in one call (each as it would be alone, up to the summation orders of the
  // executor's batched products), and a pass undone. The CPU and CUDA executors'; the others refuse
  // by name (issue 18).
  virtual bool speculates() const { return false; }
  virtual void dspark_ingest(Sequence& sequence, int64_t first_pos, std::span<const float> hidden, int64_t rows);
  virtual std::vector<Draft> dspark_drafts(const std::vector<DraftRequest>& requests);
  Draft dspark_draft(Sequence& sequence, int anchor, const DraftChoice& choose);  // one request's, its logits kept
  virtual SequenceMark mark(Sequence& sequence, int64_t rows);
  virtual void rewind(Sequence& sequence, const SequenceMark& mark);

  // Images (docs/vision.md): whether forward_batch takes rows of image spans
  // (ForwardOptions::span_embeddings), and the vision tower on a call's images (each image's
  // aligner rows, as encode_images of forward/vision_cpu.h). The CPU and CUDA executors'; the
  // others refuse by name.
  virtual bool takes_images() const { return false; }
  virtual std::vector<std::vector<float>> encode_images(const std::vector<VisionImage>& images);
};

// Throws dsv41::Error, naming what it found, for an item whose sample request no executor can
// take (no choice to write, a row cut by bounded replay, a vocabulary outside [1, vocab_size], more
// than kMaxTopLogprobs, all_logits with anything but a plain greedy choice).
void check_sample(const BatchItem& item, int64_t vocab_size);

// The reference: forward() in host memory, the items one after another. Its sequences keep their
// compressed main KV in `global_kv` (KV-FP4, the release's; SWA-FP8 for `dsv41 eval --kv-fp8`,
// whose sequences the KV tiers refuse: they store KV-FP4). Over a rank's part of a model
// (model/partition.h), `comm` is its rank's collectives (forward/ranked_executor.h runs the ranks).
class CpuExecutor final : public Executor {
 public:
  explicit CpuExecutor(const Model& model, GlobalKvFormat global_kv = GlobalKvFormat::Fp4, Comm* comm = nullptr)
      : model_(model), global_kv_(global_kv), comm_(comm) {}
  const Model& model() const override { return model_; }
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Sequence> new_sequence() override;
  std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) override;
  bool speculates() const override { return true; }
  void dspark_ingest(Sequence& sequence, int64_t first_pos, std::span<const float> hidden, int64_t rows) override;
  std::vector<Draft> dspark_drafts(const std::vector<DraftRequest>& requests) override;
  SequenceMark mark(Sequence& sequence, int64_t rows) override;
  void rewind(Sequence& sequence, const SequenceMark& mark) override;
  bool takes_images() const override { return true; }
  std::vector<std::vector<float>> encode_images(const std::vector<VisionImage>& images) override;

 private:
  const Model& model_;
  GlobalKvFormat global_kv_;
  Comm* comm_;
};

}  // namespace dsv41
