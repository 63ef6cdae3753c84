// Engram hashing against independent values: NumPy's own test vectors for SeedSequence and PCG64,
// draws of NumPy 1.24.2 (Debian's python3-numpy, the version the reference's multipliers were
// checked with) for the bounded integers, the released multipliers and table sizes, and the hash
// ids the reference engram.py wrote into the golden fixtures (tests/data/fixtures/*/engram.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "model/config.h"
#include "model/engram_compress.h"
#include "model/engram_hash.h"
#include "model/numpy_random.h"
#include "model/tokenizer/normalizers.h"
#include "model/tokenizer/tokenizer.h"
#include "test_util.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;
using u64s = std::vector<uint64_t>;
using i64s = std::vector<int64_t>;

// --- NumPy's generator --------------------------------------------------------------------------

// numpy/random/tests/test_seed_sequence.py::test_reference_data (from O'Neill's C++ reference).
TEST(NumpySeedSequence, MatchesNumpyReferenceData) {
  const std::vector<std::vector<uint32_t>> inputs = {
      {3735928559, 195939070, 229505742, 305419896},  {3668361503, 4165561550, 1661411377, 3634257570},
      {164546577, 4166754639, 1765190214, 1303880213}, {446610472, 3941463886, 522937693, 1882353782},
      {1864922766, 1719732118, 3882010307, 1776744564}, {4141682960, 3310988675, 553637289, 902896340},
      {1134851934, 2352871630, 3699409824, 2648159817}, {1240956131, 3107113773, 1283198141, 1924506131},
      {2669565031, 579818610, 3042504477, 2774880435}, {2766103236, 2883057919, 4029656435, 862374500},
  };
  const std::vector<std::vector<uint32_t>> outputs = {
      {3914649087, 576849849, 3593928901, 2229911004}, {2240804226, 3691353228, 1365957195, 2654016646},
      {3562296087, 3191708229, 1147942216, 3726991905}, {1403443605, 3591372999, 1291086759, 441919183},
      {1086200464, 2191331643, 560336446, 3658716651}, {3249937430, 2346751812, 847844327, 2996632307},
      {2584285912, 4034195531, 3523502488, 169742686}, {959045797, 3875435559, 1886309314, 359682705},
      {3978441347, 432478529, 3223635119, 138903045},  {296367413, 4262059219, 13109864, 3283683422},
  };
  const std::vector<u64s> outputs64 = {
      {2477551240072187391u, 9577394838764454085u},   {15854241394484835714u, 11398914698975566411u},
      {13708282465491374871u, 16007308345579681096u}, {15424829579845884309u, 1898028439751125927u},
      {9411697742461147792u, 15714068361935982142u},  {10079222287618677782u, 12870437757549876199u},
      {17326737873898640088u, 729039288628699544u},   {16644868984619524261u, 1544825456798124994u},
      {1857481142255628931u, 596584038813451439u},    {18305404959516669237u, 14103312907920476776u},
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    numpy::SeedSequence ss(inputs[i]);
    EXPECT_EQ(ss.generate_state_u32(4), outputs[i]) << "input " << i;
    EXPECT_EQ(ss.generate_state_u64(2), outputs64[i]) << "input " << i;
  }
}

// Integer entropy is split into 32-bit words, low first; entropy longer than the pool is folded in.
// Pools from NumPy 1.24.2: SeedSequence(x).pool.
TEST(NumpySeedSequence, IntegerAndLongEntropy) {
  using pool = std::array<uint32_t, 4>;
  EXPECT_EQ(numpy::SeedSequence(0).pool(), (pool{4265667335, 1328953910, 1320288413, 3365567143}));
  EXPECT_EQ(numpy::SeedSequence(0).generate_state_u64(2), (u64s{15793235383387715774u, 12390638538380655177u}));
  EXPECT_EQ(numpy::SeedSequence(10007).pool(), (pool{4053860749, 2814774274, 4246066442, 62394930}));
  EXPECT_EQ(numpy::SeedSequence(10007).generate_state_u64(4),
            (u64s{8634291315755388167u, 11042498673593962405u, 15418481100450270793u, 9041516862649747678u}));
  EXPECT_EQ(numpy::SeedSequence((uint64_t(1) << 32) + 7).pool(), (pool{70599722, 3325653387, 3012850390, 3772321688}));
  const std::vector<uint32_t> words_2_64_plus_5 = {5, 0, 1};  // the Python int 2**64 + 5
  EXPECT_EQ(numpy::SeedSequence(words_2_64_plus_5).pool(), (pool{108568305, 305444451, 2968744074, 1512150343}));
  const std::vector<uint32_t> six = {1, 2, 3, 4, 5, 6};
  numpy::SeedSequence long_entropy(six);
  EXPECT_EQ(long_entropy.pool(), (pool{988259991, 2719934729, 3479241324, 1314086023}));
  EXPECT_EQ(long_entropy.generate_state_u32(5),
            (std::vector<uint32_t>{488360481, 3956080669, 2986500235, 3488252836, 3841783222}));
}

