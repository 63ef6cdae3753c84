#include "train/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "model/engram_compress.h"
#include "model/engram_hash.h"
#include "model/accounting.h"
#include "model/json_document.h"
#include "model/random_checkpoint.h"
#include "train/data/packed_tokens.h"
#include "train/model/train_model.h"
#include "train/trainer/masters.h"
#include "train/trainer/release_checkpoint.h"
#include "train/trainer/step_executor.h"

namespace dsv41::train {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

namespace {

constexpr const char* kConfigFile = "train_config.json";
constexpr const char* kLogFile = "log.jsonl";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable file", fs::exists(path) ? "an unreadable file" : "no such file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Written beside and renamed over `path`: a reader sees the old file or the new one.
void write_text(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) fail(partial, "a file we can write", "a write error");
  }
  fs::rename(partial, path);
}

// The model config for the data's tokenizer: every id the tokenizer makes has an embedding row
// (the rows above it are padding, as DeepSeek pads its vocabulary), and Engram hashes over the
// tokenizer's compressed vocabulary, as `dsv41 init-random` sets it for the tokenizer it ships.
Config config_for_tokenizer(Config c, const Tokenizer& tokenizer, const std::string& data_dir) {
  const int64_t ids = int64_t(tokenizer.vocab_size());
  if (ids > c.vocab_size)
    fail(c.source + ": key 'vocab_size'", "at least the " + std::to_string(ids) + " ids of " + data_dir + "/tokenizer.json",
         std::to_string(c.vocab_size));
  if (c.has_engram()) {
    if (c.engram_pad_id >= ids)
      fail(c.source + ": key 'engram_pad_id'", "an id of the data's tokenizer (below " + std::to_string(ids) + ")",
           std::to_string(c.engram_pad_id));
    c.engram_compressed_vocab_size = engram_compress_vocabulary(tokenizer).size;
  }
  validate(c);
  return c;
}

// The steps of a run's complete checkpoints (a step-N directory holding a trainer state), in
// increasing order.
std::vector<int64_t> checkpoint_steps(const std::string& out_dir) {
  std::vector<int64_t> steps;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 13 || name.compare(0, 5, "step-") != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    if (fs::exists(e.path() / "resume" / "trainer.json")) steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// A checkpoint's resume/trainer.json.
struct TrainerState {
  int64_t step = 0, tokens = 0;
  uint64_t data_position = 0, seed = 0, train_tokens = 0;
};

TrainerState read_trainer_state(const std::string& path) {
  const json j = parse_json(read_text(path), path);
  auto field = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_number_unsigned())
      fail(path + ": key '" + key + "'", "a non-negative integer", j.contains(key) ? j.at(key).dump() : "no such key");
    return j.at(key).get<uint64_t>();
  };
  return {int64_t(field("step")), int64_t(field("tokens")), field("data_position"), field("seed"), field("train_tokens")};
}

}  // namespace

// Everything a run holds; made once and never moved (the iterator and the model refer to members).
struct Trainer::Run {
  TrainConfig cfg;
  TokenizerFiles tokenizer;
  PackedTokens train_split, validation_split;
  std::unique_ptr<EngramHasher> hasher;
  Parameters<float> params;
  std::unique_ptr<StepExecutor> executor;
  SequenceIterator order;
  int64_t step = 0, tokens = 0;
  std::ofstream log;

  // `position`: the train sequences already taken (SequenceIterator::position()).
  // `device`: where the steps run (step_executor.h).
  Run(TrainConfig config, const TokenizerFiles& files, PackedTokens train, uint64_t position, TrainDevice device)
      : cfg(std::move(config)),
        tokenizer(files),
        train_split(std::move(train)),
        params(cfg.model),
        order(train_split, uint64_t(cfg.seq_len), cfg.seed, position) {
    if (cfg.validation_interval > 0) read_validation();
    if (cfg.model.has_engram())
      hasher = std::make_unique<EngramHasher>(cfg.model, engram_compress_vocabulary(tokenizer.tokenizer).token_map);
    executor = make_step_executor(device, params, cfg);
  }

  std::string out(const std::string& name) const { return (fs::path(cfg.out_dir) / name).string(); }

