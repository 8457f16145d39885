// The CUDA backend's training kernels (train/optim.h TrainKernels): AdamW on flat float32
// buffers (the element update is train/optim.h adamw_element, the CPU's), deterministic
// sums of squares per segment (fixed chunks summed in double, then the chunk sums in order;
// one copy to the host for all segments), scale, fill and the EMA update; and the
// deterministic sum of products other kernels use. With them the trainer keeps parameters,
// gradients and optimizer state on the GPU.
#include <vector>

#include "kernels/cuda/block_sum.cuh"

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

// Block b: the sum of a[j] b[j] (b null: a[j]^2) over its chunk, in double, in a fixed order.
__global__ void products_kernel(const float* a, const float* b, int64_t n, double* part) {
  const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
  double s = 0;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) s += (double)a[j] * (b ? b[j] : a[j]);
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// One block: *out = the sum of part[0..n) in a fixed order.
__global__ void sum_kernel(const double* part, int64_t n, double* out) {
  double s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += part[j];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

void adamw(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t n) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(s, p, g, m, v, n);
  CUDA_LAUNCHED();
}

void segment_sum_squares(const float* x, const std::vector<int64_t>& bounds, double* out) {
  const size_t segments = bounds.empty() ? 0 : bounds.size() - 1;
  if (segments == 0) return;
  Scratch sums(segments * sizeof(double));
  for (size_t i = 0; i < segments; ++i)
    launch_sum_products(x + bounds[i], nullptr, bounds[i + 1] - bounds[i], (double*)sums.p + i);
  CUDA_CHECK(cudaMemcpyAsync(out, sums.p, segments * sizeof(double), cudaMemcpyDeviceToHost, ctx().stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
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

void launch_sum_products(const float* a, const float* b, int64_t n, double* out) {
  const int64_t blocks = n > 0 ? (n + kChunk - 1) / kChunk : 1;
  Scratch part(blocks * sizeof(double));
  if (n > 0) {
    products_kernel<<<(unsigned)blocks, kThreads, 0, ctx().stream>>>(a, b, n, (double*)part.p);
    CUDA_LAUNCHED();
  }
  sum_kernel<<<1, kThreads, 0, ctx().stream>>>((double*)part.p, n > 0 ? blocks : 0, out);
  CUDA_LAUNCHED();
}

const TrainKernels& train_kernels() {
  static const TrainKernels k{adamw, segment_sum_squares, scale, fill, ema};
  return k;
}

}  // namespace wxe::cuda
