#pragma once
// The training forward's record of its backward (docs/training.md, "The model"): each op of the
// network, as it runs, appends the call of its backward (the op's own, from src/train/grad, with its
// Saved struct and its inputs captured); backward() runs them in reverse. The order is the network's
// own (forward/network.h run by the training op set), so the reverse schedule is never written by
// hand. A tensor's gradient is added into by every op that read it — the residual streams by each
// sub-layer's mixes, input and write-back, a Full layer's compressed KV and index keys by its Reindex
// and Reuse layers — before its producer's backward, recorded earlier, runs and reads it.
#include <functional>
#include <memory>
#include <vector>

namespace dsv41::train {

// An activation and its gradient (allocated, zero, by the first op that adds to it; an activation
// no gradient reached has none, and its producer's backward has nothing to do).
template <class T>
struct Node {
  std::vector<T> value, grad;

  explicit Node(size_t n) : value(n) {}
  explicit Node(std::vector<T> v) : value(std::move(v)) {}
  size_t size() const { return value.size(); }
  T* v() { return value.data(); }
  const T* v() const { return value.data(); }
  T* g() {
    if (grad.empty()) grad.assign(value.size(), T(0));
    return grad.data();
  }
  bool has_grad() const { return !grad.empty(); }
};

template <class T>
using Tensor = std::shared_ptr<Node<T>>;

template <class T>
Tensor<T> tensor(size_t n) {
  return std::make_shared<Node<T>>(n);
}

// The same values with no way back: what reads it never reaches what produced it (the indexer's
// inputs, docs/training.md "The indexer's gradient").
template <class T>
Tensor<T> detach(const Tensor<T>& x) {
  return std::make_shared<Node<T>>(x->value);
}

class Tape {
 public:
  void record(std::function<void()> backward) { steps_.push_back(std::move(backward)); }
  // Runs every recorded backward, last first, and forgets them.
  void backward() {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) (*it)();
    steps_.clear();
  }
  void clear() { steps_.clear(); }
  bool empty() const { return steps_.empty(); }

 private:
  std::vector<std::function<void()>> steps_;
};

}  // namespace dsv41::train
