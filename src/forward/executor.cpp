#include "forward/executor.h"

#include "base/error.h"

namespace dsv41 {

namespace {

class CpuSequence final : public Sequence {
 public:
  explicit CpuSequence(const Config& config) : state_(config) {}
  int64_t length() const override { return state_.length; }
  const SequenceState& host() override { return state_; }
  void assign(SequenceState state) override { state_ = std::move(state); }
  SequenceState& state() { return state_; }

 private:
  SequenceState state_;
};

}  // namespace

std::unique_ptr<Sequence> CpuExecutor::new_sequence() { return std::make_unique<CpuSequence>(model_.config()); }

std::vector<std::vector<float>> CpuExecutor::forward_batch(const std::vector<BatchItem>& batch) {
  for (const BatchItem& item : batch)
    if (!dynamic_cast<CpuSequence*>(item.sequence)) fail("CpuExecutor", "sequences of the CPU executor", "another executor's");
  std::vector<std::vector<float>> logits;
  for (const BatchItem& item : batch)
    logits.push_back(forward(model_, static_cast<CpuSequence*>(item.sequence)->state(), item.tokens, item.engram_ids, item.options));
  return logits;
}

}  // namespace dsv41
