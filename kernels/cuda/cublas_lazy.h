// cuBLAS, loaded when the CUDA backend first needs it (dlopen), not linked: linking it costs
// every wxe process about 210 MB of resident memory at start-up (libcublasLt's relocations and
// initializers), CPU runs and each MPI rank included. The calls the backend makes go through
// these pointers; cuda_util.h's CUBLAS_CHECK reads the status string through them too.
#pragma once
#include <cublas_v2.h>

namespace wxe::cuda {

struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // the exported C functions (the header's C++ overloads taking cudaDataType are inline wrappers)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The library's name (libcublas.so.<major> of the toolkit this was built with).
const char* cublas_library_name();
// Loaded on the first call (the soname, then beside the CUDA runtime this process loaded);
// a one-line error naming the library and dlerror's reason when it or a symbol is missing.
const Cublas& cublas();

}  // namespace wxe::cuda