  // A sequence as the model takes it (TrainSequence's storage): its L + 1 ids, the Engram hash ids of
  // its L inputs; DSpark's draft blocks at `anchors`; served as `calls` (bounded replay; none: exact
  // mode).
  struct Sequence {
    std::vector<int64_t> tokens, engram_ids, anchors;
    std::vector<ServedCall> calls;
    TrainSequence view() const { return {tokens, engram_ids.empty() ? nullptr : engram_ids.data(), anchors, calls}; }
  };
  Sequence sequence(std::span<const uint32_t> ids, std::vector<int64_t> anchors = {}, std::vector<ServedCall> calls = {}) const {
    Sequence q{std::vector<int64_t>(ids.begin(), ids.end()), {}, std::move(anchors), std::move(calls)};
    if (hasher) {
      const std::vector<int> inputs(ids.begin(), ids.end() - 1);
      q.engram_ids.resize(inputs.size() * size_t(hasher->n_layers() * hasher->columns()));
      EngramHistory history;  // each sequence from its own start, as a prompt is hashed
      hasher->hash(inputs, {}, history, q.engram_ids.data());
    }
    return q;
  }
  static std::vector<TrainSequence> views(const std::vector<Sequence>& batch) {
    std::vector<TrainSequence> v;
    for (const Sequence& q : batch) v.push_back(q.view());
    return v;
  }

  // The draft blocks' anchors of the `index`-th sequence of its split (none when DSpark is not trained);
  // under bounded replay, among the rows its served calls decode.
  std::vector<int64_t> anchors(uint64_t index, std::span<const ServedCall> served = {}) const {
    if (!cfg.trains_dspark()) return {};
    return dspark_anchors(cfg.model, cfg.seq_len, cfg.dspark_blocks, cfg.seed, index, served);
  }

  // The served calls of the `index`-th train sequence under bounded replay (none in exact mode).
  std::vector<ServedCall> calls(uint64_t index) const {
    if (cfg.replay_turns == 0) return {};
    return replay_calls(cfg.model, cfg.seq_len, cfg.replay_turns, cfg.seed, index);
  }

  StepReport train_step() {
    executor->zero_grad();
    const float share = 1.0f / float(cfg.batch_size);
    StepReport r;
    std::vector<Sequence> batch;
    for (int64_t b = 0; b < cfg.batch_size; ++b) {
      std::vector<ServedCall> served = calls(order.position());
      std::vector<int64_t> at = anchors(order.position(), served);
      batch.push_back(sequence(order.next(), std::move(at), std::move(served)));
    }
    const std::vector<Losses> losses = executor->forward_backward(views(batch), share, share * float(cfg.indexer_loss_weight),
                                                                  share * float(cfg.dspark_loss_weight));
    for (const Losses& l : losses) {
      r.loss += l.lm;
      r.indexer_loss += l.indexer;
      r.dspark_loss += l.dspark;
    }
    r.loss /= double(cfg.batch_size);
    r.indexer_loss /= double(cfg.batch_size);
    r.dspark_loss /= double(cfg.batch_size);
    if (!std::isfinite(r.loss) || !std::isfinite(r.indexer_loss) || !std::isfinite(r.dspark_loss))
      fail("training step " + std::to_string(step + 1), "a finite loss",
           "loss " + std::to_string(r.loss) + ", indexer loss " + std::to_string(r.indexer_loss) + ", DSpark loss " +
               std::to_string(r.dspark_loss) + " (lower the learning rate?)");
    r.lr = cfg.optimizer.schedule.lr(executor->optimizer_steps());
    executor->step();
    ++step;
    tokens += cfg.batch_size * cfg.seq_len;
    r.step = step;
    r.steps = cfg.steps;
    r.tokens = tokens;
    return r;
  }

  void read_validation() {
    const std::string path = cfg.data_dir + "/validation.tokens";
    validation_split = PackedTokens::read(path);
    if (validation_split.size() < uint64_t(cfg.seq_len + 1))
      fail(path, "at least seq_len + 1 = " + std::to_string(cfg.seq_len + 1) + " tokens for a validation sequence",
           std::to_string(validation_split.size()));
  }

