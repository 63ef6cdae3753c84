#include "train/data/chat_documents.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "base/error.h"
#include "engine/chat_format.h"
#include "train/data/text_lines.h"

namespace dsv41::train {

namespace {

// FNV-1a: a phrasing chosen by the word alone, the same on every platform and build.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == ';')) s.remove_suffix(1);
  return s;
}

std::string capitalized(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 'a' + 'A');
  return s;
}

bool ends_sentence(std::string_view s) { return !s.empty() && (s.back() == '.' || s.back() == '!' || s.back() == '?'); }

std::string sentence(std::string s) { return ends_sentence(s) ? s : s + "."; }

// "a" or "an" by the first letter (a spelling rule, not a pronunciation one: "an hour" is missed).
std::string article(std::string_view word) {
  const char c = char(std::tolower(static_cast<unsigned char>(word.empty() ? 'x' : word[0])));
  return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u' ? "an" : "a";
}

bool proper(std::string_view word) { return !word.empty() && word[0] >= 'A' && word[0] <= 'Z'; }

// "x", "x and y", "x, y and z".
std::string listed(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i > 0) s += i + 1 == words.size() ? " and " : ", ";
    s += words[i];
  }
  return s;
}

// The first paragraph of a text, its lines joined by spaces.
std::string first_paragraph(std::string_view text) {
  text = trim(text);
  std::string out;
  for (std::string_view line : split_lines(text)) {
    line = trim(line);
    if (line.empty()) break;
    if (!out.empty()) out += ' ';
    out += line;
  }
  return out;
}

}  // namespace

std::optional<ChatTurn> wordnet_turn(std::string_view line) {
  const size_t close = line.find("): ");
  if (close == std::string_view::npos) return std::nullopt;
  const size_t open = line.rfind(" (", close);
  if (open == std::string_view::npos || open == 0) return std::nullopt;
  const std::string_view pos = line.substr(open + 2, close - open - 2), rest = line.substr(close + 3);
  std::vector<std::string> lemmas;
  for (std::string_view names = line.substr(0, open); !names.empty();) {
    const size_t comma = names.find(", ");
    lemmas.emplace_back(trim(names.substr(0, comma)));
    names = comma == std::string_view::npos ? std::string_view() : names.substr(comma + 2);
  }
  // The gloss, then its quoted examples: gloss; "example"; "example".
  const size_t quote = rest.find("; \"");
  const std::string gloss(trim(rest.substr(0, quote)));
  std::string example;
  if (quote != std::string_view::npos) {
    const std::string_view ex = rest.substr(quote + 3);
    example = std::string(ex.substr(0, ex.find('"')));
  }
  if (lemmas.empty() || lemmas[0].empty() || gloss.empty()) return std::nullopt;
  const std::string& word = lemmas[0];
  const uint64_t pick = fnv1a(word);

  ChatTurn t;
  if (pos == "noun") {
    const std::string named = proper(word) ? word : article(word) + " " + word;
    const std::string questions[] = {"What is " + named + "?", "What does \"" + word + "\" mean?", "Can you define " + word + "?"};
    t.question = questions[pick % 3];
    t.answer = sentence(capitalized(named) + " is " + gloss);
  } else if (pos == "verb") {
    const std::string questions[] = {"What does it mean to " + word + "?", "What does \"" + word + "\" mean?"};
    t.question = questions[pick % 2];
    t.answer = sentence("To " + word + " is to " + gloss);
  } else {
    const std::string questions[] = {"What does \"" + word + "\" mean?", "What is the meaning of \"" + word + "\"?"};
    t.question = questions[pick % 2];
    t.answer = sentence("\"" + word + "\" means " + gloss);
  }
  std::vector<std::string> others;
  for (size_t i = 1; i < lemmas.size() && others.size() < 3; ++i)
    if (lemmas[i] != word) others.push_back(lemmas[i]);
  if (others.size() == 1) t.answer += " Another word for it is " + others[0] + ".";
  if (others.size() > 1) t.answer += " Other words for it are " + listed(others) + ".";
  if (!example.empty()) t.answer += " For example: \"" + example + "\"";
  return t;
}

