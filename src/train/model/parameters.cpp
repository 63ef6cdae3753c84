#include "train/model/parameters.h"

#include <cmath>
#include <type_traits>

#include "backend/cpu/engram.h"
#include "base/counter_random.h"
#include "base/error.h"
#include "forward/model.h"

namespace dsv41::train {

namespace {

// The logical element count of a table row.
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The checkpoint name of a table row: a Linear's is "<name>.weight".
std::string tensor_name(const BlockTensor& t) {
  return t.kind == BlockTensor::Kind::Plain ? t.name : t.name + ".weight";
}

BlockTensor global(const std::string& name, std::vector<int64_t> shape, WeightRole role) {
  return BlockTensor{BlockTensor::Kind::Plain, name, DType::BF16, std::move(shape), role, std::nullopt, WeightGroup::Backbone};
}

}  // namespace

template <class T>
Parameters<T>::Parameters(const Config& config) : config_(config) {
  const Config& c = config_;
  if (c.has_vision()) fail(c.source, "a text-only config for training (vision_n_layers 0)", "a vision tower");
  // In the weights map's order (model/weights.cpp expected_tensors): the globals, the backbone's
  // blocks, then DSpark's blocks with their heads.
  embed_ = &add(global("embed.weight", {c.vocab_size, c.dim}, WeightRole::Lookup));
  norm_ = &add(global("norm.weight", {c.dim}, WeightRole::Dense));
  head_ = &add(global("head.weight", {c.vocab_size, c.dim}, WeightRole::Head));
  const int stages = c.has_dspark() ? c.n_mtp_layers : 0;
  layers_.resize(size_t(c.n_layers + stages));
  auto bind = [&](const BlockTensor& t, Param<T>*& field) {
    if (t.role != WeightRole::Scale) field = &add(t);
  };
  for (int i = 0; i < c.n_layers; ++i) for_each_block_tensor(c, "layers." + std::to_string(i) + ".", i, bind, layers_[size_t(i)]);
  for (int j = 0; j < stages; ++j) {
    const int id = c.n_layers + j;
    for_each_block_tensor(c, "mtp." + std::to_string(j) + ".", id, bind, layers_[size_t(id)]);
    for_each_dspark_tensor(c, j, bind, dspark_);
  }
}

template <class T>
Param<T>& Parameters<T>::add(const BlockTensor& t) {
  Param<T>& p = all_.emplace_back();
  p.name = tensor_name(t);
  p.shape = t.shape;
  p.kind = t.kind;
  p.role = t.role;
  p.group = t.group;
  p.value.assign(size_t(numel_of(t.shape)), T(0));
  p.grad.assign(p.value.size(), T(0));
  if (!by_name_.emplace(p.name, &p).second) fail("parameters", "one tensor per name", "\"" + p.name + "\" twice");
  return p;
}

template <class T>
Param<T>& Parameters<T>::at(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) fail("parameters of " + config_.source, "a tensor \"" + name + "\"", "none");
  return *it->second;
}

template <class T>
const Param<T>& Parameters<T>::at(const std::string& name) const {
  return const_cast<Parameters<T>*>(this)->at(name);
}

template <class T>
void Parameters<T>::zero_grad() {
  for (Param<T>& p : all_) std::fill(p.grad.begin(), p.grad.end(), T(0));
}

template <class T>
int64_t Parameters<T>::count() const {
  int64_t n = 0;
  for (const Param<T>& p : all_) n += p.numel();
  return n;
}

// --- initialisation ------------------------------------------------------------------------------

