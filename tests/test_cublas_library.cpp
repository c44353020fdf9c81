// cuBLAS and cuBLASLt are opened when the CUDA backend first needs them, not when a process that
// links the backend starts: a process that runs on the CPU never pays their half-second load.
// The test needs no GPU: the libraries load, and resolve, without one.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "graph/runner_factory.h"
#include "model/llama_weights.h"
#include "tests/support/shared_data.h"
#ifdef PIPELINE_HAVE_CUDA
#include "kernels/cuda/cublas_library.h"
#endif

namespace pipeline {
namespace {

#ifdef PIPELINE_HAVE_CUDA

// Whether cuBLAS is loaded depends on what the process did before, so the check that it is not
// and the first use that loads it are one test.
TEST(CublasLibrary, IsOpenedOnFirstUseNotAtStartOrForTheCpu) {
  EXPECT_FALSE(cuda::cublas_loaded()) << "cuBLAS was loaded when the process started";
  const auto weights = std::make_shared<const LlamaWeights>(
      LlamaWeights::load(testing::shared_path("models/stories260K")));
  RunnerOptions options;
  options.kv_cache_blocks = 16;
  options.threads = 1;
  const auto runner = make_runner("cpu", weights, options);
  ASSERT_NE(runner, nullptr);
  EXPECT_FALSE(cuda::cublas_loaded()) << "making a CPU runner loaded cuBLAS";

  const cuda::CublasLibrary& library = cuda::cublas();
  EXPECT_TRUE(cuda::cublas_loaded());
  // cublas() returned, so every entry point resolved; two that need no device answer.
  EXPECT_STREQ(library.GetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_NE(std::string(library.GetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)), "");
  for (const void* entry :
       {reinterpret_cast<const void*>(library.Create),
        reinterpret_cast<const void*>(library.GemmEx),
        reinterpret_cast<const void*>(library.LtMatmul),
        reinterpret_cast<const void*>(library.LtMatmulAlgoConfigGetAttribute)}) {
    EXPECT_NE(entry, nullptr);
  }
  EXPECT_EQ(&cuda::cublas(), &library) << "opened twice";
}

#else

TEST(CublasLibrary, IsOpenedOnFirstUseNotAtStartOrForTheCpu) {
  GTEST_SKIP() << "no CUDA device: built without the CUDA backend";
}

#endif

}  // namespace
}  // namespace pipeline
