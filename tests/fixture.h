#pragma once
// Reading the golden fixtures of DeepSeek's reference (tests/data/fixtures/<name>/): the tensors of
// expected.safetensors as flat vectors, and logit statistics as baseline.json reports them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "numerics/types.h"

namespace dsv41::test {

inline std::string fixture_dir(const std::string& name) { return (std::filesystem::path(DSV41_TEST_DATA) / "fixtures" / name).string(); }

// The fixtures every parity test runs on, and their names as gtest parameter names.
inline const std::vector<std::string> kFixtures = {"v41-tiny", "v41-tiny-bf16", "v41-tiny-noengram"};
struct FixtureName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string s = info.param;
    for (char& ch : s)
      if (ch == '-') ch = '_';
    return s;
  }
};

class Expected {
 public:
  explicit Expected(const std::string& fixture)
      : file_(SafetensorsFile::open(fixture_dir(fixture) + "/expected.safetensors")) {}

  bool has(const std::string& name) const { return file_.find(name) != nullptr; }
  const TensorView& view(const std::string& name) const {
    const TensorView* t = file_.find(name);
    if (!t) throw std::runtime_error("expected.safetensors has no tensor " + name);
    return *t;
  }
  // Any numeric tensor as floats (BF16, F32) or integers (I32, I64, U8) as int64.
  std::vector<float> floats(const std::string& name) const {
    const TensorView& t = view(name);
    std::vector<float> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == DType::F32) {
        std::memcpy(&out[i], t.data + 4 * i, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = bf16_to_float(b);
      }
    }
    return out;
  }
  std::vector<int64_t> ints(const std::string& name) const {
    const TensorView& t = view(name);
    std::vector<int64_t> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == DType::I64) {
        std::memcpy(&out[i], t.data + 8 * i, 8);
      } else if (t.dtype == DType::I32) {
        int32_t v;
        std::memcpy(&v, t.data + 4 * i, 4);
        out[i] = v;
      } else {
        out[i] = t.data[i];
      }
    }
    return out;
  }

 private:
  SafetensorsFile file_;
};

// |ours - reference| over rows of `width` logits: the statistics baseline.json records.
struct LogitStats {
  double max = 0, mean = 0, p99 = 0, argmax_agree = 0;
  int rows = 0;
};

inline LogitStats compare_logits(const std::vector<float>& ours, const std::vector<float>& ref, int64_t width) {
  LogitStats s;
  std::vector<double> diffs;
  s.rows = int(ref.size() / size_t(width));
  int agree = 0;
  for (int r = 0; r < s.rows; ++r) {
    const float* a = ours.data() + r * width;
    const float* b = ref.data() + r * width;
    for (int64_t i = 0; i < width; ++i) diffs.push_back(std::fabs(double(a[i]) - double(b[i])));
    agree += std::max_element(a, a + width) - a == std::max_element(b, b + width) - b;
  }
  std::sort(diffs.begin(), diffs.end());
  for (double d : diffs) s.mean += d;
  s.mean /= double(diffs.size());
  s.max = diffs.back();
  s.p99 = diffs[size_t(0.99 * double(diffs.size() - 1))];
  s.argmax_agree = double(agree) / s.rows;
  return s;
}

}  // namespace dsv41::test
