// Backward kernels of the elementwise, shape and data ops (engine/ops.h BackwardFn).
//
// Elementwise ops: each output element's local derivative times its gradient, summed over
// the dims an input was broadcast along (double accumulators).
//
// Data-movement ops (Slice, Gather, GatherND, Transpose, Pad, DepthToSpace, Split, Tile,
// Expand, Concat): every output element is a copy of one input element or of a constant.
// Running the op's own reference kernel on the inputs' element numbers (an integer tensor)
// gives that source map, and the gradient is the output gradient scattered (added) through
// it. So the backward follows every attribute, mode, clamping rule and opset variant of the
// forward exactly, without a second copy of that logic.
//
// Resize: the transpose of the forward's per-axis taps (cpu_ops.h resize_axis_taps).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {

using Gouts = std::vector<const Tensor*>;
using Gins = std::vector<Tensor*>;

constexpr int64_t kParallelMin = 1 << 15;  // elements; below this OpenMP costs more than it saves

void zero(Tensor* t) {
  if (t && t->nbytes()) std::memset(t->raw(), 0, t->nbytes());
}

void zero_from(const Gins& gin, size_t first) {
  for (size_t i = first; i < gin.size(); ++i) zero(gin[i]);
}

// Checks the gradient tensors, then runs F. When no output has a gradient every input
// gradient is zero, so F may assume gout[0] is set for single-output ops.
template <BackwardFn F>
void checked(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  bool want = false;
  for (size_t i = 0; i < gin.size(); ++i) {
    if (!gin[i]) continue;
    NCHECK(i < in.size() && in[i], "gradient asked for omitted input ", i);
    NCHECK(gin[i]->dtype == DType::F32 && gin[i]->numel() == in[i]->numel(), "gradient of input ", i,
           " must be float32 ", shape_str(in[i]->shape), ", got ", dtype_name(gin[i]->dtype), " ",
           shape_str(gin[i]->shape));
    want = true;
  }
  if (!want) return;
  bool any = false;
  for (size_t k = 0; k < gout.size(); ++k) {
    if (!gout[k]) continue;
    NCHECK(k < out.size() && out[k], "gradient given for absent output ", k);
    NCHECK(gout[k]->dtype == DType::F32 && gout[k]->numel() == out[k]->numel(),
           "gradient of output ", k, " must be float32 ", shape_str(out[k]->shape), ", got ",
           dtype_name(gout[k]->dtype), " ", shape_str(gout[k]->shape));
    any = true;
  }
  if (!any) {
    zero_from(gin, 0);
    return;
  }
  F(n, in, out, gout, gin);
}

// A float32 view of a forward input (a converted copy in `keep` when it has another dtype).
const float* as_f32(const Tensor& t, Tensor& keep) {
  if (t.dtype == DType::F32) return t.data<float>();
  keep = t.to_f32();
  return keep.data<float>();
}

// ---------------------------------------------------------------------------------------
// Broadcasting: output element i (shape `out`, in rows of the last dim L) reads element
// off[k] of input k; strides are 0 along the dims input k is broadcast over.

struct Bcast {
  Shape out;
  int64_t L = 1, rows = 0;
  std::vector<std::vector<int64_t>> st;  // per input, per out dim
  Bcast(const Shape& o, const std::vector<Shape>& ins) : out(o) {
    WXE_ASSERT(ins.size() <= 3);
    for (const Shape& s : ins) {
      std::vector<int64_t> v(o.size(), 0), cs = strides_of(s);
      const size_t off = o.size() - s.size();
      for (size_t d = 0; d < s.size(); ++d) v[off + d] = s[d] == 1 ? 0 : cs[d];
      st.push_back(v);
    }
    L = o.empty() ? 1 : o.back();
    rows = L == 0 ? 0 : numel(o) / L;
  }
  // Offsets of the first element of `row`, and each input's step along a row.
  void row_start(int64_t row, int64_t* off, int64_t* step) const {
    const int r = (int)out.size();
    for (size_t k = 0; k < st.size(); ++k) {
      off[k] = 0;
      step[k] = r ? st[k][r - 1] : 0;
    }
    for (int d = r - 2; d >= 0; --d) {
      const int64_t idx = row % out[d];
      row /= out[d];
      for (size_t k = 0; k < st.size(); ++k) off[k] += idx * st[k][d];
    }
  }
};

