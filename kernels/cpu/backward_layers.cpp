// Backward kernels (layers): Softmax, LayerNormalization, InstanceNormalization,
// GroupNormalization, Reduce*, Gelu (norm.cpp); MatMul, Gemm, Einsum and Linear (linalg.cpp)
// are backward_linalg.cpp.
// See engine/ir/ops.h (BackwardFn) for the contract. Each kernel reads the node's attributes as
// its forward kernel does and accumulates in double; statistics the forward computes
// (mean, 1/std, the Reduce* aggregates) are recomputed from the inputs in double.
//
// Linear, MatMul, Gemm, Einsum and ReduceSum / ReduceMean also have a fast path (the
// registered kernels; backward_layers.h lets tests pick either): the products as oneDNN
// matmuls on strided views (float accumulation, as the forward fast path), the reductions as
// broadcast copies. The loops stay as the reference.
#include "kernels/cpu/backward_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/transpose.h"

namespace wxe::cpu {

void register_spectral_norm();  // spectral_norm.cpp: the SpectralNorm op and its backward

void register_linalg_backward();  // backward_linalg.cpp

void register_fused_backward();  // backward_fused.cpp: ChannelLayerNorm
void register_attention_backward();  // backward_attention.cpp: WindowAttention

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements


// Sums `full` (shaped `target`) into a parameter of shape p that broadcasts to target
// (trailing alignment, size-1 dims repeated): the gradient of expand_to in norm.cpp.
void sum_to(const std::vector<double>& full, const Shape& target, const Shape& p, float* dst) {
  const int64_t np = numel(p);
  std::vector<double> acc((size_t)np, 0.0);
  const size_t off = target.size() - p.size();
  const auto pst = strides_of(p);
  for (int64_t e = 0; e < (int64_t)full.size(); ++e) {
    int64_t rem = e, src = 0;
    for (size_t d = target.size(); d-- > 0;) {
      const int64_t i = rem % target[d];
      rem /= target[d];
      if (d >= off && p[d - off] != 1) src += i * pst[d - off];
    }
    acc[src] += full[e];
  }
  for (int64_t i = 0; i < np; ++i) dst[i] = (float)acc[i];
}

// Parameter broadcast to target as doubles (norm.cpp expand_to).
std::vector<double> expand_to(const Tensor& t, const Shape& target) {
  const Shape& p = t.shape;
  const size_t off = target.size() - p.size();
  const auto pst = strides_of(p);
  std::vector<double> r((size_t)numel(target));
  for (int64_t e = 0; e < (int64_t)r.size(); ++e) {
    int64_t rem = e, src = 0;
    for (size_t d = target.size(); d-- > 0;) {
      const int64_t i = rem % target[d];
      rem /= target[d];
      if (d >= off && p[d - off] != 1) src += i * pst[d - off];
    }
    r[e] = t.data<float>()[src];
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Softmax: gx = y * (g - sum_axis(g * y)).

void softmax_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return fill_zero(gin[0]);
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const int64_t outer = prod(x.shape, 0, axis), len = x.rank() ? x.shape[axis] : 1,
                inner = prod(x.shape, axis + 1, x.rank());
  const float* y = out[0]->data<float>();
  const float* g = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
  if (inner == 1) {  // the usual last axis: contiguous rows
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
    for (int64_t o = 0; o < outer; ++o) {
      const float* yr = y + o * len;
      const float* gr = g + o * len;
      float* xr = gx + o * len;
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t k = 0; k < len; ++k) dot += (double)gr[k] * yr[k];
#pragma omp simd
      for (int64_t k = 0; k < len; ++k) xr[k] = (float)(yr[k] * (gr[k] - dot));
    }
    return;
  }
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t oi = 0; oi < outer * inner; ++oi) {
    const int64_t base = (oi / inner) * len * inner + oi % inner;
    double dot = 0;
    for (int64_t k = 0; k < len; ++k) dot += (double)g[base + k * inner] * y[base + k * inner];
    for (int64_t k = 0; k < len; ++k) {
      const int64_t e = base + k * inner;
      gx[e] = (float)(y[e] * (g[e] - dot));
    }
  }
}

