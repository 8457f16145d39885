// Normalizations and reductions (ONNX opsets 13-21): Softmax, LayerNormalization,
// InstanceNormalization, GroupNormalization, Reduce{Mean,Sum,Max,Min,Prod,L1,L2,SumSquare,
// LogSum,LogSumExp}, Gelu. Reference kernels: plain loops with double accumulators, the
// oracle for faster paths. float32 (integer Reduce{Sum,Max,Min,Prod} too).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {


constexpr int64_t kParallelMin = 1 << 15;  // elements

const Value* opt_v(const Values& in, size_t i) { return i < in.size() ? in[i] : nullptr; }
const Tensor* opt_t(const Ins& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

const Value& req_v(const Node& n, const Values& in, size_t i) {
  NCHECK(i < in.size() && in[i], "missing input ", i);
  return *in[i];
}

void check_f32(const Node& n, const Value& v, const char* what) {
  NCHECK(v.dtype == DType::F32, what, " must be float32, got ", dtype_name(v.dtype));
}

// Products of dims [0, a), [a, b), [b, r).
int64_t prod(const Shape& s, size_t a, size_t b) {
  int64_t p = 1;
  for (size_t d = a; d < b && d < s.size(); ++d) p *= s[d];
  return p;
}

// ---------------------------------------------------------------------------------------
// Softmax (opset 13): along one axis, max-subtracted.

std::vector<TypeShape> softmax_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  check_f32(n, x, "input");
  norm_axis(n.i("axis", -1), (int64_t)x.shape.size(), n);
  return {{x.dtype, x.shape}};
}

void softmax_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const int64_t outer = prod(x.shape, 0, axis), len = x.rank() ? x.shape[axis] : 1,
                inner = prod(x.shape, axis + 1, x.rank());
  const float* xp = x.data<float>();
  float* yp = out[0]->data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t oi = 0; oi < outer * inner; ++oi) {
    const int64_t o = oi / inner, i = oi % inner;
    const float* a = xp + o * len * inner + i;
    float* b = yp + o * len * inner + i;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < len; ++k) m = std::max(m, a[k * inner]);
    double sum = 0;
    for (int64_t k = 0; k < len; ++k) {
      const float e = std::exp(a[k * inner] - m);
      b[k * inner] = e;
      sum += e;
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t k = 0; k < len; ++k) b[k * inner] *= inv;
  }
}

// ---------------------------------------------------------------------------------------
// Per-channel / per-element parameters broadcast to a target shape (trailing alignment).

void check_broadcast_to(const Node& n, const Shape& p, const Shape& target, const char* what) {
  bool ok = p.size() <= target.size();
  for (size_t k = 0; ok && k < p.size(); ++k) {
    const int64_t a = p[p.size() - 1 - k], b = target[target.size() - 1 - k];
    ok = a == b || a == 1;
  }
  NCHECK(ok, what, " of shape ", shape_str(p), " does not broadcast to ", shape_str(target));
}

