#include "forward/ranked_executor.h"

#include <exception>
#include <mutex>
#include <thread>

#include "base/error.h"

namespace dsv41 {

namespace {

// One sequence as the ranks hold it: a copy on each, advanced together.
class RankedSequence final : public Sequence {
 public:
  explicit RankedSequence(std::vector<std::unique_ptr<Sequence>> copies) : copies_(std::move(copies)) {}
  int64_t length() const override { return copies_[0]->length(); }
  const SequenceState& host() override { return copies_[0]->host(); }
  StateView saved(int64_t from_token) override { return copies_[0]->saved(from_token); }
  void assign(SequenceState state) override {
    for (size_t r = 1; r < copies_.size(); ++r) copies_[r]->assign(state);
    copies_[0]->assign(std::move(state));
  }
  void restore(const StateView& view) override {
    for (auto& copy : copies_) copy->restore(view);
  }
  Sequence* on(size_t rank) { return copies_[rank].get(); }

 private:
  std::vector<std::unique_ptr<Sequence>> copies_;
};

}  // namespace

RankedCpuExecutor::RankedCpuExecutor(const Model& model, int ranks) : model_(model), group_(ranks) {
  for (int r = 0; r < ranks; ++r) {
    parts_.push_back(Model::load(model.dir(), Partition{r, ranks}));
    ranks_.push_back(std::make_unique<CpuExecutor>(*parts_.back()));
  }
}

RankedCpuExecutor::~RankedCpuExecutor() = default;

std::unique_ptr<Sequence> RankedCpuExecutor::new_sequence() {
  std::vector<std::unique_ptr<Sequence>> copies;
  for (auto& rank : ranks_) copies.push_back(rank->new_sequence());
  return std::make_unique<RankedSequence>(std::move(copies));
}

std::vector<std::vector<float>> RankedCpuExecutor::forward_batch(const std::vector<BatchItem>& batch) {
  const std::lock_guard<std::mutex> serial(calls_);
  const size_t world = ranks_.size();
  for (const BatchItem& item : batch) {
    if (!dynamic_cast<RankedSequence*>(item.sequence)) fail(name() + " executor", "sequences of this executor", "another executor's");
    if (item.drafter_context)
      fail(name() + " executor", "calls without DSpark's context (speculation runs on a whole model)", "an item with drafter_context");
  }
  // Rank r's batch: its copies of the sequences, its collectives. What a call hands out (the
  // trace, the choices) is rank 0's; the others record into copies that carry the same imposed
  // choices, and return logits that are dropped.
  std::vector<std::vector<BatchItem>> batches(world, batch);
  std::vector<std::vector<Trace>> traces(world);
  std::vector<std::vector<TokenChoice>> choices(world);
  for (size_t r = 0; r < world; ++r) {
    traces[r].resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      BatchItem& item = batches[r][i];
      item.sequence = static_cast<RankedSequence*>(item.sequence)->on(r);
      item.options.comm = &group_.comm(int(r));
      if (r == 0) continue;
      if (item.options.trace) {
        traces[r][i] = *item.options.trace;
        item.options.trace = &traces[r][i];
      }
      item.sample = nullptr;
      item.choice = nullptr;
    }
  }
  // A rank that fails releases the others (LocalGroup::abort); the first failure is the cause.
  std::vector<std::vector<std::vector<float>>> logits(world);
  std::exception_ptr failed;
  std::mutex failing;
  auto run = [&](size_t r) {
    try {
      logits[r] = ranks_[r]->forward_batch(batches[r]);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(failing);
        if (!failed) failed = std::current_exception();
      }
      group_.abort();
    }
  };
  std::vector<std::thread> threads;
  for (size_t r = 1; r < world; ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
  group_.reset();
  if (failed) std::rethrow_exception(failed);
  return std::move(logits[0]);
}

std::vector<std::vector<float>> RankedCpuExecutor::encode_images(const std::vector<VisionImage>& images) {
  return ranks_[0]->encode_images(images);  // the vision tower is whole on every rank
}

}  // namespace dsv41
