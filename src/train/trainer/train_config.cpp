#include "train/trainer/train_config.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "model/json_document.h"

namespace dsv41::train {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string show(const json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// Reads the keys of one object of the configuration, each with its type and range, and refuses
// the keys it did not read by name. `path` is the object's place ("" at the top, "schedule.").
class Keys {
 public:
  Keys(const json& obj, std::string where, std::string path) : obj_(obj), where_(std::move(where)), path_(std::move(path)) {
    if (!obj_.is_object()) fail(at_object(), "a JSON object", show(obj_));
  }

  std::string at(const std::string& key) const { return where_ + ": key '" + path_ + key + "'"; }

  // The value of `key`, or nullptr when it is absent (or null: the default then).
  const json* take(const char* key) {
    seen_.insert(key);
    return obj_.contains(key) && !obj_.at(key).is_null() ? &obj_.at(key) : nullptr;
  }
  const json& required(const char* key, const std::string& expected) {
    const json* v = take(key);
    if (!v) fail(at(key), expected, "no such key");
    return *v;
  }

  void integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    const json* v = take(key);
    if (!v) return;
    const std::string expected = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v->is_number_integer()) fail(at(key), expected, show(*v));
    // An unsigned above 2^63 - 1 would read as a negative int64_t.
    const bool in_range = v->is_number_unsigned() ? v->get<uint64_t>() <= uint64_t(hi) && (lo <= 0 || v->get<uint64_t>() >= uint64_t(lo))
                                                  : v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    if (!in_range)
      fail(at(key), expected, show(*v));
    out = v->get<int64_t>();
  }
  // A number for which `ok` holds, `expected` saying which.
  template <class T, class Ok>
  void number(const char* key, T& out, Ok ok, const std::string& expected) {
    const json* v = take(key);
    if (!v) return;
    if (!v->is_number() || !ok(v->get<double>())) fail(at(key), expected, show(*v));
    out = T(v->get<double>());
  }
  void boolean(const char* key, bool& out) {
    const json* v = take(key);
    if (!v) return;
    if (!v->is_boolean()) fail(at(key), "true or false", show(*v));
    out = v->get<bool>();
  }
  // A nested object's keys, read by `read`.
  template <class Read>
  void object(const char* key, Read read) {
    const json* v = take(key);
    if (!v) return;
    Keys inner(*v, where_, path_ + key + ".");
    read(inner);
    inner.finish();
  }

  void finish() const {
    for (const auto& [key, value] : obj_.items())
      if (!seen_.count(key)) fail(at(key), "a key of the training configuration (docs/training.md)", "an unknown key (value " + show(value) + ")");
  }

 private:
  std::string at_object() const { return path_.empty() ? where_ : where_ + ": key '" + path_.substr(0, path_.size() - 1) + "'"; }

  const json& obj_;
  std::string where_, path_;
  std::set<std::string> seen_;
};

// A float option as the shortest decimal that reads back as the same float (0.95, not the double
// 0.949999988079071 the float widens to), so that the written configuration reads as it was given.
double float_json(float x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  const double shortest = std::strtod(std::string(text, end).c_str(), nullptr);
  return float(shortest) == x ? shortest : double(x);  // the latter if rounding twice ever moved it
}

bool positive(double x) { return x > 0 && x < std::numeric_limits<double>::infinity(); }
bool non_negative(double x) { return x >= 0 && x < std::numeric_limits<double>::infinity(); }
bool fraction(double x) { return x >= 0 && x <= 1; }
bool momentum(double x) { return x >= 0 && x < 1; }