std::vector<float> expand_to(const Tensor& t, const Shape& target) {
  const int64_t total = numel(target);
  std::vector<float> r((size_t)total);
  Tensor f = t.to_f32();
  const Shape& p = t.shape;
  const size_t off = target.size() - p.size();
  const auto pst = strides_of(p);
  for (int64_t e = 0; e < total; ++e) {
    int64_t rem = e, src = 0;
    for (size_t d = target.size(); d-- > 0;) {
      const int64_t i = rem % target[d];
      rem /= target[d];
      if (d >= off && p[d - off] != 1) src += i * pst[d - off];
    }
    r[e] = f.data<float>()[src];
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// LayerNormalization (opset 17): X, Scale, B?; axis (-1), epsilon (1e-5), stash_type 1.
// Outputs Y, Mean?, InvStdDev? (the last two shaped X.shape[:axis] + [1]*(r-axis)).

std::vector<TypeShape> layernorm_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  check_f32(n, x, "input");
  const int64_t r = (int64_t)x.shape.size();
  NCHECK(r >= 1, "input must have rank >= 1");
  const int64_t axis = norm_axis(n.i("axis", -1), r, n);
  NCHECK(n.i("stash_type", 1) == 1, "stash_type ", n.i("stash_type", 1), " is not supported");
  const Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  check_broadcast_to(n, req_v(n, in, 1).shape, norm_shape, "Scale");
  if (opt_v(in, 2)) check_broadcast_to(n, in[2]->shape, norm_shape, "B");
  NCHECK(n.outputs.size() >= 1 && n.outputs.size() <= 3, "expects 1 to 3 outputs, got ",
         n.outputs.size());
  std::vector<TypeShape> r_{{x.dtype, x.shape}};
  Shape stat(x.shape.begin(), x.shape.begin() + axis);
  stat.resize(r, 1);
  for (size_t k = 1; k < n.outputs.size(); ++k) r_.push_back({DType::F32, stat});
  return r_;
}

void layernorm_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const double eps = n.f("epsilon", 1e-5f);
  const Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  const int64_t rows = prod(x.shape, 0, axis), D = numel(norm_shape);
  const std::vector<float> g = expand_to(*in[1], norm_shape);
  const std::vector<float> b =
      opt_t(in, 2) ? expand_to(*in[2], norm_shape) : std::vector<float>((size_t)D, 0.f);
  float* mean_out = out.size() > 1 && out[1] ? out[1]->data<float>() : nullptr;
  float* inv_out = out.size() > 2 && out[2] ? out[2]->data<float>() : nullptr;
  const float* xp = x.data<float>();
  float* yp = out[0]->data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t i = 0; i < rows; ++i) {
    const float* a = xp + i * D;
    float* y = yp + i * D;
    double s = 0;
    for (int64_t k = 0; k < D; ++k) s += a[k];
    const double mean = s / D;
    double v = 0;
    for (int64_t k = 0; k < D; ++k) v += (a[k] - mean) * (a[k] - mean);
    const double inv = 1.0 / std::sqrt(v / D + eps);
    for (int64_t k = 0; k < D; ++k) y[k] = (float)((a[k] - mean) * inv * g[k] + b[k]);
    if (mean_out) mean_out[i] = (float)mean;
    if (inv_out) inv_out[i] = (float)inv;
  }
}

// ---------------------------------------------------------------------------------------
// InstanceNormalization: X (N, C, ...), scale (C), B (C); epsilon.
// GroupNormalization (18/21): X (N, C, ...), scale, bias of size C (per channel, opset 21)
// or num_groups (per group, opset 18); num_groups, epsilon.

std::vector<TypeShape> instnorm_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  check_f32(n, x, "input");
  NCHECK(x.shape.size() >= 2, "input must have rank >= 2, got ", shape_str(x.shape));
  const int64_t C = x.shape[1];
  for (size_t i = 1; i <= 2; ++i) {
    const Value& p = req_v(n, in, i);
    NCHECK(numel(p.shape) == C, i == 1 ? "scale" : "B", " has shape ", shape_str(p.shape),
           ", expected ", C, " values");
  }
  return {{x.dtype, x.shape}};
}

// Normalizes x viewed as (N, G, M) per (n, g); channel c of group g covers M/(C/G) elements.
// Parameter index: per channel (cpg channels per group) or per group.
void group_norm(const Tensor& x, Tensor& y, int64_t G, double eps, const std::vector<float>& g,
                const std::vector<float>& b) {
  const int64_t N = x.shape[0], C = x.shape[1], S = prod(x.shape, 2, x.rank());
  const int64_t cpg = C / G, M = cpg * S;
  const bool per_channel = (int64_t)g.size() == C;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t ng = 0; ng < N * G; ++ng) {
    const float* a = xp + ng * M;
    float* o = yp + ng * M;
    double s = 0;
    for (int64_t k = 0; k < M; ++k) s += a[k];
    const double mean = M ? s / M : 0;
    double v = 0;
    for (int64_t k = 0; k < M; ++k) v += (a[k] - mean) * (a[k] - mean);
    const double inv = 1.0 / std::sqrt((M ? v / M : 0) + eps);
    const int64_t grp = ng % G;
    for (int64_t c = 0; c < cpg; ++c) {
      const int64_t pi = per_channel ? grp * cpg + c : grp;
      const double gs = g[pi], bs = b[pi];
      for (int64_t k = c * S; k < (c + 1) * S; ++k) o[k] = (float)((a[k] - mean) * inv * gs + bs);
    }
  }
}

