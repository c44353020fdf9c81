#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace pipeline::cuda {

namespace {

// The library of the cuBLAS major version the headers are: "libcublasLt" -> libcublasLt.so.13.
std::string library_name(const char* stem) {
  return std::string(stem) + ".so." + std::to_string(CUBLAS_VER_MAJOR);
}

void* open_library(const std::string& name) {
  // Never closed: the handles and descriptors made through it live as long as the process.
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) throw std::runtime_error("cannot load " + name + ": " + dlerror());
  return library;
}

template <typename Function>
void resolve(void* library, const char* library_name, const char* symbol, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  if (!function) {
    throw std::runtime_error(std::string(library_name) + " has no " + symbol +
                             " (a cuBLAS older than the headers this was built with?)");
  }
}

// The symbol's name after macro expansion: cublasCreate is cublasCreate_v2.
#define PIPELINE_SYMBOL_NAME(symbol) PIPELINE_SYMBOL_NAME_EXPANDED(symbol)
#define PIPELINE_SYMBOL_NAME_EXPANDED(symbol) #symbol
#define PIPELINE_RESOLVE(library, field, symbol) \
  resolve(library##_handle, library##_name.c_str(), PIPELINE_SYMBOL_NAME(symbol), loaded.field)

CublasLibrary load() {
  // cuBLASLt first: cuBLAS needs it, and an error then names the library that is missing.
  const std::string lt_name = library_name("libcublasLt");
  void* const lt_handle = open_library(lt_name);
  const std::string blas_name = library_name("libcublas");
  void* const blas_handle = open_library(blas_name);
  CublasLibrary loaded{};
  PIPELINE_RESOLVE(blas, Create, cublasCreate);
  PIPELINE_RESOLVE(blas, Destroy, cublasDestroy);
  PIPELINE_RESOLVE(blas, SetMathMode, cublasSetMathMode);
  PIPELINE_RESOLVE(blas, SetStream, cublasSetStream);
  PIPELINE_RESOLVE(blas, SetWorkspace, cublasSetWorkspace);
  PIPELINE_RESOLVE(blas, GemmEx, cublasGemmEx);
  PIPELINE_RESOLVE(blas, GetStatusName, cublasGetStatusName);
  PIPELINE_RESOLVE(blas, GetStatusString, cublasGetStatusString);
  PIPELINE_RESOLVE(lt, LtCreate, cublasLtCreate);
  PIPELINE_RESOLVE(lt, LtDestroy, cublasLtDestroy);
  PIPELINE_RESOLVE(lt, LtMatmulDescCreate, cublasLtMatmulDescCreate);
  PIPELINE_RESOLVE(lt, LtMatmulDescDestroy, cublasLtMatmulDescDestroy);
  PIPELINE_RESOLVE(lt, LtMatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
  PIPELINE_RESOLVE(lt, LtMatrixLayoutCreate, cublasLtMatrixLayoutCreate);
  PIPELINE_RESOLVE(lt, LtMatrixLayoutDestroy, cublasLtMatrixLayoutDestroy);
  PIPELINE_RESOLVE(lt, LtMatmulPreferenceCreate, cublasLtMatmulPreferenceCreate);
  PIPELINE_RESOLVE(lt, LtMatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy);
  PIPELINE_RESOLVE(lt, LtMatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
  PIPELINE_RESOLVE(lt, LtMatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
  PIPELINE_RESOLVE(lt, LtMatmulAlgoCheck, cublasLtMatmulAlgoCheck);
  PIPELINE_RESOLVE(lt, LtMatmulAlgoConfigGetAttribute, cublasLtMatmulAlgoConfigGetAttribute);
  PIPELINE_RESOLVE(lt, LtMatmul, cublasLtMatmul);
  return loaded;
}

#undef PIPELINE_RESOLVE
#undef PIPELINE_SYMBOL_NAME_EXPANDED
#undef PIPELINE_SYMBOL_NAME

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary library = load();  // a load that throws is tried again next call
  return library;
}

bool cublas_loaded() {
  void* const library = dlopen(library_name("libcublasLt").c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (library) dlclose(library);  // what RTLD_NOLOAD's handle added to the count
  return library != nullptr;
}

}  // namespace pipeline::cuda
