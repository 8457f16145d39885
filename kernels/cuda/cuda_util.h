// Private plumbing of the CUDA backend: error checks, the process-wide context (one GPU, one
// stream, cuBLAS and cuDNN handles, a grow-only workspace), and the launchers that the op
// files share. Every CUDA, cuBLAS and cuDNN call and every kernel launch is checked.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>
#include <vector>

#include "engine/exec/backend.h"
#include "engine/ir/ops.h"
#include "kernels/cuda/cublas_lazy.h"
#include "kernels/cuda/index_math.h"

namespace wxe::cuda {

#define CUDA_CHECK(call)                                                                    \
  do {                                                                                      \
    cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) ::wxe::fail("cuda: ", cudaGetErrorString(err_), " (", #call, ")"); \
  } while (0)
#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::wxe::fail("cublas: ", ::wxe::cuda::cublas().status_string(st_), " (", #call, ")");                \
  } while (0)
#define CUDNN_CHECK(call)                                                                   \
  do {                                                                                      \
    cudnnStatus_t st_ = (call);                                                             \
    if (st_ != CUDNN_STATUS_SUCCESS) ::wxe::fail("cudnn: ", cudnnGetErrorString(st_), " (", #call, ")"); \
  } while (0)
// After a kernel launch.
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

// Bad input in a kernel, naming the node.
#define NCHECK(cond, ...) WXE_CHECK(cond, "node ", n.name, " (", n.op, "): ", __VA_ARGS__)

using Ins = std::vector<const Tensor*>;
using Outs = std::vector<Tensor*>;

struct Context {
  int device = 0;  // the node-local rank modulo the visible GPUs
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
};
// Created at the first use (never at registration: the tables exist without a GPU).
Context& ctx();
// Device scratch of at least `bytes`, valid until the next call (kernels run in stream order,
// so consecutive users may share it).
void* workspace(size_t bytes);

constexpr int kThreads = 256;  // threads per block of the elementwise kernels

// Grid-stride loop of a kernel over i < n (in .cu files).
#define GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : (b > 65535LL * 512 ? 65535LL * 512 : b));
}

// Device scratch allocated and freed in stream order (kernels may still read it when the
// host returns).
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes) { CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 4, ctx().stream)); }
  ~Scratch() { cudaFreeAsync(p, ctx().stream); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* f() { return (float*)p; }
};

// Fails naming the node unless every present input is float32.
void require_f32(const Node& n, const Ins& in);

// dst[walk side b] = src[walk side a], elements of elem_size bytes (1, 2, 4 or 8).
void launch_copy(const Walk& w, const void* src, void* dst, size_t elem_size);
// y (P, N, Q) += bias[j] (if bias), then GELU (if gelu).
void launch_bias_act(float* y, const float* bias, int64_t P, int64_t N, int64_t Q, bool gelu);

// y = x padded as p says (constant value where p gives no source), y contiguous.
void launch_pad(const PadIndex& p, int64_t total, const float* x, float* y, float value);
// Concat and Split (pointwise.cu): part is the block of `big` along `axis` from `start`; copied
// from part into big (to_big) or from big into part.
void part_copy(const Node& n, const Tensor& big, const Tensor& part, int64_t axis, int64_t start, bool to_big);
// Slice's output as a strided view of its input (element offset, strides, shape), pointwise.cu.
struct StridedView {
  int64_t base = 0;
  std::vector<int64_t> strides;
  Shape shape;
};
StridedView slice_view(const Node& n, const Ins& in);
// The walk of a binary op's output over two operands broadcast to `out` (pointwise.cu).
Walk broadcast_walk(const Node& n, const Shape& a, const Shape& b, const Shape& out);
// Resize's taps for the device (pointwise.cu): cpu::resize_axis_taps (from the input's shape and
// the host inputs roi, scales, sizes) as a ResizeIndex, with the taps' int64 indices and float32
// weights to copy into device memory of bytes() (upload; the weights at weights(dev)).
struct ResizeTaps {
  ResizeIndex r;
  std::vector<int64_t> idx;
  std::vector<float> w;
  size_t idx_bytes() const { return idx.size() * sizeof(int64_t); }
  size_t bytes() const { return idx_bytes() + w.size() * sizeof(float) + 16; }
  const float* weights(const void* dev) const { return (const float*)((const uint8_t*)dev + idx_bytes()); }
  void upload(void* dev) const;  // waits for the copies: the sources are pageable
};
ResizeTaps resize_taps(const Node& n, const Ins& in, const Shape& out);
// y (contiguous, total elements) = the einsum of up to 3 operands (EinsumIndex in index_math.h).
void launch_einsum_generic(const EinsumIndex& e, const std::vector<const float*>& src, float* y, int64_t total);

// dst (shape `to`, which broadcasts to `from`) = scale * full (contiguous, shape `from`) summed
// over the broadcast dims; deterministic (double accumulation in a fixed order).
void launch_sum_to(const Node& n, const float* full, const Shape& from, float* dst, const Shape& to, float scale = 1.f);
// Zeros a device tensor (nullptr: nothing).
void launch_zero(Tensor* t);
// gz = g * GELU'(z) (the exact, erf form), n elements; gz may be z.
void launch_gelu_grad(const float* z, const float* g, float* gz, int64_t n);

// WindowAttention's pieces (attention.cu; index_math.h has their math): the windows' token
// rows (B nW T, D) gathered from x (B, D, H, W); o (B nW T, I) = the attention of q, k, v
// (same layout) per window and head (bias_numel: heads * T * T, or T * T for one bias every
// head); y[token pixels] = rows + bo (+ res), each optional.
void launch_window_gather(const cpu::WindowGeom& g, const float* x, float* rows);
void launch_window_attention(const cpu::WindowGeom& g, float scale, const float* q, const float* k, const float* v,
                             const float* bias, int64_t bias_numel, float* o);
void launch_window_scatter(const cpu::WindowGeom& g, const float* rows, const float* bo, const float* res, float* y);

// The optimizer's kernels on device buffers (optim.cu), the backend's train_kernels().
const TrainKernels& train_kernels();
// *out (device double) = sum of a[i] b[i] (b null: a[i]^2) over n floats: chunks of 16384
// summed in double, then the chunk sums, each in a fixed order (deterministic). optim.cu.
void launch_sum_products(const float* a, const float* b, int64_t n, double* out);

// Registration of each op group into the CUDA backend's table (kernels/cuda/*).
void register_pointwise(TableBackend& b);  // pointwise.cu: elementwise, copies, Pad, Resize
void register_norm(TableBackend& b);       // norm.cu: reductions, Softmax, norms, Einsum (generic)
void register_linalg(TableBackend& b);     // linalg.cpp: Linear, MatMul, Gemm, Einsum, Conv, ConvTranspose
                                           //   (forward and backward), WindowAttention (forward)
void register_backward_kernels(TableBackend& b);  // backward.cu: the other ops' backward kernels
void register_spectral_norm(TableBackend& b);    // spectral_norm.cu: SpectralNorm, forward and backward
void register_gather(TableBackend& b);           // gather.cu: Gather, forward and backward

}  // namespace wxe::cuda
