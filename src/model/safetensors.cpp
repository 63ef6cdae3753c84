#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "model/json_document.h"

namespace dsv41 {

// Tensor bytes are used in place, so the file's little-endian element order must be the host's.
static_assert(std::endian::native == std::endian::little, "dsv41 assumes a little-endian host");

namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr size_t kLengthBytes = 8;  // the header length that opens every file

std::string errno_text() { return std::strerror(errno); }

// A JSON value as an error message quotes it, shortened so that a huge array stays readable.
std::string brief(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string known_dtype_names() {
  std::string names;
  for (int i = 0; i <= static_cast<int>(DType::I64); ++i)
    names += std::string(i ? ", " : "") + dtype_name(static_cast<DType>(i));
  return names;
}

// numel * dtype size, or nullopt when numel or the byte count overflows int64 along the way
// (the reference implementation refuses the same shapes). Dimensions must be non-negative.
std::optional<size_t> checked_nbytes(DType dtype, std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t dim : shape)
    if (__builtin_mul_overflow(numel, dim, &numel)) return std::nullopt;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(dtype)), &bytes)) return std::nullopt;
  return static_cast<size_t>(bytes);
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

void write_all(const Fd& fd, std::span<const uint8_t> bytes, const std::string& path) {
  while (!bytes.empty()) {
    // write() may write less than asked (it stops near 2 GiB on Linux) or be interrupted.
    const ssize_t written = ::write(fd.get(), bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) fail(path, "a successful write", errno_text());
    bytes = bytes.subspan(static_cast<size_t>(written));
  }
}

// A rename is durable only once the directory holding it is synced.
void sync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) fail(dir, "a directory we can open", errno_text());
  if (::fsync(fd.get()) != 0) fail(dir, "a successful fsync", errno_text());
}

// The header parsed as JSON (model/json_document.h: bounded depth, each key once, so that a
// tensor name given twice cannot hide one of the two tensors).
json parse_header_json(const std::string& path, const uint8_t* begin, const uint8_t* end) {
  const json header = parse_json(std::string_view(reinterpret_cast<const char*>(begin), size_t(end - begin)), path + ": header");
  if (!header.is_object()) fail(path + ": header", "a JSON object", header.type_name());
  return header;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& value) {
  const std::string where = path + ": header key '" + kMetadataKey + "'";
  if (!value.is_object()) fail(where, "an object of strings", brief(value));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(where + ", key '" + key + "'", "a string", brief(item));
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// A non-negative integer of the header, as int64 (which every offset and dimension must fit).
std::optional<int64_t> header_integer(const json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  const uint64_t number = value.get<uint64_t>();
  if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(number);
}

// One header entry, checked against the data section it points into.
TensorView parse_entry(const std::string& path, const std::string& name, const json& entry,
                       const uint8_t* data_section, size_t data_size) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!entry.is_object()) fail(where, "an object with dtype, shape and data_offsets", brief(entry));

  const auto dtype_field = entry.find("dtype");
  if (dtype_field == entry.end() || !dtype_field->is_string())
    fail(where, "a \"dtype\" string", dtype_field == entry.end() ? "none" : brief(*dtype_field));
  const std::optional<DType> dtype = dtype_from_name(dtype_field->get<std::string>());
  if (!dtype) fail(where, "a dtype among " + known_dtype_names(), brief(*dtype_field));

  const auto shape_field = entry.find("shape");
  if (shape_field == entry.end() || !shape_field->is_array())
    fail(where, "a \"shape\" array", shape_field == entry.end() ? "none" : brief(*shape_field));
  std::vector<int64_t> shape;
  for (const json& dim : *shape_field) {
    const std::optional<int64_t> value = header_integer(dim);
    if (!value) fail(where, "a shape of non-negative integers below 2^63", brief(*shape_field));
    shape.push_back(*value);
  }

  const auto offsets_field = entry.find("data_offsets");
  const bool is_pair = offsets_field != entry.end() && offsets_field->is_array() && offsets_field->size() == 2;
  const std::optional<int64_t> begin = is_pair ? header_integer((*offsets_field)[0]) : std::nullopt;
  const std::optional<int64_t> end = is_pair ? header_integer((*offsets_field)[1]) : std::nullopt;
  if (!begin || !end || *begin > *end)
    fail(where, "\"data_offsets\" [begin, end] with 0 <= begin <= end",
         offsets_field == entry.end() ? "none" : brief(*offsets_field));
  const std::string offsets = "data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) + "]";

  if (static_cast<size_t>(*end) > data_size)
    fail(where, "data within the " + std::to_string(data_size) + "-byte data section",
         offsets + ": the file is truncated, or its offsets are wrong");

  const std::optional<size_t> nbytes = checked_nbytes(*dtype, shape);
  if (!nbytes) fail(where, "a shape whose byte size fits in 64 bits", shape_text(shape));
  const size_t span = static_cast<size_t>(*end - *begin);
  if (*nbytes != span)
    fail(where,
         std::to_string(*nbytes) + " bytes for shape " + shape_text(shape) + " of " + dtype_name(*dtype),
         offsets + ", " + std::to_string(span) + " bytes");

  return TensorView{name, *dtype, std::move(shape), data_section + *begin, *nbytes};
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

