// The guard of "the same answers on every x86-64 CPU" (docs/forward.md, "Summation order"): the
// CPU forward's logits are the same bits whichever GEMM code path runs (scalar, AVX2, AVX-512:
// every one this CPU has) and on 1 or 2 threads; `dsv41 generate` prints the same tokens under
// every such setting, whatever OpenBLAS kernel the environment names; and no BLAS, whose kernels
// each sum in their own order, is in the process at all.
#include <gtest/gtest.h>
#include <omp.h>

#include <fstream>

#include "backend/cpu/gemm.h"
#include "forward_fixture.h"
#include "test_util.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

std::vector<GemmIsa> available() {
  std::vector<GemmIsa> out;
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (cpu_has(isa)) out.push_back(isa);
  return out;
}

class Determinism : public testing::TestWithParam<std::string> {};

// The 300-token prompt (every layer kind, top-k choices, window wraps) and its 8 decode steps,
// every row's logits, against the scalar path on one thread.
TEST_P(Determinism, LogitsAreTheSameOnEveryPathAndThreadCount) {
  Fixture f(GetParam());
  const GemmIsa isa_before = gemm_isa();
  const int threads_before = omp_get_max_threads();
  set_gemm_isa(GemmIsa::Scalar);
  omp_set_num_threads(1);
  const Logits want = f.run(2, false);
  for (GemmIsa isa : available())
    for (int threads : {1, 2}) {
      set_gemm_isa(isa);
      omp_set_num_threads(threads);
      const Logits got = f.run(2, false);
      EXPECT_EQ(got.prefill, want.prefill) << isa_name(isa) << ", " << threads << " thread(s)";
      EXPECT_EQ(got.decode, want.decode) << isa_name(isa) << ", " << threads << " thread(s)";
    }
  set_gemm_isa(isa_before);
  omp_set_num_threads(threads_before);
}

// What a user sees: greedy tokens, exact mode, on each fixture, under every GEMM path, thread
// count and OpenBLAS core type (which must not matter: there is no BLAS to pick a kernel).
TEST_P(Determinism, GenerateIsTheSameUnderEverySetting) {
  const std::string ids = "0,36,313,301,344,322,262,283,281,75,454,271";
  const std::string args = "generate --model " + fixture_dir(GetParam()) + " --ids " + ids + " --exact --temperature 0 --max-tokens 8 --json";
  auto tokens = [&](const std::string& env) {
    const Outcome r = run_dsv41(args, env);
    EXPECT_EQ(r.status, 0) << env << ": " << r.output;
    return r.status == 0 ? nlohmann::json::parse(r.output)["generated_ids"].get<std::vector<int>>() : std::vector<int>{};
  };
  const std::vector<int> want = tokens("DSV41_CPU_ISA=scalar OMP_NUM_THREADS=1");
  ASSERT_EQ(want.size(), 8u);
  for (GemmIsa isa : available())
    for (const char* threads : {"1", "2"})
      for (const char* core : {"Haswell", "SkylakeX", "Cooperlake", "Zen"}) {
        const std::string env = std::string("DSV41_CPU_ISA=") + isa_name(isa) + " OMP_NUM_THREADS=" + threads +
                                " OPENBLAS_CORETYPE=" + core;
        EXPECT_EQ(tokens(env), want) << env;
      }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Determinism, testing::ValuesIn(test::kFixtures), test::FixtureName());

// The process (which links every layer of the engine) maps no BLAS library.
TEST(Determinism, NoBlasInTheProcess) {
  std::ifstream maps("/proc/self/maps");
  ASSERT_TRUE(maps.good());
  std::string line;
  int libraries = 0;
  while (std::getline(maps, line)) {
    libraries += line.find(".so") != std::string::npos;
    for (const char* blas : {"openblas", "libblas", "mkl_", "libblis", "atlas"}) EXPECT_EQ(line.find(blas), std::string::npos) << line;
  }
  EXPECT_GT(libraries, 0) << "no shared library seen in /proc/self/maps";
}

// A named path the CPU lacks, or no such path, is refused with the choices named.
TEST(Determinism, RefusesAnUnknownPath) {
  const Outcome r = run_dsv41("generate --model " + fixture_dir("v41-tiny") + " --ids 0,36 --max-tokens 1", "DSV41_CPU_ISA=sse9");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("DSV41_CPU_ISA: expected scalar, avx2 or avx512, found sse9"), std::string::npos) << r.output;
}

}  // namespace