// gin (the shape of input k) = for each of its elements, the sum of d(i, off) over the
// output elements i that read it. Deterministic: broadcast sums go through a fixed number of
// partial buffers whatever the thread count.
template <class D>
void reduce_into(const Bcast& b, size_t k, Tensor* gin, D d) {
  float* G = gin->data<float>();
  const int64_t total = numel(b.out), gn = gin->numel(), L = b.L;
  if (gn == total) {  // not broadcast: the layouts agree
#pragma omp parallel for schedule(static) if (total > kParallelMin)
    for (int64_t r = 0; r < b.rows; ++r) {
      int64_t off[3], step[3];
      b.row_start(r, off, step);
      for (int64_t j = 0; j < L; ++j) {
        G[r * L + j] = (float)d(r * L + j, off);
        for (size_t q = 0; q < b.st.size(); ++q) off[q] += step[q];
      }
    }
    return;
  }
  const int64_t parts = total > kParallelMin && gn * 16 <= total ? 16 : 1;
  std::vector<double> acc((size_t)(parts * gn), 0.0);
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int64_t p = 0; p < parts; ++p) {
    double* A = acc.data() + p * gn;
    const int64_t r0 = b.rows * p / parts, r1 = b.rows * (p + 1) / parts;
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off[3], step[3];
      b.row_start(r, off, step);
      for (int64_t j = 0; j < L; ++j) {
        A[off[k]] += d(r * L + j, off);
        for (size_t q = 0; q < b.st.size(); ++q) off[q] += step[q];
      }
    }
  }
  for (int64_t e = 0; e < gn; ++e) {
    double s = 0;
    for (int64_t p = 0; p < parts; ++p) s += acc[p * gn + e];
    G[e] = (float)s;
  }
}

// ---------------------------------------------------------------------------------------
// Binary arithmetic with broadcasting.

enum class Bin { Add, Sub, Mul, Div, Pow, Max, Min };

// dL/da (k = 0) or dL/db (k = 1) of out = a OP b, given dL/dout = g.
template <Bin OP>
inline double binary_grad(int k, double a, double b, double g) {
  switch (OP) {
    case Bin::Add: return g;
    case Bin::Sub: return k == 0 ? g : -g;
    case Bin::Mul: return k == 0 ? g * b : g * a;
    case Bin::Div: return k == 0 ? g / b : -g * a / (b * b);
    case Bin::Pow:
      // d/da: b a^(b-1), taken as 0 where b = 0 (a^0 = 1 everywhere, also at a = 0);
      // d/db: a^b log a, taken as 0 where a <= 0 (PyTorch: 0 at a = 0, NaN for a < 0).
      if (k == 0) return b == 0 ? 0 : g * b * std::pow(a, b - 1);
      return a > 0 ? g * std::pow(a, b) * std::log(a) : 0;
    // ties split the gradient in half, as PyTorch's maximum/minimum do
    case Bin::Max:
      if (a == b) return g / 2;
      return (k == 0) == (a > b) ? g : 0;
    case Bin::Min:
      if (a == b) return g / 2;
      return (k == 0) == (a < b) ? g : 0;
  }
  return 0;
}

template <Bin OP>
void binary_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  Tensor ka, kb;  // float32 copies of non-float32 operands (Pow's integer exponent)
  const float* A = as_f32(*in[0], ka);
  const float* B = as_f32(*in[1], kb);
  const float* G = gout[0]->data<float>();
  const Bcast b(out[0]->shape, {in[0]->shape, in[1]->shape});
  for (int k = 0; k < 2; ++k)
    if (gin[k])
      reduce_into(b, (size_t)k, gin[k], [&](int64_t i, const int64_t* off) {
        return binary_grad<OP>(k, A[off[0]], B[off[1]], G[i]);
      });
}

// Sum(x0, x1, ...): each input gets the output gradient summed to its shape.
void sum_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const float* G = gout[0]->data<float>();
  for (size_t k = 0; k < in.size(); ++k)
    if (gin[k]) {
      const Bcast b(out[0]->shape, {in[k]->shape});
      reduce_into(b, 0, gin[k], [&](int64_t i, const int64_t*) { return (double)G[i]; });
    }
}

// Where(cond, x, y): x gets the gradient where cond holds, y where it does not.
void where_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(dtype_size(in[0]->dtype) == 1, "condition must be bool");
  const uint8_t* C = in[0]->data<uint8_t>();
  const float* G = gout[0]->data<float>();
  const Bcast b(out[0]->shape, {in[0]->shape, in[1]->shape, in[2]->shape});
  zero(gin[0]);
  for (int k = 1; k < 3; ++k)
    if (gin[k])
      reduce_into(b, (size_t)k, gin[k], [&](int64_t i, const int64_t* off) {
        return (C[off[0]] != 0) == (k == 1) ? (double)G[i] : 0.0;
      });
}