// ---------------------------------------------------------------------------------------
// Normalization of one block a[0..M): xhat = (a - mean) * inv. With gxhat the gradient of
// xhat, dx = inv * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)).

struct Stats {
  double mean, inv;
};

Stats block_stats(const float* a, int64_t M, double eps) {
  double s = 0;
  for (int64_t k = 0; k < M; ++k) s += a[k];
  const double mean = M ? s / M : 0;
  double v = 0;
  for (int64_t k = 0; k < M; ++k) v += (a[k] - mean) * (a[k] - mean);
  return {mean, 1.0 / std::sqrt((M ? v / M : 0) + eps)};
}

// ---------------------------------------------------------------------------------------
// LayerNormalization: X, Scale, B?; outputs Y, Mean?, InvStdDev? (any of whose gradients may
// be absent). Mean and InvStdDev depend on X: d mean/dx = 1/D, d inv/dx = -inv^3 (x - mean)/D.

void layernorm_backward(const Node& n, const Ins& in, const Ins& /*out*/, const Ins& gout,
                        const Outs& gin) {
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const double eps = n.f("epsilon", 1e-5f);
  const Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  const int64_t rows = prod(x.shape, 0, axis), D = numel(norm_shape);
  const std::vector<double> gamma = expand_to(*in[1], norm_shape);
  const float* gy = opt_g(gout, 0) ? gout[0]->data<float>() : nullptr;
  const float* gmean = opt_g(gout, 1) ? gout[1]->data<float>() : nullptr;
  const float* ginv = opt_g(gout, 2) ? gout[2]->data<float>() : nullptr;
  const float* xp = x.data<float>();
  std::vector<Stats> st((size_t)rows);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t i = 0; i < rows; ++i) st[i] = block_stats(xp + i * D, D, eps);
  if (Tensor* gx_t = gin[0]) {
    float* gx = gx_t->data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
    for (int64_t i = 0; i < rows; ++i) {
      const float* a = xp + i * D;
      const double mean = st[i].mean, inv = st[i].inv;
      double sg = 0, sgx = 0;  // sum(gxhat), sum(gxhat * xhat)
      if (gy)
        for (int64_t k = 0; k < D; ++k) {
          const double gh = (double)gy[i * D + k] * gamma[k];
          sg += gh;
          sgx += gh * (a[k] - mean) * inv;
        }
      const double gm = gmean ? gmean[i] : 0.0, gi = ginv ? ginv[i] : 0.0;
      for (int64_t k = 0; k < D; ++k) {
        const double xh = (a[k] - mean) * inv;
        const double gh = gy ? (double)gy[i * D + k] * gamma[k] : 0.0;
        gx[i * D + k] =
            (float)(inv * (gh - sg / D - xh * sgx / D) + gm / D - gi * inv * inv * xh / D);
      }
    }
  }
  Tensor* gs = opt_gin(gin, 1);
  Tensor* gb = opt_gin(gin, 2);
  if (!gs && !gb) return;
  // per normalized element k: sum over rows of gy * xhat and of gy
  std::vector<double> sgs((size_t)D, 0.0), sgb((size_t)D, 0.0);
  if (gy) {
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
    for (int64_t k = 0; k < D; ++k)
      for (int64_t i = 0; i < rows; ++i) {
        const double g = gy[i * D + k];
        sgs[k] += g * (xp[i * D + k] - st[i].mean) * st[i].inv;
        sgb[k] += g;
      }
  }
  if (gs) sum_to(sgs, norm_shape, in[1]->shape, gs->data<float>());
  if (gb) sum_to(sgb, norm_shape, in[2]->shape, gb->data<float>());
}

// ---------------------------------------------------------------------------------------
// InstanceNormalization / GroupNormalization (norm.cpp group_norm): x viewed as (N, G, M),
// statistics per (n, g); channel c of group g covers S = M / cpg elements; scale and bias per
// channel (C values) or per group (G values).

