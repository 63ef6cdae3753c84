// The training corpus (src/train/data, docs/training-data.md): cleaning and deduplication on
// small hand-written inputs whose answers are worked out in the comments, the split's hash and
// stability, the sources' parsers on miniature copies of their formats, the R and gzip readers,
// and the real sources as installed by scripts/setup.sh, checked against facts about those texts
// (1,189 Bible chapters, Austen's chapter counts, WordNet 3.0's 117,659 synsets).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "base/error.h"
#include "test_util.h"
#include "train/data/corpus.h"
#include "train/data/dedup.h"
#include "train/data/inflate.h"
#include "train/data/r_data.h"
#include "train/data/sources.h"
#include "train/data/split.h"
#include "train/data/text_clean.h"

namespace dsv41::train {
namespace {

using namespace std::string_literals;

using test::error_of;

// ---------------------------------------------------------------- cleaning

TEST(TrainDataClean, Utf8IsCheckedAndTheFirstBadByteNamed) {
  EXPECT_NO_THROW(check_utf8("plain, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80", "doc"));
  // A lead byte followed by ASCII; a sequence cut off by the end; a stray continuation byte; an
  // overlong form; a surrogate; bytes that begin like U+FFFD's own encoding (EF BF) but stop.
  EXPECT_EQ(error_of([] { check_utf8("ab\xC3(", "doc"); }), "doc: expected UTF-8 text, found the invalid byte 0xC3 at byte 2");
  EXPECT_EQ(error_of([] { check_utf8("abc\xE2\x82", "d"); }), "d: expected UTF-8 text, found the invalid byte 0xE2 at byte 3");
  EXPECT_EQ(error_of([] { check_utf8("\x80", "d"); }), "d: expected UTF-8 text, found the invalid byte 0x80 at byte 0");
  EXPECT_EQ(error_of([] { check_utf8("x\xC0\xAF", "d"); }), "d: expected UTF-8 text, found the invalid byte 0xC0 at byte 1");
  EXPECT_EQ(error_of([] { check_utf8("\xE2\x82\xAC\xED\xA0\x80", "d"); }),
            "d: expected UTF-8 text, found the invalid byte 0xED at byte 3");
  EXPECT_EQ(error_of([] { check_utf8("\xEF\xBF(", "d"); }), "d: expected UTF-8 text, found the invalid byte 0xEF at byte 0");
}

TEST(TrainDataClean, GutenbergHeaderAndFooterAreRemoved) {
  EXPECT_EQ(strip_gutenberg("The Project Gutenberg EBook of X\nLicence text\n"
                            "*** START OF THE PROJECT GUTENBERG EBOOK X ***\nReal text.\nMore.\n"
                            "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nfooter licence\n"),
            "Real text.\nMore.\n");
  EXPECT_EQ(strip_gutenberg("header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\nBody\n"
                            "End of the Project Gutenberg EBook of X\nfooter"),
            "Body\n");
  EXPECT_EQ(strip_gutenberg("  *** Start Of This Project Gutenberg EBook y ***\nBody\n"), "Body\n");
  // Without the marker lines (or with the words inside a line) nothing is removed.
  EXPECT_EQ(strip_gutenberg("No markers.\nThe end of Project Gutenberg's text is here.\n"),
            "No markers.\nThe end of Project Gutenberg's text is here.\n");
}

TEST(TrainDataClean, WhitespaceIsNormalised) {
  // Line 1 is a BOM; line 2 has indentation 2 + a tab to column 8; line 5 has indentation 4,
  // a control character, a no-break space and trailing spaces; then 6 and 21 columns, and a
  // final CR. The common indentation, 4, goes; 21 - 4 = 17 is capped at 8.
  EXPECT_EQ(normalize_whitespace("\xEF\xBB\xBF\r\n  \tTitle  line \r\n\r\n\r\n    body\x01 text\xC2\xA0here   \n\n\n"
                                 "      deep\n                     far\r"),
            "    Title line\n\nbody text here\n\n  deep\n        far");
  // Line separators: U+2028, FF, VT, NEL (U+0085), CR LF, lone CR.
  EXPECT_EQ(normalize_whitespace("a\xE2\x80\xA8"
                                 "b\fc\vd\xC2\x85"
                                 "e\r\nf\rg"),
            "a\nb\nc\nd\ne\nf\ng");
  EXPECT_EQ(normalize_whitespace(" \n\t\n"), "");
}

TEST(TrainDataClean, HardWrappedProseIsJoined) {
  // "cannon-" + "shot": a word broken at its hyphen joins without a space (the hyphen kept);
  // "--" and "20-" are not words broken at a hyphen; indented lines (verse) keep their lines; a
  // prose line after verse starts a line of its own; blank lines stay paragraph breaks.
  EXPECT_EQ(unwrap_paragraphs("It was a cannon-\nshot acknowledged that a\nsingle man --\nnot\n\n"
                              "    Verse one\n    verse two\nProse after verse\ncontinues here.\n\nA 20-\n30 split"),
            "It was a cannon-shot acknowledged that a single man -- not\n\n"
            "    Verse one\n    verse two\nProse after verse continues here.\n\nA 20- 30 split");
}

TEST(TrainDataClean, CleanTextComposesEveryStep) {
  // NFC: e + U+0301 COMBINING ACUTE ACCENT becomes U+00E9.
  EXPECT_EQ(clean_text("  Cafe\xCC\x81 au\n  lait.\n\n\n  Next.  ", true, "d"), "Caf\xC3\xA9 au lait.\n\nNext.");
  EXPECT_EQ(clean_text("  Cafe\xCC\x81 au\n  lait.", false, "d"), "Caf\xC3\xA9 au\nlait.");
  EXPECT_EQ(error_of([] { clean_text("ok\xFF", false, "kjv document \"Genesis 1\""); }),
            "kjv document \"Genesis 1\": expected UTF-8 text, found the invalid byte 0xFF at byte 2");
}

// ---------------------------------------------------------------- deduplication

TEST(TrainDataDedup, FingerprintIgnoresCasePunctuationAndSpacing) {
  EXPECT_EQ(fingerprint("  The LORD's house,\n\tis  here!  "), "the lord s house is here");
  EXPECT_EQ(fingerprint("Caf\xC3\xA9 -- 42"), "caf\xC3\xA9 42");
  EXPECT_EQ(fingerprint("?!"), "");
}

TEST(TrainDataDedup, ExactDuplicatesAreFoundThroughTheirFingerprints) {
  Deduplicator d;
  EXPECT_EQ(d.offer("The quick brown fox jumps over the lazy dog.\nShort."), Verdict::kept);
  EXPECT_EQ(d.offer("the QUICK brown fox, jumps over the lazy dog\nshort"), Verdict::exact_duplicate);
  EXPECT_EQ(d.offer("The quick brown fox jumps over the lazy cat."), Verdict::kept);
}

TEST(TrainDataDedup, NearDuplicatesAreDocumentsMadeMostlyOfSeenLines) {
  // Lines of lower-case letters and single spaces: a line's fingerprint is the line.
  const std::string l1 = "the first line has exactly forty chars..";  // the dots are not in the fingerprint
  const std::string l2 = "and the second line is of the same size";
  const std::string l3 = "a third line that is forty characters ok";
  const std::string l4 = "the fourth line also has forty chars yes";
  const std::string l5 = "a fifth line new and forty chars long ok";
  const std::string l6 = "a new line of twenty five";
  ASSERT_EQ(fingerprint(l1).size(), 38u);
  ASSERT_EQ(fingerprint(l2).size(), 39u);
  ASSERT_EQ(fingerprint(l3).size(), 40u);
  ASSERT_EQ(fingerprint(l4).size(), 40u);
  ASSERT_EQ(fingerprint(l5).size(), 40u);
  ASSERT_EQ(fingerprint(l6).size(), 25u);
  Deduplicator d;
  ASSERT_EQ(d.offer(l1 + "\n" + l2 + "\n" + l3 + "\n" + l4), Verdict::kept);
  // Seen: l2, l3, l4 = 119 of 159 counted characters = 75% < 80%: kept (and l5 remembered).
  EXPECT_EQ(d.offer(l2 + "\n" + l3 + "\n" + l4 + "\n" + l5), Verdict::kept);
  // All counted lines seen; "Amen." is shorter than kMinLineChars and does not count.
  EXPECT_EQ(d.offer(l1 + "\n" + l2 + "\nAmen.\n" + l3), Verdict::near_duplicate);
  // Seen 120 of 145 = 83%: a near duplicate, so l6 is not remembered ...
  EXPECT_EQ(d.offer(l3 + "\n" + l4 + "\n" + l5 + "\n" + l6), Verdict::near_duplicate);
  // ... and a document of l6 alone is new.
  EXPECT_EQ(d.offer(l6), Verdict::kept);
  // Nothing counts in a document of short lines: only the exact test applies.
  EXPECT_EQ(d.offer("Amen.\nSelah."), Verdict::kept);

  Deduplicator strict(0.7);
  ASSERT_EQ(strict.offer(l1 + "\n" + l2 + "\n" + l3 + "\n" + l4), Verdict::kept);
  EXPECT_EQ(strict.offer(l2 + "\n" + l3 + "\n" + l4 + "\n" + l5), Verdict::near_duplicate);  // 75% >= 70%
}

// ---------------------------------------------------------------- split

TEST(TrainDataSplit, TheHashIsXxh3OfTheIdentity) {
  // `printf 'kjv\0Genesis 1' | xxhsum -H3` (Debian xxhash 0.8.1) prints 9b8d244f38e06b95.
  EXPECT_EQ(document_hash("kjv", "Genesis 1"), 0x9b8d244f38e06b95ull);
  // Its top 53 bits as a fraction: 0x1371a489e71c0d / 2^53 = 0.607622...
  EXPECT_EQ(split_of("kjv", "Genesis 1", 0.6076), Split::train);
  EXPECT_EQ(split_of("kjv", "Genesis 1", 0.6077), Split::validation);
  EXPECT_EQ(split_of("kjv", "Genesis 1", 0.0), Split::train);
  EXPECT_EQ(split_of("kjv", "Genesis 1", 1.0), Split::validation);
  // The source is part of the identity: the same key elsewhere has another hash.
  EXPECT_NE(document_hash("jargon", "Genesis 1"), document_hash("kjv", "Genesis 1"));
  EXPECT_NE(document_hash("kjv", "Genesis 1x"), document_hash("kjv", "Genesis 1"));
}

TEST(TrainDataSplit, TheValidationShareIsTheFractionAsked) {
  // 20,000 identities at 10%: the count is binomial, sd sqrt(20000 * 0.1 * 0.9) = 42.4; 4 sd.
  int validation = 0;
  for (int i = 0; i < 20000; ++i) validation += split_of("s", "key " + std::to_string(i), 0.1) == Split::validation;
  EXPECT_NEAR(validation, 2000, 170);
}

Source fake(const std::string& name, bool wrapped, std::vector<Document> docs) {
  return {name, name, "test", "test", wrapped, [docs] { return docs; }};
}

TEST(TrainDataCorpus, CleansDeduplicatesAndSplits) {
  const Source a = fake("a", false,
                        {{"", "k1", "Hello world, this is the first document."},
                         {"", "k2", "  \n \t "},
                         {"", "k3", "hello WORLD this is the first document"},
                         {"", "k4", "Line one is long enough to count.\nLine two is long enough to count."}});
  // b/k1 unwrapped is one line, but its fingerprint is a/k4's: an exact duplicate. b/k2 has one
  // seen line (32 of 60 counted characters): kept.
  const Source b = fake("b", true,
                        {{"", "k1", "Line one is long enough to count.\nLine two is long enough to count."},
                         {"", "k2", "Line one is long enough to count.\n\nA new line that is also long."}});
  CorpusOptions options;
  options.validation_fraction = 0;
  const Corpus c = build_corpus({a, b}, options);
  ASSERT_EQ(c.train.size(), 3u);
  EXPECT_TRUE(c.validation.empty());
  EXPECT_EQ(c.train[0].source + "/" + c.train[0].key, "a/k1");
  EXPECT_EQ(c.train[1].text, "Line one is long enough to count.\nLine two is long enough to count.");
  EXPECT_EQ(c.train[2].source + "/" + c.train[2].key, "b/k2");
  EXPECT_EQ(c.train[2].text, "Line one is long enough to count.\n\nA new line that is also long.");
  ASSERT_EQ(c.sources.size(), 2u);
  const SourceStats& sa = c.sources[0];
  EXPECT_EQ(sa.documents, 4);
  EXPECT_EQ(sa.empty, 1);
  EXPECT_EQ(sa.exact_duplicates, 1);
  EXPECT_EQ(sa.near_duplicates, 0);
  EXPECT_EQ(sa.kept_documents[0], 2);
  EXPECT_EQ(sa.kept_bytes[0], int64_t(c.train[0].text.size() + c.train[1].text.size()));
  EXPECT_EQ(c.sources[1].exact_duplicates, 1);
  EXPECT_EQ(c.sources[1].kept_documents[0], 1);

  const Source twice = fake("c", false, {{"", "x", "one"}, {"", "x", "two"}});
  EXPECT_EQ(error_of([&] { build_corpus({twice}, options); }), "source c: expected unique document keys, found \"x\" twice");
}

TEST(TrainDataCorpus, AddingASourceMovesNoDocumentOfTheOthers) {
  std::vector<Document> docs_a, docs_b;
  for (int i = 0; i < 200; ++i) docs_a.push_back({"", "a" + std::to_string(i), "Document number " + std::to_string(i) + " of a."});
  for (int i = 0; i < 200; ++i) docs_b.push_back({"", "b" + std::to_string(i), "Document number " + std::to_string(i) + " of b."});
  CorpusOptions options;
  options.validation_fraction = 0.3;
  const Corpus one = build_corpus({fake("a", false, docs_a)}, options);
  const Corpus two = build_corpus({fake("a", false, docs_a), fake("b", false, docs_b)}, options);
  ASSERT_FALSE(one.validation.empty());
  ASSERT_FALSE(one.train.empty());
  auto of = [](const std::vector<Document>& docs, const std::string& source) {
    std::vector<std::string> keys;
    for (const Document& d : docs)
      if (d.source == source) keys.push_back(d.key);
    return keys;
  };
  EXPECT_EQ(of(two.train, "a"), of(one.train, "a"));
  EXPECT_EQ(of(two.validation, "a"), of(one.validation, "a"));
  for (const Document& d : two.validation) EXPECT_EQ(split_of(d.source, d.key, 0.3), Split::validation) << d.key;
}

// ---------------------------------------------------------------- the sources' formats

TEST(TrainDataSources, KjvChaptersFromBibleOutput) {
  const std::vector<Document> docs = parse_kjv("\nGenesis 1\n\n  1 In the beginning.\n  2 And the earth.\n\nGenesis 2\n\n  1 Thus.\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].key, "Genesis 1");
  EXPECT_EQ(docs[0].text, "Genesis 1\n\nIn the beginning.\nAnd the earth.");
  EXPECT_EQ(docs[1].text, "Genesis 2\n\nThus.");
  EXPECT_EQ(error_of([] { parse_kjv("  1 A verse before any heading.\n"); }),
            "bible output, line \"  1 A verse before any heading.\": expected a chapter heading, then verses \"  N text\", found this line");
  EXPECT_NE(error_of([] { parse_kjv("Genesis 1\n  x no number\n"); }), "");
}

TEST(TrainDataSources, AustenChapters) {
  const std::vector<Document> docs = parse_austen(
      "emma", {"EMMA", "", "By Jane Austen", "", "VOLUME I", "", "CHAPTER I", "", "Emma Woodhouse, handsome,", "clever.", "",
               "Chapter 2", "Text two.", "FINIS"});
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].key, "emma/0");
  EXPECT_EQ(docs[0].text, "EMMA\n\nBy Jane Austen\n\n\n");
  EXPECT_EQ(docs[1].key, "emma/1");
  EXPECT_EQ(docs[1].text, "\nEmma Woodhouse, handsome,\nclever.\n\n");
  EXPECT_EQ(docs[2].key, "emma/2");
  EXPECT_EQ(docs[2].text, "Text two.\n");
}

TEST(TrainDataSources, JargonEntriesAndSections) {
  const std::string text =
      "                                The Jargon File\n\n   Table of Contents\n\n   Glossary\n\n"
      "Chapter 1. Hacker Slang\n\n   This document is a {collection}\n   of slang.\n\n"
      "\xE2\x94\x8C\xE2\x94\x80\xE2\x94\x90\n\xE2\x94\x82 x \xE2\x94\x82\n"
      "Glossary\n\n   0\n\n   A\n\n   :abbrev: /@breev'/, n.\n\n   Common abbreviation for {abbreviation}.\n\n"
      "   :ACK: /ak/, interj.\n\n   1. [common] Acknowledge.\n\n      an example\n\n  B\n\n   back door\n\n"
      "   :back door: n.\n\n   A hole in the security.\n\n"
      "Appendix A. Hacker Folklore\n\n   Some text.\n";
  const std::vector<Document> docs = parse_jargon(text);
  ASSERT_EQ(docs.size(), 5u);
  EXPECT_EQ(docs[0].key, "Chapter 1. Hacker Slang");
  EXPECT_EQ(docs[0].text, "Chapter 1. Hacker Slang\n\n\nThis document is a collection\nof slang.\n\n");
  EXPECT_EQ(docs[1].key, "abbrev");
  EXPECT_EQ(docs[1].text, "abbrev: /@breev'/, n.\n\nCommon abbreviation for abbreviation.\n\n");
  EXPECT_EQ(docs[2].key, "ACK");
  EXPECT_EQ(docs[2].text, "ACK: /ak/, interj.\n\n1. [common] Acknowledge.\n\n   an example\n\n");
  EXPECT_EQ(docs[3].key, "back door");
  EXPECT_EQ(docs[3].text, "back door: n.\n\nA hole in the security.\n\n");
  EXPECT_EQ(docs[4].key, "Appendix A. Hacker Folklore");
  EXPECT_EQ(docs[4].text, "Appendix A. Hacker Folklore\n\n\nSome text.\n");
}

TEST(TrainDataSources, DictdEntries) {
  // Offsets and lengths in dictd's base 64 (A=0 ... Z=25, a=26 ... z=51, 0=52 ... 9=61, +, /):
  // the header entry at 0 (A), 23 bytes (X); ABBOT at 23 (X), 15 bytes (P); ZEUS after 32 bytes
  // of filler at 70 = 1*64 + 6 (BG), 14 bytes (O), named by two headwords.
  const std::string dict = "00-database-info\nabout\n"s + "ABBOT, n. One.\n" + std::string(32, 'x') + "ZEUS, n. God.\n";
  const std::vector<Document> docs = parse_devil(dict, "00databaseinfo\tA\tX\nabbot\tX\tP\nzeus\tBG\tO\ngod\tBG\tO\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].key, "abbot");
  EXPECT_EQ(docs[0].text, "ABBOT, n. One.\n");
  EXPECT_EQ(docs[1].key, "zeus");
  EXPECT_EQ(docs[1].text, "ZEUS, n. God.\n");
  // A headword with a second entry.
  const std::vector<Document> two = parse_devil(dict, "abbot\tX\tP\nabbot\tBG\tO\n");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].key, "abbot #2");
  EXPECT_EQ(error_of([&] { parse_devil(dict, "bad\tX\n"); }),
            "dictd index line \"bad\tX\": expected word, offset and length, found fewer fields");
  EXPECT_EQ(error_of([&] { parse_devil(dict, "bad\t!\tA\n"); }),
            "dictd index line \"bad\t!\tA\": expected a base-64 number, found \"!\"");
  EXPECT_EQ(error_of([&] { parse_devil(dict, "far\tBG\tP\n"); }),
            "dictd index line \"far\tBG\tP\": expected an entry inside the 84-byte dictionary, found bytes 70+15");
}

