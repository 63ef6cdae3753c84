#include "train/cuda/model/device_parameters.h"

#include "base/error.h"

namespace dsv41::train_cuda {

namespace {

constexpr int64_t kAlign = 64;  // elements: 256 bytes of fp32, 128 of bf16

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

DeviceParameters::DeviceParameters(train::Parameters<float>& host, cudaStream_t stream) : host_(host), stream_(stream) {
  for (const train::Param<float>& p : host_.all()) {
    slots_.emplace(&p, Slot{elements_, p.shape.size() == 2});
    elements_ += aligned(p.numel());
  }
  values_ = cuda::DeviceBuffer<float>(elements_);
  grads_ = cuda::DeviceBuffer<float>(elements_);
  bf16_ = cuda::DeviceBuffer<bf16>(elements_);
  // The padding stays zero: an arena-wide sum (a gradient norm) sees only the tensors.
  for (const cuda::DeviceBuffer<float>* b : {&values_, &grads_})
    if (b->size() > 0) cuda::check(cudaMemsetAsync(b->get(), 0, size_t(b->bytes()), stream_), "device parameters");
  if (bf16_.size() > 0) cuda::check(cudaMemsetAsync(bf16_.get(), 0, size_t(bf16_.bytes()), stream_), "device parameters");
}

const DeviceParameters::Slot& DeviceParameters::slot(const train::Param<float>& p) const {
  const auto it = slots_.find(&p);
  if (it == slots_.end()) fail("device parameters", "a tensor of the host parameters they mirror", p.name);
  return it->second;
}

void DeviceParameters::upload() {
  for (const train::Param<float>& p : host_.all()) values_.upload(p.value.data(), p.numel(), slot(p).offset, stream_);
  cast_weights();
}

void DeviceParameters::download_into(const cuda::DeviceBuffer<float>& arena, std::vector<float> train::Param<float>::*host) {
  for (train::Param<float>& p : host_.all())
    if (p.numel() > 0)
      cuda::check(cudaMemcpyAsync((p.*host).data(), arena.get() + slot(p).offset, size_t(p.numel()) * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_),
                  "device parameters: download");
  cuda::check(cudaStreamSynchronize(stream_), "device parameters: download");
}

void DeviceParameters::download() { download_into(values_, &train::Param<float>::value); }

void DeviceParameters::download_grads() { download_into(grads_, &train::Param<float>::grad); }

void DeviceParameters::zero_grad() {
  if (grads_.size() > 0) cuda::check(cudaMemsetAsync(grads_.get(), 0, size_t(grads_.bytes()), stream_), "device parameters");
}

void DeviceParameters::cast_weights() {
  if (elements_ > 0) cast_bf16(values_.get(), elements_, bf16_.get(), stream_);
}

const bf16* DeviceParameters::weight_bf16(const train::Param<float>& p) {
  const Slot& s = slot(p);
  if (!s.matrix) fail("device parameters: " + p.name, "a matrix (a bf16 copy)", std::to_string(p.shape.size()) + " dimensions");
  return bf16_.get() + s.offset;
}

std::vector<dsv41::optim::Parameter> DeviceParameters::optimizer_parameters(const std::function<bool(const std::string&)>& keep) {
  std::vector<dsv41::optim::Parameter> out;
  for (train::Param<float>& p : host_.all())
    if (keep(p.name)) out.push_back({p.name, p.shape, value(p), grad(p)});
  return out;
}

}  // namespace dsv41::train_cuda
