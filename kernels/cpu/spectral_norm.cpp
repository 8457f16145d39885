// SpectralNorm (wxe op): PyTorch's torch.nn.utils.spectral_norm in train mode, as one node.
//
//   inputs   weight_orig (rank >= 1, float32), u (rows), v (cols)
//   attrs    dim (0 or 1, default 0; ConvTranspose weights use 1), power_iterations (default 0),
//            eps (default 1e-12)
//   output   W, shaped like weight_orig
//
// W_mat is weight_orig with dimension `dim` moved first, reshaped to (rows, cols). The forward
// runs `power_iterations` steps of { v = normalize(W_mat^T u); u = normalize(W_mat v) } with
// normalize(x) = x / max(||x||_2, eps), writing u and v back into their input tensors, then
// sigma = u . (W_mat v) (double accumulation, rounded to float) and W = weight_orig / sigma.
// With power_iterations 0 this is the eval-mode fold (engine/layout_rules.h fold_spectral_norm).
// The backward treats u and v as constants (PyTorch detaches them):
//   dL/dweight_orig = (g - sum(g * W) * u v^T) / sigma, u v^T laid out like weight_orig.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops.h"
#include "engine/passes.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {

// weight_orig viewed as (d0, d1, rest); W_mat rows are dim `dim` of (d0, d1).
// Element (a, b, r) sits at (a * d1 + b) * rest + r and is W_mat[a][b * rest + r] for dim 0,
// W_mat[b][a * rest + r] for dim 1.
struct SnDims {
  int dim = 0;
  int64_t d0 = 1, d1 = 1, rest = 1, rows = 1, cols = 1;
};

SnDims sn_dims(const Node& n, const Shape& w) {
  SnDims d;
  const int64_t dim = n.i("dim", 0);
  NCHECK(dim == 0 || dim == 1, "dim must be 0 or 1, got ", dim);
  NCHECK(!w.empty(), "weight_orig must have rank >= 1");
  NCHECK(dim < (int64_t)w.size(), "dim ", dim, " out of range for weight_orig ", shape_str(w));
  d.dim = (int)dim;
  d.d0 = w[0];
  d.d1 = w.size() > 1 ? w[1] : 1;
  const int64_t total = numel(w);
  d.rest = d.d0 * d.d1 ? total / (d.d0 * d.d1) : 0;
  d.rows = dim == 0 ? d.d0 : d.d1;
  d.cols = d.rows ? total / d.rows : 0;
  return d;
}

// f(e, row, col) for every element e of weight_orig, in storage order.
template <class F>
void for_each_wmat(const SnDims& d, F f) {
  for (int64_t a = 0; a < d.d0; ++a)
    for (int64_t b = 0; b < d.d1; ++b)
      for (int64_t r = 0; r < d.rest; ++r) {
        const int64_t e = (a * d.d1 + b) * d.rest + r;
        if (d.dim == 0) f(e, a, b * d.rest + r);
        else f(e, b, a * d.rest + r);
      }
}

// W_mat v (rows), in double.
std::vector<double> wmat_v(const SnDims& d, const float* w, const float* v) {
  std::vector<double> out((size_t)d.rows, 0.0);
  for_each_wmat(d, [&](int64_t e, int64_t row, int64_t col) { out[row] += (double)w[e] * v[col]; });
  return out;
}

// W_mat^T u (cols), in double.
std::vector<double> wmat_t_u(const SnDims& d, const float* w, const float* u) {
  std::vector<double> out((size_t)d.cols, 0.0);
  for_each_wmat(d, [&](int64_t e, int64_t row, int64_t col) { out[col] += (double)w[e] * u[row]; });
  return out;
}

// dst = x / max(||x||_2, eps), rounded to float.
void normalize_into(const std::vector<double>& x, double eps, float* dst) {
  double ss = 0;
  for (double a : x) ss += a * a;
  const double scale = 1.0 / std::max(std::sqrt(ss), eps);
  for (size_t i = 0; i < x.size(); ++i) dst[i] = (float)(x[i] * scale);
}

