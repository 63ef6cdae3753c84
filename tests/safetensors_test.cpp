// Safetensors files and checkpoints: round trips, zero-copy views, and the refusal of malformed
// files with a message that names the problem.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/layout_checkpoint.h"
#include "model/weights.h"
#include "model/dtype.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr DType kAllDTypes[] = {DType::F32,     DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E8M0,
                                DType::I8,      DType::U8,  DType::I32,  DType::I64};

// Each test works in a fresh directory of its own, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  TempDirTest() { fs::create_directories(dir_.path()); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  test::TempDir dir_{"safetensors_test"};
};

class SafetensorsTest : public TempDirTest {};
class CheckpointTest : public TempDirTest {};

// n bytes that differ from tensor to tensor, so a mixed-up tensor shows.
std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return bytes;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A hand-made file: the 8-byte length (the header's own unless `length` says otherwise), the
// header text, then `data_size` bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_size, uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = header.size();
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(length >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_size, 0xAB);
  write_bytes(path, bytes);
}

// The message of the dsv41::Error that `action` throws.
template <class Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a dsv41::Error";
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" missing from: " << message;
}

std::string open_error(const std::string& path) {
  return error_of([&] { SafetensorsFile::open(path); });
}

TEST(SafetensorsDType, NamesRoundTrip) {
  for (DType dtype : kAllDTypes) EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F8_E8M0), 1u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_FALSE(dtype_from_name("F64"));
  EXPECT_FALSE(dtype_from_name("bf16"));
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeAndTheMetadata) {
  SafetensorsWriter writer;
  std::vector<std::vector<uint8_t>> written;
  for (DType dtype : kAllDTypes) {
    written.push_back(pattern(2 * 3 * dtype_size(dtype), static_cast<uint8_t>(written.size())));
    writer.add(std::string("t.") + dtype_name(dtype), dtype, {2, 3}, written.back());
  }
  writer.add("scalar", DType::F32, {}, pattern(4, 99));
  writer.add("empty", DType::BF16, {0, 5}, std::vector<uint8_t>{});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "grüße"}};
  writer.set_metadata(metadata);
  writer.write(path("a.safetensors"));

  const SafetensorsFile file = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(file.path(), path("a.safetensors"));
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.tensors().size(), std::size(kAllDTypes) + 2);
  for (size_t i = 0; i < std::size(kAllDTypes); ++i) {
    const TensorView* view = file.find(std::string("t.") + dtype_name(kAllDTypes[i]));
    ASSERT_NE(view, nullptr);
    EXPECT_EQ(view->dtype, kAllDTypes[i]);
    EXPECT_EQ(view->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(view->numel(), 6);
    EXPECT_EQ(std::vector<uint8_t>(view->data, view->data + view->nbytes), written[i]);
  }
  const TensorView* scalar = file.find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_EQ(std::vector<uint8_t>(scalar->data, scalar->data + 4), pattern(4, 99));
  ASSERT_NE(file.find("empty"), nullptr);
  EXPECT_EQ(file.find("empty")->nbytes, 0u);
  EXPECT_EQ(file.find("nope"), nullptr);

  // Written contiguously in insertion order, so file-offset order is insertion order.
  EXPECT_EQ(file.tensors().front().name, "t.F32");
  EXPECT_EQ(file.tensors().back().name, "empty");
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp")));
}

TEST_F(SafetensorsTest, HeaderIsPaddedWithSpacesToEightBytes) {
  SafetensorsWriter writer;
  writer.add("x", DType::U8, {3}, pattern(3, 1));
  writer.write(path("a.safetensors"));
  const std::vector<uint8_t> bytes = read_bytes(path("a.safetensors"));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
  EXPECT_EQ(length % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + length + 3);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(length));
  EXPECT_EQ(json::parse(header)["x"]["data_offsets"], json::array({0, 3}));
}

