#pragma once
// NumPy's default random generator, bit for bit: `numpy.random.default_rng(seed)` is a PCG64 bit
// generator seeded through a SeedSequence, and `Generator.integers(low, high, dtype=int64)` draws
// bounded integers with Lemire's multiply-and-reject method. The reference Engram code
// (inference/engram.py) derives its hash multipliers this way, so the engine must draw exactly the
// same numbers to address the same table rows. Written from NumPy's sources (bit_generator.pyx,
// src/pcg64/pcg64.{h,c}, src/distributions/distributions.c, _bounded_integers.pyx.in) and checked
// against NumPy's own test vectors and NumPy 1.24.2 (tests/engram_hash_test.cpp).
//
// Only what the engine needs is here: SeedSequence without spawn keys, PCG64 (XSL-RR 128/64) and
// the bounded integer draws of Generator.integers with endpoint=False.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace dsv41::numpy {

// PCG64's 128-bit state; GCC and Clang provide the type (`__extension__` keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 uint128;

// SeedSequence(entropy): the entropy words are mixed into a pool of four 32-bit words
// (O'Neill's seed_seq alternative); generate_state hashes the pool into as many words as asked.
class SeedSequence {
 public:
  // A non-negative Python int, as NumPy splits it: 32-bit words, least significant first; 0 is [0].
  explicit SeedSequence(uint64_t entropy);
  // A sequence of ints each below 2^32, one word each (NumPy concatenates the words of each int).
  explicit SeedSequence(std::span<const uint32_t> entropy_words);

  const std::array<uint32_t, 4>& pool() const { return pool_; }
  // generate_state(n, np.uint32).
  std::vector<uint32_t> generate_state_u32(size_t n_words) const;
  // generate_state(n, np.uint64): 2n 32-bit words, paired little-endian (low word first).
  std::vector<uint64_t> generate_state_u64(size_t n_words) const;

 private:
  std::array<uint32_t, 4> pool_{};
};

// PCG64: a 128-bit LCG whose output is the XSL-RR permutation of the state after each step.
class Pcg64 {
 public:
  // PCG64(seed_seq): four 64-bit state words give the initial state (words 0, 1: high, low) and
  // the stream (words 2, 3), then pcg_setseq_128_srandom_r.
  explicit Pcg64(const SeedSequence& seed);
  // Advances and returns 64 bits (pcg64_next64).
  uint64_t next64();
  // 32 bits: the low half of a fresh 64-bit draw, then its high half on the next call (pcg64_next32).
  uint32_t next32();

 private:
  uint128 state_ = 0;
  uint128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// NumPy's random_bounded_uint64_fill with use_masked=false (what Generator uses): n values in
// [off, off + rng], inclusive, wrapping modulo 2^64. Ranges that fit in 32 bits draw 32-bit words.
std::vector<uint64_t> bounded_uint64_fill(Pcg64& gen, uint64_t off, uint64_t rng, size_t n);

// Generator.integers(low, high, size=n, dtype=np.int64): n values in [low, high). Throws
// dsv41::Error when low >= high, as NumPy raises ValueError.
std::vector<int64_t> integers(Pcg64& gen, int64_t low, int64_t high, size_t n);

}  // namespace dsv41::numpy
