#include "train/model/train_model.h"

#include <malloc.h>

#include "forward/network.h"
#include "train/model/train_ops.h"

namespace dsv41::train {

namespace {

// A step allocates its activations, gradients and saved values (tens of MB at tiny's 256 tokens) and
// frees them at the next; glibc would hand the large blocks back to the kernel each time (mmap'd
// blocks, a trimmed heap) and fault them in again, zero-filled: half of tiny's backward time. A
// training process keeps them instead (glibc's tunables, process-wide; set once).
void keep_freed_memory() {
  static const bool kept = [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    return true;
  }();
  (void)kept;
}

}  // namespace

template <class T>
TrainModel<T>::TrainModel(Parameters<T>& params, TrainOptions options) : params_(params), options_(options) {
  keep_freed_memory();
  reset_expert_load();
}

template <class T>
TrainModel<T>::~TrainModel() = default;

template <class T>
Losses TrainModel<T>::forward(std::span<const int64_t> tokens, const int64_t* engram_ids, Trace* trace) {
  const Config& c = params_.config();
  tape_.clear();  // the last forward's backward, if never run, reads the op set replaced here
  if (trace) {
    trace->block_out.assign(size_t(c.n_layers), {});
    trace->route_experts.assign(size_t(c.n_layers), {});
    trace->route_scores.assign(size_t(c.n_layers), {});
    trace->topk.clear();
  }
  ops_ = std::make_unique<TrainOps<T>>(params_, options_, tape_, tokens, engram_ids, trace, expert_load_);
  run_network(c, *ops_, trace);
  return ops_->losses;
}

template <class T>
void TrainModel<T>::backward(T lm_weight, T indexer_weight) {
  if (!ops_ || tape_.empty()) fail("train backward", "a forward whose backward has not run", "none");
  ops_->lm_weight = lm_weight;
  ops_->indexer_weight = indexer_weight;
  tape_.backward();
}

template <class T>
const Margins& TrainModel<T>::margins() const {
  if (!ops_) fail("train model", "a forward before its margins are read", "none");
  return ops_->margins;
}

template <class T>
std::vector<T> TrainModel<T>::logits() const {
  if (!ops_) fail("train model", "a forward before its logits are read", "none");
  const Config& c = params_.config();
  const Tensor<T>& h = ops_->final_hidden();
  const int64_t rows = int64_t(h->size()) / c.dim;
  std::vector<T> out(size_t(rows * c.vocab_size));
  grad::linear_forward(h->v(), rows, int64_t(c.dim), params_.head().v(), c.vocab_size, out.data());
  return out;
}

template <class T>
void TrainModel<T>::reset_expert_load() {
  const Config& c = params_.config();
  expert_load_.assign(size_t(c.n_layers), {});
  for (int l = 0; l < c.n_layers; ++l) expert_load_[size_t(l)].assign(size_t(c.routed_experts(l)), 0);
}

template class TrainModel<float>;
template class TrainModel<double>;

}  // namespace dsv41::train