namespace {

// Element i of a tensor's standard normal sequence: Box–Muller over two uniforms of the counter-based
// generator keyed by (seed, name), so that a tensor's values do not depend on the order of the others.
class NormalStream {
 public:
  NormalStream(uint64_t seed, const std::string& name) : key_(name_key(seed, name)) {}
  double at(int64_t i) const {
    const double u1 = (double(splitmix64(key_ + 2 * uint64_t(i)) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = double(splitmix64(key_ + 2 * uint64_t(i) + 1) >> 11) * 0x1.0p-53;
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  }

 private:
  uint64_t key_;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

template <class T>
void init_parameters(Parameters<T>& params, const InitOptions& o) {
  const int hc = params.config().hc_mult;
  for (Param<T>& p : params.all()) {
    const std::string& n = p.name;
    std::vector<T>& v = p.value;
    if (ends_with(n, "norm.weight") || ends_with(n, "q_weight") || ends_with(n, "k_weight")) {
      std::fill(v.begin(), v.end(), T(1));
    } else if (ends_with(n, "_fn")) {
      std::fill(v.begin(), v.end(), T(0));
    } else if (ends_with(n, "_scale")) {
      std::fill(v.begin(), v.end(), T(o.hc_scale));
    } else if (ends_with(n, "_base")) {
      // pre_j = σ(logit(1/hc)) = 1/hc, post_j = 2σ(0) = 1, comb's logits o.comb_diagonal · I.
      for (int64_t i = 0; i < p.numel(); ++i) {
        if (i < hc) v[size_t(i)] = T(-std::log(double(hc - 1)));
        else if (i < 2 * hc) v[size_t(i)] = T(0);
        else v[size_t(i)] = (i - 2 * hc) / hc == (i - 2 * hc) % hc ? T(o.comb_diagonal) : T(0);
      }
    } else if (ends_with(n, "attn_sink") || ends_with(n, "gate.bias")) {
      std::fill(v.begin(), v.end(), T(0));
    } else {
      const NormalStream normal(o.seed, n);
      for (int64_t i = 0; i < p.numel(); ++i) v[size_t(i)] = T(o.stddev * normal.at(i));
    }
  }
}

// --- loading -------------------------------------------------------------------------------------

namespace {

template <class T>
void load_weight(Param<T>& p, const Weight& w) {
  if (w.rows * w.cols != p.numel())
    fail("checkpoint tensor \"" + p.name + "\"", std::to_string(p.numel()) + " values for the training config",
         std::to_string(w.rows * w.cols));
  std::vector<float> row(size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row(r, row.data());
    std::copy(row.begin(), row.end(), p.value.begin() + r * w.cols);
  }
}

// The Engram table: e4m3 rows times their ue8m0 scale per 32, exactly as the forward gathers them.
template <class T>
void load_engram_table(Param<T>& p, const EngramWeights& g) {
  const int64_t rows = p.shape[0], hd = p.shape[1];
  std::vector<float> row(static_cast<size_t>(hd));
  for (int64_t r = 0; r < rows; ++r) {
    engram_gather(g.table, g.table_scale, hd, &r, 1, row.data());
    std::copy(row.begin(), row.end(), p.value.begin() + r * hd);
  }
}


// The weights map's tensor names, less the scales: what two configs must share for one's checkpoint
// to load into the other's parameters (each tensor's size is checked as it loads).
std::vector<std::string> parameter_names(const Config& c) {
  std::vector<std::string> names;
  for (const TensorSpec& t : expected_tensors(c))
    if (t.role != WeightRole::Scale) names.push_back(t.name);
  return names;
}

}  // namespace

template <class T>
void load_parameters(Parameters<T>& params, const Model& model) {
  const Config& c = params.config();
  const Config& mc = model.config();
  if (parameter_names(c) != parameter_names(mc))
    fail("load_parameters", "a checkpoint with the tensors of the training config (" + c.source + ")",
         "another set of tensors (" + mc.source + ")");
  load_weight(params.embed(), model.embed());
  load_weight(params.norm(), model.norm());
  load_weight(params.head(), model.head());
  auto load = [&](const BlockTensor& t, Param<T>*& mine, const auto& theirs) {
    if constexpr (std::is_same_v<std::decay_t<decltype(theirs)>, Weight>) load_weight(*mine, theirs);
    (void)t;
  };
  for (int i = 0; i < params.blocks(); ++i) {
    const std::string prefix = i < c.n_layers ? "layers." + std::to_string(i) + "." : "mtp." + std::to_string(i - c.n_layers) + ".";
    LayerParams<T>& mine = params.layer(i);
    const LayerWeights& theirs = model.layer(i);
    for_each_block_tensor(c, prefix, i, load, mine, theirs);
    if (mine.engram) load_engram_table(*mine.engram->table, *theirs.engram);
  }
  for (int j = 0; j < (c.has_dspark() ? c.n_mtp_layers : 0); ++j) for_each_dspark_tensor(c, j, load, params.dspark(), model.dspark());
}

template class Parameters<float>;
template class Parameters<double>;
template void init_parameters(Parameters<float>&, const InitOptions&);
template void init_parameters(Parameters<double>&, const InitOptions&);
template void load_parameters(Parameters<float>&, const Model&);
template void load_parameters(Parameters<double>&, const Model&);

}  // namespace dsv41::train
