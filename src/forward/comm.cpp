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
    group_.publish(rank_, x.data(), x.size());
    group_.arrive_and_wait();
    group_.check_sizes("all_reduce_sum");
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
    group_.publish(rank_, part.data(), part.size());
    group_.arrive_and_wait();
    group_.check_sizes("all_gather");
    for (int r = 0; r < group_.world_; ++r) std::copy_n(group_.shared_[size_t(r)], part.size(), whole.begin() + r * part.size());
    group_.arrive_and_wait();
  }

 private:
  LocalGroup& group_;
  int rank_;
  std::vector<float> sum_;
};

LocalGroup::LocalGroup(int world) : world_(world), shared_(size_t(world), nullptr), sizes_(size_t(world), 0) {
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

void LocalGroup::publish(int rank, const float* data, size_t size) {
  shared_[size_t(rank)] = data;
  sizes_[size_t(rank)] = size;
}

// Ranks that disagree on a collective's size have left the same call: every rank throws (each
// sees the same sizes), none reads past another's buffer.
void LocalGroup::check_sizes(const char* collective) const {
  for (int r = 1; r < world_; ++r)
    if (sizes_[size_t(r)] != sizes_[0])
      fail(std::string(collective) + " of " + std::to_string(world_) + " ranks", "the same size on every rank",
           std::to_string(sizes_[0]) + " values on rank 0, " + std::to_string(sizes_[size_t(r)]) + " on rank " + std::to_string(r));
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
