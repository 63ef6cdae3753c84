#include "model/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "base/error.h"
#include "model/json_document.h"

namespace dsv41 {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";
constexpr std::string_view kShardPrefix = "model-";
constexpr std::string_view kShardSuffix = ".safetensors";

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

bool is_shard_name(std::string_view name) {
  return name.size() > kShardPrefix.size() + kShardSuffix.size() && name.starts_with(kShardPrefix) &&
         name.ends_with(kShardSuffix);
}

// "model-00002-of-00003.safetensors" -> {2, 3}; nullopt for any other name.
std::optional<std::pair<size_t, size_t>> parse_numbered_shard(std::string_view name) {
  if (!is_shard_name(name)) return std::nullopt;
  name.remove_prefix(kShardPrefix.size());
  name.remove_suffix(kShardSuffix.size());
  const size_t of = name.find("-of-");
  if (of == std::string_view::npos) return std::nullopt;
  const auto number = [](std::string_view digits) -> std::optional<size_t> {
    size_t value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return value;
  };
  const std::optional<size_t> index = number(name.substr(0, of));
  const std::optional<size_t> count = number(name.substr(of + 4));
  if (!index || !count || *index < 1 || *index > *count) return std::nullopt;
  return std::pair{*index, *count};
}

std::string numbered_shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index, count);
  return name;
}

std::string partial_shard_name(size_t index) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu.safetensors.partial", index);
  return name;
}

// Without an index nothing lists the shards, but numbered names do: next to model-00002-of-00003
// must lie 00001 and 00003. A partial download would otherwise open as a smaller checkpoint.
void check_numbered_shards_complete(const std::string& dir, const std::vector<std::string>& file_names) {
  std::optional<size_t> count;
  std::set<size_t> present;
  for (const std::string& name : file_names) {
    const auto numbered = parse_numbered_shard(name);
    if (!numbered) continue;
    if (count && *count != numbered->second)
      fail(dir, "shards of one set, all \"-of-" + std::to_string(*count) + "\"", name);
    count = numbered->second;
    present.insert(numbered->first);
  }
  if (count && present.size() != *count)
    fail(dir + " (no " + kIndexName + ")", "all " + std::to_string(*count) + " shards model-*-of-*.safetensors",
         std::to_string(present.size()) + " of them");
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable file", "one we cannot open");
  return parse_json(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), path);
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) fail(dir, "a checkpoint directory", error ? error.message() : "no directory");
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  if (fs::exists(join(dir, kIndexName), error))
    checkpoint.open_indexed();
  else
    checkpoint.open_unindexed();
  return checkpoint;
}

void Checkpoint::open_indexed() {
  const std::string index_path = join(dir_, kIndexName);
  const json index = read_json_file(index_path);
  const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || weight_map == index.end() || !weight_map->is_object())
    fail(index_path + ": key 'weight_map'", "an object mapping tensor names to shard files",
         index.is_object() && weight_map != index.end() ? std::string("a JSON ") + weight_map->type_name() : "none");

  std::set<std::string> shard_names;
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string()) fail(index_path + ": weight_map entry '" + tensor + "'", "a shard file name", shard.dump());
    // A shard is a file of the checkpoint's own directory: a path elsewhere (absolute, or up
    // through "..") would load weights from outside the checkpoint and its identity.
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos)
      fail(index_path + ": weight_map entry '" + tensor + "'", "a file name in the checkpoint's directory", shard.dump());
    shard_names.insert(shard.get<std::string>());
  }
  const std::vector<std::string> file_names(shard_names.begin(), shard_names.end());
  open_shards(file_names);

  // The index and the shards must agree both ways; a disagreement means one of them is stale.
  for (const auto& [tensor, shard] : weight_map->items()) {
    const auto position = std::lower_bound(file_names.begin(), file_names.end(), shard.get<std::string>());
    const SafetensorsFile& file = shards_[static_cast<size_t>(position - file_names.begin())];
    if (!file.find(tensor))
      fail("tensor '" + tensor + "'", "in shard " + file.path() + ", as " + index_path + " says", "missing");
  }
  for (const auto& [name, located] : tensors_)
    if (!weight_map->contains(name))
      fail("tensor '" + name + "' of shard " + shards_[located.shard].path(), "listed in " + index_path, "unlisted");
}

