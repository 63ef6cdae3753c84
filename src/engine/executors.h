#pragma once
// Choosing the executor (forward/executor.h) a command runs on: `--device auto|cpu|cuda`.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "forward/executor.h"

namespace dsv41 {

// Where to run: the CPU, CUDA, or CUDA when this build has it and a GPU is present.
enum class Device { Auto, Cpu, Cuda };
Device parse_device(const std::string& name);  // "auto", "cpu", "cuda"; dsv41::Error otherwise

// Whether this build can run the network on a CUDA device here; if not, `why` says what is missing.
bool cuda_available(std::string* why = nullptr);

// Throws dsv41::Error, naming what is missing, when `device` cannot be had here (Device::Cuda
// without a usable GPU): a command checks before it loads a model.
void check_device(Device device);

// The executor for `device` over `model` (which must outlive it). Device::Cuda without a usable
// GPU is a dsv41::Error naming what is missing; Device::Auto then takes the CPU. `random_weights`
// (a seed): random values made on the device instead of the checkpoint's (CUDA only; benchmarks
// over a layout checkpoint, `dsv41 init-random --layout-only`). `ranks` > 1: the model cut over
// that many ranks (model/partition.h) as model.py's world_size cuts it, on the CPU
// (forward/ranked_executor.h), which Device::Auto then takes; on CUDA, several GPUs are issue 24's.
std::unique_ptr<Executor> make_executor(const Model& model, Device device, std::optional<uint64_t> random_weights = std::nullopt,
                                        int ranks = 1);

}  // namespace dsv41
