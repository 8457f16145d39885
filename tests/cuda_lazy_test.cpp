// cuBLAS loaded at first use (kernels/cuda/cublas_lazy.h): found and bound on a machine with the
// toolkit, GPU or not (tests/cli_test.sh checks that wxe itself does not link it).
#ifdef WXE_HAVE_CUDA
#include <string>

#include "kernels/cuda/cublas_lazy.h"
#include "tests/test_util.h"  // IWYU pragma: keep

TEST(CudaLazyCublas, LoadsAndBindsEverySymbol) {
  const wxe::cuda::Cublas& b = wxe::cuda::cublas();
  EXPECT_NE(b.create, nullptr);
  EXPECT_NE(b.set_stream, nullptr);
  EXPECT_NE(b.set_math_mode, nullptr);
  EXPECT_NE(b.gemm_ex, nullptr);
  EXPECT_NE(b.gemm_strided_batched_ex, nullptr);
  ASSERT_NE(b.status_string, nullptr);
  // a call into the library that needs no GPU
  const std::string what = b.status_string(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_FALSE(what.empty()) << what;
  EXPECT_NE(what, b.status_string(CUBLAS_STATUS_SUCCESS));
  EXPECT_EQ(&wxe::cuda::cublas(), &b);  // loaded once
}
#endif
