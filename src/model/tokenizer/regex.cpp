#include "model/tokenizer/regex.h"

#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

// PCRE2 needs a match-data block (and for JIT, a stack) per thread; encode() is const and may
// run on several threads at once, so each thread keeps its own, made on first use.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string where;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern, const std::string& where) : compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->where = where;
  // PCRE2_MULTILINE: in Oniguruma's syntax, which HF's regexes are written for, ^ and $ match
  // at every line start and end, not only at the ends of the text.
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  if (!compiled_->code)
    fail(where, "a regex PCRE2 accepts", "'" + std::string(pattern) + "' (" + pcre2_message(error) +
                                            " at offset " + std::to_string(offset) + ")");
  // JIT is an optimisation: where the platform lacks it, the interpreter gives the same matches.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<Match>& out) const {
  ThreadMatchState& state = thread_state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last_end = size_t(-1);
  while (pos <= text.size()) {
    // The text is valid UTF-8 (checked once by the caller), so PCRE2 need not check it again.
    int rc = pcre2_match(compiled_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) fail(compiled_->where, "a regex match", pcre2_message(rc));
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    size_t begin = ovector[0], end = ovector[1];
    if (begin == end) {
      // An empty match: skipped when it touches the previous match; either way the search
      // moves on by one character so that it terminates.
      if (begin != last_end) out.push_back({begin, end});
      if (begin >= text.size()) return;
      pos = begin + size_t(unicode::sequence_length(static_cast<unsigned char>(text[begin])));
    } else {
      out.push_back({begin, end});
      pos = end;
    }
    last_end = end;
  }
}

Pattern Pattern::from_json(const nlohmann::json& spec, const std::string& where) {
  Pattern p;
  if (spec.is_object() && spec.size() == 1 && spec.contains("String") && spec["String"].is_string()) {
    p.literal_ = spec["String"].get<std::string>();
  } else if (spec.is_object() && spec.size() == 1 && spec.contains("Regex") && spec["Regex"].is_string()) {
    p.regex_ = std::make_shared<const Regex>(spec["Regex"].get<std::string>(), where);
  } else {
    fail(where, "pattern {\"String\": ...} or {\"Regex\": ...}", spec.dump());
  }
  return p;
}

void Pattern::find_all(std::string_view text, std::vector<Match>& out) const {
  if (regex_) return regex_->find_all(text, out);
  // An empty literal matches nothing (HF splits nothing on it either).
  if (literal_.empty()) return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos; pos = text.find(literal_, pos)) {
    out.push_back({pos, pos + literal_.size()});
    pos += literal_.size();
  }
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  std::vector<Match> matches;
  find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const Match& m : matches) {
    out.append(text.substr(prev, m.begin - prev));
    out.append(content);
    prev = m.end;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace dsv41
