#pragma once
// A tokenizer for random checkpoints: byte-level BPE in the layout of DeepSeek's tokenizer.json
// (the BOS / EOS / PAD specials at ids 0, 1, 2; the 256 byte symbols; merges), with merges made up
// until it has exactly `vocab_size` tokens, so that every id a random model can emit decodes and
// hashes. Its text is not language, but every code path a real tokenizer takes runs.
#include <cstdint>
#include <string>

namespace dsv41 {

std::string random_tokenizer_json(int64_t vocab_size);
std::string random_tokenizer_config_json();

}  // namespace dsv41
