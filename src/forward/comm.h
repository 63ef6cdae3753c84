#pragma once
// The collectives the ranks of a partitioned model (model/partition.h) meet at, as model.py's
// dist.all_reduce / dist.all_gather: every rank calls each one, in the same order, with buffers of
// the same size. Each rank gets the same bits: sums are taken in rank order, never in the order the
// ranks arrive. On one host the ranks may be threads of one process (LocalGroup, below: the CPU
// executor's ranks); across GPUs, NCCL (issue 24).
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace dsv41 {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // x ← x₀ + x₁ + … + x_{world−1}, element by element, the ranks' x added in rank order.
  virtual void all_reduce_sum(std::span<float> x) = 0;
  // whole ← the ranks' parts one after another (each part.size() values; whole holds world of them).
  virtual void all_gather(std::span<const float> part, std::span<float> whole) = 0;
};

// `world` ranks as threads of this process, each holding comm(rank). A rank that fails calls
// abort(): the others, waiting at a collective or arriving at one later, throw dsv41::Error instead
// of waiting forever; reset() makes the group usable again once every rank has left.
class LocalGroup {
 public:
  explicit LocalGroup(int world);
  ~LocalGroup();
  Comm& comm(int rank);
  void abort();
  void reset();

 private:
  class Rank;
  friend class Rank;
  // Every rank arrives before any leaves; dsv41::Error once the group is aborted.
  void arrive_and_wait();
  void publish(int rank, const float* data, size_t size);
  void check_sizes(const char* collective) const;

  int world_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<const float*> shared_;  // each rank's buffer, published for the collective in flight
  std::vector<size_t> sizes_;         // and its size
  std::mutex mutex_;
  std::condition_variable arrived_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace dsv41
