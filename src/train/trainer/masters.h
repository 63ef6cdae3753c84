#pragma once
// The fp32 master weights beside a checkpoint (docs/training.md, "dsv41 train"): what a resume
// continues from bit for bit, since the released formats round them. One safetensors file, every
// parameter (train/model/parameters.h) as F32 in its logical shape — a quantized linear [out, in],
// the Engram table [rows, head_dim] — under its checkpoint name, in the parameters' order.
#include <string>

#include "train/model/parameters.h"

namespace dsv41::train {

void write_masters(const Parameters<float>& params, const std::string& path);
// Reads the masters into `params`. The file must hold exactly its tensors, each F32 in its shape;
// otherwise dsv41::Error naming the file, the tensor, what was expected and what was found.
void read_masters(Parameters<float>& params, const std::string& path);

}  // namespace dsv41::train
