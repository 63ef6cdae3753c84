// server/request_body.h: the document read_body builds is the one nlohmann's own parser builds,
// except the top-level array of ids it reads apart, and only while every element is an id.
#include "server/request_body.h"

#include <gtest/gtest.h>

#include <string>

#include "server/openai_api.h"

namespace dsv41 {
namespace {

using ojson = nlohmann::ordered_json;

const std::vector<std::string> kBodies = {
    R"({"model": "m", "prompt": "text", "max_tokens": 16})",
    R"({"a": [1, -2, 3.5, "x", null, true, false, {"b": [[]], "c": {}}], "d": {"e": {"f": [1, [2, [3]]]}}})",
    R"({"k": 1, "k": 2, "j": "\"[{\\"})",
    R"({"messages": [{"role": "user", "content": "[{]} \u00e9"}], "tools": [{"type": "function"}]})",
    R"([1, 2, 3])",
    R"("a string")",
    R"(18446744073709551615)",
};

TEST(RequestBody, WithoutAnIdsKeyIsNlohmannsDocument) {
  for (const std::string& text : kBodies) {
    const RequestBody body = read_body(text, 128);
    EXPECT_EQ(body.json, ojson::parse(text)) << text;
    EXPECT_EQ(body.json.dump(), ojson::parse(text).dump()) << text;  // the keys' order too
    EXPECT_FALSE(body.ids.has_value()) << text;
  }
}

TEST(RequestBody, ReadsTheTopLevelIdsApart) {
  const RequestBody body = read_body(R"({"model": "m", "prompt": [5, 0, 129279, 7], "n": [1]})", 128, "prompt");
  ASSERT_TRUE(body.ids.has_value());
  EXPECT_EQ(*body.ids, (std::vector<uint64_t>{5, 0, 129279, 7}));
  EXPECT_EQ(body.json, ojson::parse(R"({"model": "m", "prompt": [], "n": [1]})"));
  const RequestBody empty = read_body(R"({"prompt": []})", 128, "prompt");
  ASSERT_TRUE(empty.ids.has_value());
  EXPECT_TRUE(empty.ids->empty());
}

TEST(RequestBody, AnArrayOfOtherElementsStaysInTheDocument) {
  // Each element that is not an integer >= 0, first or after some ids: the whole array as parsed.
  for (const char* text : {
           R"({"prompt": [1, 2, -3, 4]})",
           R"({"prompt": [-1]})",
           R"({"prompt": [1, 2.5]})",
           R"({"prompt": [1, "two"]})",
           R"({"prompt": [[1, 2], [3]]})",
           R"({"prompt": [7, [8, 9], 10]})",
           R"({"prompt": [1, {"a": 2}]})",
           R"({"prompt": [1, null, true]})",
           R"({"prompt": "text"})",
           R"({"prompt": 5})",
           R"({"x": {"prompt": [1, 2]}})",  // not at the top level
       }) {
    const RequestBody body = read_body(text, 128, "prompt");
    EXPECT_FALSE(body.ids.has_value()) << text;
    EXPECT_EQ(body.json, ojson::parse(text)) << text;
  }
}

TEST(RequestBody, ARepeatedKeyIsTheLastOne) {
  const RequestBody ids_first = read_body(R"({"prompt": [1, 2], "prompt": "text"})", 128, "prompt");
  EXPECT_FALSE(ids_first.ids.has_value());
  EXPECT_EQ(ids_first.json, ojson::parse(R"({"prompt": "text"})"));
  const RequestBody ids_last = read_body(R"({"prompt": "text", "prompt": [3]})", 128, "prompt");
  ASSERT_TRUE(ids_last.ids.has_value());
  EXPECT_EQ(*ids_last.ids, std::vector<uint64_t>{3});
}

TEST(RequestBody, RefusesInvalidOrTooDeepJson) {
  for (const std::string& text : {std::string(R"({"prompt": [1, 2)"), std::string(R"({"a": 1e400})"),
                                  std::string("{\"a\": \"\xff\"}"), std::string("")}) {
    try {
      read_body(text, 128, "prompt");
      ADD_FAILURE() << "accepted " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("found invalid JSON ("), std::string::npos) << e.what();
    }
  }
  // The depth counts arrays and objects, not brackets inside strings.
  EXPECT_NO_THROW(read_body("{\"a\": \"" + std::string(500, '[') + "\"}", 4));
  EXPECT_NO_THROW(read_body(R"({"a": [[[1]]]})", 4));
  try {
    read_body(R"({"a": [[[[1]]]]})", 4);
    ADD_FAILURE() << "accepted 5 levels under a limit of 4";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("nested at most 4 levels"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41