void Checkpoint::open_unindexed() {
  bool has_single = false;
  std::vector<std::string> shard_names;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (name == kSingleName)
      has_single = true;
    else if (is_shard_name(name))
      shard_names.push_back(name);
  }
  if (error) fail(dir_, "a directory we can list", error.message());

  if (has_single && !shard_names.empty())
    fail(dir_, std::string("either ") + kSingleName + " or model-*.safetensors shards (or an index to choose)",
         "both");
  if (has_single) {
    open_shards({kSingleName});
    return;
  }
  if (shard_names.empty())
    fail(dir_, std::string("a checkpoint: ") + kSingleName + ", model-*.safetensors shards or " + kIndexName,
         "no safetensors file");
  std::sort(shard_names.begin(), shard_names.end());
  check_numbered_shards_complete(dir_, shard_names);
  open_shards(shard_names);
}

void Checkpoint::open_shards(const std::vector<std::string>& file_names) {
  shards_.reserve(file_names.size());
  for (const std::string& name : file_names) shards_.push_back(SafetensorsFile::open(join(dir_, name)));
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    for (const TensorView& view : shards_[shard].tensors()) {
      const auto [it, inserted] = tensors_.try_emplace(view.name, Located{&view, shard});
      if (!inserted)
        fail("tensor '" + view.name + "'", "in one shard only",
             "in " + shards_[it->second.shard].path() + " and " + shards_[shard].path());
    }
  }
}

const TensorView* Checkpoint::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.view;
}

const TensorView& Checkpoint::get(std::string_view name) const {
  const TensorView* view = find(name);
  if (!view) fail("tensor " + std::string(name), "in checkpoint " + dir_, "missing");
  return *view;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, located] : tensors_) names.push_back(name);
  return names;
}

ShardedWriter::ShardedWriter(std::string dir, size_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error) fail(dir_, "a directory we can create", error.message());
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (name == kSingleName || name == kIndexName || is_shard_name(name))
      fail(dir_, "a directory without a checkpoint (ShardedWriter does not overwrite one)", "existing " + name);
  }
  if (error) fail(dir_, "a directory we can list", error.message());
}

void ShardedWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t>&& bytes) {
  const std::string where = "ShardedWriter " + dir_ + ": tensor '" + name + "'";
  if (finished_) fail(where, "add() before finish()", "add() after finish()");
  if (shard_of_.contains(name)) fail(where, "a name not added before", "a duplicate");
  if (current_.tensor_count() > 0 && current_.data_bytes() + bytes.size() > max_shard_bytes_) write_current_shard();

  const size_t nbytes = bytes.size();
  current_.add(name, dtype, std::move(shape), std::move(bytes));
  shard_of_.emplace(std::move(name), shards_written_ + 1);
  total_bytes_ += nbytes;
}

void ShardedWriter::write_current_shard() {
  current_.write(join(dir_, partial_shard_name(shards_written_ + 1)));
  current_ = SafetensorsWriter();  // frees the shard's tensors
  ++shards_written_;
}

void ShardedWriter::finish() {
  if (finished_) fail("ShardedWriter " + dir_, "finish() once", "finish() again");
  finished_ = true;

  if (shards_written_ == 0) {  // everything fit in one shard: no index needed
    current_.write(join(dir_, kSingleName));
    return;
  }
  if (current_.tensor_count() > 0) write_current_shard();

  const size_t count = shards_written_;
  for (size_t index = 1; index <= count; ++index) {
    std::error_code error;
    fs::rename(join(dir_, partial_shard_name(index)), join(dir_, numbered_shard_name(index, count)), error);
    if (error) fail(join(dir_, partial_shard_name(index)), "a successful rename", error.message());
  }

  json index;
  index["metadata"]["total_size"] = total_bytes_;
  index["weight_map"] = json::object();
  for (const auto& [name, shard] : shard_of_) index["weight_map"][name] = numbered_shard_name(shard, count);
  const std::string text = index.dump(2) + "\n";
  // The index goes last and atomically (which also makes the renames above durable).
  write_text_atomically(join(dir_, kIndexName), text);
}

}  // namespace dsv41
