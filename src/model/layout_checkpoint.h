#pragma once
// A checkpoint that holds the tensor layout of a Config and no values: config.json (the official
// layout) and one model.safetensors whose tensors (the weights map, weights.h) are all zero, as a
// sparse file — 23 GB of bench-1gpu in a few kilobytes of disk. A model loaded from it has every
// shape and format of the real one; the device benchmark fills its weights with random values on
// the GPU (forward/device/device_model.h).
#include <string>

#include "model/config.h"

namespace dsv41 {

void write_layout_checkpoint(const Config& config, const std::string& dir);

}  // namespace dsv41
