// The CUDA backend's training kernels (engine/optim.h TrainKernels): AdamW on flat float32
// buffers (the element update is engine/optim.h adamw_element, the CPU's), a deterministic
// sum of squares (fixed chunks summed in double, the chunk sums added in order on the host),
// scale, fill and the EMA update. With them the trainer keeps parameters, gradients and
// optimizer state on the GPU.
#include <vector>

#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per block of the sum of squares

__global__ void adamw_kernel(AdamWScalars s, float* p, const float* g, float* m, float* v, int64_t n) {
  GRID_LOOP(j, n) adamw_element(s, p[j], g[j], m[j], v[j]);
}

__global__ void scale_kernel(float* x, int64_t n, float f) {
  GRID_LOOP(j, n) x[j] *= f;
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  GRID_LOOP(j, n) x[j] = value;
}

__global__ void ema_kernel(float* s, const float* p, int64_t n, float d, float w) {
  GRID_LOOP(j, n) s[j] = d * s[j] + w * p[j];
}

// Block b: the sum of x[j]^2 over its chunk, in double, in a fixed order.
__global__ void sum_squares_kernel(const float* x, int64_t n, double* part) {
  __shared__ double acc[kThreads];
  const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) s += (double)x[j] * x[j];
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if ((int)threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = acc[0];
}

void adamw(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t n) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(s, p, g, m, v, n);
  CUDA_LAUNCHED();
}

double sum_squares(const float* x, int64_t n) {
  if (n == 0) return 0;
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  Scratch part(blocks * sizeof(double));
  sum_squares_kernel<<<(unsigned)blocks, kThreads, 0, ctx().stream>>>(x, n, (double*)part.p);
  CUDA_LAUNCHED();
  std::vector<double> host(blocks);
  CUDA_CHECK(cudaMemcpyAsync(host.data(), part.p, blocks * sizeof(double), cudaMemcpyDeviceToHost, ctx().stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  double s = 0;
  for (double v : host) s += v;
  return s;
}

void scale(float* x, int64_t n, float f) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(x, n, f);
  CUDA_LAUNCHED();
}

void fill(float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(x, n, value);
  CUDA_LAUNCHED();
}

void ema(float* s, const float* p, int64_t n, float d, float w) {
  if (n == 0) return;
  ema_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(s, p, n, d, w);
  CUDA_LAUNCHED();
}

}  // namespace

const TrainKernels& train_kernels() {
  static const TrainKernels k{adamw, sum_squares, scale, fill, ema};
  return k;
}

}  // namespace wxe::cuda
