#include "train/data/sources.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "train/data/inflate.h"
#include "train/data/r_data.h"

namespace dsv41::train {

namespace {

std::string read_installed(const std::string& path, const std::string& package) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a file of the Debian package " + package + " (scripts/setup.sh installs it)", "no readable file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What a command prints on stdout; a failure to run it is an error naming the package.
std::string command_output(const std::string& command, const std::string& package) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) fail(command, "to start", "an error");
  std::string out;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0 || out.empty())
    fail("`" + command + "`", "the text of the Debian package " + package + " (scripts/setup.sh installs it)",
         "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  return out;
}

std::vector<Document> read_kjv() {
  return parse_kjv(command_output("COLUMNS=100000 bible -l100000 'gen1:1-rev22:21' 2>/dev/null", "bible-kjv"));
}

std::vector<Document> read_austen() {
  const std::string dir = "/usr/lib/R/site-library/janeaustenr/data/";
  const std::string rdx = read_installed(dir + "Rdata.rdx", "r-cran-janeaustenr");
  const std::string rdb = read_installed(dir + "Rdata.rdb", "r-cran-janeaustenr");
  // The index lists the novels alphabetically; they are read in order of publication.
  static const char* kNovels[] = {"sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"};
  const auto objects = read_lazy_load_db(rdx, rdb, dir + "Rdata");
  std::vector<Document> docs;
  for (const char* novel : kNovels) {
    auto it = std::find_if(objects.begin(), objects.end(), [&](const auto& o) { return o.first == novel; });
    if (it == objects.end() || it->second.type != RObject::Type::character)
      fail(dir + "Rdata", std::string("the novel ") + novel + " as a character vector", "none");
    for (Document& d : parse_austen(novel, it->second.strings)) docs.push_back(std::move(d));
  }
  return docs;
}

std::vector<Document> read_jargon() {
  const std::string path = "/usr/share/doc/jargon-text/jargon.txt.gz";
  return parse_jargon(inflate(read_installed(path, "jargon-text"), path));
}

std::vector<Document> read_devil() {
  const std::string path = "/usr/share/dictd/devil";
  return parse_devil(inflate(read_installed(path + ".dict.dz", "dict-devil"), path + ".dict.dz"),
                     read_installed(path + ".index", "dict-devil"));
}

std::vector<Document> read_wordnet() {
  std::vector<Document> docs;
  for (auto [file, pos] : {std::pair{"noun", "noun"}, {"verb", "verb"}, {"adj", "adjective"}, {"adv", "adverb"}})
    for (Document& d : parse_wordnet(read_installed(std::string("/usr/share/wordnet/data.") + file, "wordnet-base"), pos))
      docs.push_back(std::move(d));
  return docs;
}

}  // namespace

std::vector<Source> corpus_sources() {
  return {
      {"kjv", "The King James Bible (1611, the 1769 Oxford text)", "Debian bible-kjv-text (read by bible-kjv's bible)",
       "public domain", false, read_kjv},
      {"austen", "Jane Austen's six novels (1811-1818)", "Debian r-cran-janeaustenr (Project Gutenberg texts)",
       "public domain (package: MIT)", true, read_austen},
      {"jargon", "The Jargon File 4.4.7 (2003)", "Debian jargon-text", "public domain (dedicated by its editor)", true,
       read_jargon},
      {"devil", "Ambrose Bierce, The Devil's Dictionary (1911)", "Debian dict-devil", "public domain (copyright expired)",
       true, read_devil},
      {"wordnet", "WordNet 3.0 glosses (2006)", "Debian wordnet-base", "WordNet 3.0 licence (permissive, notice kept)",
       false, read_wordnet},
  };
}

std::vector<Source> select_sources(const std::vector<std::string>& names) {
  std::vector<Source> all = corpus_sources(), out;
  std::string known;
  for (const Source& s : all) known += (known.empty() ? "" : ", ") + s.name;
  for (const std::string& n : names)
    if (std::none_of(all.begin(), all.end(), [&](const Source& s) { return s.name == n; }))
      fail("source \"" + n + "\"", "one of " + known, "\"" + n + "\"");
  for (Source& s : all)
    if (std::find(names.begin(), names.end(), s.name) != names.end()) out.push_back(std::move(s));
  return out;
}

}  // namespace dsv41::train
