#include "kernel_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <vector>

#ifdef DSV41_HAVE_CUPTI
#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#endif

namespace dsv41::bench {

#ifdef DSV41_HAVE_CUPTI
namespace {

struct Record {
  std::string name;
  uint64_t start, end;
};

std::mutex records_mutex;
std::vector<Record> records;  // filled by CUPTI's buffer callback, on its own thread

void check_cupti(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  throw std::runtime_error(std::string("kernel trace: ") + what + ": " + (text ? text : "unknown CUPTI error"));
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Record> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      got.push_back({k->name ? k->name : "?", k->start, k->end});
    }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), got.begin(), got.end());
}

// "void dsv41::cuda::(anonymous namespace)::grouped_kernel<(dsv41::WeightFormat)3, 1, 32, true>(…)"
// → "grouped_kernel<(WeightFormat)3, 1, 32, true>": the kernel and its template arguments.
std::string short_name(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  if (!s.empty() && s.back() == ')') {  // drop the parameter list
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (const std::string prefix : {"(anonymous namespace)::", "dsv41::cuda::", "dsv41::"})
    for (size_t at; (at = s.find(prefix)) != std::string::npos;) s.erase(at, prefix.size());
  return s;
}

}  // namespace

bool KernelTrace::available() { return true; }

void KernelTrace::start() {
  static const bool registered = [] {
    check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register buffers");
    return true;
  }();
  (void)registered;
  check_cupti(cuptiActivityFlushAll(1), "flush");
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
  }
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
}

void KernelTrace::stop() {
  check_cupti(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel records");
  check_cupti(cuptiActivityFlushAll(1), "flush");
}

std::string KernelTrace::table(int steps) const {
  std::vector<Record> rs;
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    rs = records;
  }
  if (rs.empty() || steps < 1) return "(no kernels recorded)\n";
  std::sort(rs.begin(), rs.end(), [](const Record& a, const Record& b) { return a.start < b.start; });
  struct Row {
    int64_t launches = 0;
    double ns = 0, idle_before_ns = 0, extends_ns = 0;
  };
  std::map<std::string, Row> rows;
  std::map<std::string, std::string> shorts;
  uint64_t latest_end = rs.front().start;
  double busy = 0, sum = 0;
  for (const Record& r : rs) {
    auto [it, fresh] = shorts.try_emplace(r.name);
    if (fresh) it->second = short_name(r.name);
    Row& row = rows[it->second];
    ++row.launches;
    row.ns += double(r.end - r.start);
    sum += double(r.end - r.start);
    if (r.start > latest_end) row.idle_before_ns += double(r.start - latest_end);
    if (r.end > latest_end) {
      const double extends = double(r.end - std::max(r.start, latest_end));
      row.extends_ns += extends, busy += extends, latest_end = r.end;
    }
  }
  const double span = double(latest_end - rs.front().start);
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.extends_ns > b.second.extends_ns; });
  std::string out =
      "| kernel | launches | µs | µs a launch | µs past the kernels before it | GPU idle before, µs |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  char line[512];
  for (const auto& [name, row] : sorted) {
    std::snprintf(line, sizeof line, "| `%s` | %.1f | %.1f | %.2f | %.1f | %.1f |\n", name.substr(0, 90).c_str(),
                  double(row.launches) / steps, row.ns / 1e3 / steps, row.ns / 1e3 / double(row.launches),
                  row.extends_ns / 1e3 / steps, row.idle_before_ns / 1e3 / steps);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "\nA step: span %.1f µs (first start to last end, over %d steps), GPU busy %.1f µs (%.1f%%), "
                "kernels' sum %.1f µs, %zu launches.\n",
                span / 1e3 / steps, steps, busy / 1e3 / steps, 100.0 * busy / span, sum / 1e3 / steps,
                rs.size() / size_t(steps));
  return out + line;
}

#else

bool KernelTrace::available() { return false; }
void KernelTrace::start() {
  throw std::runtime_error("kernel trace: this build has no CUPTI (CUDA::cupti was not found at configure time)");
}
void KernelTrace::stop() {}
std::string KernelTrace::table(int) const { return {}; }

#endif

}  // namespace dsv41::bench