TEST_F(SafetensorsTest, ViewsPointIntoTheFileMapping) {
  SafetensorsWriter writer;
  writer.add("a", DType::F32, {5}, pattern(20, 1));
  writer.add("b", DType::I64, {2, 2}, pattern(32, 2));
  writer.write(path("a.safetensors"));

  const std::vector<uint8_t> bytes = read_bytes(path("a.safetensors"));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
  const json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(length));

  const SafetensorsFile file = SafetensorsFile::open(path("a.safetensors"));
  const TensorView& first = file.tensors().front();
  for (const TensorView& view : file.tensors()) {
    const size_t begin = header[view.name]["data_offsets"][0].get<size_t>();
    // The view is the file's bytes at the header's offset...
    EXPECT_EQ(std::memcmp(view.data, bytes.data() + 8 + length + begin, view.nbytes), 0);
    // ...at the same distance from the first tensor as in the file, so one mapping holds them all.
    EXPECT_EQ(static_cast<size_t>(view.data - first.data), begin);
  }

  // And that mapping is of the file itself: /proc/self/maps lists it around the data.
  const auto address = reinterpret_cast<uintptr_t>(first.data);
  std::ifstream maps("/proc/self/maps");
  bool mapped = false;
  for (std::string line; std::getline(maps, line);) {
    uintptr_t low = 0, high = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &low, &high) == 2 && low <= address && address < high)
      mapped = line.find(fs::canonical(path("a.safetensors")).string()) != std::string::npos;
  }
  EXPECT_TRUE(mapped);
}

TEST_F(SafetensorsTest, FileMovesKeepTheirViews) {
  SafetensorsWriter writer;
  writer.add("a", DType::U8, {4}, pattern(4, 3));
  writer.write(path("a.safetensors"));
  SafetensorsFile file = SafetensorsFile::open(path("a.safetensors"));
  const TensorView* view = file.find("a");
  const SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.find("a"), view);
  EXPECT_EQ(std::vector<uint8_t>(view->data, view->data + 4), pattern(4, 3));
}

TEST_F(SafetensorsTest, WriteReplacesAnExistingFile) {
  SafetensorsWriter first;
  first.add("old", DType::U8, {1}, pattern(1, 1));
  first.write(path("a.safetensors"));
  SafetensorsWriter second;
  second.add("new", DType::U8, {2}, pattern(2, 2));
  second.write(path("a.safetensors"));
  const SafetensorsFile file = SafetensorsFile::open(path("a.safetensors"));
  EXPECT_EQ(file.find("old"), nullptr);
  EXPECT_NE(file.find("new"), nullptr);
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp")));
}

TEST_F(SafetensorsTest, WriterRefusesBadTensors) {
  SafetensorsWriter writer;
  writer.add("w", DType::F32, {2}, pattern(8, 1));
  expect_contains(error_of([&] { writer.add("w", DType::F32, {2}, pattern(8, 1)); }), {"'w'", "duplicate"});
  expect_contains(error_of([&] { writer.add("v", DType::BF16, {3}, pattern(4, 1)); }),
                  {"'v'", "expected 6 bytes for shape [3] of BF16", "found 4 bytes"});
  expect_contains(error_of([&] { writer.add("n", DType::U8, {-1}, std::vector<uint8_t>{}); }),
                  {"'n'", "non-negative", "[-1]"});
  expect_contains(error_of([&] { writer.add("__metadata__", DType::U8, {0}, std::vector<uint8_t>{}); }),
                  {"__metadata__", "reserved"});
  expect_contains(error_of([&] { writer.add("big", DType::F32, {int64_t{1} << 62, 4}, std::vector<uint8_t>{}); }),
                  {"'big'", "fits in 64 bits"});
}

TEST_F(SafetensorsTest, RefusesAMissingFile) {
  expect_contains(open_error(path("nope.safetensors")), {path("nope.safetensors"), "readable file"});
}

TEST_F(SafetensorsTest, RefusesAFileShorterThanEightBytes) {
  write_bytes(path("a.safetensors"), {1, 2, 3, 4, 5});
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "at least 8 bytes", "found 5 bytes"});
}

TEST_F(SafetensorsTest, RefusesATruncatedFile) {
  SafetensorsWriter writer;
  writer.add("a", DType::F32, {4}, pattern(16, 1));
  writer.add("b", DType::F32, {8}, pattern(32, 2));
  writer.write(path("a.safetensors"));
  std::vector<uint8_t> bytes = read_bytes(path("a.safetensors"));
  bytes.resize(bytes.size() - 4);
  write_bytes(path("a.safetensors"), bytes);
  expect_contains(open_error(path("a.safetensors")),
                  {path("a.safetensors"), "tensor 'b'", "44-byte data section", "[16, 48]", "truncated"});
}