// sigma = u . (W_mat v), accumulated in double and rounded to float as PyTorch's float32 sigma.
float sigma_of(const SnDims& d, const float* w, const float* u, const float* v) {
  const std::vector<double> wv = wmat_v(d, w, v);
  double s = 0;
  for (int64_t i = 0; i < d.rows; ++i) s += (double)u[i] * wv[i];
  return (float)s;
}

std::vector<TypeShape> spectral_norm_shape(const Node& n, const Values& in) {
  NCHECK(in.size() == 3 && in[0] && in[1] && in[2], "expects inputs weight_orig, u, v");
  const Value &w = *in[0], &u = *in[1], &v = *in[2];
  for (const Value* t : {&w, &u, &v})
    NCHECK(t->dtype == DType::F32, "input '", t->name, "' must be float32, got ", dtype_name(t->dtype));
  const SnDims d = sn_dims(n, w.shape);
  NCHECK(n.i("power_iterations", 0) >= 0, "power_iterations must be >= 0, got ",
         n.i("power_iterations", 0));
  NCHECK(n.f("eps", 1e-12f) > 0, "eps must be > 0, got ", n.f("eps", 1e-12f));
  NCHECK(u.shape == Shape{d.rows} && v.shape == Shape{d.cols}, "u ", shape_str(u.shape), " / v ",
         shape_str(v.shape), " do not fit weight_orig ", shape_str(w.shape), " at dim ", d.dim,
         ": expected (", d.rows, ") and (", d.cols, ")");
  return {{DType::F32, w.shape}};
}

void spectral_norm_kernel(const Node& n, const Ins& in, const Outs& out) {
  const SnDims d = sn_dims(n, in[0]->shape);
  const float* w = in[0]->data<float>();
  // u and v are buffers this op owns (PyTorch's weight_u / weight_v): the power iteration
  // updates them in place, and the training executor shares their storage with the graph so
  // the next forward starts from the updated vectors. Hence the const_cast.
  float* u = const_cast<Tensor*>(in[1])->data<float>();
  float* v = const_cast<Tensor*>(in[2])->data<float>();
  const double eps = n.f("eps", 1e-12f);
  for (int64_t it = n.i("power_iterations", 0); it > 0; --it) {
    normalize_into(wmat_t_u(d, w, u), eps, v);
    normalize_into(wmat_v(d, w, v), eps, u);
  }
  // No check on sigma: a zero or non-finite sigma gives inf/NaN as in PyTorch, which the
  // training loop's non-finite-loss check reports.
  const float sigma = sigma_of(d, w, u, v);
  float* y = out[0]->data<float>();
  const int64_t total = in[0]->numel();
  for (int64_t e = 0; e < total; ++e) y[e] = w[e] / sigma;
}

// gin[0] = (g - sum(g * W) * u v^T) / sigma with the u, v the forward left in its inputs;
// u and v get no gradient (zero when asked).
void spectral_norm_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout,
                            const Outs& gin) {
  for (size_t i = 1; i < 3 && i < gin.size(); ++i)
    if (gin[i]) std::fill(gin[i]->data<float>(), gin[i]->data<float>() + gin[i]->numel(), 0.f);
  if (!gin[0]) return;
  float* gw = gin[0]->data<float>();
  const int64_t total = in[0]->numel();
  if (!gout[0]) {
    std::fill(gw, gw + total, 0.f);
    return;
  }
  const SnDims d = sn_dims(n, in[0]->shape);
  const float *w = in[0]->data<float>(), *u = in[1]->data<float>(), *v = in[2]->data<float>();
  const float* g = gout[0]->data<float>();
  const float* W = out[0]->data<float>();
  const double sigma = sigma_of(d, w, u, v);
  double gW = 0;  // sum(g * W)
  for (int64_t e = 0; e < total; ++e) gW += (double)g[e] * W[e];
  for_each_wmat(d, [&](int64_t e, int64_t row, int64_t col) {
    gw[e] = (float)((g[e] - gW * u[row] * v[col]) / sigma);
  });
}

}  // namespace

// Called from register_layer_backward() (backward_layers.cpp).
void register_spectral_norm() {
  register_op("SpectralNorm", spectral_norm_shape, spectral_norm_kernel);
  register_backward("SpectralNorm", spectral_norm_backward);
  register_updates_inputs("SpectralNorm");
}

}  // namespace wxe::cpu
