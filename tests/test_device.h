#pragma once
// The executor the engine's tests (server, scheduler) run on: the CPU, and again CUDA where
// tests/CMakeLists.txt registers them a second time with DSV41_TEST_DEVICE=cuda (label gpu).
#include <cstdlib>

#include "engine/executors.h"

namespace dsv41::test {

inline Device test_device() {
  const char* name = std::getenv("DSV41_TEST_DEVICE");
  return name ? parse_device(name) : Device::Cpu;
}

}  // namespace dsv41::test
