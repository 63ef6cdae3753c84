#pragma once
// The identity of a checkpoint directory, for the cache keys' salt (kv/prefix_key.h): two
// checkpoints of one config (two random seeds, two fine-tunes) must never share KV.
//
// Hashing every weight would cost minutes for the real model at each start, so the identity is
// the XXH3-128 of: config.json's text, tokenizer.json's if present (Engram hashes over the
// vocabulary it defines), then for each *.safetensors file (by name) its name, its size, and its
// first and last 4 MiB — the safetensors header (names, shapes, offsets) and weights
// of the first and last tensors. Two checkpoints that differ only inside the middle of a shard
// would share an identity; a fine-tune or a reseeded random checkpoint changes every tensor.
#include <string>

namespace dsv41 {

// A 32-hex-digit text. Throws dsv41::Error if the directory has no config.json.
std::string checkpoint_identity(const std::string& dir);

}  // namespace dsv41