  // The mean L_lm and DSpark loss over the validation sequences (DSpark's blocks drawn as for the
  // k-th train sequence).
  Losses validation_losses() {
    if (validation_split.size() == 0) read_validation();
    const SequenceIterator file_order(validation_split, uint64_t(cfg.seq_len), cfg.seed);
    const uint64_t n = std::min<uint64_t>(uint64_t((cfg.validation_tokens + cfg.seq_len - 1) / cfg.seq_len),
                                          file_order.sequences_per_epoch());
    Losses sum;
    for (uint64_t k0 = 0; k0 < n; k0 += uint64_t(cfg.batch_size)) {  // a training batch's worth at a time
      std::vector<Sequence> batch;
      for (uint64_t k = k0; k < std::min<uint64_t>(n, k0 + uint64_t(cfg.batch_size)); ++k)
        batch.push_back(sequence(file_order.sequence(k), anchors(k)));
      for (const Losses& l : executor->evaluate(views(batch))) {
        sum.lm += l.lm;
        sum.dspark += l.dspark;
      }
    }
    sum.lm /= double(n);
    sum.dspark /= double(n);
    return sum;
  }

  void log_event(const json& event) {
    log << event.dump() << '\n';
    log.flush();
    if (!log) fail(out(kLogFile), "a log we can append to", "a write error");
  }

  void write_checkpoint() {
    const std::string name = checkpoint_name(step), dir = out(name), partial = dir + ".partial";
    fs::remove_all(partial);
    executor->to_host();
    write_release_checkpoint(params, partial, {tokenizer.tokenizer_json, tokenizer.tokenizer_config_json});
    const fs::path resume = fs::path(partial) / "resume";
    fs::create_directories(resume);
    write_masters(params, (resume / "masters.safetensors").string());
    executor->save_optimizer((resume / "optimizer.state").string());
    const json state = {{"step", step},
                        {"data_position", order.position()},
                        {"tokens", tokens},
                        {"seed", cfg.seed},
                        {"train_tokens", train_split.size()}};
    write_text((resume / "trainer.json").string(), state.dump(2) + "\n");
    fs::remove_all(dir);
    fs::rename(partial, dir);
    const std::string latest = out("latest"), link = latest + ".partial";
    fs::remove(link);
    fs::create_directory_symlink(name, link);
    fs::rename(link, latest);
    if (cfg.keep_checkpoints > 0) {
      const std::vector<int64_t> steps = checkpoint_steps(cfg.out_dir);
      for (size_t i = 0; i + size_t(cfg.keep_checkpoints) < steps.size(); ++i) fs::remove_all(out(checkpoint_name(steps[i])));
    }
  }

  // Continues from checkpoint `s` of this run's directory at `state` (its trainer.json): the
  // masters, the optimizer's state; log lines of steps after it (a run stopped past its last
  // checkpoint) go.
  void restore(int64_t s, const TrainerState& state) {
    const fs::path resume = fs::path(out(checkpoint_name(s))) / "resume";
    read_masters(params, (resume / "masters.safetensors").string());
    executor->from_host();
    executor->load_optimizer((resume / "optimizer.state").string());
    step = state.step;
    tokens = state.tokens;
    if (executor->optimizer_steps() != step)
      fail((resume / "optimizer.state").string(), std::to_string(step) + " steps (trainer.json's)",
           std::to_string(executor->optimizer_steps()));

    std::string kept;
    std::istringstream lines(read_text(out(kLogFile)));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && parse_json(line, out(kLogFile)).value("step", int64_t(0)) <= step) kept += line + "\n";
    write_text(out(kLogFile), kept);
  }
};

Trainer::Trainer(std::unique_ptr<Run> run) : run_(std::move(run)) {}
Trainer::~Trainer() = default;

