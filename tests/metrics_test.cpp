// The Prometheus registry (src/server/metrics): the text exposition format 0.0.4 written out by
// hand (HELP/TYPE once per family, label escaping, histogram buckets), the registration rules,
// and counts that stay exact and consistent under concurrent updates.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "server/metrics.h"

namespace dsv41 {
namespace {

TEST(Metrics, CounterAndGauge) {
  MetricsRegistry r;
  Counter& requests = r.counter("dsv41_requests_total", "Requests served.");
  requests.inc();
  requests.inc(2);
  Gauge& queue = r.gauge("dsv41_queue_depth", "Requests waiting.");
  queue.set(5);
  queue.add(-2);
  EXPECT_EQ(requests.value(), 3);
  EXPECT_EQ(queue.value(), 3);
  // Families sorted by name, each with one HELP and one TYPE line before its samples.
  EXPECT_EQ(r.render(),
            "# HELP dsv41_queue_depth Requests waiting.\n"
            "# TYPE dsv41_queue_depth gauge\n"
            "dsv41_queue_depth 3\n"
            "# HELP dsv41_requests_total Requests served.\n"
            "# TYPE dsv41_requests_total counter\n"
            "dsv41_requests_total 3\n");
}

TEST(Metrics, AnUnusedMetricRendersAsZero) {
  MetricsRegistry r;
  r.counter("dsv41_refused_writes_total", "Writes refused.");
  EXPECT_EQ(r.render(),
            "# HELP dsv41_refused_writes_total Writes refused.\n"
            "# TYPE dsv41_refused_writes_total counter\n"
            "dsv41_refused_writes_total 0\n");
  EXPECT_EQ(MetricsRegistry().render(), "");
}

TEST(Metrics, LabelledSeriesShareOneTypeLine) {
  MetricsRegistry r;
  const std::string help = "Prompt tokens found in a cache tier.";
  r.counter("dsv41_cache_hit_tokens_total", help, {{"tier", "host"}}).inc(7);
  r.counter("dsv41_cache_hit_tokens_total", help, {{"tier", "device"}}).inc(100);
  r.counter("dsv41_cache_hit_tokens_total", help, {{"tier", "disk"}});
  EXPECT_EQ(r.render(),
            "# HELP dsv41_cache_hit_tokens_total Prompt tokens found in a cache tier.\n"
            "# TYPE dsv41_cache_hit_tokens_total counter\n"
            "dsv41_cache_hit_tokens_total{tier=\"device\"} 100\n"
            "dsv41_cache_hit_tokens_total{tier=\"disk\"} 0\n"
            "dsv41_cache_hit_tokens_total{tier=\"host\"} 7\n");
}

TEST(Metrics, TheSameSeriesIsReturnedAgain) {
  MetricsRegistry r;
  Counter& a = r.counter("dsv41_x_total", "X.", {{"k", "v"}});
  Counter& b = r.counter("dsv41_x_total", "X.", {{"k", "v"}});
  Counter& c = r.counter("dsv41_x_total", "X.", {{"k", "w"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  Histogram& h1 = r.histogram("dsv41_h", "H.", {1, 2});
  Histogram& h2 = r.histogram("dsv41_h", "H.", {1, 2});
  EXPECT_EQ(&h1, &h2);
}

TEST(Metrics, Escaping) {
  MetricsRegistry r;
  // HELP escapes backslash and newline; a label value also escapes the double quote.
  r.gauge("dsv41_info", "Path \"C:\\x\"\nsecond line.", {{"path", "a\\b\"c\nd"}, {"b", "plain"}}).set(1);
  EXPECT_EQ(r.render(),
            "# HELP dsv41_info Path \"C:\\\\x\"\\nsecond line.\n"
            "# TYPE dsv41_info gauge\n"
            "dsv41_info{path=\"a\\\\b\\\"c\\nd\",b=\"plain\"} 1\n");
}

TEST(Metrics, Values) {
  MetricsRegistry r;
  r.gauge("dsv41_g", "G.", {{"v", "million"}}).set(1e6);
  r.gauge("dsv41_g", "G.", {{"v", "quarter"}}).set(0.25);
  r.gauge("dsv41_g", "G.", {{"v", "negative"}}).set(-3);
  r.gauge("dsv41_g", "G.", {{"v", "nan"}}).set(std::nan(""));
  r.gauge("dsv41_g", "G.", {{"v", "inf"}}).set(std::numeric_limits<double>::infinity());
  r.gauge("dsv41_g", "G.", {{"v", "ninf"}}).set(-std::numeric_limits<double>::infinity());
  r.gauge("dsv41_g", "G.", {{"v", "tiny"}}).set(1.5e-7);
  EXPECT_EQ(r.render(),
            "# HELP dsv41_g G.\n"
            "# TYPE dsv41_g gauge\n"
            "dsv41_g{v=\"inf\"} +Inf\n"
            "dsv41_g{v=\"million\"} 1000000\n"
            "dsv41_g{v=\"nan\"} NaN\n"
            "dsv41_g{v=\"negative\"} -3\n"
            "dsv41_g{v=\"ninf\"} -Inf\n"
            "dsv41_g{v=\"quarter\"} 0.25\n"
            "dsv41_g{v=\"tiny\"} 1.5e-07\n");
}

TEST(Metrics, Histogram) {
  MetricsRegistry r;
  Histogram& h = r.histogram("dsv41_ttft_seconds", "Time to first token.", {0.125, 0.5, 2});
  // Binary fractions, so that the sum is exact. "le" is inclusive: 0.125 counts in the 0.125
  // bucket, 0.5 in the 0.5 bucket. Buckets are cumulative.
  for (double v : {0.0625, 0.125, 0.25, 0.5, 1.0, 7.0}) h.observe(v);
  EXPECT_EQ(r.render(),
            "# HELP dsv41_ttft_seconds Time to first token.\n"
            "# TYPE dsv41_ttft_seconds histogram\n"
            "dsv41_ttft_seconds_bucket{le=\"0.125\"} 2\n"
            "dsv41_ttft_seconds_bucket{le=\"0.5\"} 4\n"
            "dsv41_ttft_seconds_bucket{le=\"2\"} 5\n"
            "dsv41_ttft_seconds_bucket{le=\"+Inf\"} 6\n"
            "dsv41_ttft_seconds_sum 8.9375\n"
            "dsv41_ttft_seconds_count 6\n");
}

TEST(Metrics, LabelledHistogramPutsLeLast) {
  MetricsRegistry r;
  r.histogram("dsv41_step_tokens", "Tokens per step.", {8}, {{"phase", "prefill"}}).observe(9);
  EXPECT_EQ(r.render(),
            "# HELP dsv41_step_tokens Tokens per step.\n"
            "# TYPE dsv41_step_tokens histogram\n"
            "dsv41_step_tokens_bucket{phase=\"prefill\",le=\"8\"} 0\n"
            "dsv41_step_tokens_bucket{phase=\"prefill\",le=\"+Inf\"} 1\n"
            "dsv41_step_tokens_sum{phase=\"prefill\"} 9\n"
            "dsv41_step_tokens_count{phase=\"prefill\"} 1\n");
}

TEST(Metrics, Misuse) {
  MetricsRegistry r;
  r.counter("dsv41_a_total", "A.", {{"tier", "host"}});
  r.histogram("dsv41_h", "H.", {1, 2});
  EXPECT_THROW(r.gauge("dsv41_a_total", "A.", {{"tier", "host"}}), Error);          // another type
  EXPECT_THROW(r.counter("dsv41_a_total", "Other help.", {{"tier", "host"}}), Error);  // another help
  EXPECT_THROW(r.counter("dsv41_a_total", "A."), Error);                               // other label names
  EXPECT_THROW(r.counter("dsv41_a_total", "A.", {{"level", "host"}}), Error);
  EXPECT_THROW(r.histogram("dsv41_h", "H.", {1, 3}), Error);  // other buckets
  EXPECT_THROW(r.counter("1abc", "Bad."), Error);
  EXPECT_THROW(r.counter("dsv41-a", "Bad."), Error);
  EXPECT_THROW(r.counter("", "Bad."), Error);
  EXPECT_THROW(r.counter("dsv41_b", "B.", {{"__name", "x"}}), Error);
  EXPECT_THROW(r.counter("dsv41_b", "B.", {{"a:b", "x"}}), Error);
  EXPECT_THROW(r.counter("dsv41_b", "B.", {{"k", "x"}, {"k", "y"}}), Error);
  EXPECT_THROW(r.histogram("dsv41_c", "C.", {1}, {{"le", "x"}}), Error);
  EXPECT_THROW(r.histogram("dsv41_c", "C.", {1, 1}), Error);
  EXPECT_THROW(r.histogram("dsv41_c", "C.", {2, 1}), Error);
  EXPECT_THROW(r.histogram("dsv41_c", "C.", {1, std::numeric_limits<double>::infinity()}), Error);
  EXPECT_THROW(r.counter("dsv41_a_total", "A.", {{"tier", "host"}}).inc(-1), Error);
  EXPECT_THROW(r.counter("dsv41_a_total", "A.", {{"tier", "host"}}).inc(std::nan("")), Error);
  // A refused registration leaves nothing behind; colons are allowed in metric names.
  r.counter("dsv41:ok", "Ok.");
  const std::string text = r.render();
  EXPECT_EQ(text.find("dsv41_b"), std::string::npos);
  EXPECT_EQ(text.find("dsv41_c"), std::string::npos);
  EXPECT_NE(text.find("# TYPE dsv41:ok counter\n"), std::string::npos);
}

TEST(Metrics, MessagesSayWhatWasExpected) {
  MetricsRegistry r;
  r.counter("dsv41_a_total", "A.", {{"tier", "host"}});
  try {
    r.counter("dsv41_a_total", "A.", {{"level", "x"}});
    FAIL() << "accepted other label names";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "dsv41_a_total label names: expected [tier] (as first registered), found [level]");
  }
}

// Every sample line of the exposition format: name, optional {label="value",...}, a value.
void expect_well_formed(const std::string& text) {
  static const std::regex sample(
      R"re([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*")*\})? (\+Inf|-Inf|NaN|-?[0-9.e+-]+))re");
  static const std::regex comment(R"re(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*)re");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    EXPECT_TRUE(std::regex_match(line, sample) || std::regex_match(line, comment)) << line;
}

TEST(Metrics, ConcurrentUpdatesAreExactAndSnapshotsConsistent) {
  MetricsRegistry r;
  constexpr int kThreads = 4, kEach = 20000;
  std::atomic<bool> done{false};
  // A reader renders while the writers run: in every rendering the histogram's +Inf bucket equals
  // its count (an observation is in both or in neither).
  std::thread reader([&] {
    static const std::regex inf_bucket(R"(dsv41_lat_bucket\{le="\+Inf"\} (\d+))"), count(R"(dsv41_lat_count (\d+))");
    while (!done.load()) {
      const std::string text = r.render();
      std::smatch a, b;
      if (std::regex_search(text, a, inf_bucket) && std::regex_search(text, b, count)) {
        EXPECT_EQ(a[1], b[1]);
      }
      expect_well_formed(text);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t)
    writers.emplace_back([&, t] {
      Counter& c = r.counter("dsv41_tokens_total", "Tokens.", {{"kind", "decode"}});
      Gauge& g = r.gauge("dsv41_running", "Running.");
      Histogram& h = r.histogram("dsv41_lat", "Latency.", {0.5, 1.5});
      for (int i = 0; i < kEach; ++i) {
        c.inc();
        g.add(t % 2 ? 1 : -1);
        h.observe(i % 3);  // 0, 1, 2 in turn
      }
    });
  for (auto& w : writers) w.join();
  done = true;
  reader.join();

  EXPECT_EQ(r.counter("dsv41_tokens_total", "Tokens.", {{"kind", "decode"}}).value(), kThreads * kEach);
  EXPECT_EQ(r.gauge("dsv41_running", "Running.").value(), 0);
  const Histogram::Snapshot s = r.histogram("dsv41_lat", "Latency.", {0.5, 1.5}).snapshot();
  const uint64_t n = uint64_t(kThreads) * kEach;
  // i % 3 over 0..19999: 6667 zeros, 6667 ones, 6666 twos per thread.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{4 * 6667, 4 * 6667 * 2, n}));
  EXPECT_EQ(s.count, n);
  EXPECT_EQ(s.sum, 4.0 * (6667 + 2 * 6666));
}

}  // namespace
}  // namespace dsv41