void group_norm_backward(const Ins& in, const Ins& gout, const Outs& gin, int64_t G, double eps) {
  const Tensor& x = *in[0];
  const int64_t N = x.shape[0], C = x.shape[1], S = prod(x.shape, 2, x.rank());
  const int64_t cpg = C / G, M = cpg * S;
  const int64_t P = in[1]->numel();  // C or G
  const bool per_channel = P == C;
  const Tensor gamma_t = in[1]->to_f32();
  const float* gamma = gamma_t.data<float>();
  Tensor* gx_t = gin[0];
  Tensor* gs_t = opt_gin(gin, 1);
  Tensor* gb_t = opt_gin(gin, 2);
  if (!gout[0]) {
    for (Tensor* t : {gx_t, gs_t, gb_t}) fill_zero(t);
    return;
  }
  const float* gy = gout[0]->data<float>();
  const float* xp = x.data<float>();
  // per (n, g, channel within the group): sums of gy * xhat and gy
  std::vector<double> part_s((size_t)(N * G * cpg), 0.0), part_b((size_t)(N * G * cpg), 0.0);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t ng = 0; ng < N * G; ++ng) {
    const float* a = xp + ng * M;
    const float* g = gy + ng * M;
    const Stats s = block_stats(a, M, eps);
    const int64_t grp = ng % G;
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < cpg; ++c) {
      const double gs = gamma[per_channel ? grp * cpg + c : grp];
      double ps = 0, pb = 0;
      for (int64_t k = c * S; k < (c + 1) * S; ++k) {
        const double xh = (a[k] - s.mean) * s.inv;
        ps += g[k] * xh;
        pb += g[k];
      }
      part_s[ng * cpg + c] = ps;
      part_b[ng * cpg + c] = pb;
      sg += gs * pb;
      sgx += gs * ps;
    }
    if (!gx_t) continue;
    float* gx = gx_t->data<float>() + ng * M;
    for (int64_t c = 0; c < cpg; ++c) {
      const double gs = gamma[per_channel ? grp * cpg + c : grp];
      for (int64_t k = c * S; k < (c + 1) * S; ++k) {
        const double xh = (a[k] - s.mean) * s.inv;
        gx[k] = (float)(s.inv * (g[k] * gs - sg / M - xh * sgx / M));
      }
    }
  }
  std::vector<double> ss((size_t)P, 0.0), sb((size_t)P, 0.0);
  for (int64_t ng = 0; ng < N * G; ++ng)
    for (int64_t c = 0; c < cpg; ++c) {
      const int64_t pi = per_channel ? (ng % G) * cpg + c : ng % G;
      ss[pi] += part_s[ng * cpg + c];
      sb[pi] += part_b[ng * cpg + c];
    }
  for (int64_t p = 0; p < P; ++p) {
    if (gs_t) gs_t->data<float>()[p] = (float)ss[p];
    if (gb_t) gb_t->data<float>()[p] = (float)sb[p];
  }
}

void instnorm_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  group_norm_backward(in, gout, gin, in[0]->shape[1], n.f("epsilon", 1e-5f));
}

void groupnorm_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  group_norm_backward(in, gout, gin, n.i("num_groups", 0), n.f("epsilon", 1e-5f));
}

// ---------------------------------------------------------------------------------------
// Reduce*: the axes plan of norm.cpp (axes attribute or input 1, keepdims, noop_with_empty_axes).
// Each input element maps to one output element; keepdims does not change that map.

// Which dims of x the node reduces (none, and noop, with empty axes and noop_with_empty_axes).
struct ReduceAxes {
  bool noop = false;
  std::vector<bool> reduced;
};

ReduceAxes reduce_axes(const Node& n, const Tensor& x, const Tensor* axes_t) {
  const int64_t r = x.rank();
  std::vector<int64_t> axes = axes_t ? axes_t->to_i64() : n.ints("axes");
  ReduceAxes ra;
  ra.reduced.assign((size_t)r, axes.empty());
  if (axes.empty() && n.i("noop_with_empty_axes", 0)) {
    ra.noop = true;
    ra.reduced.assign((size_t)r, false);
    return ra;
  }
  for (int64_t a : axes) ra.reduced[norm_axis(a, r, n)] = true;
  return ra;
}

struct ReducePlan {
  bool noop = false;
  std::vector<int64_t> out_index;  // per input element
  int64_t nout = 0;
  int64_t count = 0;               // input elements per output element
};