TEST(TrainDataSources, WordnetSynsets) {
  const std::string data =
      "  1 This software and database is being provided\n"
      "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04431553 n 0000 | that which is perceived  \n"
      "00001930 03 n 02 physical_entity 0 thing 1 001 @ 00001740 n 0000 | an entity that has physical existence  \n"
      "00002137 04 n 01 abstraction 0 001 @ 00001740 n 0000 | a general concept  \n";
  const std::vector<Document> docs = parse_wordnet(data, "noun");
  ASSERT_EQ(docs.size(), 2u);  // lexicographer files 03 and 04
  EXPECT_EQ(docs[0].key, "noun/00001740");
  EXPECT_EQ(docs[0].text, "entity (noun): that which is perceived\nphysical entity, thing (noun): an entity that has physical existence\n");
  EXPECT_EQ(docs[1].key, "noun/00002137");
  EXPECT_EQ(docs[1].text, "abstraction (noun): a general concept\n");

  // Adjective markers go; a hexadecimal word count (0c = 12 words); 51 synsets of one file
  // make two documents of 50 and 1.
  const std::vector<Document> adj = parse_wordnet(
      "00000001 00 a 0c a(a) 0 b(p) 0 c(ip) 0 d 0 e 0 f 0 g 0 h 0 i 0 j 0 k 0 l 0 000 | letters  \n", "adjective");
  ASSERT_EQ(adj.size(), 1u);
  EXPECT_EQ(adj[0].text, "a, b, c, d, e, f, g, h, i, j, k, l (adjective): letters\n");
  std::string many;
  for (int i = 0; i < 51; ++i) many += std::to_string(10000000 + i) + " 05 n 01 w 0 000 | g  \n";
  const std::vector<Document> chunks = parse_wordnet(many, "noun");
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].key, "noun/10000050");
  EXPECT_EQ(error_of([] { parse_wordnet("00000001 00 n 01 w 0 000 no gloss\n", "noun"); }),
            "WordNet noun synset \"00000001 00 n 01 w 0 000 no gloss...\": expected a synset with a gloss after \" | \", found none");
}

