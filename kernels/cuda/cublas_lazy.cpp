// cuBLAS through dlopen: see cublas_lazy.h.
#include "kernels/cuda/cublas_lazy.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "engine/ir/error.h"

namespace wxe::cuda {

namespace {

#define WXE_STR2(x) #x
#define WXE_STR(x) WXE_STR2(x)

// The directory of the loaded CUDA runtime (cuBLAS sits beside it in a toolkit), or "".
std::string runtime_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) || !info.dli_fname) return "";
  const std::string f = info.dli_fname;
  const size_t slash = f.rfind('/');
  return slash == std::string::npos ? "" : f.substr(0, slash + 1);
}

template <class F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  WXE_CHECK(fn, cublas_library_name(), ": symbol ", name, " not found (", dlerror(), ")");
}

}  // namespace

const char* cublas_library_name() { return "libcublas.so." WXE_STR(CUBLAS_VER_MAJOR); }

const Cublas& cublas() {
  static const Cublas c = [] {
    void* lib = dlopen(cublas_library_name(), RTLD_NOW | RTLD_LOCAL);
    std::string why = lib ? "" : dlerror();
    if (!lib) {
      const std::string beside = runtime_dir() + cublas_library_name();
      lib = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) why += std::string("; ") + dlerror();
    }
    WXE_CHECK(lib, "device 'cuda' needs cuBLAS: cannot load ", cublas_library_name(), " (", why, ")");
    Cublas r;
    bind(lib, r.create, "cublasCreate_v2");
    bind(lib, r.set_stream, "cublasSetStream_v2");
    bind(lib, r.set_math_mode, "cublasSetMathMode");
    bind(lib, r.gemm_ex, "cublasGemmEx");
    bind(lib, r.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
    bind(lib, r.status_string, "cublasGetStatusString");
    return r;
  }();
  return c;
}

}  // namespace wxe::cuda