std::vector<float> floats_of(const Tensor& t) {
  Tensor f = t.to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

void instnorm_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  group_norm(x, *out[0], x.shape[1], n.f("epsilon", 1e-5f), floats_of(*in[1]), floats_of(*in[2]));
}

std::vector<TypeShape> groupnorm_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  check_f32(n, x, "input");
  NCHECK(x.shape.size() >= 2, "input must have rank >= 2, got ", shape_str(x.shape));
  NCHECK(n.has("num_groups"), "missing attribute num_groups");
  const int64_t G = n.i("num_groups", 0), C = x.shape[1];
  NCHECK(G > 0 && C % G == 0, "num_groups ", G, " does not divide ", C, " channels");
  NCHECK(n.i("stash_type", 1) == 1, "stash_type ", n.i("stash_type", 1), " is not supported");
  const int64_t s = numel(req_v(n, in, 1).shape), b = numel(req_v(n, in, 2).shape);
  NCHECK(s == b && (s == C || s == G), "scale and bias must both have ", C,
         " (per channel) or ", G, " (per group) values, got ", s, " and ", b);
  return {{x.dtype, x.shape}};
}

void groupnorm_kernel(const Node& n, const Ins& in, const Outs& out) {
  group_norm(*in[0], *out[0], n.i("num_groups", 0), n.f("epsilon", 1e-5f), floats_of(*in[1]),
             floats_of(*in[2]));
}

// ---------------------------------------------------------------------------------------
// Reduce*: axes as attribute (ReduceSum < 13, others < 18) or as input 1; keepdims (1),
// noop_with_empty_axes (0).

enum class Red { Sum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp };

Red red_kind(const std::string& op) {
  if (op == "ReduceSum") return Red::Sum;
  if (op == "ReduceMean") return Red::Mean;
  if (op == "ReduceMax") return Red::Max;
  if (op == "ReduceMin") return Red::Min;
  if (op == "ReduceProd") return Red::Prod;
  if (op == "ReduceL1") return Red::L1;
  if (op == "ReduceL2") return Red::L2;
  if (op == "ReduceSumSquare") return Red::SumSquare;
  if (op == "ReduceLogSum") return Red::LogSum;
  return Red::LogSumExp;
}

struct RedPlan {
  bool noop = false;
  std::vector<bool> reduced;  // per input dim
  Shape out;
};

RedPlan red_plan(const Node& n, const Shape& s, std::vector<int64_t> axes, bool axes_input) {
  const int64_t r = (int64_t)s.size();
  if (!axes_input && n.has("axes")) axes = n.ints("axes");
  RedPlan p;
  p.reduced.assign(r, false);
  if (axes.empty()) {
    if (n.i("noop_with_empty_axes", 0)) {
      p.noop = true;
      p.out = s;
      return p;
    }
    p.reduced.assign(r, true);
  }
  for (int64_t a : axes) {
    a = norm_axis(a, r, n);
    NCHECK(!p.reduced[a], "axis ", a, " repeated");
    p.reduced[a] = true;
  }
  const bool keep = n.i("keepdims", 1) != 0;
  for (int64_t d = 0; d < r; ++d) {
    if (!p.reduced[d]) p.out.push_back(s[d]);
    else if (keep) p.out.push_back(1);
  }
  return p;
}

bool red_int_ok(Red k) { return k == Red::Sum || k == Red::Max || k == Red::Min || k == Red::Prod; }

std::vector<TypeShape> reduce_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const Red k = red_kind(n.op);
  NCHECK(x.dtype == DType::F32 ||
             ((x.dtype == DType::I64 || x.dtype == DType::I32) && red_int_ok(k)),
         "unsupported dtype ", dtype_name(x.dtype));
  const Value* a = opt_v(in, 1);
  std::vector<int64_t> axes;
  if (a) {
    NCHECK(!n.has("axes"), "axes given both as attribute and input");
    axes = const_ints(n, in, 1);
  }
  return {{x.dtype, red_plan(n, x.shape, axes, a != nullptr).out}};
}

