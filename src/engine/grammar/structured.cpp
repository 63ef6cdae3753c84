#include "engine/grammar/structured.h"

#include <algorithm>

#include "engine/chat_format.h"

namespace dsv41::grammar {

using ojson = nlohmann::ordered_json;

namespace {

// The tool-call block's markup, as engine/chat_format.cpp renders and parses it.
const std::string kDsml(chat_token::kDsml);
const std::string kCallsOpen = "<" + kDsml + " calls>";
const std::string kCallsClose = "</" + kDsml + " calls>";
const std::string kInvokeOpen = "<" + kDsml + " invoke name=\"";
const std::string kInvokeClose = "</" + kDsml + " invoke>";
const std::string kParamOpen = "<" + kDsml + " parameter name=\"";
const std::string kParamClose = "</" + kDsml + " parameter>";

// One invoke of `function`: its name, then a line per parameter (in the schema's order, the
// required ones always) and the end tag; with no parameter written, an empty line instead. A
// string parameter is written raw (string="true"), any other as compact JSON.
Fragment invoke(Nfa& nfa, const ojson& function, const std::string& where) {
  const std::string name = function.at("name").get<std::string>();
  const Fragment open = nfa.literal(kInvokeOpen + name + "\">\n");
  const ojson params = function.contains("parameters") ? function.at("parameters") : ojson::object();
  const ojson props = params.contains("properties") ? params.at("properties") : ojson::object();
  std::vector<std::string> required;
  if (params.contains("required"))
    for (const ojson& r : params.at("required")) required.push_back(r.get<std::string>());
  SchemaCompiler compiler(nfa, params, /*no_angle=*/true);
  int none = open.end, some = nfa.add_state();
  bool any_written = false;
  for (const auto& [key, schema] : props.items()) {
    const bool raw = schema.is_object() && schema.contains("type") && schema.at("type") == "string" && !schema.contains("enum") &&
                     !schema.contains("const");
    const std::string at = where + "/parameters/properties/" + key;
    const Fragment line = nfa.seq({nfa.literal(kParamOpen + key + "\" string=\"" + (raw ? "true" : "false") + "\">"),
                                   raw ? compiler.raw_string(schema, at) : compiler.value(schema, at), nfa.literal(kParamClose + "\n")});
    const int next_none = nfa.add_state(), next_some = nfa.add_state();
    nfa.epsilon(none, line.start);
    if (any_written) nfa.epsilon(some, line.start);
    nfa.epsilon(line.end, next_some);
    if (std::find(required.begin(), required.end(), key) == required.end()) {
      nfa.epsilon(none, next_none);
      if (any_written) nfa.epsilon(some, next_some);
    }
    none = next_none, some = next_some;
    any_written = true;
  }
  const Fragment empty_line = nfa.literal("\n"), close = nfa.literal(kInvokeClose);
  nfa.epsilon(none, empty_line.start);
  nfa.epsilon(empty_line.end, close.start);
  nfa.epsilon(some, close.start);
  return {open.start, close.end};
}

}  // namespace

Fragment json_schema_automaton(Nfa& nfa, const ojson& schema) { return SchemaCompiler(nfa, schema).value(schema, "#"); }

Fragment json_object_automaton(Nfa& nfa) { return SchemaCompiler(nfa, ojson::object()).any_object(SchemaCompiler::kAnyDepth); }

Fragment tool_calls_automaton(Nfa& nfa, const std::vector<ojson>& functions, bool parallel) {
  auto any_invoke = [&] {
    std::vector<Fragment> options;
    for (size_t i = 0; i < functions.size(); ++i) options.push_back(invoke(nfa, functions[i], "tools/" + std::to_string(i) + "/function"));
    return nfa.alt(options);
  };
  const Fragment calls = parallel ? nfa.seq(any_invoke(), nfa.repeat([&] { return nfa.seq(nfa.literal("\n"), any_invoke()); }, 0, -1))
                                  : any_invoke();
  return nfa.seq({nfa.literal("\n\n" + kCallsOpen + "\n"), calls, nfa.literal("\n" + kCallsClose)});
}

// Text without kDsml: the matching automaton of Knuth, Morris and Pratt, its states the length of
// the marker's start that the text ends with, every state but the full marker accepting.
Fragment no_tool_calls_automaton(Nfa& nfa) {
  const std::string& x = kDsml;
  const int m = int(x.size());
  auto next = [&](int q, uint8_t b) {
    std::string seen = x.substr(0, size_t(q)) + char(b);
    for (int k = std::min(int(seen.size()), m); k > 0; --k)
      if (seen.compare(seen.size() - size_t(k), size_t(k), x, 0, size_t(k)) == 0) return k;
    return 0;
  };
  std::vector<int> q(static_cast<size_t>(m));
  for (int& s : q) s = nfa.add_state();
  const int end = nfa.add_state();
  for (int i = 0; i < m; ++i) {
    nfa.epsilon(q[size_t(i)], end);
    std::vector<ByteSet> to(static_cast<size_t>(m));
    for (int b = 0; b < 256; ++b)
      if (const int k = next(i, uint8_t(b)); k < m) to[size_t(k)].set(size_t(b));
    for (int k = 0; k < m; ++k) {
      if (to[size_t(k)].none()) continue;
      const Fragment edge = nfa.bytes(to[size_t(k)]);
      nfa.epsilon(q[size_t(i)], edge.start);
      nfa.epsilon(edge.end, q[size_t(k)]);
    }
  }
  return {q[0], end};
}

std::vector<int> tool_call_specials(const Vocabulary& v) {
  const std::string markers = kCallsOpen + kCallsClose + kInvokeOpen + kInvokeClose + kParamOpen + kParamClose;
  std::vector<int> out;
  for (int t = 0; t < int(v.size()); ++t)
    if (v.special(t) && !v.bytes(t).empty() && markers.find(v.bytes(t)) != std::string::npos) out.push_back(t);
  return out;
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity)
    : vocabulary_(std::move(vocabulary)), capacity_(capacity) {}

template <class Build>
std::shared_ptr<Grammar> GrammarCache::get(const std::string& key, Build build, std::vector<int> specials, bool closes) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      recent_.splice(recent_.begin(), recent_, it->second);
      return it->second->second;
    }
  }
  // Built outside the lock (a large schema takes a while); two threads may build the same one.
  Nfa nfa;
  const Fragment whole = build(nfa);
  auto grammar = std::make_shared<Grammar>(std::move(nfa), whole, vocabulary_, std::move(specials), closes);
  std::lock_guard lock(mutex_);
  ++compiled_;
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;
  recent_.emplace_front(key, grammar);
  index_[key] = recent_.begin();
  if (recent_.size() > capacity_) {
    index_.erase(recent_.back().first);
    recent_.pop_back();
  }
  return grammar;
}

std::shared_ptr<Grammar> GrammarCache::json_schema(const ojson& schema) {
  return get("schema " + schema.dump(), [&](Nfa& nfa) { return json_schema_automaton(nfa, schema); });
}

std::shared_ptr<Grammar> GrammarCache::json_object() {
  return get("object", [](Nfa& nfa) { return json_object_automaton(nfa); });
}

std::shared_ptr<Grammar> GrammarCache::tool_calls(const std::vector<ojson>& functions, bool parallel) {
  return get(std::string(parallel ? "calls " : "call ") + ojson(functions).dump(),
             [&](Nfa& nfa) { return tool_calls_automaton(nfa, functions, parallel); }, tool_call_specials(*vocabulary_));
}

std::shared_ptr<Grammar> GrammarCache::no_tool_calls() {
  return get("no calls", [](Nfa& nfa) { return no_tool_calls_automaton(nfa); }, {}, /*closes=*/false);
}

size_t GrammarCache::compiled() const {
  std::lock_guard lock(mutex_);
  return compiled_;
}

}  // namespace dsv41::grammar
