#pragma once
// The vision tower on the device: forward/vision_network.h (written once) over the CUDA op set
// (backend/cuda/vision.h, rms_norm, the tensor-core GEMMs of linear_f32), with the tables of
// forward/vision_layout.h made on the host. The contract is forward/vision_cpu.h's encode_images.
#include <cuda_runtime_api.h>

#include <vector>

#include "forward/device/device_model.h"
#include "forward/vision_cpu.h"

namespace dsv41::cuda {

// Each image's aligner rows [ceil(n_vit_h/r) · ceil(n_vit_w/r), dim] (bf16 values), in order; all
// images through one pass of the tower (their GEMMs over every image's rows together). `model`
// must have a vision tower; each image at least one patch. Synchronizes `stream`.
std::vector<std::vector<float>> encode_images(const DeviceModel& model, const std::vector<VisionImage>& images,
                                              cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