std::string preset_list() {
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

// "model": a preset's name; an object with "preset" and official config.json keys replacing the
// preset's; or a whole config.json object (official or Hugging Face layout).
Config read_model(const json& v, const std::string& where) {
  const std::string expected = "a preset name (" + preset_list() + ") or a config.json object";
  auto known = [&](const json& name, const std::string& at) {
    if (!name.is_string()) fail(at, expected, show(name));
    for (const std::string& n : preset_names())
      if (n == name.get<std::string>()) return n;
    fail(at, expected, show(name));
  };
  Config c;
  if (v.is_string()) {
    c = preset(known(v, where));
  } else if (v.is_object() && v.contains("preset")) {
    const std::string name = known(v.at("preset"), where + ": key 'preset'");
    json merged = json::parse(to_official_json(preset(name)));
    for (const auto& [key, value] : v.items())
      if (key != "preset") merged[key] = value;
    c = parse_config(merged.dump(), where + " (preset " + name + " with its changes)");
  } else if (v.is_object()) {
    c = parse_config(v.dump(), where);
  } else {
    fail(where, expected, show(v));
  }
  if (c.has_vision()) fail(where, "a text model (vision_n_layers 0): the trainer has no vision tower", "a vision tower");
  return c;
}

std::string path_from(const std::string& base_dir, const json& v, const std::string& at) {
  if (!v.is_string() || v.get<std::string>().empty()) fail(at, "a directory path", show(v));
  return fs::absolute(fs::path(base_dir) / v.get<std::string>()).lexically_normal().string();
}

}  // namespace

TrainConfig parse_train_config(const std::string& text, const std::string& where, const std::string& base_dir) {
  const json j = parse_json(text, where);
  TrainConfig t;
  t.source = where;
  Keys k(j, where, "");
  t.model = read_model(k.required("model", "the model (a preset name or a config.json object)"), k.at("model"));
  t.data_dir = path_from(base_dir, k.required("data", "the directory of `dsv41 data build`"), k.at("data"));
  if (const json* out = k.take("out")) t.out_dir = path_from(base_dir, *out, k.at("out"));

  constexpr int64_t kMax = int64_t(1) << 40;
  k.integer("seq_len", t.seq_len, 1, kMax);
  if (t.seq_len > t.model.max_seq_len)
    fail(k.at("seq_len"), "at most the model's max_seq_len (" + std::to_string(t.model.max_seq_len) + ")",
         std::to_string(t.seq_len));
  k.integer("batch_size", t.batch_size, 1, 1 << 20);
  k.integer("steps", t.steps, 1, kMax);
  int64_t seed = 0;
  k.integer("seed", seed, 0, std::numeric_limits<int64_t>::max());
  t.seed = uint64_t(seed);
  k.number("init_std", t.init_std, positive, "a positive number");

  optim::Schedule& s = t.optimizer.schedule;
  k.object("schedule", [&](Keys& o) {
    o.number("peak_lr", s.peak_lr, positive, "a positive number");
    o.integer("warmup_steps", s.warmup_steps, 0, kMax);
    o.integer("decay_start", s.decay_start, 0, kMax);
    o.integer("decay_steps", s.decay_steps, 0, kMax);
    o.number("final_ratio", s.final_ratio, fraction, "a number in [0, 1]");
    if (s.decay_steps > 0 && s.decay_start < s.warmup_steps)
      fail(o.at("decay_start"), "at least warmup_steps (" + std::to_string(s.warmup_steps) + ") when decay_steps > 0",
           std::to_string(s.decay_start));
  });
  optim::MuonOptions& muon = t.optimizer.muon;
  k.object("muon", [&](Keys& o) {
    o.number("momentum", muon.momentum, momentum, "a number in [0, 1)");
    o.number("weight_decay", muon.weight_decay, non_negative, "a number >= 0");
    o.number("update_rms", muon.update_rms, positive, "a positive number");
  });
  optim::AdamWOptions& adamw = t.optimizer.adamw;
  k.object("adamw", [&](Keys& o) {
    o.number("beta1", adamw.beta1, momentum, "a number in [0, 1)");
    o.number("beta2", adamw.beta2, momentum, "a number in [0, 1)");
    o.number("eps", adamw.eps, positive, "a positive number");
    o.number("weight_decay", adamw.weight_decay, non_negative, "a number >= 0");
  });
  optim::SinkhornOptions& sink = t.optimizer.sinkhorn;
  k.object("sinkhorn", [&](Keys& o) {
    o.number("momentum", sink.momentum, momentum, "a number in [0, 1)");
    int64_t steps = sink.steps;
    o.integer("steps", steps, 1, 1001);
    if (steps % 2 == 0) fail(o.at("steps"), "an odd number (the last step normalizes the rows)", std::to_string(steps));
    sink.steps = int(steps);
    o.number("tau", sink.tau, fraction, "a number in [0, 1]");
    o.number("eps", sink.eps, positive, "a positive number");
    o.number("lr_correction", sink.lr_correction, positive, "a positive number");
  });
  k.number("expert_bias_rate", t.expert_bias_rate, non_negative, "a number >= 0");
  k.number("indexer_loss_weight", t.indexer_loss_weight, non_negative, "a number >= 0");
  k.object("dspark", [&](Keys& o) {
    o.number("loss_weight", t.dspark_loss_weight, non_negative, "a number >= 0");
    o.integer("blocks", t.dspark_blocks, 0, 1 << 20);
  });
  k.object("qat", [&](Keys& o) {
    o.boolean("kv_fp4", t.qat.kv_fp4);
    o.boolean("swa_fp8", t.qat.swa_fp8);
    o.boolean("mxfp4_indexer", t.qat.mxfp4_indexer);
  });
  k.object("bounded_replay", [&](Keys& o) {
    o.integer("turns", t.replay_turns, 0, kMax);
  });
  k.integer("log_interval", t.log_interval, 1, kMax);
  k.integer("validation_interval", t.validation_interval, 0, kMax);
  k.integer("validation_tokens", t.validation_tokens, 1, kMax);
  k.integer("checkpoint_interval", t.checkpoint_interval, 0, kMax);
  k.integer("keep_checkpoints", t.keep_checkpoints, 0, kMax);
  k.finish();
  t.optimizer.schedule.validate();
  return t;
}

