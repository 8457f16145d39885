// SpectralNorm on the CUDA backend (kernels/cpu/spectral_norm.cpp has the op and
// engine/math/spectral_norm_math.h the math): the power iteration updates u and v in place in the
// device's memory (the trainer copies them to the host for checkpoints), W = weight_orig /
// sigma, and the backward (g - sum(g W) u v^T) / sigma. Matrix-vector products one thread per
// output, accumulated in double in the CPU's order; norms and dots by block_sum (deterministic).
// The element <-> (row, col) maps are engine/math/spectral_norm_math.h's sn::offset / sn::row_col.
#include "engine/math/spectral_norm_math.h"
#include "kernels/cuda/block_sum.cuh"

namespace wxe::cuda {

namespace {

// out[row] = sum over col of W_mat[row, col] v[col]
__global__ void wv_kernel(sn::MatrixIndex s, const float* w, const float* v, double* out) {
  GRID_LOOP(row, s.rows) {
    double a = 0;
    for (int64_t col = 0; col < s.cols; ++col) a += (double)w[sn::offset(s, row, col)] * v[col];
    out[row] = a;
  }
}

// out[col] = sum over row of W_mat[row, col] u[row]
__global__ void wtu_kernel(sn::MatrixIndex s, const float* w, const float* u, double* out) {
  GRID_LOOP(col, s.cols) {
    double a = 0;
    for (int64_t row = 0; row < s.rows; ++row) a += (double)w[sn::offset(s, row, col)] * u[row];
    out[col] = a;
  }
}

// One block: dst = x / max(||x||_2, eps), rounded to float.
__global__ void normalize_kernel(const double* x, int64_t n, double eps, float* dst) {
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
  ss = block_sum(ss);
  const double scale = 1.0 / fmax(sqrt(ss), eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = (float)(x[i] * scale);
}

// One block: *sigma = u . wv, rounded to float.
__global__ void sigma_kernel(const float* u, const double* wv, int64_t n, float* sigma) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)u[i] * wv[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *sigma = (float)s;
}

__global__ void divide_kernel(const float* w, const float* sigma, float* y, int64_t n) {
  const float s = *sigma;
  GRID_LOOP(e, n) y[e] = w[e] / s;
}

__global__ void sn_grad_kernel(sn::MatrixIndex s, const float* g, const double* gW, const float* u, const float* v,
                               const float* sigma, float* gw, int64_t n) {
  const double sg = *sigma, gw0 = *gW;
  GRID_LOOP(e, n) {
    int64_t row, col;
    sn::row_col(s, e, &row, &col);
    gw[e] = (float)((g[e] - gw0 * u[row] * v[col]) / sg);
  }
}

sn::MatrixIndex sn_index(const Node& n, const Shape& w) {
  const int64_t dim = n.i("dim", 0);
  NCHECK((dim == 0 || dim == 1) && (int64_t)w.size() > dim, "dim ", dim, " does not fit weight_orig ",
         shape_str(w));
  return sn::matrix_index(sn::geometry((int)dim, w));
}

// sigma (device float) = u . (W_mat v); scratch holds W_mat v (rows doubles).
void launch_sigma(const sn::MatrixIndex& s, const float* w, const float* u, const float* v, double* wv, float* sigma) {
  wv_kernel<<<blocks_for(s.rows), kThreads, 0, ctx().stream>>>(s, w, v, wv);
  CUDA_LAUNCHED();
  sigma_kernel<<<1, kThreads, 0, ctx().stream>>>(u, wv, s.rows, sigma);
  CUDA_LAUNCHED();
}

void spectral_norm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const sn::MatrixIndex s = sn_index(n, in[0]->shape);
  const int64_t N = in[0]->numel();
  if (N == 0) return;
  const float* w = in[0]->data<float>();
  // u and v are the op's buffers: updated in place (kernels/cpu/spectral_norm.cpp)
  float* u = const_cast<Tensor*>(in[1])->data<float>();
  float* v = const_cast<Tensor*>(in[2])->data<float>();
  const double eps = n.f("eps", 1e-12f);
  Scratch vec(std::max(s.rows, s.cols) * sizeof(double)), sigma(sizeof(float));
  double* x = (double*)vec.p;
  for (int64_t it = n.i("power_iterations", 0); it > 0; --it) {
    wtu_kernel<<<blocks_for(s.cols), kThreads, 0, ctx().stream>>>(s, w, u, x);
    CUDA_LAUNCHED();
    normalize_kernel<<<1, kThreads, 0, ctx().stream>>>(x, s.cols, eps, v);
    CUDA_LAUNCHED();
    wv_kernel<<<blocks_for(s.rows), kThreads, 0, ctx().stream>>>(s, w, v, x);
    CUDA_LAUNCHED();
    normalize_kernel<<<1, kThreads, 0, ctx().stream>>>(x, s.rows, eps, u);
    CUDA_LAUNCHED();
  }
  launch_sigma(s, w, u, v, x, sigma.f());
  divide_kernel<<<blocks_for(N), kThreads, 0, ctx().stream>>>(w, sigma.f(), out[0]->data<float>(), N);
  CUDA_LAUNCHED();
}

// gin[0] = (g - sum(g W) u v^T) / sigma with the u, v the forward left; u and v get zeros.
void spectral_norm_bw(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  for (size_t i = 1; i < 3 && i < gin.size(); ++i) launch_zero(gin[i]);
  Tensor* gw = gin.empty() ? nullptr : gin[0];
  if (!gw) return;
  if (!gout[0]) return launch_zero(gw);
  const sn::MatrixIndex s = sn_index(n, in[0]->shape);
  const int64_t N = in[0]->numel();
  if (N == 0) return;
  const float *u = in[1]->data<float>(), *v = in[2]->data<float>();
  Scratch wv(s.rows * sizeof(double)), sigma(sizeof(float)), gW(sizeof(double));
  launch_sigma(s, in[0]->data<float>(), u, v, (double*)wv.p, sigma.f());
  launch_sum_products(gout[0]->data<float>(), out[0]->data<float>(), N, (double*)gW.p);
  sn_grad_kernel<<<blocks_for(N), kThreads, 0, ctx().stream>>>(s, gout[0]->data<float>(), (double*)gW.p, u, v,
                                                               sigma.f(), gw->data<float>(), N);
  CUDA_LAUNCHED();
}

}  // namespace

void register_spectral_norm(TableBackend& b) {
  b.register_kernel("SpectralNorm", spectral_norm_op);
  b.register_backward("SpectralNorm", spectral_norm_bw);
}

}  // namespace wxe::cuda
