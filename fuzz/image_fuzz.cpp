// Image bytes as a request brings them: decode_image either decodes them (PNG, JPEG) or refuses them
// with ImageError; a decoded image then goes through the tiny fixture's preprocessing (plan, fit,
// patches), which must accept any size the decoder lets through. A 1 M-pixel limit keeps each run
// quick; the limit's own check is the same at any value.
#include "fuzz_util.h"
#include "model/image/decode.h"
#include "model/image/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv41::fuzz::refused_or_ok([&] {
    const dsv41::RgbImage image = dsv41::decode_image(data, size, {1 << 20});
    if (image.pixels.size() != size_t(image.width) * size_t(image.height) * 3) __builtin_trap();
    const dsv41::VisionConfig tiny{2, 64, 4, 96, 14, 10000.0, 3, 64, 3136, std::nullopt};
    const dsv41::ImagePlan plan = dsv41::plan_image(image.width, image.height, tiny);
    const dsv41::RgbImage fitted = dsv41::fit_image(image, plan, tiny);
    if (dsv41::image_patches(fitted, plan, tiny.patch_size).size() != size_t(plan.patches()) * 3 * 14 * 14)
      __builtin_trap();
  });
  return 0;
}