// numpy/random/tests/data/pcg64-testset-{1,2}.csv: PCG64(seed).random_raw(), outputs 0, 1, 2, 999.
TEST(NumpyPcg64, MatchesNumpyTestSets) {
  struct Set {
    uint64_t seed;
    u64s first3;
    uint64_t at999;
  };
  for (const Set& s : {Set{0xdeadbeaf, {0x60d24054e17a0698, 0xd5e79d89856e4f12, 0xd254972fe64bd782}, 0xa5cb380b8de10d10},
                       Set{0x0, {0xa30febcfd9c2825f, 0x4510bdf882d9d721, 0xa7d3da94ecde8b8}, 0x6148329042f743b0}}) {
    numpy::Pcg64 gen{numpy::SeedSequence(s.seed)};
    u64s first3 = {gen.next64(), gen.next64(), gen.next64()};
    EXPECT_EQ(first3, s.first3) << "seed " << s.seed;
    for (int i = 3; i < 999; ++i) gen.next64();
    EXPECT_EQ(gen.next64(), s.at999) << "seed " << s.seed;
  }
}

// next32 hands out the low half of a 64-bit output, then its high half.
TEST(NumpyPcg64, Next32SplitsOneOutput) {
  numpy::Pcg64 a{numpy::SeedSequence(0)}, b{numpy::SeedSequence(0)};
  uint64_t whole = a.next64();
  EXPECT_EQ(b.next32(), uint32_t(whole));
  EXPECT_EQ(b.next32(), uint32_t(whole >> 32));
  EXPECT_EQ(b.next64(), a.next64());
}

// Every path of random_bounded_uint64_fill. Values: NumPy 1.24.2,
// default_rng(seed).integers(low, high, size=n, dtype=np.uint64), i.e. off = low, rng = high - 1 - low.
TEST(NumpyBounded, EveryRangeClassMatchesNumpy) {
  struct Case {
    uint64_t seed, off, rng;
    u64s expected;
  };
  const uint64_t two62 = uint64_t(1) << 62;
  const std::vector<Case> cases = {
      // 64-bit Lemire where a quarter of the draws are rejected (threshold 2^62)
      {0, 0, 3 * two62 - 1,
       {8812401923082805703u, 3732514847466938712u, 228660797053744149u, 11251640973968981228u, 12628026401919866170u,
        8392841176150066655u, 10092627272342303667u, 7521083317226397647u}},
      {123456789, 0, (uint64_t(1) << 63) + 12344,
       {8362831937566020383u, 7617656884690826060u, 8828877160935530655u, 4887093300818488978u, 2488873973637854233u,
        496215913448217076u}},
      // 32-bit Lemire on buffered halves of the 64-bit outputs
      {1, 0, 999, {473, 511, 755, 950, 34, 144, 822}},
      {5, 0, 3 * (uint64_t(1) << 30) - 1,
       {2593095922, 72971127, 2602559451, 1659979823, 2030125912, 3155266737, 173722951, 895255019}},
      // the full 32-bit range: the words themselves, plus the offset
      {2, 5, 0xFFFFFFFFu, {3597359302, 1123615565, 469463401, 1282009704, 1777316131}},
      // the full 64-bit range
      {3, 0, std::numeric_limits<uint64_t>::max(),
       {1579948266424812280u, 4368382809143759861u, 14780904992460893238u, 10738994088709064484u}},
      // a single value: no draw
      {4, 7, 0, {7, 7, 7}},
  };
  for (const Case& c : cases) {
    numpy::Pcg64 gen{numpy::SeedSequence(c.seed)};
    EXPECT_EQ(numpy::bounded_uint64_fill(gen, c.off, c.rng, c.expected.size()), c.expected) << "seed " << c.seed;
  }
}

