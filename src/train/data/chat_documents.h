#pragma once
// Chat documents (docs/training-data.md, "Chat documents"): question-and-answer turns derived from
// the corpus's dictionaries, so that a model trained on them answers a chat turn rather than
// continuing it as prose. Each is rendered as the server renders a conversation with thinking off
// (engine/chat_format.h: "<｜User｜>question<｜Assistant｜></think>answer", an EOS after each
// answer), so the model sees the exact token sequence it is served. Derived from one split only,
// split by split: a validation document's turns never reach the train split.
//
//   wordnet  "lemma, synonym (noun): gloss; "example""  →  "What is a lemma?"  /  "A lemma is
//            gloss. It is also called a synonym. For example: "example"" (verbs: "To lemma is to
//            gloss."; adjectives and adverbs: "“lemma” means gloss.")
//   devil    "WORD, n. Definition …"                     →  "What is word?"  /  "Definition …"
//   jargon   "term: n. [etymology] Definition …"         →  "What does “term” mean in hacker
//            slang?"  /  "Definition …" (entries that only point elsewhere, "See …", are left out)
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/data/document.h"

namespace dsv41::train {

struct ChatTurn {
  std::string question, answer;
};

// One WordNet line "lemma, lemma (pos): gloss; "example"" (source_wordnet's form); nothing for a line
// of another form.
std::optional<ChatTurn> wordnet_turn(std::string_view line);
// A devil document's text (source_devil's form "WORD, n. Definition", its first paragraph).
std::optional<ChatTurn> devil_turn(std::string_view text);
// A jargon glossary entry (source_jargon's form "term: pos.\n\nDefinition"), keyed by its term;
// nothing for a section (its key is not the text's term) or an entry that only says "See …".
std::optional<ChatTurn> jargon_turn(std::string_view key, std::string_view text);

// Turns per conversation drawn from a WordNet document (of kWordnetSynsetsPerDocument synsets:
// spread evenly over it).
inline constexpr int kChatTurnsPerWordnetDocument = 4;

// The conversation's text as the packer takes a document: render_chat's, thinking off, without
// the leading BOS (the tokenizer's post-processor adds it) and the final EOS (the packer appends it).
std::string chat_text(const std::vector<ChatTurn>& turns);

// The chat documents of one split's documents, in their order: source "chat", keyed
// "<source>/<key>" of the document each comes from.
std::vector<Document> chat_documents(const std::vector<Document>& split);

}  // namespace dsv41::train
