#include "train/data/dedup.h"

#include <xxhash.h>

#include <vector>

namespace dsv41::train {

std::string fingerprint(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    const bool keep = u >= 0x80 || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!keep) {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

Verdict Deduplicator::offer(std::string_view text) {
  const std::string whole = fingerprint(text);
  const XXH128_hash_t h = XXH3_128bits(whole.data(), whole.size());
  const std::pair<uint64_t, uint64_t> key{h.low64, h.high64};
  if (documents_.count(key)) return Verdict::exact_duplicate;

  std::vector<uint64_t> line_hashes;
  size_t counted = 0, seen = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string line = fingerprint(text.substr(pos, eol - pos));
    pos = eol + 1;
    if (line.size() < kMinLineChars) continue;
    const uint64_t lh = XXH3_64bits(line.data(), line.size());
    counted += line.size();
    if (lines_.count(lh)) seen += line.size();
    line_hashes.push_back(lh);
  }
  if (counted > 0 && double(seen) >= near_fraction_ * double(counted)) return Verdict::near_duplicate;

  documents_.insert(key);
  lines_.insert(line_hashes.begin(), line_hashes.end());
  return Verdict::kept;
}

}  // namespace dsv41::train
