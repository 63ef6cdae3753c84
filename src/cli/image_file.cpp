#include "cli/image_file.h"

#include <fstream>
#include <iterator>
#include <vector>

#include "base/error.h"
#include "model/image/decode.h"

namespace dsv41::cli {

std::shared_ptr<const ImageInput> load_image_file(const std::string& path, const Config& config) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable image file", "none that opens");
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    return prepare_image(decode_image(bytes.data(), bytes.size()), config);
  } catch (const ImageError& e) {
    throw ImageError(path + ": " + e.what());
  }
}

}  // namespace dsv41::cli
