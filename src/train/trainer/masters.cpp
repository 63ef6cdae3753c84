#include "train/trainer/masters.h"

#include <cstring>

#include "base/error.h"
#include "model/safetensors.h"

namespace dsv41::train {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "F32[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void write_masters(const Parameters<float>& params, const std::string& path) {
  SafetensorsWriter w;
  for (const Param<float>& p : params.all()) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(p.value.data());
    w.add(p.name, DType::F32, p.shape, std::span<const uint8_t>(bytes, p.value.size() * sizeof(float)));
  }
  w.set_metadata({{"format", "dsv41 fp32 master weights"}});
  w.write(path);
}

void read_masters(Parameters<float>& params, const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  if (file.tensors().size() != params.all().size())
    fail(path, std::to_string(params.all().size()) + " master tensors (the model's parameters)",
         std::to_string(file.tensors().size()));
  for (Param<float>& p : params.all()) {
    const TensorView* t = file.find(p.name);
    if (!t) fail(path, "master tensor '" + p.name + "'", "none");
    if (t->dtype != DType::F32 || t->shape != p.shape)
      fail(path + ", tensor '" + p.name + "'", shape_text(p.shape), std::string(dtype_name(t->dtype)) + shape_text(t->shape).substr(3));
    std::memcpy(p.value.data(), t->data, p.value.size() * sizeof(float));
  }
}

}  // namespace dsv41::train
