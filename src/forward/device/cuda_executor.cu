#include "forward/device/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

#include "backend/cuda/check.h"
#include "base/error.h"
#include "forward/device/decode_graph.h"
#include "forward/device/device_dspark.h"
#include "forward/device/device_forward.h"
#include "forward/device/device_vision.h"

namespace dsv41::cuda {

namespace {

// A sequence's caches start with room for this many tokens and double when a call needs more
// (one copy through the host per doubling), so a short chat does not hold a long context's memory.
constexpr int64_t kFirstCapacity = 4096;

// Every DeviceSequence a CudaSequence makes gets an id of its own, never reused: a captured decode
// step names its sequences by these ids, so it is replayed only on the very buffers it captured.
uint64_t next_device_id() {
  static std::atomic<uint64_t> ids{0};
  return ++ids;
}

// The device is one executor's at a time: every CUDA call of the executor and its sequences holds
// this lock, so that no thread's call lands in another's graph capture (which refuses it) and no
// two forwards overlap (Mega-mHC's arrival counters are shared). Shared, since a sequence may
// outlive the executor's other users.
using DeviceLock = std::shared_ptr<std::recursive_mutex>;

// The pinned memory a thread's restores and saves go through: one per thread, so that the view a
// save returns (valid until that thread's next restore or save) is not overwritten by another
// thread's call meanwhile.
PinnedStaging& staging() {
  thread_local PinnedStaging memory;
  return memory;
}

class CudaSequence final : public Sequence {
 public:
  // No device memory until the first call needs it: a sequence made for a restore from the tiers
  // is allocated once, at the restored length (allocations and frees of device memory synchronize
  // with the device).
  CudaSequence(const Config& config, DeviceLock lock) : config_(config), lock_(std::move(lock)) {}
  ~CudaSequence() override {
    std::lock_guard hold(*lock_);
    device_.reset();
  }
  int64_t length() const override { return device_ ? device_->length : 0; }
  const SequenceState& host() override {
    std::lock_guard hold(*lock_);
    if (!host_) host_ = device_ ? device_->download() : SequenceState(config_);
    return *host_;
  }
  void assign(SequenceState state) override { restore(view_of(state)); }
  StateView saved(int64_t from_token) override {
    std::lock_guard hold(*lock_);
    if (!device_) return view_of(host());
    return device_->download(from_token, staging());
  }
  void restore(const StateView& view) override {
    std::lock_guard hold(*lock_);
    host_.reset();
    // An empty state needs no memory yet; a device state in use is cleared in place.
    if (view.length == 0 && !device_) return;
    // A state restored for encoder replay holds the global KV past its length (up to the hit); the
    // caches get room for a turn more, so that the call after a restore does not grow them at once.
    int64_t held = view.length;
    for (const auto& [layer, cache] : view.compressed)
      held = std::max(held, cache.entries * config_.compress_ratios[size_t(layer)] + cache.pending);
    if (!device_ || held > device_->capacity()) replace(held + kFirstCapacity);  // nothing to keep
    device_->upload(view, staging());
  }
  // Room for `tokens` tokens, the state kept.
  void reserve(int64_t tokens) {
    std::lock_guard hold(*lock_);
    if (!device_) return replace(std::max(tokens, kFirstCapacity));
    if (tokens <= device_->capacity()) return;
    SequenceState state = device_->download();
    replace(std::max(tokens, 2 * device_->capacity()));
    device_->upload(view_of(state), staging());
  }
  // The device state, about to change: the host copy is stale from now on (reserve() first).
  DeviceSequence* running() {
    host_.reset();
    return device_.get();
  }
  uint64_t id() const { return id_; }
  const DeviceSequence* device() const { return device_.get(); }

 private:
  void replace(int64_t capacity) {
    device_.reset();  // its memory first: the new caches may reuse it
    device_ = std::make_unique<DeviceSequence>(config_, capacity);
    id_ = next_device_id();
  }