// Generator.integers(low, high, dtype=np.int64), NumPy 1.24.2.
TEST(NumpyBounded, SignedIntegersMatchNumpy) {
  numpy::Pcg64 a{numpy::SeedSequence(6)};
  EXPECT_EQ(numpy::integers(a, 0, 10, 5), (i64s{4, 5, 5, 3, 9}));
  numpy::Pcg64 b{numpy::SeedSequence(6)};
  EXPECT_EQ(numpy::integers(b, -3, 1000000000000, 3), (i64s{538164351470, 343270869811, 369067239793}));
  numpy::Pcg64 c{numpy::SeedSequence(7)};
  EXPECT_EQ(numpy::integers(c, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 3),
            (i64s{2307604057237572234, 7327301329031162516, 5085503372737050977}));
  numpy::Pcg64 d{numpy::SeedSequence(0)};
  EXPECT_THROW(numpy::integers(d, 5, 5, 1), Error);
}

// --- multipliers --------------------------------------------------------------------------------

// The released model (compressed vocabulary 99092): the values are the odd multipliers
// 2r + 1; the raw draws r are what default_rng(10007 * layer).integers returns.
TEST(EngramMultipliers, ReleasedModel) {
  EXPECT_EQ(engram_multipliers(1, 4, 99092), (i64s{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(engram_multipliers(14, 4, 99092), (i64s{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
  const int64_t bound = 46539438283891;  // (INT64_MAX // 99092) // 2
  numpy::Pcg64 gen1{numpy::SeedSequence(10007)};
  EXPECT_EQ(numpy::integers(gen1, 0, bound, 4), (i64s{38316048023122, 2419938046656, 17979836159674, 36993668729195}));
  numpy::Pcg64 gen14{numpy::SeedSequence(10007 * 14)};
  EXPECT_EQ(numpy::integers(gen14, 0, bound, 4), (i64s{33858405369630, 25755403400457, 15460673601360, 41309613242795}));
}

// Layers, sizes and orders the released model never uses, NumPy 1.24.2:
// default_rng(10007 * layer).integers(0, max(1, (INT64_MAX // V) // 2), size=N, dtype=np.int64) * 2 + 1.
TEST(EngramMultipliers, AnyLayerAndVocabulary) {
  EXPECT_EQ(engram_multipliers(3, 4, 1000), (i64s{2727703110629359, 8091777532450917, 1077915957631161, 6965864756390093}));
  EXPECT_EQ(engram_multipliers(0, 4, 1),
            (i64s{5874934615388537135, 2488343231644625807, 377914054924498011, 152440531369162767}));
  EXPECT_EQ(engram_multipliers(40, 5, 129280),
            (i64s{8952753882805, 11782661251171, 48151405586697, 58441394371689, 10063729988747}));
  // V = 2^31: the bound fits in 32 bits, so NumPy draws 32-bit words
  EXPECT_EQ(engram_multipliers(7, 6, int64_t(1) << 31),
            (i64s{3920440305, 3801034711, 1489166667, 3219680829, 3710021449, 3452583855}));
  // V > INT64_MAX / 2: the bound is 1, every draw is 0 and every multiplier 1
  EXPECT_EQ(engram_multipliers(2, 3, std::numeric_limits<int64_t>::max()), (i64s{1, 1, 1}));
  EXPECT_THROW(engram_multipliers(-1, 4, 1000), Error);
  EXPECT_THROW(engram_multipliers(1, 4, 0), Error);
}

// --- the prime table layout ---------------------------------------------------------------------

TEST(EngramLayout, ReleasedTableSizes) {
  Config c = preset("deepseek-v4.1-flash");
  EXPECT_EQ(engram_table_rows(c), (i64s{384006168, 384016682}));
  const std::vector<i64s> primes = engram_primes(c);
  ASSERT_EQ(primes.size(), 2u);
  i64s first = primes[0], second = primes[1];
  ASSERT_EQ(first.size(), 24u);
  ASSERT_EQ(second.size(), 24u);
  EXPECT_EQ((i64s{first[0], first[1], first[2]}), (i64s{16000057, 16000079, 16000081}));
  EXPECT_EQ(second.back(), 16000889);
  EXPECT_LT(first.back(), second.front());  // all 48 distinct, in (layer, order, head) order
}

// --- the golden fixtures ------------------------------------------------------------------------

struct Prompt {
  std::vector<int> tokens, decode_tokens;
  i64s prefill_hash, decode_hash;  // [P, layers, columns] and [N, layers, columns], flattened
};

struct Fixture {
  Config config;
  json data;
  std::vector<int32_t> token_map;
  std::vector<Prompt> prompts;
};

Fixture load_fixture(const std::string& name) {
  const std::string dir = std::string(DSV41_TEST_DATA) + "/fixtures/" + name;
  Fixture f{load_config(dir + "/config.json"), json::parse(test::read_text(dir + "/engram.json")), {}, {}};
  f.token_map = f.data.at("token_map").get<std::vector<int32_t>>();
  for (const json& p : f.data.at("prompts"))
    f.prompts.push_back({p.at("tokens").get<std::vector<int>>(), p.at("decode_tokens").get<std::vector<int>>(),
                         p.at("prefill_engram_hash").get<i64s>(), p.at("decode_engram_hash").get<i64s>()});
  return f;
}

// Hashes `tokens` in chunks of `chunk` through one history; returns [n, layers, columns] ids.
i64s hash_in_chunks(const EngramHasher& h, const std::vector<int>& tokens, size_t chunk, EngramHistory& history) {
  const size_t per_token = size_t(h.n_layers() * h.columns());
  i64s out(tokens.size() * per_token, -1);
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    size_t len = std::min(chunk, tokens.size() - start);
    h.hash(std::span<const int>(tokens).subspan(start, len), {}, history, out.data() + start * per_token);
  }
  return out;
}

class EngramFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EngramFixture, ParametersMatchTheReference) {
  Fixture f = load_fixture(GetParam());
  EngramHasher h(f.config, f.token_map);
  ASSERT_EQ(h.n_layers(), 2);
  ASSERT_EQ(h.columns(), 6);
  EXPECT_EQ(h.pad_id(), f.data.at("pad_id").at(0).get<int32_t>());
  const i64s mult = f.data.at("multipliers").get<i64s>(), primes = f.data.at("primes").get<i64s>(),
             offsets = f.data.at("offsets").get<i64s>();
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(h.multipliers(l), i64s(mult.begin() + 4 * l, mult.begin() + 4 * l + 4)) << "layer " << l;
    EXPECT_EQ(h.primes(l), i64s(primes.begin() + 6 * l, primes.begin() + 6 * l + 6)) << "layer " << l;
    EXPECT_EQ(h.offsets(l), i64s(offsets.begin() + 6 * l, offsets.begin() + 6 * l + 6)) << "layer " << l;
  }
  EXPECT_EQ(engram_table_rows(f.config), f.config.engram_num_embeddings);
}

// Every prompt as one prefill, and in chunks of 1, 7 and 64, then its decode tokens one at a time.
TEST_P(EngramFixture, HashIdsMatchTheReferenceInAnyChunking) {
  Fixture f = load_fixture(GetParam());
  EngramHasher h(f.config, f.token_map);
  ASSERT_EQ(f.prompts.size(), 3u);
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const Prompt& p = f.prompts[i];
    for (size_t chunk : {p.tokens.size(), size_t(1), size_t(7), size_t(64)}) {
      EngramHistory history;
      EXPECT_EQ(hash_in_chunks(h, p.tokens, chunk, history), p.prefill_hash) << "prompt " << i << " chunk " << chunk;
      EXPECT_EQ(hash_in_chunks(h, p.decode_tokens, 1, history), p.decode_hash) << "prompt " << i << " chunk " << chunk;
    }
    // Resuming from the tokens alone gives the same decode ids.
    EngramHistory resumed = h.history_after(p.tokens, {});
    EXPECT_EQ(hash_in_chunks(h, p.decode_tokens, 1, resumed), p.decode_hash) << "prompt " << i << " resumed";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngramFixture, ::testing::Values("v41-tiny", "v41-tiny-bf16"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// --- the compressed vocabulary -----------------------------------------------------------------

// The fixture tokenizer (600 ids: specials, byte symbols and their merges, added tokens) gives
// the reference's map id for id, its size and pad id; and hashing through the computed map gives
// the reference's ids.
TEST(EngramVocabulary, MatchesTheReferenceTokenMap) {
  Fixture f = load_fixture("v41-tiny");
  Tokenizer tok = Tokenizer::from_file(std::string(DSV41_TEST_DATA) + "/tokenizer/v41-tiny.json");
  EngramVocabulary vocab = engram_compress_vocabulary(tok);
  ASSERT_EQ(vocab.token_map.size(), 600u);
  EXPECT_EQ(vocab.token_map, f.token_map);
  EXPECT_EQ(vocab.size, 522);
  EXPECT_EQ(vocab.size, f.config.engram_compressed_vocab_size);

  EngramHasher h(f.config, vocab.token_map);
  EXPECT_EQ(h.pad_id(), f.data.at("pad_id").at(0).get<int32_t>());
  for (const Prompt& p : f.prompts) {
    EngramHistory history;
    EXPECT_EQ(hash_in_chunks(h, p.tokens, p.tokens.size(), history), p.prefill_hash);
    EXPECT_EQ(hash_in_chunks(h, p.decode_tokens, 1, history), p.decode_hash);
  }
}

// The normalizer on texts the fixture's tokens do not reach. Expected keys by hand from the HF
// components: NFKC folds compatibility forms (full-width letters, ligatures, no-break and
// ideographic spaces), NFD + StripAccents drop accents, Lowercase, runs of [ \t\r\n] become one
// space, a lone space survives Strip, other whitespace does not.
TEST(EngramVocabulary, NormalizerKeys) {
  std::unique_ptr<Normalizer> n = normalizer_from_json(engram_normalizer_spec());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" The", "the"},
      {"THE", "the"},
      {" ", " "},
      {"\t", " "},
      {" \r\n\t  ", " "},
      {"\xC2\xA0", " "},                  // U+00A0 no-break space
      {"\xE3\x80\x80", " "},             // U+3000 ideographic space
      {"\xE2\x80\xA8", ""},              // U+2028: whitespace, but not folded, so stripped
      {"  a \n b  ", "a b"},
      {"\xEF\xBC\xA3" "af\xC3\xA9", "cafe"},  // full-width C, e with acute
      {"\xEF\xAC\x81", "fi"},             // U+FB01 ligature
      {"\xC3\x84rger", "arger"},           // A with diaeresis
      {"\xEE\x80\x80", " "},             // the sentinel itself reads as a space
  };
  for (const auto& [text, key] : cases) EXPECT_EQ(n->normalize(text), key) << "text '" << text << "'";
}

// --- image positions, by hand -------------------------------------------------------------------

// The ids of one position from its look-back window (compressed ids at t, t-1, t-2, t-3), straight
// from the formula with the fixture's own multipliers, primes and offsets.
i64s ids_from_window(const Fixture& f, const std::vector<int64_t>& window) {
  const i64s mult = f.data.at("multipliers").get<i64s>(), primes = f.data.at("primes").get<i64s>(),
             offsets = f.data.at("offsets").get<i64s>();
  i64s ids;
  for (int l = 0; l < 2; ++l) {
    int64_t x = window[0] * mult[4 * l];
    for (int order = 1; order < 4; ++order) {
      x ^= window[order] * mult[4 * l + order];
      for (int head = 0; head < 2; ++head) {
        int col = 6 * l + 2 * (order - 1) + head;
        ids.push_back(x % primes[col] + offsets[col]);
      }
    }
  }
  return ids;
}

// Positions 0..6 = [0, 476, 506, 265, 84, 300, 301] with 2 and 3 inside an image span. Position 2
// and 3 see only pad; 4 starts afresh after the span; 1 and 5, 6 are ordinary n-grams.
TEST(EngramImages, BlockLookBackAndAreBlockedThemselves) {
  Fixture f = load_fixture("v41-tiny");
  EngramHasher h(f.config, f.token_map);
  const std::vector<int> tokens = {0, 476, 506, 265, 84, 300, 301};
  const std::vector<uint8_t> image = {0, 0, 1, 1, 0, 0, 0};
  auto m = [&](int id) { return int64_t(f.token_map[size_t(id)]); };
  const int64_t pad = h.pad_id();
  const std::vector<std::vector<int64_t>> windows = {
      {m(0), pad, pad, pad},        {m(476), m(0), pad, pad},     {pad, pad, pad, pad},
      {pad, pad, pad, pad},         {m(84), pad, pad, pad},       {m(300), m(84), pad, pad},
      {m(301), m(300), m(84), pad},
  };
  i64s expected;
  for (const auto& w : windows) {
    i64s ids = ids_from_window(f, w);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  const size_t per_token = 12;
  i64s whole(tokens.size() * per_token);
  EngramHistory history;
  h.hash(tokens, image, history, whole.data());
  EXPECT_EQ(whole, expected);

  // One token at a time: the image marks travel in the history.
  i64s stepped(tokens.size() * per_token);
  EngramHistory step_history;
  for (size_t t = 0; t < tokens.size(); ++t)
    h.hash(std::span<const int>(tokens).subspan(t, 1), std::span<const uint8_t>(image).subspan(t, 1), step_history,
           stepped.data() + t * per_token);
  EXPECT_EQ(stepped, expected);
  EXPECT_EQ(step_history.recent, (std::vector<int32_t>{int32_t(m(84)), int32_t(m(300)), int32_t(m(301))}));

  // A history that ends on an image: the next token starts afresh.
  EngramHistory after_image = h.history_after(std::span<const int>(tokens).first(4), std::span<const uint8_t>(image).first(4));
  EXPECT_EQ(after_image.recent, (std::vector<int32_t>{int32_t(m(476)), EngramHistory::kImage, EngramHistory::kImage}));
  i64s next(per_token);
  h.hash(std::span<const int>(tokens).subspan(4, 1), {}, after_image, next.data());
  EXPECT_EQ(next, i64s(expected.begin() + 4 * per_token, expected.begin() + 5 * per_token));

  // An image position is DEAD whatever id it carries, also one past the token map (DeepSeek's V3
  // tokenizer has no <｜deepseek_image｜>: V4.1's image_token_id lies past its ids).
  std::vector<int> past_the_map = tokens;
  past_the_map[2] = past_the_map[3] = int(f.token_map.size()) + 7;
  i64s again(tokens.size() * per_token);
  EngramHistory fresh;
  h.hash(past_the_map, image, fresh, again.data());
  EXPECT_EQ(again, expected);
}

TEST(EngramHasherInputs, RefusesWhatTheReferenceCannotHash) {
  Fixture f = load_fixture("v41-tiny");
  EngramHasher h(f.config, f.token_map);
  i64s out(12 * 2);
  EngramHistory history;
  const std::vector<int> outside = {0, 600};
  EXPECT_THROW(h.hash(outside, {}, history, out.data()), Error);
  const std::vector<int> two = {0, 1};
  const std::vector<uint8_t> one_flag = {0};
  EXPECT_THROW(h.hash(two, one_flag, history, out.data()), Error);
  EngramHistory too_long{{1, 2, 3, 4}};
  EXPECT_THROW(h.hash(two, {}, too_long, out.data()), Error);

  // A map whose compressed vocabulary is not the configured size would rehash everything.
  std::vector<int32_t> merged = f.token_map;
  for (int32_t& x : merged)
    if (x == 521) x = 520;
  EXPECT_THROW(EngramHasher(f.config, merged), Error);
  Config no_engram = load_config(std::string(DSV41_TEST_DATA) + "/fixtures/v41-tiny-noengram/config.json");
  EXPECT_THROW(EngramHasher(no_engram, f.token_map), Error);
}

}  // namespace
}  // namespace dsv41