template <class T, class Acc>
void reduce_loop(Red kind, const T* x, T* y, int64_t nout, const std::vector<int64_t>& base,
                 const std::vector<int64_t>& roff) {
  const int64_t cnt = (int64_t)roff.size();
#pragma omp parallel for schedule(static) if (nout * cnt > kParallelMin)
  for (int64_t e = 0; e < nout; ++e) {
    const T* a = x + base[e];
    Acc acc;
    switch (kind) {
      case Red::Max: {
        acc = std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                     : std::numeric_limits<Acc>::lowest();
        for (int64_t k = 0; k < cnt; ++k) {
          const Acc v = a[roff[k]];
          if (v > acc || v != v) acc = v;
        }
        break;
      }
      case Red::Min: {
        acc = std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                     : std::numeric_limits<Acc>::max();
        for (int64_t k = 0; k < cnt; ++k) {
          const Acc v = a[roff[k]];
          if (v < acc || v != v) acc = v;
        }
        break;
      }
      case Red::Prod:
        acc = 1;
        for (int64_t k = 0; k < cnt; ++k) acc *= (Acc)a[roff[k]];
        break;
      case Red::L1:
        acc = 0;
        for (int64_t k = 0; k < cnt; ++k) acc += std::fabs((double)a[roff[k]]);
        break;
      case Red::L2:
      case Red::SumSquare:
        acc = 0;
        for (int64_t k = 0; k < cnt; ++k) acc += (Acc)a[roff[k]] * (Acc)a[roff[k]];
        if (kind == Red::L2) acc = std::sqrt((double)acc);
        break;
      case Red::LogSumExp: {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t k = 0; k < cnt; ++k) m = std::max(m, (double)a[roff[k]]);
        if (std::isinf(m)) {  // empty, all -inf, or some +inf
          double s = 0;
          for (int64_t k = 0; k < cnt; ++k) s += std::exp((double)a[roff[k]]);
          acc = (Acc)std::log(s);
          break;
        }
        double s = 0;
        for (int64_t k = 0; k < cnt; ++k) s += std::exp((double)a[roff[k]] - m);
        acc = (Acc)(std::log(s) + m);
        break;
      }
      default:  // Sum, Mean, LogSum
        acc = 0;
        for (int64_t k = 0; k < cnt; ++k) acc += (Acc)a[roff[k]];
        if (kind == Red::Mean) acc = acc / (Acc)cnt;
        if (kind == Red::LogSum) acc = std::log((double)acc);
        break;
    }
    y[e] = (T)acc;
  }
}

// Sum-like float reductions over axes that are adjacent (ignoring size-1 dims): x viewed as
// (outer, R, inner), rows of R added into blocks of `inner` (contiguous reads).
bool reduce_contiguous(Red kind, const Tensor& x, const RedPlan& p, Tensor& y) {
  if (kind != Red::Sum && kind != Red::Mean && kind != Red::SumSquare && kind != Red::L2)
    return false;
  const int r = x.rank();
  int a = -1, b = -1;  // first and last reduced dim of size > 1
  for (int d = 0; d < r; ++d)
    if (p.reduced[d] && x.shape[d] > 1) {
      if (a < 0) a = d;
      b = d;
    }
  if (a < 0) return false;
  for (int d = a; d <= b; ++d)
    if (!p.reduced[d] && x.shape[d] > 1) return false;
  const int64_t outer = prod(x.shape, 0, a), R = prod(x.shape, a, b + 1),
                inner = prod(x.shape, b + 1, r);
  const bool sq = kind == Red::SumSquare || kind == Red::L2;
  const double post = kind == Red::Mean ? 1.0 / R : 1.0;
  constexpr int64_t kB = 256;
  const int64_t nb = (inner + kB - 1) / kB;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t t = 0; t < outer * nb; ++t) {
    const int64_t o = t / nb, i0 = (t % nb) * kB, m = std::min(kB, inner - i0);
    double acc[kB] = {0};
    for (int64_t k = 0; k < R; ++k) {
      const float* row = xp + (o * R + k) * inner + i0;
      if (sq)
        for (int64_t i = 0; i < m; ++i) acc[i] += (double)row[i] * row[i];
      else
        for (int64_t i = 0; i < m; ++i) acc[i] += row[i];
    }
    for (int64_t i = 0; i < m; ++i) {
      const double v = acc[i] * post;
      yp[o * inner + i0 + i] = (float)(kind == Red::L2 ? std::sqrt(v) : v);
    }
  }
  return true;
}