  const Config& config_;
  DeviceLock lock_;
  std::unique_ptr<DeviceSequence> device_;  // null until a call or a restore needs it
  uint64_t id_ = 0;
  std::optional<SequenceState> host_;  // the last host() copy while the device state is unchanged
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(const Model& model, std::optional<uint64_t> random_seed)
      : model_(model),
        device_(model, random_seed ? DeviceModel::Values::Random : DeviceModel::Values::Checkpoint, random_seed.value_or(0)) {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "CudaExecutor");
    free_at_start_ = int64_t(free);
  }
  const Model& model() const override { return model_; }
  std::string name() const override { return "cuda"; }
  // Half the device memory free once the weights are placed: each sequence's caches grow by
  // doubling, so a sequence can hold up to twice its tokens' bytes; scratch takes its share too.
  int64_t default_kv_budget() const override { return free_at_start_ / 2; }
  // The serving benchmark's budget (docs/benchmarks.md): a step of 8,192 prompt rows took 0.55 s
  // (one prompt, the default mode's ~15K tokens/s) to 1.2 s (64 prompts of 128) on the H200, a
  // decoding sequence's longest wait while prompts arrive; 256 a step would make those 64 prompts
  // wait 32 steps for their first token.
  int64_t default_step_tokens() const override { return 8192; }
  ~CudaExecutor() override {
    std::lock_guard hold(*lock_);
    graph_.reset();
  }
  std::unique_ptr<Sequence> new_sequence() override { return std::make_unique<CudaSequence>(model_.config(), lock_); }

  std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) override {
    std::lock_guard hold(*lock_);
    std::vector<DeviceItem> items;
    for (const BatchItem& item : batch) {
      if (!dynamic_cast<CudaSequence*>(item.sequence)) fail("CudaExecutor", "sequences of the CUDA executor", "another executor's");
      check_sample(item, model_.config().vocab_size);
    }
    for (const BatchItem& item : batch) static_cast<CudaSequence*>(item.sequence)->reserve(item.sequence->length() + int64_t(item.tokens.size()));
    if (decode_step(batch)) return replay(batch);
    for (const BatchItem& item : batch)
      items.push_back(DeviceItem{static_cast<CudaSequence*>(item.sequence)->running(), item.tokens, item.engram_ids, item.options,
                                 item.sample, item.choice, item.drafter_context});
    return cuda::forward_batch(device_, items);
  }

  // Speculative decoding (forward/dspark.h, sequence_mark.h) on the device: the drafter's context
  // and its drafts (device_dspark.h), a pass marked and undone (DeviceSequence::mark, rewind).
  bool speculates() const override { return true; }
  void dspark_ingest(Sequence& sequence, int64_t first_pos, std::span<const float> hidden, int64_t rows) override {
    std::lock_guard hold(*lock_);
    cuda::dspark_ingest(device_, running(sequence, "dspark_ingest"), first_pos, hidden, rows);
  }
  std::vector<Draft> dspark_drafts(const std::vector<DraftRequest>& requests) override {
    std::lock_guard hold(*lock_);
    std::vector<cuda::DeviceDraftRequest> on_device;
    for (const DraftRequest& r : requests) on_device.push_back({&held(*r.sequence, "dspark_drafts"), r.anchor, r.choose});
    return cuda::dspark_drafts(device_, on_device);
  }
  // Images (docs/vision.md): the vision tower on the device (device_vision.h); forward_batch takes
  // rows of image spans (ForwardOptions::span_embeddings) as forward() does.
  bool takes_images() const override { return true; }
  std::vector<std::vector<float>> encode_images(const std::vector<VisionImage>& images) override {
    if (!model_.has_vision()) fail(model_.config().source, "a checkpoint with a vision tower for images", "a text-only one");
    std::lock_guard hold(*lock_);
    return cuda::encode_images(device_, images);
  }
  SequenceMark mark(Sequence& sequence, int64_t rows) override {
    std::lock_guard hold(*lock_);
    return held(sequence, "mark").mark(rows);
  }
  void rewind(Sequence& sequence, const SequenceMark& mark) override {
    std::lock_guard hold(*lock_);
    running(sequence, "rewind").rewind(mark);
  }

 private:
  // A sequence of this executor's with device memory (a call has run on it), read only / about to
  // change.
  static const DeviceSequence& held(Sequence& sequence, const char* what) {
    auto* s = dynamic_cast<CudaSequence*>(&sequence);
    if (!s) fail(std::string("CudaExecutor::") + what, "a sequence of the CUDA executor", "another executor's");
    if (!s->device()) fail(std::string("CudaExecutor::") + what, "a sequence with tokens run", "an empty one");
    return *s->device();
  }
  static DeviceSequence& running(Sequence& sequence, const char* what) {
    held(sequence, what);
    return *static_cast<CudaSequence&>(sequence).running();
  }

