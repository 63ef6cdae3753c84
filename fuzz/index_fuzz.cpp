// model.safetensors.index.json in a checkpoint directory: Checkpoint::open reads the index, then
// the shards it names (none exist here, so a well-formed index is refused for its missing shards).
#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dsv41_index_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  std::ofstream(dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  dsv41::fuzz::refused_or_ok([&] { dsv41::Checkpoint::open(dir.string()); });
  return 0;
}
