#pragma once
// A counter-based generator for seeded tensors: element i of a tensor is a hash of (seed, the
// tensor's name, i), so any slice is produced on its own, in any order, the same on every machine.
// The random checkpoints (model/random_checkpoint.cpp) and the trainer's initialisation
// (train/model/parameters.cpp) draw from it.
#include <cstdint>
#include <string>

namespace dsv41 {

// SplitMix64's output function: a bijection of 64-bit words that mixes every input bit into all.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A tensor's key: the FNV-1a hash of its name, mixed with the seed.
inline uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001B3ull;
  return splitmix64(seed ^ h);
}

}  // namespace dsv41