  // A step of one decode row per sequence, none replayed or traced, at most kDecodeGraphRows: what a
  // captured step (DecodeGraph) runs, to the bit as forward_batch would.
  static bool decode_step(const std::vector<BatchItem>& batch) {
    if (batch.empty() || int64_t(batch.size()) > kDecodeGraphRows) return false;
    for (const BatchItem& item : batch)
      if (item.options.trace || !decode_row(*static_cast<CudaSequence*>(item.sequence)->device(), item.tokens.size(), item.options))
        return false;
    return true;
  }

  // The step through the captured graph of these sequences, captured now if the last one was of
  // others (a batch that changed, or a sequence whose caches grew) or did not record the DSpark
  // context features some item now asks for (a graph that records them serves every later step).
  std::vector<std::vector<float>> replay(const std::vector<BatchItem>& batch) {
    std::vector<uint64_t> ids;
    std::vector<DeviceSequence*> sequences;
    std::vector<int32_t> tokens;
    std::vector<const int64_t*> engram_ids;
    std::vector<const SampleRequest*> sample;
    std::vector<TokenChoice*> choice;
    std::vector<int64_t> decoder_from;
    for (const BatchItem& item : batch) {
      auto* s = static_cast<CudaSequence*>(item.sequence);
      ids.push_back(s->id());
      sequences.push_back(s->running());
      tokens.push_back(item.tokens[0]);
      engram_ids.push_back(item.engram_ids);
      sample.push_back(item.sample);
      choice.push_back(item.choice);
      decoder_from.push_back(item.options.decoder_from);
    }
    const bool features = std::any_of(batch.begin(), batch.end(),
                                      [](const BatchItem& item) { return item.options.dspark_hidden || item.drafter_context; });
    if (!graph_ || ids != graph_ids_ || (features && !graph_->features())) {
      graph_.reset();
      graph_ = std::make_unique<DecodeGraph>(device_, sequences, features);
      graph_ids_ = ids;
    }
    if (std::all_of(engram_ids.begin(), engram_ids.end(), [](const int64_t* p) { return p == nullptr; })) engram_ids.clear();
    graph_->launch(tokens, engram_ids, decoder_from);
    const std::vector<int64_t> one_row(batch.size(), 1);
    std::vector<std::vector<float>> out =
        deliver_logits(graph_->logits(), model_.config().vocab_size, one_row, sample, choice, graph_->stream());
    // Each asking item's row of the step's context features, as forward_batch hands them.
    const Config& c = model_.config();
    const int64_t width = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
    bool handed = false;
    for (size_t b = 0; b < batch.size(); ++b) {
      std::vector<float>* hidden = batch[b].options.dspark_hidden;
      if (!hidden) continue;
      hidden->resize(size_t(width));
      check(cudaMemcpyAsync(hidden->data(), graph_->features() + int64_t(b) * width, size_t(width) * sizeof(float),
                            cudaMemcpyDeviceToHost, graph_->stream()), "CudaExecutor features");
      handed = true;
    }
    if (handed) check(cudaStreamSynchronize(graph_->stream()), "CudaExecutor features");
    // The drafter's context of the rows that ask, straight from the step's features: one call.
    std::vector<cuda::DraftContextRow> context;
    for (size_t b = 0; b < batch.size(); ++b)
      if (batch[b].drafter_context) cuda::add_context_rows(c, *sequences[b], sequences[b]->length, 1, int64_t(b), context);
    cuda::dspark_ingest_rows(device_, context, graph_->features(), graph_->stream());
    return out;
  }

  const Model& model_;
  DeviceLock lock_ = std::make_shared<std::recursive_mutex>();
  DeviceModel device_;
  int64_t free_at_start_ = 0;
  std::unique_ptr<DecodeGraph> graph_;  // the last decode step's, replayed while its batch stays
  std::vector<uint64_t> graph_ids_;
};

}  // namespace

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return true;
  if (why) *why = e == cudaSuccess ? "no CUDA device" : std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  return false;
}

std::unique_ptr<Executor> make_executor(const Model& model, std::optional<uint64_t> random_seed) {
  // The device op set computes a whole model: a rank's part (its heads, experts and vocabulary
  // rows only) would run as if it were one. Several GPUs: issue 24, docs/parallel.md.
  if (!model.partition().whole())
    fail("--device cuda", "a whole model (a model cut over ranks runs on the CPU executor)",
         "rank " + std::to_string(model.partition().rank) + " of " + std::to_string(model.partition().world));
  std::string why;
  if (!device_available(&why)) fail("--device cuda", "a CUDA device", why);
  return std::make_unique<CudaExecutor>(model, random_seed);
}

}  // namespace dsv41::cuda
