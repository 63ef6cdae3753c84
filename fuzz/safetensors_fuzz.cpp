// A safetensors file (8-byte header length, JSON header, data) opened from memory through a
// memfd: SafetensorsFile::open either maps it with every tensor checked or refuses it.
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("safetensors_fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size == 0 || ::write(fd, data, size) == ssize_t(size)) {
    dsv41::fuzz::refused_or_ok([&] {
      dsv41::SafetensorsFile file = dsv41::SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
      // Every tensor view lies inside the mapping: read its first and last byte (ASan checks).
      uint64_t sum = 0;
      for (const dsv41::TensorView& t : file.tensors()) {
        if (t.nbytes > 0) sum += t.data[0] + t.data[t.nbytes - 1];
        if (file.find(t.name) != &t) __builtin_trap();
      }
      (void)sum;
    });
  }
  ::close(fd);
  return 0;
}
