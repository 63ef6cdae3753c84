#pragma once
// The executor the engine's tests (server, scheduler) run on: the CPU, and again CUDA where
// tests/CMakeLists.txt registers them a second time with DSV41_TEST_DEVICE=cuda (label gpu), and
// the CPU over two ranks (DSV41_TEST_RANKS=2: the model cut as model.py cuts it, docs/parallel.md).
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/executors.h"

namespace dsv41::test {

inline Device test_device() {
  const char* name = std::getenv("DSV41_TEST_DEVICE");
  return name ? parse_device(name) : Device::Cpu;
}

inline int test_ranks() {
  const char* n = std::getenv("DSV41_TEST_RANKS");
  return n ? std::stoi(n) : 1;
}

inline std::unique_ptr<Executor> test_executor(const Model& model) {
  return make_executor(model, test_device(), std::nullopt, test_ranks());
}

}  // namespace dsv41::test
