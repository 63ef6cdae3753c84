// tokenizer.json, and encoding with it: the input's first line is the text to encode, the rest
// the tokenizer's JSON. Either the tokenizer is refused, or encoding and decoding the text work.
#include "fuzz_util.h"
#include "model/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = dsv41::fuzz::text(data, size);
  const size_t newline = in.find('\n');
  const std::string_view sample = newline == std::string_view::npos ? std::string_view() : in.substr(0, newline);
  const std::string json(newline == std::string_view::npos ? in : in.substr(newline + 1));
  dsv41::fuzz::refused_or_ok([&] {
    const dsv41::Tokenizer t = dsv41::Tokenizer::from_json(json, "fuzz/tokenizer.json");
    const std::vector<int> ids = t.encode(sample);
    (void)t.decode(ids);
  });
  return 0;
}
