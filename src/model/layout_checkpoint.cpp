#include "model/layout_checkpoint.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace dsv41 {

void write_layout_checkpoint(const Config& config, const std::string& dir) {
  std::filesystem::create_directories(dir);
  SafetensorsWriter writer;
  for (const TensorSpec& t : expected_tensors(config)) writer.add_zeros(t.name, t.dtype, t.shape);
  writer.write(dir + "/model.safetensors");
  std::ofstream out(dir + "/config.json");
  out << to_official_json(config);
  if (!out.flush()) fail(dir + "/config.json", "a written file", "a write error");
}

}  // namespace dsv41