// ---------------------------------------------------------------- R data and gzip

TEST(TrainDataRData, UnserializesVectorsListsAttributesAndReferences) {
  // R's XDR format, written by hand: "X\n", version 2, writer 4.2.1, reader 2.3.0; a list
  // (VECSXP 19 with attributes: 0x213) of two elements: a character vector ("one", NA) and an
  // integer vector 42 with its own names attribute; the list's names c("a", "b"). The second
  // "names" symbol is a reference (REFSXP 255, index 1 in the flags: 0x1FF) to the first.
  const std::string x = "X\n"s + "\x00\x00\x00\x02"s + "\x00\x04\x02\x01"s + "\x00\x02\x03\x00"s +  //
                        "\x00\x00\x02\x13"s + "\x00\x00\x00\x02"s +                                    // list of 2
                        "\x00\x00\x00\x10"s + "\x00\x00\x00\x02"s +                                    // character(2)
                        "\x00\x04\x00\x09"s + "\x00\x00\x00\x03"s + "one" +                            //   "one"
                        "\x00\x00\x00\x09"s + "\xFF\xFF\xFF\xFF"s +                                    //   NA
                        "\x00\x00\x02\x0D"s + "\x00\x00\x00\x01"s + "\x00\x00\x00\x2A"s +              // integer 42
                        "\x00\x00\x04\x02"s + "\x00\x00\x00\x01"s + "\x00\x04\x00\x09"s +              //   attr: tag
                        "\x00\x00\x00\x05"s + "names" +                                                //   symbol
                        "\x00\x00\x00\x10"s + "\x00\x00\x00\x01"s + "\x00\x04\x00\x09"s +              //   "x"
                        "\x00\x00\x00\x01"s + "x" + "\x00\x00\x00\xFE"s +                              //   end
                        "\x00\x00\x04\x02"s + "\x00\x00\x01\xFF"s +                                    // attr: ref 1
                        "\x00\x00\x00\x10"s + "\x00\x00\x00\x02"s +                                    //   names
                        "\x00\x04\x00\x09"s + "\x00\x00\x00\x01"s + "a" +                              //
                        "\x00\x04\x00\x09"s + "\x00\x00\x00\x01"s + "b" + "\x00\x00\x00\xFE"s;
  const RObject o = unserialize(x, "test");
  ASSERT_EQ(o.type, RObject::Type::list);
  ASSERT_EQ(o.items.size(), 2u);
  EXPECT_EQ(o.items[0].strings, (std::vector<std::string>{"one", ""}));
  EXPECT_EQ(o.items[1].ints, std::vector<int32_t>{42});
  ASSERT_NE(o.items[1].attribute("names"), nullptr);
  EXPECT_EQ(o.items[1].attribute("names")->strings, std::vector<std::string>{"x"});
  ASSERT_NE(o.attribute("names"), nullptr);
  EXPECT_EQ(o.attribute("names")->strings, (std::vector<std::string>{"a", "b"}));

  // A closure (CLOSXP, 3) is not data.
  EXPECT_EQ(error_of([] { unserialize("X\n"s + "\x00\x00\x00\x02"s + std::string(8, '\0') + "\x00\x00\x00\x03"s, "f"); }),
            "f: expected an R object of type character, integer, logical, double, list, pairlist or symbol, found SEXP type 3");
  EXPECT_EQ(error_of([] { unserialize("X\n"s + "\x00\x00\x00\x02"s + std::string(8, '\0') + "\x00\x00\x00\x10"s, "f"); }),
            "f: expected more serialized data, found the end of the object");
  EXPECT_EQ(error_of([] { unserialize("RDX2\n", "f"); }), "f: expected R's XDR serialization (\"X\\n\"), found other data");
}

