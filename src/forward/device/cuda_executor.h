#pragma once
// The CUDA executor (forward/executor.h): the model's weights in device memory (DeviceModel), each
// sequence's KV in device memory (DeviceSequence, grown as the sequence does), a batch's rows
// through cuda::forward_batch together. Plain C++: the engine includes it without CUDA headers.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "forward/executor.h"

namespace dsv41::cuda {

// Whether a CUDA device is usable here; if not, `why` says what is missing.
bool device_available(std::string* why);

// Places `model`'s weights on the current device (`model` must outlive the executor): its
// checkpoint's values, or with `random_seed` random ones made on the device (benchmarks over a
// layout checkpoint, whose file holds no values: DeviceModel::Values::Random).
std::unique_ptr<Executor> make_executor(const Model& model, std::optional<uint64_t> random_seed = std::nullopt);

}  // namespace dsv41::cuda
