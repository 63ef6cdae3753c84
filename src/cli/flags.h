#pragma once
// Flags shared by several commands: sampling (generate, chat), and the KV tiers with DESIGN §4's
// defaults (chat, serve, bench).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "backend/cpu/sampling.h"
#include "engine/executors.h"
#include "engine/session.h"
#include "kv/kv_cache.h"

namespace dsv41::cli {

struct CacheFlags {
  std::string store_dir;  // empty: no persistent store
  double store_gb = 64;
  double store_lifetime_hours = 72;
  double host_cache_mb = 0;  // 0: 10% of RAM
  std::string swa_pool;      // empty: in-process; memcached://host:port,...
  double swa_pool_mb = 0;    // 0: 10% of RAM
  double swa_ttl_seconds = 300;
};

void add_cache_flags(CLI::App& cmd, CacheFlags& flags);
// --device auto|cpu|cuda into `device` (engine/executors.h).
// With `ranks`, also --ranks N: the model cut over N ranks (docs/parallel.md).
void add_device_flag(CLI::App& cmd, Device& device, int* ranks = nullptr);
void add_sampling_flags(CLI::App& cmd, SamplingParams& params);

// A comma-separated list of integers in [lo, hi] ("1,8"), the value of `flag`; refused by name
// (`what` says what the numbers count) when an item is not such an integer or the list is empty.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag, const std::string& what, int lo, int hi);

// The cache options for the model in `model_dir` served in `mode`, keyed by the checkpoint's identity.
KvCacheOptions cache_options(const CacheFlags& flags, const std::string& model_dir, Mode mode);

}  // namespace dsv41::cli
