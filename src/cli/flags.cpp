#include "cli/flags.h"

#include <algorithm>
#include <sstream>

#include "base/error.h"
#include "kv/checkpoint_identity.h"

namespace dsv41::cli {

void add_cache_flags(CLI::App& cmd, CacheFlags& f) {
  cmd.add_option("--store", f.store_dir, "Directory of the persistent global-KV store (default: none)");
  cmd.add_option("--store-gb", f.store_gb, "Disk budget of the persistent store, GB")->check(CLI::PositiveNumber);
  cmd.add_option("--store-lifetime-hours", f.store_lifetime_hours,
                 "Guaranteed lifetime of a stored block: younger blocks are never evicted")
      ->check(CLI::NonNegativeNumber);
  // (0 stands for the machine-derived default these two say in words.)
  cmd.add_option("--host-cache-mb", f.host_cache_mb, "Host global-KV cache budget, MB (default: 10% of RAM)")
      ->check(CLI::NonNegativeNumber)
      ->default_str("");
  cmd.add_option("--swa-pool", f.swa_pool,
                 "Where SWA tails live: memcached://host:port[,host:port...] (shared by engines), or this process")
      ->default_str("this process");
  cmd.add_option("--swa-pool-mb", f.swa_pool_mb, "SWA pool budget, MB, in this process (default: 10% of RAM)")
      ->check(CLI::NonNegativeNumber)
      ->default_str("");
  cmd.add_option("--swa-ttl", f.swa_ttl_seconds, "SWA pool time to live from the last use, seconds")
      ->check(CLI::PositiveNumber);
}

void add_device_flag(CLI::App& cmd, Device& device, int* ranks) {
  cmd.add_option("--device", device, "Where the model runs: auto (CUDA when built with it and a GPU is present), cpu, cuda")
      ->transform(CLI::CheckedTransformer(std::map<std::string, Device>{{"auto", Device::Auto}, {"cpu", Device::Cpu}, {"cuda", Device::Cuda}},
                                          CLI::ignore_case))
      ->default_str("auto");
  if (ranks)
    cmd.add_option("--ranks", *ranks,
                   "Cut the model over N ranks as DeepSeek's model.py does at world_size N (docs/parallel.md): on the CPU, N "
                   "threads each holding its part (several GPUs: not yet)")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
}

void add_sampling_flags(CLI::App& cmd, SamplingParams& p) {
  cmd.add_option("--temperature", p.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd.add_option("--top-k", p.top_k, "Keep the k most likely tokens (0 = all)")->check(CLI::Range(0, 1 << 30));
  cmd.add_option("--top-p", p.top_p, "Nucleus sampling mass")->check(CLI::Range(1e-6, 1.0));
  cmd.add_option("--min-p", p.min_p, "Drop tokens below min-p x the top probability")->check(CLI::Range(0.0, 1.0));
  cmd.add_option("--seed", p.seed, "Random seed of the sampler");
  cmd.add_option("--presence-penalty", p.presence_penalty, "Subtracted from the logit of every token of the reply so far")
      ->check(CLI::Range(-2.0, 2.0));
  cmd.add_option("--frequency-penalty", p.frequency_penalty, "Times its count, subtracted from a reply token's logit")
      ->check(CLI::Range(-2.0, 2.0));
  cmd.add_option("--repetition-penalty", p.repetition_penalty,
                 "Divides the positive logits (multiplies the negative) of prompt and reply tokens; 1 = off")
      ->check(CLI::Range(1e-3, 10.0));
}

KvCacheOptions cache_options(const CacheFlags& f, const std::string& model_dir, Mode mode) {
  KvCacheOptions o;
  o.fingerprint = "checkpoint " + checkpoint_identity(model_dir);
  o.mode = mode_name(mode);
  o.store_dir = f.store_dir;
  o.store_budget_bytes = uint64_t(f.store_gb * 1e9);
  o.store_lifetime_ms = int64_t(f.store_lifetime_hours * 3600e3);
  if (f.host_cache_mb > 0) o.host_budget_bytes = int64_t(f.host_cache_mb * 1e6);
  o.swa.url = f.swa_pool;
  if (f.swa_pool_mb > 0) o.swa.budget_bytes = int64_t(f.swa_pool_mb * 1e6);
  o.swa.ttl_ms = int64_t(f.swa_ttl_seconds * 1e3);
  return o;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& flag, const std::string& what, int lo, int hi) {
  const std::string expected = "comma-separated " + what + " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "] like " +
                               std::to_string(lo) + "," + std::to_string(std::min(hi, lo + 7));
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      const int n = std::stoi(item, &used);
      if (used != item.size() || n < lo || n > hi) throw std::invalid_argument(item);
      out.push_back(n);
    } catch (const std::exception&) {
      fail(flag, expected, "\"" + item + "\"");
    }
  }
  if (out.empty()) fail(flag, expected, "none");
  return out;
}

}  // namespace dsv41::cli
