#pragma once
// The optimizer's state on disk (docs/training.md, "Optimizer state file"): the number of steps
// taken and, per parameter, its update's buffers (Muon and Sinkhorn: the momentum; AdamW: m, v), so
// that save → load → continue gives the same bits as never stopping. Layout, little-endian:
//
//   0   "DSV41OPT"       8 bytes, the magic
//   8   version          u32, 1
//   12  tensors          u32
//   16  steps            u64, the steps completed (the next update is step `steps`, 0-based)
//   24  per tensor, in the optimizer's parameter order:
//         name length u32, then the name's bytes (the weights map's name, no terminator)
//         update          u32 (param_groups.h Update: 0 Muon, 1 AdamW, 2 Sinkhorn)
//         buffers         u32 (1 or 2)
//         elements        u64, per buffer
//         the buffers, one after the other, elements × f32 each
//   end − 8  checksum     u64, XXH3-64 (seed 0) of every byte before it
//
// The parameters' values are not in it: they are the checkpoint's (in fp32 for a bit-identical
// resume: the released fp8/fp4 formats round them).
#include <cstdint>
#include <string>
#include <vector>

namespace dsv41::optim {

struct StateTensor {
  std::string name;
  uint32_t update = 0;
  std::vector<std::vector<float>> buffers;  // each of the tensor's element count
};

struct OptimizerState {
  uint64_t steps = 0;
  std::vector<StateTensor> tensors;
};

// Writes `path` + ".partial" and renames it to `path`.
void write_optimizer_state(const std::string& path, const OptimizerState& state);
// Reads and checks a state file (magic, version, sizes, checksum): a wrong or damaged file is an
// error naming the file, what was expected and what was found.
OptimizerState read_optimizer_state(const std::string& path);

}  // namespace dsv41::optim