TEST(TrainDataInflate, GzipAndZlib) {
  // Python: gzip.compress(b"Hello, corpus!\n", mtime=0) and zlib.compress(b"zlib data").
  const std::string gz = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xf3\x48\xcd\xc9\xc9\xd7\x51\x48\xce\x2f\x2a\x28\x2d"
                         "\x56\xe4\x02\x00\x7d\xb9\xcc\x8d\x0f\x00\x00\x00"s;
  EXPECT_EQ(inflate(gz, "g"), "Hello, corpus!\n");
  EXPECT_EQ(inflate("\x78\x9c\xab\xca\xc9\x4c\x52\x48\x49\x2c\x49\x04\x00\x11\x7a\x03\x6c"s, "z"), "zlib data");
  EXPECT_EQ(error_of([&] { inflate(gz.substr(0, 20), "g"); }), "g: expected a whole gzip or zlib stream, found data cut short");
  EXPECT_NE(error_of([] { inflate("not compressed", "n"); }), "");
}

// ---------------------------------------------------------------- the installed sources

// Each source as scripts/setup.sh installs it, against what is known of the text.
TEST(TrainDataSources, InstalledSourcesAreReadWhole) {
  std::map<std::string, std::vector<Document>> docs;
  for (const Source& s : corpus_sources()) docs[s.name] = s.read();
  ASSERT_EQ(docs.size(), 5u);

  ASSERT_EQ(docs["kjv"].size(), 1189u);  // the chapters of the Protestant canon
  EXPECT_TRUE(docs["kjv"].front().text.starts_with("Genesis 1\n\nIn the beginning God created the heaven and the earth.\n"));
  EXPECT_EQ(docs["kjv"].back().key, "Revelation 22");

  // Chapters: Sense and Sensibility 50, Pride and Prejudice 61, Mansfield Park 48, Emma 55,
  // Northanger Abbey 31, Persuasion 24; and each novel's title matter.
  std::map<std::string, int> chapters;
  for (const Document& d : docs["austen"]) chapters[d.key.substr(0, d.key.find('/'))] += 1;
  EXPECT_EQ(chapters, (std::map<std::string, int>{{"emma", 56}, {"mansfieldpark", 49}, {"northangerabbey", 32},
                                                  {"persuasion", 25}, {"prideprejudice", 62}, {"sensesensibility", 51}}));
  EXPECT_EQ(docs["austen"][1].key, "sensesensibility/1");
  EXPECT_NE(docs["austen"][1].text.find("\nThe family of Dashwood had long been settled in Sussex."), std::string::npos);

  // The Jargon File 4.4.7 has 2,307 entries (`grep -c '^   :[^ ][^:]*:'` on jargon.txt).
  int entries = 0;
  for (const Document& d : docs["jargon"]) entries += d.text.starts_with(d.key + ":");  // sections: key + "\n\n"
  EXPECT_EQ(entries, 2307);

  // devil.index has 1,008 lines: 5 about the file, and 4 pairs of headwords that share an entry.
  EXPECT_EQ(docs["devil"].size(), 999u);

  // WordNet 3.0 has 117,659 synsets; each is one line of a document.
  size_t synsets = 0;
  for (const Document& d : docs["wordnet"]) synsets += size_t(std::count(d.text.begin(), d.text.end(), '\n'));
  EXPECT_EQ(synsets, 117659u);
}

TEST(TrainDataSources, SelectedByName) {
  std::vector<std::string> names;
  for (const Source& s : select_sources({"wordnet", "kjv"})) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"kjv", "wordnet"}));  // in the corpus's order
  EXPECT_EQ(error_of([] { select_sources({"kjv", "brown"}); }),
            "source \"brown\": expected one of kjv, austen, jargon, devil, wordnet, found \"brown\"");
}

}  // namespace
}  // namespace dsv41::train
