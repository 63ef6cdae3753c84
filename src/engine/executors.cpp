#include "engine/executors.h"

#include "base/error.h"
#ifdef DSV41_HAVE_CUDA
#include "forward/device/cuda_executor.h"
#endif

namespace dsv41 {

Device parse_device(const std::string& name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail("--device", "auto, cpu or cuda", name);
}

bool cuda_available(std::string* why) {
#ifdef DSV41_HAVE_CUDA
  return cuda::device_available(why);
#else
  if (why) *why = "a build without the CUDA backend (nvcc was not found when it was configured)";
  return false;
#endif
}

void check_device(Device device) {
  std::string why;
  if (device == Device::Cuda && !cuda_available(&why)) fail("--device cuda", "a CUDA device", why);
}

std::unique_ptr<Executor> make_executor(const Model& model, Device device, std::optional<uint64_t> random_weights) {
  check_device(device);
  if (device == Device::Cpu || (device == Device::Auto && !cuda_available())) {
    if (random_weights) fail("--random-weights", "the CUDA executor (the CPU one computes with the checkpoint's values)", "the CPU");
    return std::make_unique<CpuExecutor>(model);
  }
#ifdef DSV41_HAVE_CUDA
  return cuda::make_executor(model, random_weights);
#else
  return std::make_unique<CpuExecutor>(model);  // not reached: check_device refused Device::Cuda
#endif
}

}  // namespace dsv41