TEST_F(SafetensorsTest, RefusesAHeaderLengthBeyondTheFile) {
  write_raw(path("a.safetensors"), "{}", 0, 1000);
  expect_contains(open_error(path("a.safetensors")),
                  {path("a.safetensors"), "header length of at most 2 bytes", "found 1000", "truncated"});
}

TEST_F(SafetensorsTest, RefusesAHeaderThatIsNotJson) {
  write_raw(path("a.safetensors"), "{not json", 0);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "header", "valid JSON"});
}

TEST_F(SafetensorsTest, RefusesAHeaderThatIsNotUtf8) {
  write_raw(path("a.safetensors"), "{\"\xff\": 1}", 0);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "valid JSON", "UTF-8"});
}

// A 200 KB header of brackets is refused by its depth, not walked until the stack ends (it was a
// segfault); a key given twice at any depth is refused, not silently replaced by the second.
TEST_F(SafetensorsTest, RefusesDeepOrRepeatedHeaderJson) {
  write_raw(path("a.safetensors"), "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}", 0);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "header", "nested at most 64 levels deep"});
  write_raw(path("b.safetensors"), R"({"__metadata__": {"format": "pt", "format": "np"}})", 0);
  expect_contains(open_error(path("b.safetensors")), {"each key once", "key \"format\" twice"});
}

TEST_F(SafetensorsTest, RefusesAHeaderThatIsNotAnObject) {
  write_raw(path("a.safetensors"), "[1, 2]", 0);
  expect_contains(open_error(path("a.safetensors")), {"a JSON object", "found array"});
}

TEST_F(SafetensorsTest, RefusesAnUnknownDType) {
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}})", 1);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "tensor 'w'", "dtype", "\"F4\""});
}

TEST_F(SafetensorsTest, RefusesAMissingOrMalformedField) {
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 1);
  expect_contains(open_error(path("a.safetensors")), {"tensor 'w'", "\"shape\" array", "found none"});
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}})", 1);
  expect_contains(open_error(path("a.safetensors")), {"tensor 'w'", "non-negative integers", "[-1]"});
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 0]}})", 1);
  expect_contains(open_error(path("a.safetensors")), {"tensor 'w'", "begin <= end", "[1,0]"});
}

TEST_F(SafetensorsTest, RefusesAShapeThatDoesNotMatchTheBytes) {
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_contains(open_error(path("a.safetensors")),
                  {path("a.safetensors"), "tensor 'w'", "expected 12 bytes for shape [3] of F32", "8 bytes"});
}

TEST_F(SafetensorsTest, RefusesAShapeWhoseSizeOverflows) {
  write_raw(path("a.safetensors"),
            R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})", 0);
  expect_contains(open_error(path("a.safetensors")), {"tensor 'w'", "fits in 64 bits"});
}

TEST_F(SafetensorsTest, RefusesOverlappingTensors) {
  write_raw(path("a.safetensors"),
            R"({"a": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},)"
            R"( "b": {"dtype": "U8", "shape": [16], "data_offsets": [8, 24]}})",
            24);
  expect_contains(open_error(path("a.safetensors")),
                  {path("a.safetensors"), "tensors 'a' and 'b'", "[0, 16] and [8, 24]", "overlap"});
}

// The tensors tile the data section, as the reference's safetensors library requires: a gap
// between two, or bytes after the last, is refused.
TEST_F(SafetensorsTest, RefusesAGapOrTrailingBytes) {
  write_raw(path("a.safetensors"),
            R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
            R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [16, 24]}})",
            24);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "tensor 'b'", "beginning at 8", "[16, 24]", "a gap"});
  write_raw(path("b.safetensors"), R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 10);
  expect_contains(open_error(path("b.safetensors")), {path("b.safetensors"), "a data section of 8 bytes", "10 bytes", "trailing"});
}