namespace {

// The run's data and tokenizer, and the model config made for them.
struct Data {
  TokenizerFiles tokenizer;
  PackedTokens train;
};
Data read_data(TrainConfig& cfg) {
  Data d{checkpoint_tokenizer(cfg.model, cfg.data_dir), PackedTokens::read(cfg.data_dir + "/train.tokens")};
  if (d.train.size() < uint64_t(cfg.seq_len + 1))
    fail(cfg.data_dir + "/train.tokens", "at least seq_len + 1 = " + std::to_string(cfg.seq_len + 1) + " tokens",
         std::to_string(d.train.size()));
  if (d.train.vocab_size() != d.tokenizer.tokenizer.vocab_size())
    fail(cfg.data_dir + "/train.tokens", "ids of its tokenizer.json (" + std::to_string(d.tokenizer.tokenizer.vocab_size()) + ")",
         "vocab_size " + std::to_string(d.train.vocab_size()));
  cfg.model = config_for_tokenizer(cfg.model, d.tokenizer.tokenizer, cfg.data_dir);
  return d;
}

}  // namespace

std::unique_ptr<Trainer> Trainer::start(TrainConfig cfg, TrainDevice device) {
  if (cfg.out_dir.empty()) fail(cfg.source, "an output directory (key 'out' or --out)", "none");
  if (fs::exists(fs::path(cfg.out_dir) / kConfigFile))
    fail(cfg.out_dir, "a directory without a training run (continue one with --resume)", "the run of its " + std::string(kConfigFile));
  if (fs::exists(cfg.out_dir) && !fs::is_empty(cfg.out_dir))
    fail(cfg.out_dir, "a new or empty directory for the run", "other files in it");
  Data data = read_data(cfg);
  fs::create_directories(cfg.out_dir);
  auto run = std::make_unique<Run>(std::move(cfg), data.tokenizer, std::move(data.train), 0, device);
  init_parameters(run->params, InitOptions{run->cfg.seed, run->cfg.init_std});
  run->executor->from_host();
  run->log.open(run->out(kLogFile), std::ios::trunc);
  write_text(run->out(kConfigFile), train_config_json(run->cfg));
  return std::unique_ptr<Trainer>(new Trainer(std::move(run)));
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& out_dir, std::optional<int64_t> steps, TrainDevice device) {
  const std::string dir = fs::absolute(out_dir).lexically_normal().string();
  TrainConfig cfg = load_train_config((fs::path(dir) / kConfigFile).string());
  cfg.out_dir = dir;  // where the run is now, should it have moved
  if (steps) {
    if (*steps < 1) fail("--steps", "a positive number of steps", std::to_string(*steps));
    cfg.steps = *steps;
  }
  const std::vector<int64_t> checkpoints = checkpoint_steps(dir);
  if (checkpoints.empty()) fail(dir, "a checkpoint to resume from (step-N/resume/trainer.json)", "none");
  const int64_t from = checkpoints.back();
  if (from >= cfg.steps)
    fail(dir, "a run with steps left (--steps extends it)", "step " + std::to_string(from) + " of " + std::to_string(cfg.steps) + " done");
  const std::string state_path = (fs::path(dir) / checkpoint_name(from) / "resume" / "trainer.json").string();
  const TrainerState state = read_trainer_state(state_path);
  if (state.step != from) fail(state_path, "step " + std::to_string(from) + " (its directory's)", std::to_string(state.step));
  if (state.seed != cfg.seed)
    fail(state_path, "seed " + std::to_string(cfg.seed) + " (train_config.json's)", std::to_string(state.seed));
  Data data = read_data(cfg);
  if (state.train_tokens != data.train.size())
    fail(cfg.data_dir + "/train.tokens", std::to_string(state.train_tokens) + " tokens, as when the checkpoint was written",
         std::to_string(data.train.size()) + " (the data changed: a resume continues on the same data)");
  auto run = std::make_unique<Run>(std::move(cfg), data.tokenizer, std::move(data.train), state.data_position, device);
  run->restore(from, state);
  run->log.open(run->out(kLogFile), std::ios::app);
  write_text(run->out(kConfigFile), train_config_json(run->cfg));
  return std::unique_ptr<Trainer>(new Trainer(std::move(run)));
}