void SafetensorsFile::Unmap::operator()(const uint8_t* address) const {
  ::munmap(const_cast<uint8_t*>(address), size);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail(path, "a readable file", errno_text());
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0) fail(path, "a file we can stat", errno_text());
    if (!S_ISREG(info.st_mode))
      fail(path, "a regular file", S_ISDIR(info.st_mode) ? "a directory" : "another kind of file");
    file.file_size_ = static_cast<size_t>(info.st_size);
    if (file.file_size_ < kLengthBytes)
      fail(path, "at least 8 bytes (the header length)", std::to_string(file.file_size_) + " bytes");
    // Read-only and private: nothing we do can reach the file. Other processes must not rewrite a
    // file in place while it is mapped; our writers replace files by rename, which leaves an open
    // mapping on the old contents. The mapping outlives the descriptor.
    void* address = ::mmap(nullptr, file.file_size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (address == MAP_FAILED) fail(path, "a file we can mmap", errno_text());
    file.mapping_ = {static_cast<const uint8_t*>(address), Unmap{file.file_size_}};
  }
  file.parse_header();
  return file;
}

void SafetensorsFile::parse_header() {
  const uint8_t* bytes = mapping_.get();
  const uint64_t header_size = read_le64(bytes);
  if (header_size > file_size_ - kLengthBytes)
    fail(path_, "a header length of at most " + std::to_string(file_size_ - kLengthBytes) + " bytes (file size - 8)",
         std::to_string(header_size) + " bytes: the file is truncated, or is not safetensors");

  const uint8_t* header_begin = bytes + kLengthBytes;
  const uint8_t* data_section = header_begin + header_size;
  const size_t data_size = file_size_ - kLengthBytes - header_size;
  const json header = parse_header_json(path_, header_begin, data_section);

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey)
      metadata_ = parse_metadata(path_, value);
    else
      tensors_.push_back(parse_entry(path_, key, value, data_section, data_size));
  }

  // In offset order the tensors must tile the data section: each begins where the one before
  // ends (the first at 0), and the last ends at the file's end, as the reference's safetensors
  // library requires. An overlap means two tensors share bytes; a gap or trailing bytes mean the
  // offsets do not describe this data section — a header length a byte or two short (its padding
  // cut) reads every tensor shifted, and is caught only here.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorView& a, const TensorView& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  const auto offset = [&](const uint8_t* p) { return std::to_string(p - data_section); };
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorView& previous = tensors_[i - 1];
    const TensorView& current = tensors_[i];
    if (previous.data + previous.nbytes > current.data)
      fail(path_ + ": tensors '" + previous.name + "' and '" + current.name + "'", "disjoint data_offsets",
           "[" + offset(previous.data) + ", " + offset(previous.data + previous.nbytes) + "] and [" +
               offset(current.data) + ", " + offset(current.data + current.nbytes) + "], which overlap");
  }
  const uint8_t* expected = data_section;
  for (const TensorView& t : tensors_) {
    if (t.data != expected)
      fail(path_ + ": tensor '" + t.name + "'", "data_offsets beginning at " + offset(expected) + ", where the tensor before ends",
           "[" + offset(t.data) + ", " + offset(t.data + t.nbytes) + "]: a gap");
    expected = t.data + t.nbytes;
  }
  if (expected != data_section + data_size)
    fail(path_, "a data section of " + offset(expected) + " bytes, where the last tensor ends",
         std::to_string(data_size) + " bytes after a header of " + std::to_string(header_size) +
             ": trailing bytes, or a header length that is wrong");
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::span<const uint8_t> bytes) {
  add(std::move(name), dtype, std::move(shape), std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

size_t SafetensorsWriter::admit(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  const std::string where = "SafetensorsWriter: tensor '" + name + "'";
  if (name == kMetadataKey) fail(where, "a tensor name", "the reserved header key");
  if (names_.contains(name)) fail(where, "a name not added before", "a duplicate");
  for (int64_t dim : shape)
    if (dim < 0) fail(where, "non-negative dimensions", "shape " + shape_text(shape));
  const std::optional<size_t> nbytes = checked_nbytes(dtype, shape);
  if (!nbytes) fail(where, "a shape whose byte size fits in 64 bits", shape_text(shape));
  return *nbytes;
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t>&& bytes) {
  const size_t nbytes = admit(name, dtype, shape);
  const std::string where = "SafetensorsWriter: tensor '" + name + "'";
  if (nbytes != bytes.size())
    fail(where, std::to_string(nbytes) + " bytes for shape " + shape_text(shape) + " of " + dtype_name(dtype),
         std::to_string(bytes.size()) + " bytes");
  if (!entries_.empty() && entries_.back().zeros > 0 && !bytes.empty())
    fail(where, "tensors with bytes added before any tensor of zeros", "one after them");
  names_.insert(name);
  data_bytes_ += bytes.size();
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), std::move(bytes), 0});
}

