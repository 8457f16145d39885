// SpectralNormTP: the SpectralNorm op (kernels/cpu/spectral_norm.cpp) on a tensor-parallel
// rank's block of weight_orig, with sigma and the power iteration of the whole (unsharded)
// matrix, summed over the thread's tp communicator (collective_ops.h).
//
//   inputs   weight_orig block: block `index` of `parts` along weight axis `axis` (0 or 1),
//            within each of `groups` equal groups of that axis (engine/safetensors.h
//            TensorSlice); u (rows of the whole W_mat), v (cols of the whole W_mat)
//   attrs    dim, power_iterations, eps as SpectralNorm; axis, parts, index, groups
//   output   this rank's block of W = weight_orig / sigma
//
// u and v stay whole and replicated: every rank holds the same vectors, updated in place by the
// same sums, so the checkpoint saves them as the unsharded run has them. Each product over the
// matrix is this rank's part, written into a whole-length vector (zero where another rank's
// rows or columns go) and summed over tp: W_mat^T u and W_mat v whatever the split (for a row
// block W^T u is a sum over the blocks and W v a concatenation; for a column block the
// other way round). The backward (u, v constants, as in PyTorch):
//   dL/dweight_orig = (g - sum(g * W) * u v^T) / sigma, with sum(g * W) summed over tp.
// Every rank reaches the same collectives in the same order (1 + 2 * power_iterations in the
// forward, 2 in the backward).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/ops.h"
#include "engine/passes.h"
#include "parallel/collective_ops.h"