TrainConfig load_train_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable training configuration (JSON)", fs::exists(path) ? "an unreadable file" : "no such file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path, fs::absolute(path).parent_path().string());
}

std::string train_config_json(const TrainConfig& t) {
  const optim::Schedule& s = t.optimizer.schedule;
  const optim::MuonOptions& m = t.optimizer.muon;
  const optim::AdamWOptions& a = t.optimizer.adamw;
  const optim::SinkhornOptions& k = t.optimizer.sinkhorn;
  json j = json::object();
  j["model"] = json::parse(to_official_json(t.model));
  j["data"] = t.data_dir;
  if (!t.out_dir.empty()) j["out"] = t.out_dir;
  j["seq_len"] = t.seq_len;
  j["batch_size"] = t.batch_size;
  j["steps"] = t.steps;
  j["seed"] = t.seed;
  j["init_std"] = t.init_std;
  j["schedule"] = {{"peak_lr", s.peak_lr}, {"warmup_steps", s.warmup_steps}, {"decay_start", s.decay_start},
                   {"decay_steps", s.decay_steps}, {"final_ratio", s.final_ratio}};
  j["muon"] = {{"momentum", float_json(m.momentum)}, {"weight_decay", float_json(m.weight_decay)}, {"update_rms", float_json(m.update_rms)}};
  j["adamw"] = {{"beta1", float_json(a.beta1)}, {"beta2", float_json(a.beta2)}, {"eps", float_json(a.eps)}, {"weight_decay", float_json(a.weight_decay)}};
  j["sinkhorn"] = {{"momentum", float_json(k.momentum)}, {"steps", k.steps}, {"tau", float_json(k.tau)}, {"eps", float_json(k.eps)}, {"lr_correction", float_json(k.lr_correction)}};
  j["expert_bias_rate"] = t.expert_bias_rate;
  j["indexer_loss_weight"] = t.indexer_loss_weight;
  j["dspark"] = {{"loss_weight", t.dspark_loss_weight}, {"blocks", t.dspark_blocks}};
  j["qat"] = {{"kv_fp4", t.qat.kv_fp4}, {"swa_fp8", t.qat.swa_fp8}, {"mxfp4_indexer", t.qat.mxfp4_indexer}};
  j["bounded_replay"] = {{"turns", t.replay_turns}};
  j["log_interval"] = t.log_interval;
  j["validation_interval"] = t.validation_interval;
  j["validation_tokens"] = t.validation_tokens;
  j["checkpoint_interval"] = t.checkpoint_interval;
  j["keep_checkpoints"] = t.keep_checkpoints;
  return j.dump(2) + "\n";
}

}  // namespace dsv41::train
