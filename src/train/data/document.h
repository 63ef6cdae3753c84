#pragma once
// A document of the training corpus: one unit of text that is cleaned, deduplicated and assigned
// to a split as a whole (a Bible chapter, a novel's chapter, a dictionary entry, ...).
#include <string>

namespace dsv41::train {

struct Document {
  std::string source;  // the source's name, e.g. "kjv"
  std::string key;     // unique within the source and stable across builds, e.g. "Genesis 1"
  std::string text;    // UTF-8
};

}  // namespace dsv41::train
