#pragma once
// The grammars of structured output (docs/openai-api.md, "Structured output"), compiled once and
// kept by their text: a JSON Schema's values, any JSON object, DeepSeek-V4.1's tool-call block
// (engine/chat_format.h) with each call's arguments under its function's `parameters`, and a
// reply with no tool-call block.
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"

namespace dsv41::grammar {

// The automata alone, without a vocabulary: what a request's parser runs to refuse a schema
// outside the subset (SchemaError) before anything is generated.
Fragment json_schema_automaton(Nfa& nfa, const nlohmann::ordered_json& schema);
Fragment json_object_automaton(Nfa& nfa);
// `functions`: each tool's "function" object ({"name", "parameters"}); `parallel`: one call or more.
Fragment tool_calls_automaton(Nfa& nfa, const std::vector<nlohmann::ordered_json>& functions, bool parallel);
// Any text without a tool-call block.
Fragment no_tool_calls_automaton(Nfa& nfa);

// The special tokens a tool-call block may be written with: those whose text is part of its markers.
std::vector<int> tool_call_specials(const Vocabulary& vocabulary);

// Compiled grammars over one vocabulary, the most recently used `capacity` kept, by their text.
// Safe to call from several threads.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 64);
  std::shared_ptr<Grammar> json_schema(const nlohmann::ordered_json& schema);
  std::shared_ptr<Grammar> json_object();
  std::shared_ptr<Grammar> tool_calls(const std::vector<nlohmann::ordered_json>& functions, bool parallel);
  std::shared_ptr<Grammar> no_tool_calls();
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  size_t compiled() const;  // grammars built so far (hits do not count)

 private:
  template <class Build>
  std::shared_ptr<Grammar> get(const std::string& key, Build build, std::vector<int> specials = {}, bool closes = true);

  std::shared_ptr<const Vocabulary> vocabulary_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<Grammar>>> recent_;  // most recent first
  std::unordered_map<std::string, decltype(recent_)::iterator> index_;
  size_t compiled_ = 0;
};

}  // namespace dsv41::grammar
