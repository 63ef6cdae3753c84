#include "engine/executors.h"

#include "base/error.h"
#include "forward/ranked_executor.h"
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

std::unique_ptr<Executor> make_executor(const Model& model, Device device, std::optional<uint64_t> random_weights, int ranks) {
  check_device(device);
  if (ranks < 1) fail("--ranks", "at least 1", std::to_string(ranks));
  // A cut model runs on the CPU's ranks (several GPUs are issue 24's): auto takes them there.
  if (device == Device::Cpu || (device == Device::Auto && (!cuda_available() || ranks > 1))) {
    if (random_weights) fail("--random-weights", "the CUDA executor (the CPU one computes with the checkpoint's values)", "the CPU");
    if (ranks > 1) return std::make_unique<RankedCpuExecutor>(model, ranks);
    return std::make_unique<CpuExecutor>(model);
  }
  if (ranks > 1) fail("--ranks", "1 on the CUDA executor (a model over several GPUs is issue 24's)", std::to_string(ranks));
#ifdef DSV41_HAVE_CUDA
  return cuda::make_executor(model, random_weights);
#else
  return std::make_unique<CpuExecutor>(model);  // not reached: check_device refused Device::Cuda
#endif
}

}  // namespace dsv41
