#pragma once
// The CPU executor over a model cut into ranks (model/partition.h), as model.py runs with
// world_size > 1: each rank a CpuExecutor over its part of the weights, in a thread of its own,
// every rank running every call on its own copy of each sequence's KV (the attention's one KV head
// is every rank's), meeting the others at the collectives (forward/comm.h LocalGroup). The ranks'
// logits are the same bits; rank 0's are returned. It is the reference the multi-GPU executor is
// held to (issue 24), and it tests the partition itself on any machine. Its results are the whole
// model's up to the order of the sums cut over ranks (wo_b, the indexer's heads, the experts:
// docs/parallel.md).
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "forward/comm.h"
#include "forward/executor.h"

namespace dsv41 {

class RankedCpuExecutor final : public Executor {
 public:
  // `model` is the whole model (what model() returns); each rank's part is loaded from its
  // directory. dsv41::Error when `ranks` does not divide the model (check_partition).
  RankedCpuExecutor(const Model& model, int ranks);
  ~RankedCpuExecutor() override;
  const Model& model() const override { return model_; }
  std::string name() const override { return "cpu:" + std::to_string(ranks_.size()); }
  std::unique_ptr<Sequence> new_sequence() override;
  std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) override;
  bool speculates() const override { return true; }
  void dspark_ingest(Sequence& sequence, int64_t first_pos, std::span<const float> hidden, int64_t rows) override;
  std::vector<Draft> dspark_drafts(const std::vector<DraftRequest>& requests) override;
  SequenceMark mark(Sequence& sequence, int64_t rows) override;
  void rewind(Sequence& sequence, const SequenceMark& mark) override;
  bool takes_images() const override { return model_.has_vision(); }
  std::vector<std::vector<float>> encode_images(const std::vector<VisionImage>& images) override;

 private:
  void on_ranks(const std::function<void(size_t rank)>& f);

  const Model& model_;
  std::vector<std::unique_ptr<Model>> parts_;
  std::vector<std::unique_ptr<CpuExecutor>> ranks_;
  LocalGroup group_;
  std::mutex calls_;  // one call at a time meets at the group's collectives (others wait their turn)
};

}  // namespace dsv41
