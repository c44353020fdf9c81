// cuBLAS and cuBLASLt, opened when the first CUDA runner needs them rather than when the program
// starts. Their static initialisers take about half a second of every process that links them,
// and most processes never use them: the CPU backend, the command line's other commands, the
// tests on machines without a GPU. The backend calls them through cublas(), whose entry points
// are the libraries' own functions, named without their cublas prefix.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace pipeline::cuda {

struct CublasLibrary {
  // cuBLAS (cublas_v2.h's names: Create is cublasCreate_v2, and so on).
  decltype(&::cublasCreate) Create;
  decltype(&::cublasDestroy) Destroy;
  decltype(&::cublasSetMathMode) SetMathMode;
  decltype(&::cublasSetStream) SetStream;
  decltype(&::cublasSetWorkspace) SetWorkspace;
  // The library's own cublasGemmEx, which takes a compute type, not the header's inline overload
  // that takes a cudaDataType for one.
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t);
  decltype(&::cublasGetStatusName) GetStatusName;
  decltype(&::cublasGetStatusString) GetStatusString;
  // cuBLASLt.
  decltype(&::cublasLtCreate) LtCreate;
  decltype(&::cublasLtDestroy) LtDestroy;
  decltype(&::cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
  decltype(&::cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulAlgoCheck) LtMatmulAlgoCheck;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) LtMatmulAlgoConfigGetAttribute;
  decltype(&::cublasLtMatmul) LtMatmul;
};

// The libraries of the cuBLAS major version this was compiled against (libcublas.so.N and
// libcublasLt.so.N, found as the dynamic loader finds any library), opened on the first call.
// Throws std::runtime_error naming the library or function it could not load; a later call
// tries again.
const CublasLibrary& cublas();

// Whether this process has loaded cuBLAS (by cublas() or otherwise), without loading it: the
// test that a process starts without it asks.
bool cublas_loaded();

}  // namespace pipeline::cuda