std::optional<ChatTurn> devil_turn(std::string_view text) {
  const std::string para = first_paragraph(text);
  // "WORD, n. Definition": the headword in capitals, its part of speech, then the definition.
  const size_t comma = para.find(", ");
  if (comma == std::string::npos || comma == 0) return std::nullopt;
  const size_t dot = para.find(". ", comma + 2);
  if (dot == std::string::npos || dot - comma > 12) return std::nullopt;
  std::string word = para.substr(0, comma);
  for (char& c : word) {
    if (c >= 'a' && c <= 'z') return std::nullopt;  // not a headword
    c = char(std::tolower(static_cast<unsigned char>(c)));
  }
  const std::string part = para.substr(comma + 2, dot - comma - 2);
  const std::string definition(trim(std::string_view(para).substr(dot + 2)));
  if (definition.empty()) return std::nullopt;
  return ChatTurn{part == "n" ? "What is " + word + "?" : "What does \"" + word + "\" mean?", capitalized(sentence(definition))};
}

std::optional<ChatTurn> jargon_turn(std::string_view key, std::string_view text) {
  if (key.empty() || !text.starts_with(key) || !text.substr(key.size()).starts_with(":")) return std::nullopt;
  const size_t eol = text.find('\n');
  if (eol == std::string_view::npos) return std::nullopt;
  std::string definition = first_paragraph(text.substr(eol + 1));
  // The etymology in brackets ("[from scary devil monastery] A general …") is left out.
  if (definition.starts_with("[")) {
    const size_t end = definition.find("] ");
    definition = end == std::string::npos ? "" : definition.substr(end + 2);
  }
  if (definition.empty() || definition.starts_with("See ")) return std::nullopt;
  const std::string term(key);
  const std::string questions[] = {"What does \"" + term + "\" mean in hacker slang?", "In the Jargon File, what is \"" + term + "\"?"};
  return ChatTurn{questions[fnv1a(term) % 2], capitalized(sentence(definition))};
}

std::string chat_text(const std::vector<ChatTurn>& turns) {
  if (turns.empty()) fail("chat document", "at least one turn", "none");
  std::vector<ChatMessage> messages(2 * turns.size());
  for (size_t i = 0; i < turns.size(); ++i) {
    messages[2 * i].content = turns[i].question;
    messages[2 * i + 1].role = ChatRole::assistant;
    messages[2 * i + 1].content = turns[i].answer;
  }
  ChatOptions options;
  options.thinking = false;
  std::string text = render_chat(messages, options);
  // render_chat opens with BOS and closes the last answer with EOS; the packer adds both.
  if (!text.starts_with(chat_token::kBos) || !text.ends_with(chat_token::kEos))
    fail("chat document", "a rendered conversation between BOS and EOS", text.substr(0, 40));
  return text.substr(chat_token::kBos.size(), text.size() - chat_token::kBos.size() - chat_token::kEos.size());
}

std::vector<Document> chat_documents(const std::vector<Document>& split) {
  std::vector<Document> out;
  for (const Document& d : split) {
    std::vector<ChatTurn> turns;
    if (d.source == "wordnet") {
      const std::vector<std::string_view> lines = split_lines(d.text);
      const size_t n = lines.size(), k = std::min<size_t>(n, kChatTurnsPerWordnetDocument);
      for (size_t i = 0; i < k; ++i)
        if (auto t = wordnet_turn(lines[i * n / k])) turns.push_back(*t);
    } else if (d.source == "devil") {
      if (auto t = devil_turn(d.text)) turns.push_back(*t);
    } else if (d.source == "jargon") {
      if (auto t = jargon_turn(d.key, d.text)) turns.push_back(*t);
    }
    if (!turns.empty()) out.push_back({"chat", d.source + "/" + d.key, chat_text(turns)});
  }
  return out;
}

}  // namespace dsv41::train
