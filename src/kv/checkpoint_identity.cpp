#include "kv/checkpoint_identity.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "base/error.h"
#include "kv/block_key.h"

namespace dsv41 {

namespace {

constexpr std::streamoff kEdgeBytes = 4 << 20;

void hash_range(XXH3_state_t* state, std::ifstream& in, std::streamoff from, std::streamoff bytes) {
  std::vector<char> buffer(1 << 20);
  in.seekg(from);
  while (bytes > 0) {
    const std::streamsize n = std::streamsize(std::min<std::streamoff>(bytes, std::streamoff(buffer.size())));
    in.read(buffer.data(), n);
    if (in.gcount() != n) fail("checkpoint identity", std::to_string(n) + " readable bytes", std::to_string(in.gcount()));
    XXH3_128bits_update(state, buffer.data(), size_t(n));
    bytes -= n;
  }
}

}  // namespace

std::string checkpoint_identity(const std::string& dir) {
  namespace fs = std::filesystem;
  std::ifstream config(fs::path(dir) / "config.json", std::ios::binary);
  if (!config) fail(dir, "a checkpoint directory with config.json", "none");
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> owner(XXH3_createState(), XXH3_freeState);
  XXH3_state_t* state = owner.get();
  XXH3_128bits_reset(state);
  const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  XXH3_128bits_update(state, text.data(), text.size() + 1);
  if (std::ifstream tokenizer{fs::path(dir) / "tokenizer.json", std::ios::binary}) {
    const std::string json((std::istreambuf_iterator<char>(tokenizer)), std::istreambuf_iterator<char>());
    XXH3_128bits_update(state, json.data(), json.size() + 1);
  }

  std::vector<fs::path> shards;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") shards.push_back(entry.path());
  std::sort(shards.begin(), shards.end());
  for (const fs::path& shard : shards) {
    const std::string name = shard.filename().string();
    const uint64_t size = fs::file_size(shard);
    XXH3_128bits_update(state, name.data(), name.size() + 1);
    XXH3_128bits_update(state, &size, sizeof size);
    std::ifstream in(shard, std::ios::binary);
    // The head, then the tail that does not overlap it.
    const std::streamoff total = std::streamoff(size), head = std::min(total, kEdgeBytes);
    const std::streamoff tail_from = std::max(head, total - kEdgeBytes);
    hash_range(state, in, 0, head);
    hash_range(state, in, tail_from, total - tail_from);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  return to_hex(BlockKey{h.high64, h.low64});
}

}  // namespace dsv41