// A header length one or two bytes short of the header (its padding spaces cut: still valid
// JSON) used to be accepted, and every tensor was read one or two bytes early.
TEST_F(SafetensorsTest, RefusesAHeaderLengthShortOfItsPadding) {
  SafetensorsWriter writer;
  writer.add("w", DType::U8, {5}, pattern(5, 1));
  writer.write(path("a.safetensors"));
  std::vector<uint8_t> bytes = read_bytes(path("a.safetensors"));
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(bytes[size_t(i)]) << (8 * i);
  ASSERT_EQ(bytes[8 + length - 1], ' ') << "the writer pads its header with spaces";
  for (uint64_t cut : {1, 2}) {
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<uint8_t>((length - cut) >> (8 * i));
    write_bytes(path("short.safetensors"), bytes);
    expect_contains(open_error(path("short.safetensors")), {"a data section of 5 bytes", std::to_string(5 + cut) + " bytes"});
  }
}

TEST_F(SafetensorsTest, RefusesOffsetsBeyondTheDataSection) {
  write_raw(path("a.safetensors"), R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", 16);
  expect_contains(open_error(path("a.safetensors")),
                  {path("a.safetensors"), "tensor 'w'", "16-byte data section", "[16, 32]"});
}

TEST_F(SafetensorsTest, RefusesMetadataThatIsNotStrings) {
  write_raw(path("a.safetensors"), R"({"__metadata__": {"format": "pt", "version": 2}})", 0);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "__metadata__", "version", "a string"});
}

TEST_F(SafetensorsTest, RefusesATensorNamedTwice) {
  write_raw(path("a.safetensors"),
            R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
            R"( "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
            2);
  expect_contains(open_error(path("a.safetensors")), {path("a.safetensors"), "key \"w\" twice"});
}

// "t<i>", built by appending: GCC 12 warns falsely (-Wrestrict) about "t" + std::to_string(i).
std::string numbered(const char* prefix, int i) {
  std::string name = prefix;
  name += std::to_string(i);
  return name;
}

// Writes tensors "t0".."t{count-1}" of 64 bytes each through a ShardedWriter.
void write_sharded(const std::string& dir, int count, size_t max_shard_bytes) {
  ShardedWriter writer(dir, max_shard_bytes);
  for (int i = 0; i < count; ++i)
    writer.add(numbered("t", i), DType::F32, {4, 4}, pattern(64, static_cast<uint8_t>(i)));
  writer.finish();
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const std::string& path, const json& value) { std::ofstream(path) << value.dump(2); }