// ---------------------------------------------------------------------------------------
// Unary ops: dL/dx = dy/dx (x, y) * g, elementwise.

enum class Un { Sqrt, Erf, Relu, Sigmoid, Tanh, Exp, Log, Neg, Abs, Reciprocal, Sin, Cos, Softplus };

template <Un OP>
inline double unary_grad(double x, double y) {
  switch (OP) {
    case Un::Sqrt: return 0.5 / y;
    case Un::Erf: return 1.1283791670955126 * std::exp(-x * x);  // 2 / sqrt(pi)
    case Un::Relu: return x > 0 ? 1 : 0;
    case Un::Sigmoid: return y * (1 - y);
    case Un::Tanh: return 1 - y * y;
    case Un::Exp: return y;
    case Un::Log: return 1 / x;
    case Un::Neg: return -1;
    case Un::Abs: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case Un::Reciprocal: return -y * y;
    case Un::Sin: return std::cos(x);
    case Un::Cos: return -std::sin(x);
    case Un::Softplus: return x > 20 ? 1 : 1 / (1 + std::exp(-x));  // the forward is x above 20
  }
  return 0;
}

template <class D>  // d(x, y) = dy/dx
void unary_apply(const Ins& in, const Ins& out, const Gouts& gout, Tensor* gin, D d) {
  const float* X = in[0]->data<float>();
  const float* Y = out[0]->data<float>();
  const float* G = gout[0]->data<float>();
  float* R = gin->data<float>();
  const int64_t cnt = gin->numel();
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
  for (int64_t i = 0; i < cnt; ++i) R[i] = (float)(d(X[i], Y[i]) * G[i]);
}

template <Un OP>
void unary_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(in[0]->dtype == DType::F32 && out[0]->dtype == DType::F32, "float32 only");
  unary_apply(in, out, gout, gin[0], [](double x, double y) { return unary_grad<OP>(x, y); });
}

void leaky_relu_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const double alpha = n.f("alpha", 0.01f);
  unary_apply(in, out, gout, gin[0], [alpha](double x, double) { return x >= 0 ? 1 : alpha; });
}

// Clip(x, min?, max?) = min(max(x, lo), hi), ties resolved as std::max/std::min do in the
// forward: x passes where lo <= x and max(x, lo) <= hi; lo where x < lo <= hi; hi elsewhere.
void clip_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const bool has_lo = in.size() > 1 && in[1], has_hi = in.size() > 2 && in[2];
  const float lo = has_lo ? in[1]->to_f32().data<float>()[0] : -INFINITY;
  const float hi = has_hi ? in[2]->to_f32().data<float>()[0] : INFINITY;
  const float* X = in[0]->data<float>();
  const float* G = gout[0]->data<float>();
  const int64_t cnt = in[0]->numel();
  double glo = 0, ghi = 0;
  float* R = gin[0] ? gin[0]->data<float>() : nullptr;
  for (int64_t i = 0; i < cnt; ++i) {
    const float m = X[i] < lo ? lo : X[i];
    const bool to_hi = hi < m;
    const bool to_x = !to_hi && !(X[i] < lo);
    if (R) R[i] = to_x ? G[i] : 0.f;
    if (!to_hi && !to_x) glo += G[i];
    if (to_hi) ghi += G[i];
  }
  if (has_lo && gin.size() > 1 && gin[1]) {
    zero(gin[1]);
    if (gin[1]->numel()) gin[1]->data<float>()[0] = (float)glo;
  }
  if (has_hi && gin.size() > 2 && gin[2]) {
    zero(gin[2]);
    if (gin[2]->numel()) gin[2]->data<float>()[0] = (float)ghi;
  }
}

// ---------------------------------------------------------------------------------------
// Copies: Identity, Reshape, Squeeze, Unsqueeze, Flatten pass the gradient through; Cast and
// CastLike too between float types. A cast to or from an integer or bool type has none.

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

void copy_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (gin[0]) std::memcpy(gin[0]->raw(), gout[0]->raw(), gin[0]->nbytes());
  zero_from(gin, 1);
}

void cast_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (is_float(in[0]->dtype) && is_float(out[0]->dtype)) copy_bw(n, in, out, gout, gin);
  else zero_from(gin, 0);
}

// ---------------------------------------------------------------------------------------
// Data movement through the forward kernel's source map (see the top of the file).

