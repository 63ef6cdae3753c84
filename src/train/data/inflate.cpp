#include "train/data/inflate.h"

#include <zlib.h>

#include "base/error.h"

namespace dsv41::train {

std::string inflate(std::string_view compressed, const std::string& where) {
  z_stream z{};
  // 15 + 32: the largest window, and a gzip or zlib header detected from the data.
  if (inflateInit2(&z, 15 + 32) != Z_OK) fail(where, "zlib to initialise", "an error");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  z.avail_in = uInt(compressed.size());
  std::string out;
  char buffer[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buffer);
    z.avail_out = sizeof buffer;
    rc = ::inflate(&z, Z_NO_FLUSH);
    out.append(buffer, sizeof buffer - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // the input ends before the stream does
  }
  const std::string message = z.msg ? z.msg : "";
  inflateEnd(&z);
  if (rc != Z_STREAM_END)
    fail(where, "a whole gzip or zlib stream", rc == Z_BUF_ERROR ? "data cut short" : "corrupt data (" + message + ")");
  return out;
}

}  // namespace dsv41::train