TEST_F(CheckpointTest, OpensASingleFile) {
  SafetensorsWriter writer;
  writer.add("b", DType::U8, {2}, pattern(2, 1));
  writer.add("a", DType::U8, {3}, pattern(3, 2));
  writer.write(path("model.safetensors"));

  const Checkpoint checkpoint = Checkpoint::open(dir_.string());
  EXPECT_EQ(checkpoint.size(), 2u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(checkpoint.get("a").nbytes, 3u);
  EXPECT_EQ(checkpoint.find("c"), nullptr);
  EXPECT_EQ(error_of([&] { checkpoint.get("c"); }),
            "tensor c: expected in checkpoint " + dir_.string() + ", found missing");
}

TEST_F(CheckpointTest, WritesThreeShardsAndOpensThemThroughTheIndex) {
  write_sharded(dir_.string(), 6, 128);
  for (int i = 1; i <= 3; ++i) EXPECT_TRUE(fs::exists(path(numbered("model-0000", i) + "-of-00003.safetensors")));
  EXPECT_FALSE(fs::exists(path("model.safetensors")));
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_.path()))
    EXPECT_EQ(entry.path().extension() == ".partial" || entry.path().extension() == ".tmp", false) << entry.path();

  const json index = read_json(path("model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 6 * 64);
  EXPECT_EQ(index["weight_map"].size(), 6u);
  EXPECT_EQ(index["weight_map"]["t0"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["t5"], "model-00003-of-00003.safetensors");

  const Checkpoint checkpoint = Checkpoint::open(dir_.string());
  ASSERT_EQ(checkpoint.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const TensorView& view = checkpoint.get(numbered("t", i));
    EXPECT_EQ(view.shape, (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(std::vector<uint8_t>(view.data, view.data + view.nbytes), pattern(64, static_cast<uint8_t>(i)));
  }
}

TEST_F(CheckpointTest, ATensorLargerThanTheShardLimitGetsAShardOfItsOwn) {
  ShardedWriter writer(dir_.string(), 100);
  writer.add("small", DType::U8, {10}, pattern(10, 1));
  writer.add("large", DType::U8, {300}, pattern(300, 2));
  writer.add("tail", DType::U8, {10}, pattern(10, 3));
  writer.finish();
  const json index = read_json(path("model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["small"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["large"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["tail"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(Checkpoint::open(dir_.string()).size(), 3u);
}

TEST_F(CheckpointTest, OneShardIsWrittenAsAPlainFileWithoutIndex) {
  write_sharded(dir_.string(), 3, 1 << 20);
  EXPECT_TRUE(fs::exists(path("model.safetensors")));
  EXPECT_FALSE(fs::exists(path("model.safetensors.index.json")));
  EXPECT_EQ(Checkpoint::open(dir_.string()).size(), 3u);
}

TEST_F(CheckpointTest, ShardedWriterRefusesMisuse) {
  ShardedWriter writer(dir_.string(), 128);
  writer.add("a", DType::U8, {1}, pattern(1, 1));
  expect_contains(error_of([&] { writer.add("a", DType::U8, {1}, pattern(1, 1)); }), {"'a'", "duplicate"});
  writer.finish();
  expect_contains(error_of([&] { writer.add("b", DType::U8, {1}, pattern(1, 1)); }), {"'b'", "after finish"});
  // The directory now holds a checkpoint, which a second writer must not mix with its own.
  expect_contains(error_of([&] { ShardedWriter(dir_.string(), 128); }),
                  {dir_.string(), "without a checkpoint", "model.safetensors"});
}

// The index as the other JSON files: a tensor mapped twice (the second used to win) and deep
// nesting are refused, naming the index.
TEST_F(CheckpointTest, RefusesAnIndexWithARepeatedOrDeepEntry) {
  write_sharded(dir_.string(), 6, 128);
  const std::string file = path("model.safetensors.index.json");
  std::string text = read_json(file).dump();
  const std::string twice = text.substr(0, text.find("\"weight_map\":{") + 14) + "\"t0\":\"model-00002-of-00003.safetensors\"," +
                            text.substr(text.find("\"weight_map\":{") + 14);
  std::ofstream(file, std::ios::trunc) << twice;
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }), {file, "each key once", "key \"t0\" twice"});
  std::ofstream(file, std::ios::trunc) << "{\"weight_map\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }), {file, "nested at most 64 levels deep"});
}

TEST_F(CheckpointTest, RefusesAnIndexNamingATensorMissingFromItsShard) {
  write_sharded(dir_.string(), 6, 128);
  json index = read_json(path("model.safetensors.index.json"));
  index["weight_map"]["ghost"] = "model-00002-of-00003.safetensors";
  write_json(path("model.safetensors.index.json"), index);
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }),
                  {"tensor 'ghost'", path("model-00002-of-00003.safetensors"), "missing"});
}

// A shard named by the index is a file of the checkpoint's directory: an absolute path or one up
// through ".." (a real shard elsewhere, here the same checkpoint's own seen from outside) used to
// be opened, loading weights from outside the checkpoint and its identity.
TEST_F(CheckpointTest, RefusesAnIndexShardOutsideTheDirectory) {
  write_sharded(dir_.string(), 6, 128);
  const json original = read_json(path("model.safetensors.index.json"));
  const std::string shard = "model-00002-of-00003.safetensors";
  for (const std::string& name : {path(shard), "../" + dir_.path().filename().string() + "/" + shard, std::string(".."),
                                  std::string("")}) {
    json index = original;
    index["weight_map"]["t3"] = name;
    write_json(path("model.safetensors.index.json"), index);
    expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }),
                    {"weight_map entry 't3'", "a file name in the checkpoint's directory", json(name).dump()});
  }
}

