#include "model/numpy_random.h"

#include <limits>
#include <string>

#include "base/error.h"

namespace dsv41::numpy {

// --- SeedSequence (numpy/random/bit_generator.pyx) ---------------------------------------------

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // half the bits of a uint32

// hashmix: the multiplier evolves with every call, so it is threaded through by reference.
uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

std::vector<uint32_t> int_to_words(uint64_t n) {
  if (n == 0) return {0};
  std::vector<uint32_t> words;
  for (; n > 0; n >>= 32) words.push_back(uint32_t(n));
  return words;
}

}  // namespace

SeedSequence::SeedSequence(uint64_t entropy) : SeedSequence(std::span<const uint32_t>(int_to_words(entropy))) {}

SeedSequence::SeedSequence(std::span<const uint32_t> entropy) {
  // mix_entropy: hash the first pool-size words in (zeros past the end of short entropy), let
  // every pool word mix into every other, then fold any remaining entropy words into each.
  uint32_t hash_const = kInitA;
  const size_t n = pool_.size();
  for (size_t i = 0; i < n; ++i) pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0, hash_const);
  for (size_t src = 0; src < n; ++src)
    for (size_t dst = 0; dst < n; ++dst)
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
  for (size_t src = n; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < n; ++dst) pool_[dst] = mix(pool_[dst], hashmix(entropy[src], hash_const));
}

std::vector<uint32_t> SeedSequence::generate_state_u32(size_t n_words) const {
  std::vector<uint32_t> state(n_words);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool_[i % pool_.size()];  // the pool is cycled
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    state[i] = v;
  }
  return state;
}

std::vector<uint64_t> SeedSequence::generate_state_u64(size_t n_words) const {
  std::vector<uint32_t> words = generate_state_u32(2 * n_words);
  std::vector<uint64_t> state(n_words);
  for (size_t i = 0; i < n_words; ++i) state[i] = uint64_t(words[2 * i]) | uint64_t(words[2 * i + 1]) << 32;
  return state;
}

// --- PCG64 (numpy/random/src/pcg64) ------------------------------------------------------------

namespace {

constexpr uint128 make_u128(uint64_t high, uint64_t low) { return uint128(high) << 64 | low; }

// PCG_DEFAULT_MULTIPLIER_128
constexpr uint128 kPcgMultiplier = make_u128(2549297995355413924ULL, 4865540595714422341ULL);

}  // namespace

Pcg64::Pcg64(const SeedSequence& seed) {
  std::vector<uint64_t> words = seed.generate_state_u64(4);
  uint128 initstate = make_u128(words[0], words[1]);
  uint128 initseq = make_u128(words[2], words[3]);
  // pcg_setseq_128_srandom_r: the increment must be odd; the seed enters between two steps.
  inc_ = initseq << 1 | 1;
  state_ = 0;
  state_ = state_ * kPcgMultiplier + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMultiplier + inc_;
}

uint64_t Pcg64::next64() {
  state_ = state_ * kPcgMultiplier + inc_;
  // XSL-RR: xor the halves, rotate right by the top 6 bits of the state.
  uint64_t xored = uint64_t(state_ >> 64) ^ uint64_t(state_);
  unsigned rot = unsigned(state_ >> 122);
  return xored >> rot | xored << ((64 - rot) & 63);
}

uint32_t Pcg64::next32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  uint64_t next = next64();
  has_uint32_ = true;
  uinteger_ = uint32_t(next >> 32);
  return uint32_t(next);
}

// --- bounded integers (numpy/random/src/distributions/distributions.c) -------------------------

namespace {

// Lemire's nearly-divisionless method (arXiv 1805.10941) on 64-bit words: the high half of
// x * (rng + 1) is uniform on [0, rng] once products whose low half falls below 2^64 mod (rng + 1)
// are rejected. `rng` must not be 2^64 - 1 (rng + 1 would wrap to 0).
uint64_t bounded_lemire_uint64(Pcg64& gen, uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  uint128 m = uint128(gen.next64()) * rng_excl;
  uint64_t leftover = uint64_t(m);
  if (leftover < rng_excl) {  // rng_excl bounds the threshold: only then is the modulo needed
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = uint128(gen.next64()) * rng_excl;
      leftover = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}

// The same on 32-bit words, for ranges below 2^32 - 1; NumPy draws them with next_uint32, which
// uses both halves of each 64-bit output.
uint32_t bounded_lemire_uint32(Pcg64& gen, uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m = uint64_t(gen.next32()) * rng_excl;
  uint32_t leftover = uint32_t(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = uint64_t(gen.next32()) * rng_excl;
      leftover = uint32_t(m);
    }
  }
  return uint32_t(m >> 32);
}

}  // namespace

std::vector<uint64_t> bounded_uint64_fill(Pcg64& gen, uint64_t off, uint64_t rng, size_t n) {
  constexpr uint64_t kMax32 = std::numeric_limits<uint32_t>::max();
  constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> out(n, off);
  if (rng == 0) return out;  // a single value: no draw at all
  for (uint64_t& v : out) {
    if (rng == kMax32) v += gen.next32();  // the full 32-bit range: the word itself
    else if (rng < kMax32) v += bounded_lemire_uint32(gen, uint32_t(rng));
    else if (rng == kMax64) v += gen.next64();
    else v += bounded_lemire_uint64(gen, rng);
  }
  return out;
}

std::vector<int64_t> integers(Pcg64& gen, int64_t low, int64_t high, size_t n) {
  if (low >= high)
    fail("numpy integers(low, high)", "low < high", "low " + std::to_string(low) + ", high " + std::to_string(high));
  // The closed range [low, high - 1] as an unsigned offset and width, as _rand_int64 passes it.
  const uint64_t rng = uint64_t(high - 1) - uint64_t(low);
  std::vector<uint64_t> raw = bounded_uint64_fill(gen, uint64_t(low), rng, n);
  return std::vector<int64_t>(raw.begin(), raw.end());
}

}  // namespace dsv41::numpy
