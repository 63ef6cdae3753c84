// dsv41 eval's measures (src/eval, docs/eval.md) on a tiny random checkpoint and a data directory
// written here in dsv41 data build's layout (validation.tokens, validation.jsonl, tokenizer.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "eval/passkey.h"
#include "eval/served_loss.h"
#include "eval/validation_data.h"
#include "forward/model.h"
#include "model/random_checkpoint.h"
#include "model/random_tokenizer.h"
#include "numerics/codecs.h"
#include "test_util.h"

namespace dsv41 {
namespace {

using eval::one_pass_nll;
using eval::served_nll;

// Plain English, so that the passkey filler has sentence ends; the random tokenizer encodes any text.
const std::vector<std::string> kDocuments = {
    "In the beginning the river ran low. The farmers waited for rain, and the rain did not come. "
    "They dug the wells deeper and prayed.",
    "A letter arrived on Tuesday! It said the bridge would open in spring. Nobody believed it.\nThe mayor read it twice.",
    "What is a clock? A machine that counts. It has no opinion of the hour. It keeps counting anyway.",
    "The ship left the harbour at dawn. Gulls followed it out past the lighthouse, then turned back.",
};

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A tiny random checkpoint (with its random tokenizer) and a data directory of kDocuments, repeated
// `copies` times, packed as dsv41 data build packs them: BOS, the document, EOS.
struct Fixture {
  test::TempDir model_dir{"eval_model"}, data_dir{"eval_data"};
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  std::shared_ptr<const EngramHasher> hasher;