ReducePlan reduce_plan(const Node& n, const Tensor& x, const Tensor* axes_t) {
  const int64_t r = x.rank();
  ReducePlan p;
  const ReduceAxes ra = reduce_axes(n, x, axes_t);
  if (ra.noop) {
    p.noop = true;
    return p;
  }
  const std::vector<bool>& reduced = ra.reduced;
  // output strides over the kept dims
  std::vector<int64_t> ost((size_t)r, 0);
  int64_t s = 1;
  p.count = 1;
  for (int64_t d = r; d-- > 0;)
    if (!reduced[d]) {
      ost[d] = s;
      s *= x.shape[d];
    } else {
      p.count *= x.shape[d];
    }
  p.nout = s;
  p.out_index.resize((size_t)x.numel());
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t rem = e, o = 0;
    for (int64_t d = r; d-- > 0;) {
      o += (rem % x.shape[d]) * ost[d];
      rem /= x.shape[d];
    }
    p.out_index[e] = o;
  }
  return p;
}

// ReduceSum / ReduceMean: the output gradient (laid out as x's shape with 1 in the reduced
// dims, whatever keepdims says) broadcast to x, times 1/count for the mean.
void reduce_sum_backward_fast(const Node& n, const Tensor& x, const Tensor* axes_t, const float* g, float* gx) {
  const ReduceAxes ra = reduce_axes(n, x, axes_t);
  Shape kept = x.shape;
  int64_t count = 1;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (ra.reduced[d]) {
      count *= x.shape[d];
      kept[d] = 1;
    }
  const double scale = n.op == "ReduceMean" && count > 0 ? 1.0 / count : 1.0;
  broadcast_expand(broadcast_plan(kept, x.shape), g, gx, scale);
}

void reduce_backward_ref(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  const Tensor& x = *in[0];
  const ReducePlan p = reduce_plan(n, x, opt_t(in, 1));
  const float* g = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
  const int64_t total = x.numel();
  if (p.noop) {
    std::memcpy(gx, g, (size_t)total * sizeof(float));
    return;
  }
  const float* xp = x.data<float>();
  const float* y = out[0]->data<float>();
  const std::vector<int64_t>& oi = p.out_index;
  const std::string& op = n.op;
  // per-output aggregates recomputed in double where the forward rounds them
  std::vector<double> agg((size_t)p.nout, 0.0);
  if (op == "ReduceSum" || op == "ReduceMean") {
    const double scale = op == "ReduceMean" ? 1.0 / p.count : 1.0;
    for (int64_t e = 0; e < total; ++e) gx[e] = (float)(g[oi[e]] * scale);
  } else if (op == "ReduceSumSquare") {
    for (int64_t e = 0; e < total; ++e) gx[e] = (float)(2.0 * xp[e] * g[oi[e]]);
  } else if (op == "ReduceL1") {
    for (int64_t e = 0; e < total; ++e)
      gx[e] = xp[e] > 0 ? g[oi[e]] : xp[e] < 0 ? -g[oi[e]] : 0.f;
  } else if (op == "ReduceL2") {  // x / ||x||
    for (int64_t e = 0; e < total; ++e) agg[oi[e]] += (double)xp[e] * xp[e];
    for (auto& a : agg) a = std::sqrt(a);
    for (int64_t e = 0; e < total; ++e)
      gx[e] = agg[oi[e]] > 0 ? (float)(g[oi[e]] * xp[e] / agg[oi[e]]) : 0.f;
  } else if (op == "ReduceLogSum") {  // 1 / sum
    for (int64_t e = 0; e < total; ++e) agg[oi[e]] += xp[e];
    for (int64_t e = 0; e < total; ++e) gx[e] = (float)(g[oi[e]] / agg[oi[e]]);
  } else if (op == "ReduceLogSumExp") {  // softmax over the reduced elements
    std::vector<double> m((size_t)p.nout, -INFINITY);
    for (int64_t e = 0; e < total; ++e) m[oi[e]] = std::max(m[oi[e]], (double)xp[e]);
    for (int64_t e = 0; e < total; ++e) agg[oi[e]] += std::exp(xp[e] - m[oi[e]]);
    for (int64_t e = 0; e < total; ++e)
      gx[e] = (float)(g[oi[e]] * std::exp(xp[e] - m[oi[e]]) / agg[oi[e]]);
  } else if (op == "ReduceMax" || op == "ReduceMin") {
    // to the elements equal to the result, shared evenly between ties (as torch.amax/amin)
    for (int64_t e = 0; e < total; ++e) agg[oi[e]] += xp[e] == y[oi[e]] ? 1.0 : 0.0;
    for (int64_t e = 0; e < total; ++e)
      gx[e] = xp[e] == y[oi[e]] ? (float)(g[oi[e]] / agg[oi[e]]) : 0.f;
  } else if (op == "ReduceProd") {
    // product of the other elements: nonzero product / x, or with exactly one zero, the
    // product of the rest at that zero
    std::vector<double> nz((size_t)p.nout, 1.0);
    std::vector<int64_t> zeros((size_t)p.nout, 0);
    for (int64_t e = 0; e < total; ++e) {
      if (xp[e] == 0) ++zeros[oi[e]];
      else nz[oi[e]] *= xp[e];
    }
    for (int64_t e = 0; e < total; ++e) {
      const int64_t o = oi[e];
      double d = 0;
      if (zeros[o] == 0) d = nz[o] / xp[e];
      else if (zeros[o] == 1 && xp[e] == 0) d = nz[o];
      gx[e] = (float)(g[o] * d);
    }
  } else {
    fail("node ", n.name, " (", n.op, "): no backward for this reduction");
  }
}