// Input gradients of op n from its output gradients. `data` lists the inputs whose elements
// the outputs copy; the others (indices, pads, repeats, ...) pass to the forward unchanged.
// Element e of data input data[j] is numbered first[j] + e, from 1; 0 marks an output element
// that copies no input element (Pad's constant), whose gradients sum into *gconst.
// `injective`: no two output elements copy the same input element (parallel scatter).
template <class I>
void scatter_bw_typed(const Node& n, Ins in, const Ins& out, const Gouts& gout, const Gins& gin,
                      const std::vector<int>& data, bool injective, double* gconst) {
  const DType it = sizeof(I) == 4 ? DType::I32 : DType::I64;
  std::vector<Tensor> numbers;
  numbers.reserve(data.size());
  std::vector<int64_t> first;
  int64_t next = 1;
  for (int k : data) {
    numbers.emplace_back(it, in[k]->shape);
    I* p = numbers.back().data<I>();
    const int64_t cnt = in[k]->numel();
    for (int64_t e = 0; e < cnt; ++e) p[e] = (I)(next + e);
    first.push_back(next);
    next += cnt;
    in[k] = &numbers.back();
  }
  std::vector<Tensor> maps;
  maps.reserve(out.size());
  Outs pm;
  for (const Tensor* o : out) {  // an output nothing reads may be absent (Split)
    maps.push_back(o ? Tensor(it, o->shape) : Tensor());
    pm.push_back(o ? &maps.back() : nullptr);
  }
  kernel_for(n.op, KernelKind::Reference)(n, in, pm);
  std::vector<double> acc((size_t)next, 0.0);
  for (size_t k = 0; k < out.size(); ++k) {
    if (!gout[k] || !out[k]) continue;
    const I* m = maps[k].data<I>();
    const float* g = gout[k]->data<float>();
    const int64_t cnt = maps[k].numel();
    if (injective) {
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
      for (int64_t i = 0; i < cnt; ++i) acc[m[i]] += g[i];
    } else {
      for (int64_t i = 0; i < cnt; ++i) acc[m[i]] += g[i];
    }
  }
  for (size_t j = 0; j < data.size(); ++j) {
    Tensor* t = gin[data[j]];
    if (!t) continue;
    float* G = t->data<float>();
    const double* a = acc.data() + first[j];
    const int64_t cnt = t->numel();
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
    for (int64_t e = 0; e < cnt; ++e) G[e] = (float)a[e];
  }
  if (gconst) *gconst = acc[0];
}

void scatter_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin,
                const std::vector<int>& data, bool injective, double* gconst = nullptr) {
  for (size_t i = 0; i < gin.size(); ++i)
    if (std::find(data.begin(), data.end(), (int)i) == data.end()) zero(gin[i]);
  int64_t count = 0;
  for (int k : data) count += in[k]->numel();
  if (count < std::numeric_limits<int32_t>::max())
    scatter_bw_typed<int32_t>(n, in, out, gout, gin, data, injective, gconst);
  else
    scatter_bw_typed<int64_t>(n, in, out, gout, gin, data, injective, gconst);
}

template <bool INJECTIVE>
void first_input_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  scatter_bw(n, in, out, gout, gin, {0}, INJECTIVE);
}

void concat_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  std::vector<int> all;
  for (size_t i = 0; i < in.size(); ++i) all.push_back((int)i);
  scatter_bw(n, in, out, gout, gin, all, true);
}

// Pad: the padded border reads the data (reflect, edge, wrap: not injective) or the
// constant value, whose gradient is the sum over the constant positions.
void pad_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  Node m = n;
  m.attrs.erase("value");  // opset < 11 constant: the constant's number 0 comes in as input 2
  Ins pin = in;
  const bool has_value = in.size() > 2 && in[2] && in[2]->numel() > 0;
  int64_t count = in[0]->numel();
  Tensor number0 = Tensor::zeros(count < std::numeric_limits<int32_t>::max() ? DType::I32 : DType::I64, {});
  if (has_value) pin[2] = &number0;
  double gconst = 0;
  scatter_bw(m, pin, out, gout, gin, {0}, false, &gconst);
  if (has_value && gin[2]) gin[2]->data<float>()[0] = (float)gconst;
}

// ---------------------------------------------------------------------------------------
// Resize: out = (tensor product of per-axis tap matrices) x; gx = its transpose times gout.
// Rows along the last axis as in the forward kernel; scattered serially (taps of neighbouring
// rows overlap).

