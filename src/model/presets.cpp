// The embedded model configurations. `deepseek-v4.1-flash` is the released model (report §4.2.1,
// reference notes §0); the others keep its schedule shape at sizes a single GPU or CI can hold.
#include <functional>
#include <map>

#include "base/error.h"
#include "model/config.h"

namespace dsv41 {

namespace {

Config flash() {
  Config c;
  c.max_batch_size = 4;
  c.max_seq_len = 1 << 20;  // 1M-token context
  c.dtype = "fp8";
  c.expert_dtype = "fp4";
  c.vocab_size = 129280;
  c.dim = 5120;
  c.moe_inter_dim = 2304;
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.n_heads = 64;
  c.n_routed_experts = 384;
  c.n_shared_experts = 1;
  c.n_activated_experts = 6;
  c.score_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.q_lora_rank = 1280;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.norm_eps = 1e-20;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.window_size = 128;
  // 2 SWA layers; encoder: 3 groups of 6 at m=2 (Full + 5 Reuse); decoder: 5 groups of 4 at m=1
  // (Full + 3 Reuse, then Reindex + 3 Reuse); 3 SWA-only DSpark layers.
  c.compress_ratios = {0, 0};
  c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
  c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
  c.compress_ratios.insert(c.compress_ratios.end(), 3, 0);
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.compress_rope_theta = 160000;
  c.original_seq_len = 65536;
  c.rope_theta = 10000;
  c.rope_factor = 16;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_source_layer = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_layer_ids = {1, 14};
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_max_ngram_size = 4;
  c.engram_vocab_size = 16000000;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_pad_id = 2;
  c.engram_compressed_vocab_size = 99092;
  c.vision = VisionConfig{32, 1024, 16, 2816, 14, 10000.0, 3, 1024, 544 * 544, std::nullopt};
  c.image_token_id = 129264;
  c.dspark_block_size = 5;
  c.dspark_noise_token_id = 128799;
  c.dspark_target_layer_ids = {37, 38, 39};
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 128;
  c.dspark_n_activated_experts = 3;
  return c;
}

// The real attention, indexer, window, expert and vocabulary shapes and all 40 layers, with 16
// routed experts (6 active, as released) and Engram tables of ~2.4M rows, so that one H200 holds
// weights (~23 GB) and a 1M-token global KV (890 MB) with room for batches. No vision tower.
Config bench_1gpu() {
  Config c = flash();
  c.n_routed_experts = 16;
  c.dspark_n_routed_experts = 16;
  c.engram_vocab_size = 100000;
  c.engram_num_embeddings = {2403994, 2410706};
  c.vision.n_layers = 0;
  return c;
}

// bench-1gpu with the released vision tower: `dsv41 bench vision --device cuda --random-weights`,
// the tower and the prefill with an image at the released widths (the CUDA attention takes head
// dims 64 and 512, not small's 128).
Config bench_1gpu_vision() {
  Config c = bench_1gpu();
  c.vision = flash().vision;
  return c;
}

// A few layers with the released schedule's shape: SWA-only layers, an encoder Full+Reuse group
// at m=2, and decoder Full+Reuse and Reindex+Reuse groups at m=1 behind a candidate source;
// one Engram layer and one DSpark layer. Small enough for CI's two cores.
Config tiny() {
  Config c = flash();
  c.max_seq_len = 4096;
  c.vocab_size = 1024;
  c.dim = 128;
  c.moe_inter_dim = 64;
  c.n_layers = 8;
  c.n_mtp_layers = 1;
  c.n_heads = 4;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.q_lora_rank = 32;
  c.head_dim = 64;
  c.rope_head_dim = 16;
  c.o_groups = 2;
  c.o_lora_rank = 32;
  c.window_size = 16;
  c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0};
  c.kv_source_layers = {2, 4};
  c.index_source_layers = {2, 4, 6};
  c.candidate_source_layer = 4;
  c.candidate_topk_blocks = 4;
  c.candidate_block_size = 4;
  c.index_n_heads = 8;
  c.index_head_dim = 32;
  c.index_topk = 8;
  c.engram_layer_ids = {1};
  c.engram_num_embeddings = {6126};
  c.engram_vocab_size = 1000;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_compressed_vocab_size = 1024;
  c.vision.n_layers = 0;
  c.image_token_id = 1020;
  c.dspark_block_size = 4;
  c.dspark_noise_token_id = 1000;
  c.dspark_target_layer_ids = {5, 6, 7};
  c.dspark_markov_rank = 32;
  c.dspark_n_routed_experts = 6;
  c.dspark_n_activated_experts = 3;
  return c;
}

// tiny with the vision tower of the reference's tiny vision fixture (v41-tiny-vision, make_fixtures.py
// VISION_CONFIG: 2 ViT blocks of width 64, 4 heads, at most 64 tokens and at least 56 x 56 pixels
// per image): the engine's, the server's and the CLI's image tests.
Config tiny_vision() {
  Config c = tiny();
  c.vision = VisionConfig{2, 64, 4, 96, 14, 10000.0, 3, 64, 56 * 56, std::nullopt};
  return c;
}

// The tiny schedule at sizes where matrix products dominate, as in the real model: the CPU
// benchmark's larger configuration (~150M parameters).
Config small() {
  Config c = tiny();
  c.vocab_size = 8192;
  c.dim = 1024;
  c.moe_inter_dim = 512;
  c.n_heads = 8;
  c.head_dim = 128;
  c.rope_head_dim = 64;
  c.q_lora_rank = 256;
  c.o_lora_rank = 256;
  c.n_routed_experts = 16;
  c.n_activated_experts = 2;
  c.window_size = 64;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.index_topk = 64;
  c.candidate_topk_blocks = 16;
  c.candidate_block_size = 8;
  c.engram_n_heads = 4;
  c.engram_head_dim = 64;
  c.engram_num_embeddings = engram_table_rows(c);
  c.engram_compressed_vocab_size = c.vocab_size;
  c.image_token_id = 8190;
  c.dspark_noise_token_id = 8000;
  c.dspark_markov_rank = 64;
  c.dspark_n_routed_experts = 8;
  return c;
}

// small with the released vision tower (32 ViT blocks of width 1024, 16 heads, the released token
// and pixel bounds): `dsv41 bench vision`'s configuration, where the tower's cost is the real one.
Config small_vision() {
  Config c = small();
  c.vision = flash().vision;
  return c;
}

// V4.1-Flash's KV and schedule shapes — all 40 layers and the DSpark layers, head 512, RoPE 64,
// index keys 128 with top-512, window 128, the released ratios, sources and candidate blocks — at
// small widths: the configuration on which a CPU measures the KV bytes per token and runs the
// cache at the real block and window sizes (`dsv41 bench cache`).
Config flash_kv() {
  Config c = flash();
  c.max_seq_len = 65536;
  c.vocab_size = 1024;
  c.dim = 256;
  c.moe_inter_dim = 128;
  c.n_mtp_layers = 1;
  c.compress_ratios.resize(c.compress_ratios.size() - 2);
  c.n_heads = 4;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.q_lora_rank = 64;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.index_n_heads = 4;
  c.engram_layer_ids = {1, 14};
  c.engram_vocab_size = 1000;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_num_embeddings = engram_table_rows(c);
  c.engram_compressed_vocab_size = c.vocab_size;
  c.vision.n_layers = 0;
  c.image_token_id = 1020;
  c.dspark_noise_token_id = 1000;
  c.dspark_markov_rank = 32;
  c.dspark_n_routed_experts = 8;
  c.dspark_n_activated_experts = 2;
  return c;
}

// The model `scripts/main.sh` serves (docs/default-model.md): tiny's schedule at twice its width,
// with DeepSeek's real vocabulary (129280 rows: the V3 tokenizer's 128815 ids, then padding) so
// that it ships the real tokenizer, and a context of 16K tokens. Two CPU cores decode tens of
// tokens per second on it.
Config serve_default() {
  Config c = tiny();
  c.max_seq_len = 16384;
  c.vocab_size = 129280;
  c.dim = 256;
  c.moe_inter_dim = 128;
  c.engram_compressed_vocab_size = 98627;  // the V3 tokenizer's; init-random recomputes it from the tokenizer it ships
  c.image_token_id = flash().image_token_id;
  c.dspark_noise_token_id = flash().dspark_noise_token_id;  // <｜place▁holder▁no▁799｜> in the V3 tokenizer
  return c;
}

const std::map<std::string, std::function<Config()>>& presets() {
  static const std::map<std::string, std::function<Config()>> all = {
      {"deepseek-v4.1-flash", flash}, {"bench-1gpu", bench_1gpu}, {"bench-1gpu-vision", bench_1gpu_vision}, {"tiny", tiny}, {"tiny-vision", tiny_vision}, {"small", small},
      {"small-vision", small_vision},
      {"flash-kv", flash_kv}, {"serve-default", serve_default}};
  return all;
}

}  // namespace

Config preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string names;
    for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("preset", "one of " + names, "\"" + name + "\"");
  }
  Config c = it->second();
  c.source = "preset " + name;
  return c;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (auto& [name, make] : presets()) names.push_back(name);
  return names;
}

}  // namespace dsv41
