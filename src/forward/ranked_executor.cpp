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
    ranks_.push_back(std::make_unique<CpuExecutor>(*parts_.back(), GlobalKvFormat::Fp4, &group_.comm(r)));
  }
}

RankedCpuExecutor::~RankedCpuExecutor() = default;

std::unique_ptr<Sequence> RankedCpuExecutor::new_sequence() {
  std::vector<std::unique_ptr<Sequence>> copies;
  for (auto& rank : ranks_) copies.push_back(rank->new_sequence());
  return std::make_unique<RankedSequence>(std::move(copies));
}

// Runs f(r) for every rank, rank 0 on this thread, one call at a time. A rank that fails releases
// the others (LocalGroup::abort); the first failure is the cause, rethrown here.
void RankedCpuExecutor::on_ranks(const std::function<void(size_t rank)>& f) {
  const std::lock_guard<std::mutex> serial(calls_);
  std::exception_ptr failed;
  std::mutex failing;
  auto run = [&](size_t r) {
    try {
      f(r);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(failing);
        if (!failed) failed = std::current_exception();
      }
      group_.abort();
    }
  };
  std::vector<std::thread> threads;
  for (size_t r = 1; r < ranks_.size(); ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
  group_.reset();
  if (failed) std::rethrow_exception(failed);
}

namespace {

RankedSequence& ranked(const Executor& e, Sequence& s) {
  auto* r = dynamic_cast<RankedSequence*>(&s);
  if (!r) fail(e.name() + " executor", "sequences of this executor", "another executor's");
  return *r;
}

}  // namespace

std::vector<std::vector<float>> RankedCpuExecutor::forward_batch(const std::vector<BatchItem>& batch) {
  const size_t world = ranks_.size();
  for (const BatchItem& item : batch) ranked(*this, *item.sequence);
  // Rank r's batch: its copies of the sequences. What a call hands out (the trace, the choices, the
  // DSpark features) is rank 0's; the others record into copies that carry the same imposed
  // choices, and return logits that are dropped.
  std::vector<std::vector<BatchItem>> batches(world, batch);
  std::vector<std::vector<Trace>> traces(world);
  std::vector<std::vector<std::vector<float>>> hidden(world);
  for (size_t r = 0; r < world; ++r) {
    traces[r].resize(batch.size());
    hidden[r].resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      BatchItem& item = batches[r][i];
      item.sequence = static_cast<RankedSequence*>(item.sequence)->on(r);
      if (r == 0) continue;
      if (item.options.trace) {
        traces[r][i] = *item.options.trace;
        item.options.trace = &traces[r][i];
      }
      if (item.options.dspark_hidden) item.options.dspark_hidden = &hidden[r][i];
      item.sample = nullptr;
      item.choice = nullptr;
    }
  }
  std::vector<std::vector<std::vector<float>>> logits(world);
  on_ranks([&](size_t r) { logits[r] = ranks_[r]->forward_batch(batches[r]); });
  return std::move(logits[0]);
}

// The drafter's context and its rewinds touch each rank's own copy only (its weights are whole).
void RankedCpuExecutor::dspark_ingest(Sequence& s, int64_t first_pos, std::span<const float> hidden, int64_t rows) {
  RankedSequence& seq = ranked(*this, s);
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->dspark_ingest(*seq.on(r), first_pos, hidden, rows);
}

SequenceMark RankedCpuExecutor::mark(Sequence& s, int64_t rows) { return ranks_[0]->mark(*ranked(*this, s).on(0), rows); }

void RankedCpuExecutor::rewind(Sequence& s, const SequenceMark& mark) {
  RankedSequence& seq = ranked(*this, s);
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->rewind(*seq.on(r), mark);  // the copies are the same: so are their marks
}

// Each rank drafts every request in order, meeting the others at the drafter's collectives; rank 0
// chooses the tokens (the caller's choice, called once a token) and returns the drafts.
std::vector<Draft> RankedCpuExecutor::dspark_drafts(const std::vector<DraftRequest>& requests) {
  for (const DraftRequest& q : requests) ranked(*this, *q.sequence);
  std::vector<std::vector<DraftRequest>> mine(ranks_.size(), requests);
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (DraftRequest& q : mine[r]) {
      q.sequence = static_cast<RankedSequence*>(q.sequence)->on(r);
      if (r > 0) q.choose = nullptr;  // never called there: rank 0 chooses
    }
  std::vector<std::vector<Draft>> drafts(ranks_.size());
  on_ranks([&](size_t r) { drafts[r] = ranks_[r]->dspark_drafts(mine[r]); });
  return std::move(drafts[0]);
}

std::vector<std::vector<float>> RankedCpuExecutor::encode_images(const std::vector<VisionImage>& images) {
  return ranks_[0]->encode_images(images);  // the vision tower is whole on every rank
}

}  // namespace dsv41
