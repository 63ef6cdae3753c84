// config.json (official flat and Hugging Face layouts): parse_config either returns a config that
// passed validation or refuses with a dsv41::Error.
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv41::fuzz::refused_or_ok([&] { dsv41::parse_config(std::string(dsv41::fuzz::text(data, size)), "fuzz/config.json"); });
  return 0;
}
