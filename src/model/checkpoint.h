#pragma once
// A checkpoint directory as Hugging Face lays it out (docs/checkpoint.md): one model.safetensors,
// or shards model-00001-of-0000N.safetensors listed by model.safetensors.index.json.
//
// Checkpoint opens every shard once (mapped, zero-copy) and looks tensors up by name across them.
// ShardedWriter writes one, streaming: it holds at most one shard's tensors in memory.
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/safetensors.h"

namespace dsv41 {

class Checkpoint {
 public:
  // Opens the checkpoint in `dir`:
  //  - model.safetensors.index.json present: its "weight_map" (tensor -> shard file) says which
  //    shards to open; each listed tensor must be in its shard, and each shard tensor listed.
  //  - otherwise model.safetensors, alone;
  //  - otherwise every model-*.safetensors, merged (a model-i-of-N set must be complete).
  // A tensor name in two shards is refused, and so is a directory holding none of these.
  static Checkpoint open(const std::string& dir);

  const TensorView* find(std::string_view name) const;  // nullptr when absent
  const TensorView& get(std::string_view name) const;   // throws when absent
  std::vector<std::string> names() const;               // sorted
  size_t size() const { return tensors_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  struct Located {
    const TensorView* view;  // into shards_[shard], whose views stay put when shards_ moves
    size_t shard;
  };

  Checkpoint() = default;
  void open_indexed();
  void open_unindexed();
  void open_shards(const std::vector<std::string>& file_names);

  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, Located, std::less<>> tensors_;
};

// Writes a checkpoint one tensor at a time. Tensors fill the current shard until the next one
// would take its data past max_shard_bytes; then the shard is written to disk and freed. (A
// tensor larger than the limit gets a shard of its own.) finish() then gives the shards their
// final names model-0000i-of-0000N.safetensors and writes model.safetensors.index.json last, so
// the index only exists once every shard does. When everything fits in one shard, finish() writes
// a plain model.safetensors and no index.
//
// Until finish(), shards sit in `dir` as model-0000i.safetensors.partial, which Checkpoint ignores.
class ShardedWriter {
 public:
  // Creates `dir` if needed; refuses one that already holds a checkpoint, rather than mixing two.
  ShardedWriter(std::string dir, size_t max_shard_bytes);

  // Throws if the name was added before, or as SafetensorsWriter::add does.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t>&& bytes);

  void finish();

 private:
  void write_current_shard();

  std::string dir_;
  size_t max_shard_bytes_;
  SafetensorsWriter current_;                          // the shard being filled
  size_t shards_written_ = 0;                          // .partial files on disk
  std::map<std::string, size_t, std::less<>> shard_of_;  // tensor -> shard number, from 1
  size_t total_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace dsv41