TEST_F(CheckpointTest, RefusesAShardTensorTheIndexDoesNotList) {
  write_sharded(dir_.string(), 6, 128);
  json index = read_json(path("model.safetensors.index.json"));
  index["weight_map"].erase("t3");
  write_json(path("model.safetensors.index.json"), index);
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }),
                  {"tensor 't3'", path("model-00002-of-00003.safetensors"), "unlisted"});
}

TEST_F(CheckpointTest, MergesShardsWithoutAnIndex) {
  write_sharded(dir_.string(), 6, 128);
  fs::remove(path("model.safetensors.index.json"));
  EXPECT_EQ(Checkpoint::open(dir_.string()).size(), 6u);
}

TEST_F(CheckpointTest, RefusesAnIncompleteShardSetWithoutAnIndex) {
  write_sharded(dir_.string(), 6, 128);
  fs::remove(path("model.safetensors.index.json"));
  fs::remove(path("model-00002-of-00003.safetensors"));
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }),
                  {dir_.string(), "all 3 shards", "found 2 of them"});
}

TEST_F(CheckpointTest, RefusesATensorInTwoShards) {
  for (const char* name : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    SafetensorsWriter writer;
    writer.add("twice", DType::U8, {1}, pattern(1, 1));
    writer.write(path(name));
  }
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }),
                  {"tensor 'twice'", "one shard only", path("model-00001-of-00002.safetensors"),
                   path("model-00002-of-00002.safetensors")});
}

TEST_F(CheckpointTest, RefusesADirectoryWithoutSafetensors) {
  write_bytes(path("config.json"), {'{', '}'});
  expect_contains(error_of([&] { Checkpoint::open(dir_.string()); }), {dir_.string(), "no safetensors file"});
  expect_contains(error_of([&] { Checkpoint::open(path("absent")); }), {path("absent"), "checkpoint directory"});
}

// Zero tensors are holes: the file has their size but no disk blocks, and they read as zeros.
TEST(SafetensorsWriter, ZeroTensorsAreHolesThatReadAsZeros) {
  test::TempDir dir("st_zeros");
  std::filesystem::create_directories(dir.path());
  SafetensorsWriter writer;
  const std::vector<uint8_t> small = {1, 2, 3, 4};
  writer.add("small", DType::U8, {4}, small);
  writer.add_zeros("big", DType::F32, {1024, 1024});
  EXPECT_THROW(writer.add("late", DType::U8, {1}, std::vector<uint8_t>{7}), Error);
  writer.write((dir / "z.safetensors").string());
  struct stat st {};
  ASSERT_EQ(::stat((dir / "z.safetensors").c_str(), &st), 0);
  EXPECT_GE(st.st_size, 4 * 1024 * 1024 + 4);
  EXPECT_LT(int64_t(st.st_blocks) * 512, 1024 * 1024);  // 4 MiB of zeros take no blocks
  SafetensorsFile file = SafetensorsFile::open((dir / "z.safetensors").string());
  EXPECT_EQ(std::vector<uint8_t>(file.find("small")->data, file.find("small")->data + 4), small);
  const TensorView& big = *file.find("big");
  ASSERT_EQ(big.nbytes, size_t(4 * 1024 * 1024));
  EXPECT_TRUE(std::all_of(big.data, big.data + big.nbytes, [](uint8_t b) { return b == 0; }));
}

// A layout checkpoint has every tensor of the weights map, so a Checkpoint opens and checks it.
TEST(LayoutCheckpoint, HoldsTheWeightsMapInZeros) {
  test::TempDir dir("layout");
  const Config config = preset("tiny");
  write_layout_checkpoint(config, dir.string());
  Checkpoint ckpt = Checkpoint::open(dir.string());
  EXPECT_NO_THROW(check_weights(load_config(dir.string()), ckpt));
  int64_t bytes = 0;
  for (const TensorSpec& t : expected_tensors(config)) bytes += t.nbytes();
  struct stat st {};
  ASSERT_EQ(::stat((dir / "model.safetensors").c_str(), &st), 0);
  EXPECT_GT(st.st_size, bytes);
  EXPECT_LT(int64_t(st.st_blocks) * 512, bytes / 4);
}

}  // namespace
}  // namespace dsv41
