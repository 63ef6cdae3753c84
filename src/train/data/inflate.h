#pragma once
// Decompression of the packaged corpus files: gzip (.gz, and dictd's .dict.dz, which is gzip
// with an index in its header) and zlib streams (blocks of R's lazy-load databases), by zlib.
#include <string>
#include <string_view>

namespace dsv41::train {

// The data of one gzip or zlib stream (the header says which). `where` names the input in
// errors, e.g. "/usr/share/doc/jargon-text/jargon.txt.gz: expected a gzip or zlib stream, ...".
std::string inflate(std::string_view compressed, const std::string& where);

}  // namespace dsv41::train
