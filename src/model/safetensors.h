#pragma once
// The safetensors format (docs/checkpoint.md): an 8-byte little-endian header length N, N bytes
// of JSON header, then the data section that the header's offsets point into.
//
// SafetensorsFile maps a file read-only and hands out views into the mapping, so opening a
// checkpoint of hundreds of GB costs no copies and no more memory than the pages actually read.
// SafetensorsWriter collects tensors and writes one file atomically.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/dtype.h"

namespace dsv41 {

// One tensor of an open file. `data` points into the file's mapping: nothing is copied, and the
// view is valid as long as the SafetensorsFile (or Checkpoint) it came from.
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;  // empty for a scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;  // product of shape; 1 for a scalar
};

class SafetensorsFile {
 public:
  // Maps the file read-only (MAP_PRIVATE) and validates its header; throws dsv41::Error naming
  // the file, the tensor or header key, what was expected and what was found.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorView>& tensors() const { return tensors_; }  // in file-offset order
  const TensorView* find(std::string_view name) const;                 // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Unmap {
    size_t size;  // bytes mapped
    void operator()(const uint8_t* address) const;
  };

  SafetensorsFile() = default;
  void parse_header();

  std::string path_;
  std::unique_ptr<const uint8_t, Unmap> mapping_;  // the whole file; munmap'd on destruction
  size_t file_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Adds a tensor, copying its bytes. Throws if the name is "__metadata__" or already added, a
  // dimension is negative, or bytes.size() != numel * dtype_size(dtype).
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::span<const uint8_t> bytes);
  // The same, taking ownership of the bytes instead of copying them.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t>&& bytes);

  // A tensor of zeros that is never held in memory: written as a hole (a sparse file, no disk
  // blocks). Zero tensors come after every tensor with bytes.
  void add_zeros(std::string name, DType dtype, std::vector<int64_t> shape);

  // The string -> string "__metadata__" of the header; omitted from the file when empty.
  void set_metadata(std::map<std::string, std::string> metadata);

  // Writes the header (tensors in insertion order, data offsets contiguous, padded with spaces to
  // a multiple of 8 bytes) and the data, atomically: see write_file_atomically.
  void write(const std::string& path) const;

  size_t tensor_count() const { return entries_.size(); }
  size_t data_bytes() const { return data_bytes_; }  // sum of the tensors' byte sizes

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    size_t zeros;  // add_zeros: the tensor's size; its bytes are empty
  };

  // Checks a new tensor's name and shape; returns its byte size.
  size_t admit(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;

  std::vector<Entry> entries_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

// Writes `parts`, one after another, to `temporary` (default path + ".tmp"), fsyncs it, renames it
// over `path` and fsyncs the directory: a reader sees the old file or the complete new one, never
// half of one, even after a crash. `zeros` more bytes of zeros follow the parts, as a hole; `mode`
// is the new file's permissions (before the umask). Writers that may race on one path (engines
// sharing a KV store) each name their own temporary.
void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> parts, size_t zeros = 0,
                           unsigned mode = 0644, const std::string& temporary = {});

// The same for one text (a checkpoint's config.json, its tokenizer's files).
inline void write_text_atomically(const std::string& path, std::string_view text) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  write_file_atomically(path, std::span(&bytes, 1));
}

}  // namespace dsv41