namespace wxe {

namespace {

#define NCHECK(cond, ...) WXE_CHECK(cond, "node ", n.name, " (", n.op, "): ", __VA_ARGS__)

// The block's geometry: local (block) and whole dims of weight_orig viewed as (d0, d1, rest),
// W_mat rows being dim `dim` of (d0, d1), and the whole index of each local index along the
// sharded axis.
struct TpSnDims {
  int dim = 0, axis = 0;
  int64_t d0 = 1, d1 = 1, rest = 1;  // whole
  int64_t l0 = 1, l1 = 1;            // block
  int64_t rows = 1, cols = 1;        // whole W_mat
  std::vector<int64_t> global;       // local index along `axis` -> whole index
};

TpSnDims tp_sn_dims(const Node& n, const Shape& block) {
  TpSnDims d;
  const int64_t dim = n.i("dim", 0), axis = n.i("axis", 0), parts = n.i("parts", 1), index = n.i("index", 0),
                groups = n.i("groups", 1);
  NCHECK(dim == 0 || dim == 1, "dim must be 0 or 1, got ", dim);
  NCHECK(axis == 0 || axis == 1, "axis must be 0 or 1, got ", axis);
  NCHECK(parts >= 1 && index >= 0 && index < parts && groups >= 1, "bad block ", index, " of ", parts, " in ", groups,
         " groups");
  NCHECK((int64_t)block.size() > std::max(dim, axis), "weight_orig ", shape_str(block), " has no axis ",
         std::max(dim, axis));
  d.dim = (int)dim;
  d.axis = (int)axis;
  d.l0 = block[0];
  d.l1 = block.size() > 1 ? block[1] : 1;
  const int64_t n_local = axis == 0 ? d.l0 : d.l1;
  NCHECK(n_local % groups == 0, "block ", shape_str(block), " does not split in ", groups, " groups along axis ", axis);
  const int64_t per = n_local / groups;  // of each group, this block holds `per`
  d.d0 = axis == 0 ? d.l0 * parts : d.l0;
  d.d1 = axis == 1 ? d.l1 * parts : d.l1;
  const int64_t total_block = numel(block);
  d.rest = d.l0 * d.l1 != 0 ? total_block / (d.l0 * d.l1) : 0;
  d.rows = dim == 0 ? d.d0 : d.d1;
  d.cols = d.rows ? d.d0 * d.d1 * d.rest / d.rows : 0;
  for (int64_t i = 0; i < n_local; ++i) d.global.push_back(i / per * per * parts + index * per + i % per);
  return d;
}

// f(e, row, col) for every element e of the block, in storage order, with its whole W_mat row and col.
template <class F>
void for_each_block(const TpSnDims& d, F f) {
  for (int64_t a = 0; a < d.l0; ++a) {
    const int64_t ga = d.axis == 0 ? d.global[a] : a;
    for (int64_t b = 0; b < d.l1; ++b) {
      const int64_t gb = d.axis == 1 ? d.global[b] : b;
      for (int64_t r = 0; r < d.rest; ++r) {
        const int64_t e = (a * d.l1 + b) * d.rest + r;
        if (d.dim == 0) f(e, ga, gb * d.rest + r);
        else f(e, gb, ga * d.rest + r);
      }
    }
  }
}

// In place over the tp group (none, or a group of one: nothing to add).
void sum_over_tp(std::vector<double>& x) {
  Communicator* tp = tp_communicator();
  if (!tp || tp->size() <= 1) return;
  Tensor t(DType::F64, {(int64_t)x.size()});
  std::memcpy(t.raw(), x.data(), x.size() * sizeof(double));
  tp->all_reduce_sum(t);
  std::memcpy(x.data(), t.raw(), x.size() * sizeof(double));
}

// W_mat v (whole rows), summed over tp.
std::vector<double> wmat_v(const TpSnDims& d, const float* w, const float* v) {
  std::vector<double> out((size_t)d.rows, 0.0);
  for_each_block(d, [&](int64_t e, int64_t row, int64_t col) { out[row] += (double)w[e] * v[col]; });
  sum_over_tp(out);
  return out;
}

// W_mat^T u (whole cols), summed over tp.
std::vector<double> wmat_t_u(const TpSnDims& d, const float* w, const float* u) {
  std::vector<double> out((size_t)d.cols, 0.0);
  for_each_block(d, [&](int64_t e, int64_t row, int64_t col) { out[col] += (double)w[e] * u[row]; });
  sum_over_tp(out);
  return out;
}

void normalize_into(const std::vector<double>& x, double eps, float* dst) {
  double ss = 0;
  for (double a : x) ss += a * a;
  const double scale = 1.0 / std::max(std::sqrt(ss), eps);
  for (size_t i = 0; i < x.size(); ++i) dst[i] = (float)(x[i] * scale);
}

float sigma_of(const TpSnDims& d, const float* w, const float* u, const float* v) {
  const std::vector<double> wv = wmat_v(d, w, v);
  double s = 0;
  for (int64_t i = 0; i < d.rows; ++i) s += (double)u[i] * wv[i];
  return (float)s;
}

std::vector<TypeShape> shape_rule(const Node& n, const std::vector<const Value*>& in) {
  NCHECK(in.size() == 3 && in[0] && in[1] && in[2], "expects inputs weight_orig, u, v");
  for (const Value* t : in)
    NCHECK(t->dtype == DType::F32, "input '", t->name, "' must be float32, got ", dtype_name(t->dtype));
  const TpSnDims d = tp_sn_dims(n, in[0]->shape);
  NCHECK(in[1]->shape == Shape{d.rows} && in[2]->shape == Shape{d.cols}, "u ", shape_str(in[1]->shape), " / v ",
         shape_str(in[2]->shape), " do not fit the whole weight_orig of block ", shape_str(in[0]->shape),
         ": expected (", d.rows, ") and (", d.cols, ")");
  return {{DType::F32, in[0]->shape}};
}

void forward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const TpSnDims d = tp_sn_dims(n, in[0]->shape);
  const float* w = in[0]->data<float>();
  // u and v are the op's buffers, updated in place (as SpectralNorm's)
  float* u = const_cast<Tensor*>(in[1])->data<float>();
  float* v = const_cast<Tensor*>(in[2])->data<float>();
  const double eps = n.f("eps", 1e-12f);
  for (int64_t it = n.i("power_iterations", 0); it > 0; --it) {
    normalize_into(wmat_t_u(d, w, u), eps, v);
    normalize_into(wmat_v(d, w, v), eps, u);
  }
  const float sigma = sigma_of(d, w, u, v);
  float* y = out[0]->data<float>();
  const int64_t total = in[0]->numel();
  for (int64_t e = 0; e < total; ++e) y[e] = w[e] / sigma;
}

void backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
              const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  for (size_t i = 1; i < 3 && i < gin.size(); ++i)
    if (gin[i]) std::fill(gin[i]->data<float>(), gin[i]->data<float>() + gin[i]->numel(), 0.f);
  const TpSnDims d = tp_sn_dims(n, in[0]->shape);
  const float *w = in[0]->data<float>(), *u = in[1]->data<float>(), *v = in[2]->data<float>();
  const int64_t total = in[0]->numel();
  // every rank takes part in the sums, whether or not it has a gradient to give
  const double sigma = sigma_of(d, w, u, v);
  std::vector<double> gW(1, 0.0);  // sum(g * W) over the whole matrix
  if (gout[0])
    for (int64_t e = 0; e < total; ++e) gW[0] += (double)gout[0]->data<float>()[e] * out[0]->data<float>()[e];
  sum_over_tp(gW);
  if (!gin[0]) return;
  float* gw = gin[0]->data<float>();
  if (!gout[0]) {
    std::fill(gw, gw + total, 0.f);
    return;
  }
  const float* g = gout[0]->data<float>();
  for_each_block(d, [&](int64_t e, int64_t row, int64_t col) {
    gw[e] = (float)((g[e] - gW[0] * u[row] * v[col]) / sigma);
  });
}

#undef NCHECK

}  // namespace

void register_spectral_norm_tp() {
  register_op("SpectralNormTP", shape_rule, forward);
  register_backward("SpectralNormTP", backward);
  register_updates_inputs("SpectralNormTP");
}

}  // namespace wxe
