// The CUDA kernels of the fused WindowAttention (kernels/cpu/window_attention.h): the token
// gather and scatter, and the attention rows (one thread per query token; the window's keys
// and values of one head, and each thread's query and output rows, in shared memory). The projections run on cuBLAS
// (linalg.cpp). The math is index_math.h's window_token_offset and attention_row, which
// tests/cuda_index_test.cpp runs on the host against the CPU reference.
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

__global__ void gather_kernel(cpu::WindowGeom g, const float* x, float* rows, int64_t total) {
  GRID_LOOP(i, total) rows[i] = x[window_token_offset(g, i / g.D, i % g.D)];
}

__global__ void scatter_kernel(cpu::WindowGeom g, const float* rows, const float* bo, const float* res, float* y,
                               int64_t total) {
  GRID_LOOP(i, total) {
    const int64_t c = i % g.D, at = window_token_offset(g, i / g.D, c);
    const float a = rows[i] + (bo ? bo[c] : 0.f);
    y[at] = res ? a + res[at] : a;
  }
}

// Shared floats of a staged block: the head's keys and values (T x dh each), then per thread
// its query row and its output row (dh + 1 apart: a thread's rows start in different banks).
int64_t staged_floats(int64_t T, int64_t dh, int threads) { return 2 * T * dh + 2 * (int64_t)threads * (dh + 1); }

// Block (window bw, head h), one attention row per query token. Staged: keys, values, each
// thread's query row and its accumulating output row in shared memory, the output row copied
// out at the end; otherwise everything in global memory (heads too large for shared memory).
// bias_hs: floats between two heads' position biases (0: one bias for every head).
__global__ void attention_kernel(int64_t T, int64_t I, int64_t heads, float scale, const float* q, const float* k,
                                 const float* v, const float* bias, int64_t bias_hs, float* o, bool staged) {
  extern __shared__ float sm[];
  const int64_t bw = blockIdx.x / heads, h = blockIdx.x % heads, dh = I / heads;
  const int64_t base = bw * T * I + h * dh;
  if (!staged) {
    for (int64_t i = threadIdx.x; i < T; i += blockDim.x)
      attention_row(q + base + i * I, k + base, v + base, I, bias + h * bias_hs + i * T, T, dh, scale, o + base + i * I);
    return;
  }
  float *ks = sm, *vs = sm + T * dh;
  for (int64_t e = threadIdx.x; e < T * dh; e += blockDim.x) {
    const int64_t j = e / dh, d = e % dh;
    ks[e] = k[base + j * I + d];
    vs[e] = v[base + j * I + d];
  }
  __syncthreads();
  float* qs = vs + T * dh + threadIdx.x * (dh + 1);
  float* os = vs + T * dh + (blockDim.x + threadIdx.x) * (dh + 1);
  for (int64_t i = threadIdx.x; i < T; i += blockDim.x) {
    for (int64_t d = 0; d < dh; ++d) qs[d] = q[base + i * I + d];
    attention_row(qs, ks, vs, dh, bias + h * bias_hs + i * T, T, dh, scale, os);
    for (int64_t d = 0; d < dh; ++d) o[base + i * I + d] = os[d];
  }
}

// Largest dynamic shared memory a block may opt into on this device.
size_t shared_limit() {
  static const size_t limit = [] {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx().device));
    return (size_t)v;
  }();
  return limit;
}

}  // namespace

void launch_window_gather(const cpu::WindowGeom& g, const float* x, float* rows) {
  const int64_t total = g.B * g.nW * g.T * g.D;
  if (total == 0) return;
  gather_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(g, x, rows, total);
  CUDA_LAUNCHED();
}

void launch_window_scatter(const cpu::WindowGeom& g, const float* rows, const float* bo, const float* res, float* y) {
  const int64_t total = g.B * g.nW * g.T * g.D;
  if (total == 0) return;
  scatter_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(g, rows, bo, res, y, total);
  CUDA_LAUNCHED();
}

void launch_window_attention(const cpu::WindowGeom& g, float scale, const float* q, const float* k, const float* v,
                             const float* bias, int64_t bias_numel, float* o) {
  const int64_t blocks = g.B * g.nW * g.heads;
  if (blocks == 0 || g.T == 0) return;
  WXE_CHECK(blocks <= INT32_MAX, "WindowAttention: ", blocks, " window heads are too many for one launch");
  const int threads = (int)std::min<int64_t>(128, (g.T + 31) / 32 * 32);
  const size_t bytes = (size_t)staged_floats(g.T, g.I / g.heads, threads) * sizeof(float);
  const bool staged = bytes <= shared_limit();
  if (staged && bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  attention_kernel<<<(unsigned)blocks, threads, staged ? bytes : 0, ctx().stream>>>(g.T, g.I, g.heads, scale, q, k, v,
                                                                                     bias, cpu::bias_head_stride(g, bias_numel), o,
                                                                                     staged);
  CUDA_LAUNCHED();
}

}  // namespace wxe::cuda