void SafetensorsWriter::add_zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  const size_t nbytes = admit(name, dtype, shape);
  names_.insert(name);
  data_bytes_ += nbytes;
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), {}, nbytes});
}

void SafetensorsWriter::set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }

void SafetensorsWriter::write(const std::string& path) const {
  // ordered_json keeps insertion order, so the header lists tensors in the order they were added.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header[kMetadataKey] = metadata_;
  size_t offset = 0;
  size_t zeros = 0;
  for (const Entry& entry : entries_) {
    const size_t size = entry.bytes.size() + entry.zeros;
    header[entry.name] = {{"dtype", dtype_name(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", nlohmann::ordered_json::array({offset, offset + size})}};
    offset += size;
    zeros += entry.zeros;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& error) {
    fail(path, "tensor names and metadata in valid UTF-8", error.what());
  }
  // Pad with spaces (valid trailing JSON whitespace) so that the data section starts 8-byte
  // aligned, as the reference implementation does.
  text.append((kLengthBytes - text.size() % kLengthBytes) % kLengthBytes, ' ');

  uint8_t length[kLengthBytes];
  for (size_t i = 0; i < kLengthBytes; ++i) length[i] = static_cast<uint8_t>(text.size() >> (8 * i));

  std::vector<std::span<const uint8_t>> parts = {length, {reinterpret_cast<const uint8_t*>(text.data()), text.size()}};
  for (const Entry& entry : entries_) parts.emplace_back(entry.bytes);
  write_file_atomically(path, parts, zeros);
}

void write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> parts, size_t zeros,
                           unsigned mode, const std::string& temporary_name) {
  const std::string temporary = temporary_name.empty() ? path + ".tmp" : temporary_name;
  Fd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode_t(mode)));
  if (fd.get() < 0) fail(temporary, "a file we can create", errno_text());
  try {
    size_t size = 0;
    for (std::span<const uint8_t> part : parts) write_all(fd, part, temporary), size += part.size();
    if (zeros > 0 && ::ftruncate(fd.get(), off_t(size + zeros)) != 0) fail(temporary, "a successful ftruncate", errno_text());
    // The data must be on disk before the rename publishes it, or a crash could leave `path`
    // naming a file with missing contents.
    if (::fsync(fd.get()) != 0) fail(temporary, "a successful fsync", errno_text());
    if (fd.close() != 0) fail(temporary, "a successful close", errno_text());
    if (::rename(temporary.c_str(), path.c_str()) != 0)
      fail(path, "a successful rename from " + temporary, errno_text());
  } catch (...) {
    ::unlink(temporary.c_str());
    throw;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  sync_directory(dir.empty() ? "." : dir);
}

}  // namespace dsv41
