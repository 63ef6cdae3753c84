#include "model/weights.h"

#include <map>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/layer_weights.h"
#include "model/vision_weights.h"

namespace dsv41 {

const char* weight_group_name(WeightGroup group) {
  switch (group) {
    case WeightGroup::Backbone: return "backbone";
    case WeightGroup::Engram: return "engram";
    case WeightGroup::DSpark: return "dspark";
    case WeightGroup::Vision: return "vision";
  }
  return "?";
}

double flop_weight(Precision p) {
  switch (p) {
    case Precision::FP32:
    case Precision::BF16: return 1.0;
    case Precision::FP8: return 0.5;
    case Precision::FP4: return 0.25;
  }
  return 1.0;
}

int64_t TensorSpec::nbytes() const {
  int64_t n = int64_t(dtype_size(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorSpec::rank_bytes(const Config& c, const Partition& p) const {
  switch (shard) {
    case Shard::Whole: return nbytes();
    case Shard::OutRows:
    case Shard::InCols: return nbytes() / p.world;  // check_partition: the world divides the cut dimension
    case Shard::Expert: return p.owns_expert(expert, c.routed_experts(layer)) ? nbytes() : 0;
    case Shard::TableRows: return p.count(shape[0], Shard::TableRows) * (nbytes() / shape[0]);
  }
  return nbytes();
}

namespace {

constexpr int kBlock = 32;  // fp8 weights: 32x32 ue8m0 blocks; fp4 experts: ue8m0 per 32 along K
int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

// Builds the map for one Config; `group` and `layer` say where the tensors being added belong.
class MapBuilder {
 public:
  explicit MapBuilder(const Config& c) : c_(c) {}

  WeightGroup group = WeightGroup::Backbone;
  int layer = -1;
  Shard shard = Shard::Whole;  // of the tensors being added
  int expert = -1;

  // A plain tensor kept in the given dtype (norm weights, biases, hc_* and the like).
  void plain(const std::string& name, DType dtype, std::vector<int64_t> shape, WeightRole role = WeightRole::Dense,
             Precision compute = Precision::BF16) {
    int64_t params = 1;
    for (int64_t d : shape) params *= d;
    out.push_back({name, dtype, std::move(shape), group, role, compute, layer, params, shard, expert});
  }

  // A Linear in the checkpoint's default format: fp8 with 32x32 scales, or bf16.
  void linear(const std::string& name, int64_t out_f, int64_t in_f, WeightRole role = WeightRole::Dense,
              std::optional<Precision> compute = std::nullopt) {
    if (c_.quantized()) {
      plain(name + ".weight", DType::F8_E4M3, {out_f, in_f}, role, compute.value_or(Precision::FP8));
      scale(name + ".scale", {blocks(out_f), blocks(in_f)});
    } else {
      plain(name + ".weight", DType::BF16, {out_f, in_f}, role, compute.value_or(Precision::BF16));
    }
  }

  // A routed-expert Linear: fp4 (two e2m1 per byte, one ue8m0 per 32 along K) when the config
  // says so, else the default format. Its products are fp8 x fp4 (the activation is quantized to
  // fp8 first), which runs at the fp8 rate: an operation counts at the wider of its operands.
  void expert_linear(const std::string& name, int64_t out_f, int64_t in_f) {
    if (!c_.fp4_experts()) return linear(name, out_f, in_f, WeightRole::RoutedExpert);
    plain(name + ".weight", DType::I8, {out_f, in_f / 2}, WeightRole::RoutedExpert, Precision::FP8);
    out.back().params = out_f * in_f;
    scale(name + ".scale", {out_f, in_f / kBlock});
  }

  void scale(const std::string& name, std::vector<int64_t> shape) {
    plain(name, DType::F8_E8M0, std::move(shape), WeightRole::Scale);
    out.back().params = 0;
  }

  void norm(const std::string& name, int64_t dim) { plain(name + ".weight", DType::BF16, {dim}); }

  // A row of the block table (layer_weights.h), of a block in `block` (the backbone's layers, or
  // DSpark's mtp blocks); its Engram tensors count as Engram.
  void add(const BlockTensor& t, WeightGroup block) {
    group = t.group == WeightGroup::Engram ? WeightGroup::Engram : block;
    shard = t.shard;
    expert = t.expert;
    const int64_t out_f = t.shape[0], in_f = t.shape.size() > 1 ? t.shape[1] : 1;
    switch (t.kind) {
      case BlockTensor::Kind::Linear: linear(t.name, out_f, in_f, t.role, t.compute); break;
      case BlockTensor::Kind::ExpertLinear: expert_linear(t.name, out_f, in_f); break;
      case BlockTensor::Kind::Plain:
        if (t.role == WeightRole::Scale) scale(t.name, t.shape);
        else plain(t.name, t.dtype, t.shape, t.role, t.compute.value_or(Precision::BF16));
        break;
    }
    shard = Shard::Whole;
    expert = -1;
  }

  std::vector<TensorSpec> out;

 private:
  const Config& c_;
};

void add_vision(MapBuilder& m, const Config& c) {
  for_each_vision_tensor(c, [&](const VisionTensorSpec& t) { m.plain(t.name, t.dtype, t.shape); });
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const Config& c) {
  MapBuilder m(c);
  m.shard = Shard::OutRows;  // the vocabulary, cut over ranks
  m.plain("embed.weight", DType::BF16, {c.vocab_size, c.dim}, WeightRole::Lookup);
  m.shard = Shard::Whole;
  m.norm("norm", c.dim);
  // Stored bf16, multiplied in fp32 by the reference so that logits come out in fp32.
  m.shard = Shard::OutRows;
  m.plain("head.weight", DType::BF16, {c.vocab_size, c.dim}, WeightRole::Head, Precision::FP32);
  m.shard = Shard::Whole;

  for (int i = 0; i < c.n_layers; ++i) {
    m.layer = i;
    for_each_block_tensor(c, "layers." + std::to_string(i) + ".", i,
                          [&](const BlockTensor& t) { m.add(t, WeightGroup::Backbone); });
  }

  if (c.has_dspark()) {
    for (int j = 0; j < c.n_mtp_layers; ++j) {
      m.layer = c.n_layers + j;
      for_each_block_tensor(c, "mtp." + std::to_string(j) + ".", m.layer,
                            [&](const BlockTensor& t) { m.add(t, WeightGroup::DSpark); });
      for_each_dspark_tensor(c, j, [&](const BlockTensor& t) { m.add(t, WeightGroup::DSpark); });
    }
  }

  if (c.has_vision()) {
    m.group = WeightGroup::Vision;
    m.layer = -1;
    add_vision(m, c);
  }
  return std::move(m.out);
}

static std::string shape_text(DType dtype, const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << dtype_name(dtype) << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

void check_weights(const Config& c, const Checkpoint& ckpt) {
  std::vector<std::string> problems;
  std::map<std::string, const TensorSpec*> expected;
  std::vector<TensorSpec> specs = expected_tensors(c);
  for (const TensorSpec& s : specs) expected[s.name] = &s;

  for (const TensorSpec& s : specs) {
    const TensorView* t = ckpt.find(s.name);
    if (!t) {
      problems.push_back("tensor '" + s.name + "': expected " + shape_text(s.dtype, s.shape) + ", found missing");
    } else if (t->dtype != s.dtype || t->shape != s.shape) {
      problems.push_back("tensor '" + s.name + "': expected " + shape_text(s.dtype, s.shape) + ", found " +
                         shape_text(t->dtype, t->shape));
    }
  }
  for (const std::string& name : ckpt.names())
    if (!expected.count(name))
      problems.push_back("tensor '" + name + "': expected no such tensor for this config, found one in the checkpoint");
  if (problems.empty()) return;

  constexpr size_t kShown = 20;
  std::string msg = ckpt.dir() + ": " + std::to_string(problems.size()) + " tensor(s) do not match config " + c.source + ":";
  for (size_t i = 0; i < problems.size() && i < kShown; ++i) msg += "\n  " + problems[i];
  if (problems.size() > kShown) msg += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  throw Error(msg);
}

}  // namespace dsv41