// ---------------------------------------------------------------------------------------
// Gelu: erf form d/dx = Phi(x) + x phi(x) (on oneDNN: gelu_grad_fast); tanh form from
// y = 0.5 x (1 + tanh(k (x + c x^3))).

void gelu_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return fill_zero(gin[0]);
  const std::string a = n.s("approximate", "none");
  NCHECK(a == "none" || a == "tanh", "unsupported approximate '", a, "'");
  const int64_t N = in[0]->numel();
  const float* x = in[0]->data<float>();
  const float* g = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
  const bool tanh_form = a == "tanh";
  if (!tanh_form) return gelu_grad_fast(n, x, g, gx, N);
#pragma omp parallel for schedule(static) if (N > kParallelMin)
  for (int64_t i = 0; i < N; ++i) gx[i] = (float)(g[i] * gelu_grad(x[i], tanh_form));
}

}  // namespace

void reduce_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind) {
  if (!gin[0]) return;
  if (!gout[0]) return fill_zero(gin[0]);
  if (kind == KernelKind::Fast && (n.op == "ReduceSum" || n.op == "ReduceMean"))
    return reduce_sum_backward_fast(n, *in[0], opt_t(in, 1), gout[0]->data<float>(), gin[0]->data<float>());
  reduce_backward_ref(n, in, out, gout, gin);
}

namespace {

template <void (*F)(const Node&, const Ins&, const Ins&, const Ins&, const Outs&, KernelKind)>
void fast(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  F(n, in, out, gout, gin, KernelKind::Fast);
}

}  // namespace

void register_layer_backward() {
  register_backward("Softmax", softmax_backward);
  register_backward("LayerNormalization", layernorm_backward);
  register_backward("InstanceNormalization", instnorm_backward);
  register_backward("GroupNormalization", groupnorm_backward);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                         "ReduceLogSumExp"})
    register_backward(op, fast<reduce_backward>);
  for (const char* op : {"ReduceMean", "ReduceSum"})  // the fast path: a broadcast of the gradient
    register_backward_reads(op, {~1u, false});
  // the norms and GELU recompute what they need from their inputs; not Softmax (reads y)
  for (const char* op : {"LayerNormalization", "InstanceNormalization", "GroupNormalization", "Gelu"})
    register_backward_reads(op, {~0u, false});
  register_backward("Gelu", gelu_backward);
  register_linalg_backward();
  register_fused_backward();
  register_attention_backward();
  register_spectral_norm();
}

}  // namespace wxe::cpu

