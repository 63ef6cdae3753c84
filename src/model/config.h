#pragma once
// The model description: every hyper-parameter of a V4.1 checkpoint, named as the official
// `inference/config.json` names it (the fields of the reference's ModelArgs), plus what follows
// from them: the role of each layer in CSA2 and where the CED decoder starts.
//
// Two on-disk layouts are read (DESIGN §2 item 2): the official `inference/config.json` (flat keys,
// ModelArgs names and defaults) and the Hugging Face `config.json` (`text_config`, `vision_config`,
// `quantization_config`, HF names and the released defaults). Both give the same Config.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsv41 {

// A layer's part in CSA2 (report §2.3). Every layer keeps a sliding window; the others add
// compressed KV on top, produced (Full), re-scored (Reindex) or reused as published (Reuse).
enum class LayerKind {
  Swa,      // compress ratio 0: sliding window only
  Full,     // kv-source: owns the compressor and the index keys, and runs its own indexer
  Reindex,  // index-source without a compressor: scores the shared index keys with its own query
  Reuse,    // reads the latest published compressed KV and top-k
};
const char* layer_kind_name(LayerKind kind);

struct VisionConfig {
  int n_layers = 0;  // 0 disables the vision path
  int dim = 1024;
  int n_heads = 16;
  int inter_dim = 2816;
  int patch_size = 14;
  double rope_theta = 10000.0;
  int downsample_ratio = 3;
  int max_n_token = 1024;
  int64_t min_pixels = 544 * 544;
  std::optional<int> max_wh_ratio;
};

struct Config {
  std::string source;  // where it came from: a preset name or a file path (for messages)

  // Runtime limits the official config may carry; they size caches, not weights.
  int max_batch_size = 4;
  int64_t max_seq_len = 4096;
  double temperature = 1.0;

  // Weight storage: "fp8" (e4m3, 32x32 ue8m0 blocks) or "bf16"; experts "fp4" or the same as dtype.
  std::string dtype = "fp8";
  std::optional<std::string> expert_dtype = "fp4";

  int64_t vocab_size = 129280;
  int dim = 1024;
  int moe_inter_dim = 1024;
  int n_layers = 5;
  int n_mtp_layers = 1;  // DSpark draft layers appended after the backbone
  int n_heads = 16;

  // MoE
  int n_routed_experts = 8;
  int n_shared_experts = 1;
  int n_activated_experts = 2;
  std::string score_func = "sqrtsoftplus";
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;

  // Attention
  int q_lora_rank = 256;
  int head_dim = 128;
  int rope_head_dim = 32;
  double norm_eps = 1e-20;
  int o_groups = 8;
  int o_lora_rank = 256;
  int window_size = 128;
  std::vector<int> compress_ratios = {0, 2, 2, 1, 1, 0};  // one per layer, DSpark layers included
  std::vector<int> kv_source_layers = {1, 3};
  std::vector<int> index_source_layers = {1, 3};

  // RoPE; YaRN on compressed layers when original_seq_len > 0
  double compress_rope_theta = 40000.0;
  int64_t original_seq_len = 0;
  double rope_theta = 10000.0;
  double rope_factor = 40;
  int beta_fast = 32;
  int beta_slow = 1;

  // Indexer and the hierarchical (candidate-block) first level; candidate_source_layer < 0 = off
  int index_n_heads = 16;
  int index_head_dim = 64;
  int index_topk = 64;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;

  // mHC
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;

  // Engram
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // table rows per Engram layer
  int engram_max_ngram_size = 1;
  int64_t engram_vocab_size = 0;  // each (order, head) searches its prime from here
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;

  VisionConfig vision;
  int64_t image_token_id = 129264;

  // DSpark
  int dspark_block_size = 0;  // 0: no draft layers are built
  int64_t dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 256;
  int dspark_n_routed_experts = 0;     // 0: same as the backbone
  int dspark_n_activated_experts = 0;  // 0: same as the backbone

  // --- derived ------------------------------------------------------------------------------
  int n_total_layers() const { return n_layers + n_mtp_layers; }
  bool has_dspark() const { return dspark_block_size > 0 && n_mtp_layers > 0; }
  bool has_engram() const { return !engram_layer_ids.empty(); }
  bool has_vision() const { return vision.n_layers > 0; }
  bool quantized() const { return dtype == "fp8"; }
  bool fp4_experts() const { return expert_dtype && *expert_dtype == "fp4"; }
  LayerKind layer_kind(int layer) const;
  bool is_kv_source(int layer) const;
  // Whether DSpark reads the residual entering `layer` (dspark_target_layer_ids), and its place in
  // the context features (the targets in layer order, as model.py appends them).
  int dspark_target_index(int layer) const;
  bool is_index_source(int layer) const;
  // The kv-source whose compressed KV layer `layer` reads (itself if it is one); -1 for Swa.
  int kv_source_of(int layer) const;
  // First layer of the CED decoder: the kv-source with ratio 1 (report §2.2); n_layers if none.
  int decoder_start() const;
  int routed_experts(int layer) const;
  int activated_experts(int layer) const;
  // The n-grams hashed per Engram layer: (max_ngram_size - 1) orders x n_heads.
  int engram_hash_columns() const { return (engram_max_ngram_size - 1) * engram_n_heads; }
  // Layer `layer`'s place in engram_layer_ids (its hash ids' column block), -1 if it has no Engram.
  int engram_index(int layer) const;
  bool is_engram_layer(int layer) const { return engram_index(layer) >= 0; }
};

// Checks every field and every cross-field rule; throws dsv41::Error naming the key, what was
// expected and what was found. Called by every loader; presets are checked by the tests.
void validate(const Config& config);

// Parses config.json text in either layout; `where` names the source in messages.
Config parse_config(const std::string& json_text, const std::string& where);
// Reads DIR/config.json (or a file path).
Config load_config(const std::string& path);
// Writes the official inference/config.json layout (the one model.py's ModelArgs takes).
std::string to_official_json(const Config& config);

// Embedded presets: "deepseek-v4.1-flash", "bench-1gpu", "tiny".
Config preset(const std::string& name);
std::vector<std::string> preset_names();

// Engram table layout (reference engram.py): each (layer, order, head) hashes modulo its own
// prime; the primes are the consecutive primes above engram_vocab_size - 1 in (layer, order,
// head) order. Returns the primes of every Engram layer (in engram_layer_ids' order), found in one
// pass with a deterministic primality test (per-layer searches from the start, by trial
// division, took a minute for settings inside the config's limits).
std::vector<std::vector<int64_t>> engram_primes(const Config& config);
// Total table rows of each Engram layer: the sum of its primes.
std::vector<int64_t> engram_table_rows(const Config& config);

}  // namespace dsv41
