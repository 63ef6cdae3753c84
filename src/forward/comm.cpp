#include "forward/comm.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace dsv41 {

class LocalGroup::Rank final : public Comm {
 public:
  Rank(LocalGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return group_.world_; }

  // Publish, meet, read everyone's (in rank order) into a scratch row, meet again (no rank
  // rewrites its buffer while another still reads it), then write.
  void all_reduce_sum(std::span<float> x) override {
    group_.shared_[size_t(rank_)] = x.data();
    group_.arrive_and_wait();
    sum_.assign(group_.shared_[0], group_.shared_[0] + x.size());
    for (int r = 1; r < group_.world_; ++r) {
      const float* other = group_.shared_[size_t(r)];
      for (size_t i = 0; i < x.size(); ++i) sum_[i] += other[i];
    }
    group_.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), x.begin());
  }

  void all_gather(std::span<const float> part, std::span<float> whole) override {
    if (whole.size() != part.size() * size_t(group_.world_))
      fail("all_gather", std::to_string(group_.world_) + " parts of " + std::to_string(part.size()) + " values",
           std::to_string(whole.size()) + " values");
    group_.shared_[size_t(rank_)] = part.data();
    group_.arrive_and_wait();
    for (int r = 0; r < group_.world_; ++r) std::copy_n(group_.shared_[size_t(r)], part.size(), whole.begin() + r * part.size());
    group_.arrive_and_wait();
  }

 private:
  LocalGroup& group_;
  int rank_;
  std::vector<float> sum_;
};

LocalGroup::LocalGroup(int world) : world_(world), shared_(size_t(world), nullptr) {
  if (world < 1) fail("a group of ranks", "at least one rank", std::to_string(world));
  for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

LocalGroup::~LocalGroup() = default;

Comm& LocalGroup::comm(int rank) { return *ranks_.at(size_t(rank)); }

void LocalGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto broken = [] { fail("a collective of the ranks", "every rank arriving", "a rank that failed"); };
  if (aborted_) broken();
  const uint64_t generation = generation_;
  if (++waiting_ == world_) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) broken();
}

void LocalGroup::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = false;
  waiting_ = 0;
}

}  // namespace dsv41
