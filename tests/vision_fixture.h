#pragma once
// The fixture v41-tiny-vision for the parity tests of the image path (forward_vision_parity_test on
// the CPU executor, tests/cuda/vision_device_test on the CUDA one): its prompts' image spans with
// the reference's recorded aligner rows.
#include <string>
#include <utility>
#include <vector>

#include "forward_fixture.h"

namespace dsv41::test {

inline const std::string kName = "v41-tiny-vision";
inline constexpr int kPrompts = 2, kImages = 2;

inline std::string image_name(int j) { return "image" + std::to_string(j); }

// The fixture with the recorded aligner rows at every image span of its prompts, placed by the
// reference's own token types: IMAGE_START, IMAGE (the rows in order), IMAGE_NEW_LINE, IMAGE_END.
class VisionFixture : public Fixture {
 public:
  explicit VisionFixture(NewSequence new_sequence = cpu_sequences()) : Fixture(kName, std::move(new_sequence)) {
    for (int j = 0; j < kImages; ++j) embeds.push_back(ex.floats(image_name(j) + ".embeds"));
    const Model::ImageDelimiters& delim = model->image_delimiters();
    const int64_t d = config().dim;
    for (int i = 0; i < kPrompts; ++i) {
      const std::vector<int64_t> types = ex.ints(prefix(i) + "token_types"), starts = ex.ints(prefix(i) + "image_start"),
                                 index = ex.ints(prefix(i) + "image_index");
      std::vector<const float*> rows(types.size(), nullptr);
      for (size_t k = 0; k < starts.size(); ++k) {
        int64_t slot = 0;
        for (int64_t p = starts[k]; p < int64_t(types.size()) && types[size_t(p)] >= 0; ++p) {
          const int64_t t = types[size_t(p)];
          rows[size_t(p)] = t == 0 ? delim.start.data() : t == 2 ? delim.newline.data() : t == 3 ? delim.end.data()
                                                                  : embeds[size_t(index[k])].data() + slot++ * d;
          if (t == 3) break;
        }
      }
      spans[i] = std::move(rows);
    }
  }
  std::vector<std::vector<float>> embeds;  // per image: the recorded aligner rows [N_t, dim]
};

}  // namespace dsv41::test