void reduce_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const Red kind = red_kind(n.op);
  const Tensor* a = opt_t(in, 1);
  const RedPlan p = red_plan(n, x.shape, a ? a->to_i64() : std::vector<int64_t>{}, a != nullptr);
  if (p.noop) {
    if (x.nbytes()) std::memcpy(out[0]->raw(), x.raw(), x.nbytes());
    return;
  }
  if (x.dtype == DType::F32 && reduce_contiguous(kind, x, p, *out[0])) return;
  const int r = x.rank();
  const auto st = strides_of(x.shape);
  // offsets of the reduced sub-block and of each output's base element
  std::vector<int64_t> roff{0}, base{0};
  for (int d = 0; d < r; ++d) {
    std::vector<int64_t>& v = p.reduced[d] ? roff : base;
    std::vector<int64_t> nv;
    nv.reserve(v.size() * x.shape[d]);
    for (int64_t o : v)
      for (int64_t i = 0; i < x.shape[d]; ++i) nv.push_back(o + i * st[d]);
    v.swap(nv);
  }
  WXE_ASSERT((int64_t)base.size() == out[0]->numel());
  switch (x.dtype) {
    case DType::F32:
      reduce_loop<float, double>(kind, x.data<float>(), out[0]->data<float>(), base.size(), base,
                                 roff);
      break;
    case DType::I64:
      reduce_loop<int64_t, int64_t>(kind, x.data<int64_t>(), out[0]->data<int64_t>(), base.size(),
                                    base, roff);
      break;
    case DType::I32:
      reduce_loop<int32_t, int64_t>(kind, x.data<int32_t>(), out[0]->data<int32_t>(), base.size(),
                                    base, roff);
      break;
    default: fail("node ", n.name, " (", n.op, "): unsupported dtype ", dtype_name(x.dtype));
  }
}

// ---------------------------------------------------------------------------------------
// Gelu (opset 20): approximate "none" (erf) or "tanh".

bool gelu_tanh(const Node& n) {
  const std::string a = n.s("approximate", "none");
  NCHECK(a == "none" || a == "tanh", "unsupported approximate '", a, "'");
  return a == "tanh";
}

std::vector<TypeShape> gelu_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  check_f32(n, x, "input");
  gelu_tanh(n);
  return {{x.dtype, x.shape}};
}

void gelu_kernel(const Node& n, const Ins& in, const Outs& out) {
  const bool tanh_ = gelu_tanh(n);
  const int64_t N = in[0]->numel();
  const float* x = in[0]->data<float>();
  float* y = out[0]->data<float>();
  const double k = std::sqrt(2.0 / M_PI);
#pragma omp parallel for schedule(static) if (N > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const double v = x[i];
    y[i] = (float)(tanh_ ? 0.5 * v * (1 + std::tanh(k * (v + 0.044715 * v * v * v)))
                         : 0.5 * v * (1 + std::erf(v * M_SQRT1_2)));
  }
}

}  // namespace

void register_norm_ops() {
  register_op("Softmax", softmax_shape, softmax_kernel);
  register_op("LayerNormalization", layernorm_shape, layernorm_kernel);
  register_op("InstanceNormalization", instnorm_shape, instnorm_kernel);
  register_op("GroupNormalization", groupnorm_shape, groupnorm_kernel);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                         "ReduceLogSumExp"})
    register_op(op, reduce_shape, reduce_kernel);
  register_op("Gelu", gelu_shape, gelu_kernel);
}

}  // namespace wxe::cpu
