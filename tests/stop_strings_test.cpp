// OpenAI "stop" strings over streamed text: the reply ends just before the first stop string,
// wherever the pieces cut it, and text that could start one is held back until it is decided.
#include <gtest/gtest.h>

#include "server/stop_strings.h"

using namespace dsv41;

namespace {

// The reply `text` gives when pushed in pieces of `n` bytes, then flushed.
std::string streamed(const std::vector<std::string>& stops, const std::string& text, size_t n, bool* stopped = nullptr) {
  StopStrings s(stops);
  std::string out;
  for (size_t i = 0; i < text.size(); i += n) out += s.push(std::string_view(text).substr(i, n));
  out += s.flush();
  if (stopped) *stopped = s.stopped();
  return out;
}

}  // namespace

TEST(StopStrings, EndsBeforeTheFirstStopStringWhereverThePiecesCut) {
  for (size_t n = 1; n <= 12; ++n) {
    bool stopped = false;
    EXPECT_EQ(streamed({"END", "\n\n"}, "one two\nthree END four\n\nfive", n, &stopped), "one two\nthree ") << n;
    EXPECT_TRUE(stopped);
    EXPECT_EQ(streamed({"\n\n", "END"}, "a\n\nb END", n), "a") << n;  // the earliest, whichever string it is
    EXPECT_EQ(streamed({"END"}, "no stop here, EN", n, &stopped), "no stop here, EN") << n;  // held, then flushed
    EXPECT_FALSE(stopped);
  }
}

TEST(StopStrings, HoldsBackOnlyWhatCouldStartAStopString) {
  StopStrings s({"STOP"});
  EXPECT_EQ(s.push("abc ST"), "abc ");
  EXPECT_EQ(s.push("AR"), "STAR");  // not a stop after all: released
  EXPECT_EQ(s.push("xSTO"), "x");
  EXPECT_EQ(s.push("P and more"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("ignored"), "");
  EXPECT_EQ(s.flush(), "");
  StopStrings none({});
  EXPECT_EQ(none.push("anything"), "anything");
}
