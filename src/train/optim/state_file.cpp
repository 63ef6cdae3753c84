#include "train/optim/state_file.h"

#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "base/error.h"

namespace dsv41::optim {

static_assert(std::endian::native == std::endian::little, "the state file's floats are written as the host stores them");

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', '1', 'O', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 24, kChecksumBytes = 8;

class HashedWriter {
 public:
  explicit HashedWriter(const std::string& path) : path_(path), hash_(XXH3_createState(), &XXH3_freeState) {
    XXH3_64bits_reset(hash_.get());
    out_.open(path, std::ios::binary | std::ios::trunc);
    if (!out_) fail(path, "a file we can write", "an error opening it");
  }
  void bytes(const void* p, size_t n) {
    XXH3_64bits_update(hash_.get(), p, n);
    out_.write(static_cast<const char*>(p), std::streamsize(n));
  }
  template <class T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
  void finish() {
    const uint64_t sum = XXH3_64bits_digest(hash_.get());
    out_.write(reinterpret_cast<const char*>(&sum), sizeof sum);
    out_.close();
    if (!out_) fail(path_, "a complete write", "a write error");
  }

 private:
  std::string path_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_;
  std::ofstream out_;
};

// Reads the checked bytes front to back; running past the end is a truncated file.
class Reader {
 public:
  Reader(const std::string& path, const std::vector<uint8_t>& bytes, size_t end) : path_(path), bytes_(bytes), end_(end) {}
  void bytes(void* p, size_t n, const char* what) {
    if (end_ - at_ < n)
      fail(path_, std::string("the ") + what + " at byte " + std::to_string(at_), "the end of the data");
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
  }
  template <class T>
  T value(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  size_t left() const { return end_ - at_; }

 private:
  const std::string& path_;
  const std::vector<uint8_t>& bytes_;
  size_t end_, at_ = 0;
};

}  // namespace

void write_optimizer_state(const std::string& path, const OptimizerState& state) {
  const std::string partial = path + ".partial";
  {
    HashedWriter w(partial);
    w.bytes(kMagic, sizeof kMagic);
    w.value(kVersion);
    w.value(uint32_t(state.tensors.size()));
    w.value(uint64_t(state.steps));
    for (const StateTensor& t : state.tensors) {
      const uint64_t elements = t.buffers.empty() ? 0 : t.buffers.front().size();
      w.value(uint32_t(t.name.size()));
      w.bytes(t.name.data(), t.name.size());
      w.value(t.update);
      w.value(uint32_t(t.buffers.size()));
      w.value(elements);
      for (const std::vector<float>& b : t.buffers) {
        if (b.size() != elements)
          fail(path, "buffers of one size for tensor '" + t.name + "' (" + std::to_string(elements) + ")",
               std::to_string(b.size()));
        w.bytes(b.data(), b.size() * sizeof(float));
      }
    }
    w.finish();
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) fail(path, "the state file renamed into place", "an error");
}

OptimizerState read_optimizer_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "an optimizer state file", "no file we can read");
  const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (bytes.size() < kHeaderBytes + kChecksumBytes)
    fail(path, "at least " + std::to_string(kHeaderBytes + kChecksumBytes) + " bytes", std::to_string(bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    fail(path, "the magic DSV41OPT", "'" + std::string(reinterpret_cast<const char*>(bytes.data()), 8) + "'");
  const size_t end = bytes.size() - kChecksumBytes;
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + end, sizeof stored);
  const uint64_t computed = XXH3_64bits(bytes.data(), end);
  if (stored != computed)
    fail(path, "checksum " + std::to_string(computed) + " of its contents", std::to_string(stored) + " (damaged or truncated)");

  Reader r(path, bytes, end);
  char magic[8];
  r.bytes(magic, sizeof magic, "magic");
  const auto version = r.value<uint32_t>("version");
  if (version != kVersion) fail(path, "version " + std::to_string(kVersion), std::to_string(version));
  const auto tensors = r.value<uint32_t>("tensor count");
  OptimizerState state;
  state.steps = r.value<uint64_t>("step count");
  state.tensors.resize(tensors);
  for (StateTensor& t : state.tensors) {
    const auto name_size = r.value<uint32_t>("name length");
    t.name.resize(name_size);
    r.bytes(t.name.data(), name_size, "name");
    t.update = r.value<uint32_t>("update");
    const auto buffers = r.value<uint32_t>("buffer count");
    const auto elements = r.value<uint64_t>("element count");
    if (buffers > 2) fail(path, "1 or 2 buffers for tensor '" + t.name + "'", std::to_string(buffers));
    if (elements > r.left() / sizeof(float))
      fail(path, "tensor '" + t.name + "' of at most " + std::to_string(r.left() / sizeof(float)) + " elements (what is left)",
           std::to_string(elements));
    t.buffers.assign(buffers, std::vector<float>(elements));
    for (std::vector<float>& b : t.buffers) r.bytes(b.data(), elements * sizeof(float), "buffer");
  }
  if (r.left() != 0) fail(path, "the checksum right after the last tensor", std::to_string(r.left()) + " more bytes");
  return state;
}

}  // namespace dsv41::optim
