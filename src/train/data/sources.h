#pragma once
// The sources of the training corpus: public-domain (and one permissively licensed) English text
// from Debian packages that scripts/setup.sh installs, read from the installed files with no
// network. docs/training-data.md argues each source's licence.
//
// Each source turns its files into raw documents (the cleaning of text_clean.h comes after);
// the parse_* functions do that from the files' contents, so that tests can feed them text.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "train/data/document.h"

namespace dsv41::train {

struct Source {
  std::string name;     // short and stable: it is part of every document's identity (split.h)
  std::string title;    // what it is
  std::string package;  // where it comes from
  std::string licence;  // in a few words; docs/training-data.md has the argument
  bool hard_wrapped;    // prose broken into lines of ~70 columns: cleaning joins them
  std::function<std::vector<Document>()> read;  // the raw documents, in a fixed order
};

// Every source, in the corpus's fixed order (the first copy of a duplicate is kept, so sources
// added later go at the end): kjv, austen, jargon, devil, wordnet.
std::vector<Source> corpus_sources();

// The sources named (in the corpus's order, whatever the order of `names`); an unknown name is
// an error that lists the known ones.
std::vector<Source> select_sources(const std::vector<std::string>& names);

// bible(1)'s output for the whole book: "Genesis 1" headings, verses as "  N text". One
// document per chapter, keyed by its heading: the heading, a blank line, one verse per line.
std::vector<Document> parse_kjv(std::string_view bible_output);

// One novel's lines (as the R package stores them): one document per chapter ("CHAPTER 12",
// "Chapter XII"), keyed "NOVEL/N" (N counts chapters from 1; 0 is the title matter before the
// first); "VOLUME I" headings and "THE END" / "FINIS" lines are left out.
std::vector<Document> parse_austen(std::string_view novel, const std::vector<std::string>& lines);

// The Jargon File as text: one document per glossary entry (keyed by its term, the text
// "term: ..." with the cross-reference braces {} removed) and per chapter or appendix section
// (keyed by its heading); the table of contents, the glossary's term index and the table of
// revisions are left out.
std::vector<Document> parse_jargon(std::string_view text);

// A dictd dictionary (the .dict text and its .index): one document per entry, keyed by its
// first headword ("reason #2" for a headword's second entry); the 00-database-* entries (about
// the file) are left out.
std::vector<Document> parse_devil(std::string_view dict, std::string_view index);

// One WordNet data file (data.noun, ...; `pos` names its part of speech): each synset as a
// line "lemma, lemma (pos): gloss", kWordnetSynsetsPerDocument consecutive synsets of one
// lexicographer file to a document, keyed "POS/OFFSET" by the first synset's offset.
std::vector<Document> parse_wordnet(std::string_view data, std::string_view pos);
inline constexpr int kWordnetSynsetsPerDocument = 50;

}  // namespace dsv41::train