void resize_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // roi, scales, sizes: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const Tensor& x = *in[0];
  const Shape& os = out[0]->shape;
  const int r = x.rank();
  const int64_t total = numel(os);
  zero(gx);
  if (total == 0) return;
  const std::vector<ResizeAxisTaps> taps = resize_axis_taps(n, in, os);
  int64_t combos = 1;  // tap combinations over the axes before the last
  for (int d = 0; d < r - 1; ++d) combos *= taps[d].k;
  const auto st = strides_of(x.shape);
  const int64_t L = os[r - 1], rows = total / L, lst = st[r - 1];
  const ResizeAxisTaps& lt = taps[r - 1];
  const float* G = gout[0]->data<float>();
  std::vector<double> acc((size_t)x.numel(), 0.0);
  std::vector<int64_t> o((size_t)r), coff((size_t)combos);
  std::vector<double> cw((size_t)combos);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row;
    for (int d = r - 2; d >= 0; --d) {
      o[d] = rem % os[d];
      rem /= os[d];
    }
    for (int64_t c = 0; c < combos; ++c) {
      int64_t off = 0, cr = c;
      double w = 1;
      for (int d = r - 2; d >= 0; --d) {
        const ResizeAxisTaps& t = taps[d];
        const int j = (int)(cr % t.k);
        cr /= t.k;
        off += t.idx[o[d] * t.k + j] * st[d];
        w *= t.w[o[d] * t.k + j];
      }
      coff[c] = off;
      cw[c] = w;
    }
    const float* grow = G + row * L;
    for (int64_t j = 0; j < L; ++j)
      for (int64_t c = 0; c < combos; ++c) {
        const double gw = cw[c] * grow[j];
        for (int t = 0; t < lt.k; ++t)
          acc[coff[c] + lt.idx[j * lt.k + t] * lst] += gw * lt.w[j * lt.k + t];
      }
  }
  float* R = gx->data<float>();
  for (int64_t e = 0; e < x.numel(); ++e) R[e] = (float)acc[e];
}

}  // namespace

void register_pointwise_backward() {
  register_backward("Add", checked<binary_bw<Bin::Add>>);
  register_backward("Sub", checked<binary_bw<Bin::Sub>>);
  register_backward("Mul", checked<binary_bw<Bin::Mul>>);
  register_backward("Div", checked<binary_bw<Bin::Div>>);
  register_backward("Pow", checked<binary_bw<Bin::Pow>>);
  register_backward("Max", checked<binary_bw<Bin::Max>>);
  register_backward("Min", checked<binary_bw<Bin::Min>>);
  register_backward("Sum", checked<sum_bw>);
  register_backward("Where", checked<where_bw>);
  register_backward("Sqrt", checked<unary_bw<Un::Sqrt>>);
  register_backward("Erf", checked<unary_bw<Un::Erf>>);
  register_backward("Relu", checked<unary_bw<Un::Relu>>);
  register_backward("Sigmoid", checked<unary_bw<Un::Sigmoid>>);
  register_backward("Tanh", checked<unary_bw<Un::Tanh>>);
  register_backward("Exp", checked<unary_bw<Un::Exp>>);
  register_backward("Log", checked<unary_bw<Un::Log>>);
  register_backward("Neg", checked<unary_bw<Un::Neg>>);
  register_backward("Abs", checked<unary_bw<Un::Abs>>);
  register_backward("Reciprocal", checked<unary_bw<Un::Reciprocal>>);
  register_backward("Sin", checked<unary_bw<Un::Sin>>);
  register_backward("Cos", checked<unary_bw<Un::Cos>>);
  register_backward("Softplus", checked<unary_bw<Un::Softplus>>);
  register_backward("LeakyRelu", checked<leaky_relu_bw>);
  register_backward("Clip", checked<clip_bw>);
  register_backward("Cast", checked<cast_bw>);
  register_backward("CastLike", checked<cast_bw>);
  register_backward("Identity", checked<copy_bw>);
  register_backward("Reshape", checked<copy_bw>);
  register_backward("Squeeze", checked<copy_bw>);
  register_backward("Unsqueeze", checked<copy_bw>);
  register_backward("Flatten", checked<copy_bw>);
  register_backward("Concat", checked<concat_bw>);
  register_backward("Split", checked<first_input_bw<true>>);
  register_backward("Slice", checked<first_input_bw<true>>);
  register_backward("Transpose", checked<first_input_bw<true>>);
  register_backward("DepthToSpace", checked<first_input_bw<true>>);
  register_backward("Gather", checked<first_input_bw<false>>);    // repeated indices
  register_backward("GatherND", checked<first_input_bw<false>>);
  register_backward("Expand", checked<first_input_bw<false>>);
  register_backward("Tile", checked<first_input_bw<false>>);
  register_backward("Pad", checked<pad_bw>);
  register_backward("Resize", checked<resize_bw>);
}

}  // namespace wxe::cpu