void Trainer::run(const TrainEvents& events) {
  Run& r = *run_;
  const TrainConfig& c = r.cfg;
  auto line = [&](const std::string& text) {
    if (events.line) events.line(text);
  };
  auto validate = [&] {
    const Losses loss = r.validation_losses();
    json event = {{"event", "validation"}, {"step", r.step}, {"validation_loss", loss.lm}};
    char text[128];
    std::snprintf(text, sizeof text, "step %lld: validation loss %.4f", static_cast<long long>(r.step), loss.lm);
    std::string shown = text;
    if (c.trains_dspark()) {
      event["validation_dspark_loss"] = loss.dspark;
      std::snprintf(text, sizeof text, ", DSpark loss %.4f", loss.dspark);
      shown += text;
    }
    r.log_event(event);
    line(shown);
  };
  if (r.step == 0 && c.validation_interval > 0) validate();  // the starting point of the curve

  // The model's FLOPs a trained token, 6 per active matrix parameter (forward 2, backward 4; every
  // layer and the head on every row: exact mode), as llm.c counts them; attention's are left out.
  const double flops_per_token = 6.0 * double(account(c.model).params.active_decode);
  const Clock::time_point start = Clock::now();
  double step_seconds = 0, interval_seconds = 0, interval_loss = 0, interval_indexer = 0, interval_dspark = 0;
  StepExecutor::Times interval_start = r.executor->times();
  int64_t done = 0, interval_steps = 0;
  while (r.step < c.steps) {
    const Clock::time_point t0 = Clock::now();
    StepReport report = r.train_step();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    step_seconds += seconds;
    interval_seconds += seconds;
    ++done;
    ++interval_steps;
    interval_loss += report.loss;
    interval_indexer += report.indexer_loss;
    interval_dspark += report.dspark_loss;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    report.tokens_per_second = double(done * c.batch_size * c.seq_len) / step_seconds;
    report.eta_seconds = elapsed / double(done) * double(c.steps - r.step);
    if (events.step) events.step(report);

    if (r.step % c.log_interval == 0 || r.step == c.steps) {
      const double loss = interval_loss / double(interval_steps), indexer = interval_indexer / double(interval_steps);
      const double dspark = interval_dspark / double(interval_steps);
      const double rate = double(interval_steps * c.batch_size * c.seq_len) / interval_seconds;
      json event = {{"event", "train"}, {"step", r.step}, {"loss", loss}, {"indexer_loss", indexer}};
      if (c.trains_dspark()) event["dspark_loss"] = dspark;
      event["lr"] = report.lr;
      event["tokens"] = r.tokens;
      event["tokens_per_s"] = rate;
      event["model_tflops"] = rate * flops_per_token * 1e-12;
      event["elapsed_s"] = elapsed;
      // Where a step's time went over the interval (validation and checkpoints not counted).
      const StepExecutor::Times& now = r.executor->times();
      const double n = double(interval_steps);
      event["step_parts_s"] = {{"forward", (now.forward - interval_start.forward) / n},
                               {"backward", (now.backward - interval_start.backward) / n},
                               {"update", (now.update - interval_start.update) / n}};
      interval_start = now;
      r.log_event(event);
      char text[200];
      if (c.trains_dspark())
        std::snprintf(text, sizeof text, "step %lld: loss %.4f, indexer loss %.4f, DSpark loss %.4f, lr %.3g, %.0f tokens/s",
                      static_cast<long long>(r.step), loss, indexer, dspark, report.lr, rate);
      else
        std::snprintf(text, sizeof text, "step %lld: loss %.4f, indexer loss %.4f, lr %.3g, %.0f tokens/s",
                      static_cast<long long>(r.step), loss, indexer, report.lr, rate);
      line(text);
      interval_loss = interval_indexer = interval_dspark = interval_seconds = 0;
      interval_steps = 0;
    }
    if (c.validation_interval > 0 && (r.step % c.validation_interval == 0 || r.step == c.steps)) validate();
    if ((c.checkpoint_interval > 0 && r.step % c.checkpoint_interval == 0) || r.step == c.steps) {
      r.write_checkpoint();
      r.log_event({{"event", "checkpoint"}, {"step", r.step}, {"dir", checkpoint_name(r.step)}});
      line("step " + std::to_string(r.step) + ": wrote " + r.out(checkpoint_name(r.step)));
    }
  }
}

const TrainConfig& Trainer::config() const { return run_->cfg; }
int64_t Trainer::step() const { return run_->step; }
const Parameters<float>& Trainer::parameters() const {
  run_->executor->to_host();
  return run_->params;
}
double Trainer::validation_loss() { return run_->validation_losses().lm; }

}  // namespace dsv41::train