  explicit Fixture(int copies = 8) {
    write_random_checkpoint(preset("tiny"), model_dir.string(), {});
    model = Model::load(model_dir.string());
    tokenizer = Tokenizer::from_file(model_dir.string() + "/tokenizer.json");
    hasher = engram_hasher(model->config(), &*tokenizer);
    std::filesystem::create_directories(data_dir.path());
    std::filesystem::copy_file(model_dir / "tokenizer.json", data_dir / "tokenizer.json");
    train::PackedTokenWriter writer((data_dir / "validation.tokens").string(), uint32_t(tokenizer->vocab_size()), 1);
    std::string jsonl;
    for (int i = 0; i < copies; ++i)
      for (const std::string& d : kDocuments) {
        writer.add_document(tokenizer->encode(d));
        jsonl += nlohmann::json{{"source", "test"}, {"key", std::to_string(i)}, {"text", d}}.dump() + "\n";
      }
    writer.finish();
    write_text(data_dir / "validation.jsonl", jsonl);
  }
  const Config& config() const { return model->config(); }
  std::vector<int> sequence(int64_t length, int64_t k = 0) const {
    const train::PackedTokens t = train::PackedTokens::read((data_dir / "validation.tokens").string());
    return eval::validation_sequence(t, length, k);
  }
};

// The error `f` throws holds `text`.
template <class F>
void expect_error(F&& f, const std::string& text) {
  const std::string message = test::error_of(std::forward<F>(f));
  EXPECT_NE(message.find(text), std::string::npos) << "the error: \"" << message << "\"\nexpected to hold: " << text;
}

Fixture& fixture() {
  static Fixture f;
  return f;
}

TEST(EvalLoss, TokenNllIsTheLogSoftmax) {
  // logits (0, ln 3): softmax (1/4, 3/4).
  const std::vector<float> logits = {0.0f, float(std::log(3.0))};
  EXPECT_NEAR(eval::token_nll(logits, 0), std::log(4.0), 1e-7);
  EXPECT_NEAR(eval::token_nll(logits, 1), std::log(4.0 / 3.0), 1e-7);
  // A shift of every logit changes nothing (the max is subtracted): no overflow at 1e4.
  EXPECT_NEAR(eval::token_nll(std::vector<float>{1e4f, 1e4f}, 1), std::log(2.0), 1e-12);
  EXPECT_THROW(eval::token_nll(logits, 2), Error);
}

// Exact mode's served loss is the one-pass loss of the same tokens, to the bit: a prefill call then
// decode steps is a chunked prefill (chunks of P, then 1, 1, ...), whose logits are the one-shot
// prefill's bit for bit (docs/forward.md "Slot order and chunking", tested there), and both NLLs are
// computed by the same function from those logits. So no tolerance: the vectors must be equal. In
// either global KV format (each row's arithmetic is its own in both).
TEST(EvalLoss, ExactServedLossIsTheOnePassLoss) {
  Fixture& f = fixture();
  const int64_t W = f.config().window_size, L = 3 * W;
  const std::vector<int> seq = f.sequence(L);
  for (GlobalKvFormat format : {GlobalKvFormat::Fp4, GlobalKvFormat::Fp8}) {
    CpuExecutor executor(*f.model, format);
    const std::vector<double> one = one_pass_nll(executor, f.hasher, seq);
    ASSERT_EQ(int64_t(one.size()), L);
    for (int64_t P : {int64_t(1), W / 2, W, W + 5, L}) {
      const eval::ServedNll s = served_nll(executor, f.hasher, Mode::Exact, seq, P);
      ASSERT_EQ(int64_t(s.nll.size()), L + 1 - P);
      EXPECT_EQ(s.decoder_prompt_tokens, P);
      for (int64_t i = 0; i < int64_t(s.nll.size()); ++i)
        ASSERT_EQ(s.nll[size_t(i)], one[size_t(P - 1 + i)]) << global_kv_format_name(format) << " P " << P << " token " << P + i;
    }
  }
}

// Default mode cuts the decoder at s = P - min(W, P) (DESIGN §3): a prompt of at most W tokens is
// not cut (s = 0), so every call is exact mode's and so is every bit; past W the decoder's window
// KV of the prompt's last W positions comes from windows truncated at s, and the continuation's
// logits move.
TEST(EvalLoss, DefaultDiffersFromExactOnlyPastTheWindow) {
  Fixture& f = fixture();
  const int64_t W = f.config().window_size, L = 4 * W;
  CpuExecutor executor(*f.model);
  for (int64_t k : {0, 1}) {
    const std::vector<int> seq = f.sequence(L, k);
    for (int64_t P : {int64_t(1), W - 3, W}) {
      const eval::ServedNll d = served_nll(executor, f.hasher, Mode::Default, seq, P), e = served_nll(executor, f.hasher, Mode::Exact, seq, P);
      EXPECT_EQ(d.decoder_prompt_tokens, P);
      EXPECT_EQ(d.nll, e.nll) << "P " << P << " sequence " << k;
    }
    for (int64_t P : {W + 1, 2 * W, 3 * W}) {
      const eval::ServedNll d = served_nll(executor, f.hasher, Mode::Default, seq, P), e = served_nll(executor, f.hasher, Mode::Exact, seq, P);
      EXPECT_EQ(d.decoder_prompt_tokens, W);
      ASSERT_EQ(d.nll.size(), e.nll.size());
      EXPECT_NE(d.nll, e.nll) << "P " << P << " sequence " << k;
      EXPECT_NE(d.nll.front(), e.nll.front()) << "the prompt's last logits, P " << P;
    }
  }
}

// --kv-fp8: the compressed main KV is held in SWA-FP8 entries (swa_fp8::bytes per entry, not
// kv_fp4's), the loss moves (entries are attended from the first compressed group on), and the KV
// tiers, which store KV-FP4 only, refuse such a sequence.
TEST(EvalLoss, Fp8GlobalKvIsHeldAndUsed) {
  Fixture& f = fixture();
  const Config& c = f.config();
  const int64_t L = 3 * c.window_size;
  const std::vector<int> seq = f.sequence(L);
  CpuExecutor fp4(*f.model), fp8(*f.model, GlobalKvFormat::Fp8);
  EXPECT_NE(one_pass_nll(fp4, f.hasher, seq), one_pass_nll(fp8, f.hasher, seq));
  Session s(fp8, f.hasher, Mode::Exact);
  s.prefill(std::span(seq).first(size_t(L)));
  EXPECT_EQ(s.state().global_kv, GlobalKvFormat::Fp8);
  for (const auto& [layer, cache] : s.state().compressed) {
    ASSERT_GT(cache.entries, 0) << "layer " << layer;
    EXPECT_EQ(cache.kv.size(), size_t(cache.entries) * swa_fp8::bytes(c.head_dim)) << "layer " << layer;
  }
  auto sequence = fp8.new_sequence();
  expect_error([&] { sequence->saved(0); }, "KV tiers: expected a sequence with KV-FP4 global KV, found swa-fp8");
  expect_error([&] { view_of(s.state()); }, "expected a sequence state with KV-FP4 global KV");
  // A state with FP4 entries is not taken by an FP8 sequence.
  Session s4(fp4, f.hasher, Mode::Exact);
  s4.prefill(std::span(seq).first(size_t(L)));
  expect_error([&] { sequence->assign(s4.state()); }, "expected global KV entries in swa-fp8, found kv-fp4 ones");
}

// --- passkey ---------------------------------------------------------------------------------------

std::vector<int> filler(const Tokenizer& t) {
  std::string text;
  for (const std::string& d : kDocuments) text += (text.empty() ? "" : "\n\n") + d;
  return t.encode(text, false);
}

TEST(EvalPasskey, ThePromptHoldsTheKeyWhereAsked) {
  Fixture& f = fixture();
  const Tokenizer& t = *f.tokenizer;
  const std::vector<int> fill = filler(t), head = t.encode(eval::kPasskeyHead, true), question = t.encode(eval::kPasskeyQuestion, false);
  const std::string key = "40721";
  const std::vector<int> needle = t.encode(eval::passkey_needle(key), false);
  const int64_t fixed = int64_t(head.size() + needle.size() + question.size());
  EXPECT_EQ(eval::passkey_min_length(t, key), fixed + 1);
  for (int64_t length : {fixed + 1, fixed + 50, int64_t(3 * fill.size())}) {  // the last repeats the filler
    for (double depth : {0.0, 0.25, 0.5, 0.9, 1.0}) {
      const eval::PasskeyPrompt p = eval::passkey_prompt(t, fill, length, key, depth);
      const std::string where = "length " + std::to_string(length) + " depth " + std::to_string(depth);
      ASSERT_EQ(int64_t(p.ids.size()), length) << where;
      EXPECT_EQ(p.filler_tokens, length - fixed) << where;
      EXPECT_TRUE(std::equal(head.begin(), head.end(), p.ids.begin())) << where;
      EXPECT_TRUE(std::equal(question.rbegin(), question.rend(), p.ids.rbegin())) << where;
      ASSERT_EQ(p.needle_begin, int64_t(head.size()) + p.filler_before) << where;
      ASSERT_EQ(p.needle_end - p.needle_begin, int64_t(needle.size())) << where;
      EXPECT_TRUE(std::equal(needle.begin(), needle.end(), p.ids.begin() + p.needle_begin)) << where;
      EXPECT_NE(t.decode(std::span(p.ids).subspan(size_t(p.needle_begin), needle.size())).find(key), std::string::npos);
      // The filler, in order, around the needle.
      for (int64_t i = 0; i < p.filler_tokens; ++i) {
        const int64_t at = int64_t(head.size()) + i + (i >= p.filler_before ? int64_t(needle.size()) : 0);
        ASSERT_EQ(p.ids[size_t(at)], fill[size_t(i) % fill.size()]) << where << " filler " << i;
      }
      // At the depth asked, moved forward to a sentence end: never back, at most 64 ids on.
      const int64_t want = std::llround(depth * double(p.filler_tokens));
      EXPECT_GE(p.filler_before, want) << where;
      EXPECT_LE(p.filler_before, std::min(want + 64, p.filler_tokens)) << where;
      if (p.filler_before > 0 && p.filler_before < p.filler_tokens) {
        const int before = fill[size_t(p.filler_before - 1) % fill.size()];
        const std::string text = t.decode(std::span(&before, 1));
        if (p.filler_before != want) {  // moved: to just after a sentence end
          EXPECT_NE(std::string(".!?\n").find(text.back()), std::string::npos) << where << ": \"" << text << "\"";
        }
      }
    }
  }
  expect_error([&] { eval::passkey_prompt(t, fill, fixed, key, 0.5); },
               "expected at least " + std::to_string(fixed + 1) + " tokens (the template and one filler token), found " + std::to_string(fixed));
}

TEST(EvalPasskey, TheScorerTakesTheFirstRunOfDigits) {
  for (const char* reply : {"40721", " 40721.", " 40721. Remember it.", "is 40721", "40721 is the pass key"})
    EXPECT_TRUE(eval::passkey_correct(reply, "40721")) << reply;
  for (const char* reply : {"", " ", "4072", "407210", "40712", " 4 0721", "12345 40721", "no key"})
    EXPECT_FALSE(eval::passkey_correct(reply, "40721")) << reply;
}

TEST(EvalPasskey, TrialsAreSeededFiveDigitKeysAndDepths) {
  std::set<std::string> keys;
  for (int trial = 0; trial < 200; ++trial) {
    const eval::PasskeyTrial a = eval::passkey_trial(7, 1024, trial), b = eval::passkey_trial(7, 1024, trial);
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.depth, b.depth);
    ASSERT_EQ(a.key.size(), 5u);
    EXPECT_NE(a.key[0], '0');
    EXPECT_GE(a.depth, 0.0);
    EXPECT_LT(a.depth, 1.0);
    keys.insert(a.key);
  }
  EXPECT_GT(keys.size(), 190u);  // 200 draws of 90,000 keys: a repeat or two at most
  EXPECT_NE(eval::passkey_trial(7, 1024, 0).key, eval::passkey_trial(8, 1024, 0).key);
  EXPECT_NE(eval::passkey_trial(7, 1024, 0).key, eval::passkey_trial(7, 2048, 0).key);
}

// The probe's reply is greedy decoding's: the same ids as the session's own argmax steps, cut at a stop id.
TEST(EvalPasskey, TheReplyIsGreedyDecoding) {
  Fixture& f = fixture();
  const Tokenizer& t = *f.tokenizer;
  const int64_t length = eval::passkey_min_length(t, "40721") + 2 * f.config().window_size;
  const eval::PasskeyPrompt p = eval::passkey_prompt(t, filler(t), length, "40721", 0.5);
  CpuExecutor executor(*f.model);
  const eval::PasskeyReply r = eval::passkey_reply(executor, f.hasher, t, Mode::Default, p.ids, 6, {});
  ASSERT_EQ(r.ids.size(), 6u);
  Session s(executor, f.hasher, Mode::Default);
  std::vector<float> logits = s.prefill(p.ids);
  const int64_t vocab = sampling_vocab(f.config(), &t);
  for (int id : r.ids) {
    EXPECT_EQ(id, int(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin()));
    logits = s.decode(id);
  }
  EXPECT_EQ(r.text, t.decode(r.ids, true));
  const int stop = r.ids[2];
  const eval::PasskeyReply cut = eval::passkey_reply(executor, f.hasher, t, Mode::Default, p.ids, 6, std::span(&stop, 1));
  EXPECT_EQ(cut.ids, std::vector<int>(r.ids.begin(), std::find(r.ids.begin(), r.ids.end(), stop)));
}

// --- the command -----------------------------------------------------------------------------------

TEST(EvalCommand, ReportsTheMeasuresAsJson) {
  Fixture& f = fixture();
  const std::string common = "eval --model " + f.model_dir.string() + " --data " + f.data_dir.string() +
                             " --device cpu --json --seq-len 40 --prompt-tokens 24 --tokens 81";
  // Passkey lengths past the template's (the random tokenizer's ids are short) and the window.
  const int64_t shortest = eval::passkey_min_length(*f.tokenizer, "99999") + f.config().window_size;
  const std::string lengths = std::to_string(shortest) + "," + std::to_string(shortest + 20);
  const test::Outcome exact = test::run_dsv41(common + " --exact --passkey " + lengths + " --passkey-trials 2 --dspark --dspark-tokens 8");
  ASSERT_EQ(exact.status, 0) << exact.output;
  const nlohmann::json e = nlohmann::json::parse(exact.output);
  EXPECT_EQ(e["mode"], "exact");
  EXPECT_EQ(e["global_kv"], "kv-fp4");
  EXPECT_EQ(e["served_loss"]["sequences"], 2);  // (81 - 1) / 40
  EXPECT_EQ(e["served_loss"]["scored_tokens"], 2 * (40 + 1 - 24));
  EXPECT_EQ(e["served_loss"]["decoder_prompt_tokens"], 24);
  EXPECT_EQ(e["served_loss"]["loss"], e["one_pass"]["loss_continuation"]);  // ExactServedLossIsTheOnePassLoss
  EXPECT_EQ(e["one_pass"]["scored_tokens_all"], 80);
  EXPECT_NEAR(double(e["served_loss"]["perplexity"]), std::exp(double(e["served_loss"]["loss"])), 1e-9);
  ASSERT_EQ(e["passkey"].size(), 2u);
  EXPECT_EQ(e["passkey"][1]["length"], shortest + 20);
  EXPECT_EQ(e["passkey"][1]["replies"].size(), 2u);
  EXPECT_GE(int(e["dspark"]["steps"]), 2);
  EXPECT_NEAR(double(e["dspark"]["mean_accepted_length"]), double(e["dspark"]["mean_accepted"]) + 1.0, 1e-12);

  const test::Outcome def = test::run_dsv41(common);
  ASSERT_EQ(def.status, 0) << def.output;
  const nlohmann::json d = nlohmann::json::parse(def.output);
  EXPECT_EQ(d["mode"], "default");
  EXPECT_EQ(d["served_loss"]["decoder_prompt_tokens"], f.config().window_size);
  EXPECT_EQ(d["one_pass"], e["one_pass"]);           // exact whatever the mode
  EXPECT_NE(d["served_loss"]["loss"], e["served_loss"]["loss"]);  // P = 24 > W = 16
  EXPECT_FALSE(d.contains("passkey"));

  const test::Outcome fp8 = test::run_dsv41(common + " --kv-fp8");
  ASSERT_EQ(fp8.status, 0) << fp8.output;
  EXPECT_EQ(nlohmann::json::parse(fp8.output)["global_kv"], "swa-fp8");
}

TEST(EvalCommand, BadArgumentsAreNamed) {
  Fixture& f = fixture();
  const std::string model = " --model " + f.model_dir.string(), data = " --data " + f.data_dir.string();
  auto error = [](const std::string& args) {
    const test::Outcome o = test::run_dsv41("eval --device cpu " + args);
    EXPECT_NE(o.status, 0) << args;
    return o.output;
  };
  EXPECT_NE(error(model + data + " --tokens 0").find("--tokens: expected at least 513 (one sequence of --seq-len 512 and its next token), found 0"),
            std::string::npos);
  EXPECT_NE(error(model + data + " --seq-len 40 --prompt-tokens 41").find("--prompt-tokens: expected a prompt of 1 to 40 tokens, found 41 tokens"),
            std::string::npos);
  EXPECT_NE(error(model + data + " --passkey 4090").find("--passkey: expected lengths up to the model's max_seq_len 4096 less the reply's 8 tokens, found 4090"),
            std::string::npos);
  EXPECT_NE(error(model + data + " --seq-len 40 --dspark --dspark-tokens 4080").find("--dspark-tokens: expected the prompt's 20 tokens"),
            std::string::npos);

  test::TempDir empty("eval_empty");
  std::filesystem::create_directories(empty.path());
  std::filesystem::copy_file(f.data_dir / "tokenizer.json", empty / "tokenizer.json");
  EXPECT_NE(error(model + " --data " + empty.string())
                .find(empty.string() + "/validation.tokens: expected the packed validation tokens (dsv41 data build writes them), found no such file"),
            std::string::npos);

  test::TempDir other("eval_other");
  std::filesystem::copy(f.data_dir.path(), other.path());
  write_text(other / "tokenizer.json", random_tokenizer_json(512));
  EXPECT_NE(error(model + " --data " + other.string())
                .find(other.string() + "/tokenizer.json: expected the model's tokenizer (1024 tokens), found a tokenizer of 512 tokens"),
            std::string::npos);
  // A packed file of another vocabulary, with the model's tokenizer beside it.
  write_text(other / "tokenizer.json", test::read_text(f.data_dir / "tokenizer.json"));
  {
    train::PackedTokenWriter w((other / "validation.tokens").string(), 512, 1);
    w.add_document(std::vector<int>{0, 5, 6, 1});
    w.finish();
  }
  EXPECT_NE(error(model + " --data " + other.string())
                .find(other.string() + "/validation.tokens: expected tokens of the model's tokenizer (vocab_size 1024), found vocab_size 512"),
            std::string::npos);
}

}  // namespace
}  // namespace dsv41
