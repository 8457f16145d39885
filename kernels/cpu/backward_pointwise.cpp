// Backward kernels of the elementwise, shape and data ops (engine/ir/ops.h BackwardFn).
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
//
// Fast paths (the registered kernels; backward_pointwise.h gives tests either one): binary
// arithmetic over contiguous arrays (a broadcast operand expanded once, the gradient of a
// broadcast input summed by broadcast_sum, broadcast.h), Erf in float, Transpose as the
// inverse transpose of the gradient, Concat as a split of it, DepthToSpace as the row copies
// of its forward run backwards, Slice as row copies into zeros, Resize one axis at a time. The code above them stays as
// the reference.
#include "kernels/cpu/backward_pointwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include <omp.h>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/transpose.h"

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

// ---------------------------------------------------------------------------------------
// Fast paths.

// Buffers of whole-output size: the thread's scratch slots (dnnl_util.h).
float* scratch(int i, int64_t count) { return onednn::scratch_slot(i).floats(count); }

// dst[i] = binary_grad<OP>(K, a[i], b[i], g[i]) over contiguous arrays.
template <Bin OP, int K>
void binary_grad_loop(const float* a, const float* b, const float* g, int64_t total, float* dst) {
#pragma omp parallel for simd schedule(static) if (total > kParallelMin)
  for (int64_t i = 0; i < total; ++i) dst[i] = (float)binary_grad<OP>(K, a[i], b[i], g[i]);
}

// Binary arithmetic: the operands the derivative reads, broadcast to the output shape (a
// copy only for a broadcast one); the derivative elementwise, straight into the gradient of a
// full-shape input, else into a buffer summed to the input's shape.
template <Bin OP>
void binary_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  constexpr bool reads_operands = OP != Bin::Add && OP != Bin::Sub;  // Add, Sub: shapes only
  Tensor ka, kb;  // float32 copies of non-float32 operands (Pow's integer exponent)
  const float* A = reads_operands ? as_f32(*in[0], ka) : nullptr;
  const float* B = reads_operands ? as_f32(*in[1], kb) : nullptr;
  const float* G = gout[0]->data<float>();
  const Shape& os = out[0]->shape;
  const int64_t total = numel(os);
  if (reads_operands) {
    if (in[0]->numel() != total) {  // same count means same layout (leading 1s at most)
      float* t = scratch(0, total);
      broadcast_expand(broadcast_plan(in[0]->shape, os), A, t);
      A = t;
    }
    if (in[1]->numel() != total) {
      float* t = scratch(1, total);
      broadcast_expand(broadcast_plan(in[1]->shape, os), B, t);
      B = t;
    }
  }
  for (int k = 0; k < 2; ++k) {
    Tensor* gk = gin[k];
    if (!gk) continue;
    const bool full = gk->numel() == total;
    const float* d = G;  // the derivative at every output element
    if (OP == Bin::Sub && k == 1) {  // -g: no operand read
      float* t = full ? gk->data<float>() : scratch(2, total);
#pragma omp parallel for simd schedule(static) if (total > kParallelMin)
      for (int64_t i = 0; i < total; ++i) t[i] = -G[i];
      if (full) continue;
      d = t;
    } else if (reads_operands) {
      float* t = full ? gk->data<float>() : scratch(2, total);
      if (k == 0) binary_grad_loop<OP, 0>(A, B, G, total, t);
      else binary_grad_loop<OP, 1>(A, B, G, total, t);
      if (full) continue;
      d = t;
    }
    if (full) std::memcpy(gk->raw(), d, (size_t)total * sizeof(float));
    else broadcast_sum(broadcast_plan(in[k]->shape, os), d, gk->data<float>());
  }
}

// exp(-x^2) in float without a libm call or a branch, so that loops over it vectorize:
// x^2 = s + lo exactly (fma); -min(s, 87) = n ln2 + r with |r| <= ln2 / 2; exp(r) by Cephes'
// expf polynomial (about 1 ulp); times 2^n built in the exponent bits, times (1 - lo).
// Relative error about 2e-7 against exp(-x^2) in double. 0 where x^2 > 87 (the true value is
// below 1.7e-38), NaN for NaN.
inline float exp_neg_square(float x) {
  const float s = x * x;
  const float lo = std::fma(x, x, -s);
  const int32_t sb = __builtin_bit_cast(int32_t, s) & 0x7fffffff;
  constexpr int32_t kLim = 0x42AE0000;  // 87.0f
  const float c = -__builtin_bit_cast(float, sb < kLim ? sb : kLim);
  const float t = c * 1.44269504f + 12582912.f;  // 1.5 * 2^23: round(c log2(e)) in the low bits
  const float n = t - 12582912.f;
  const float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const float scale = __builtin_bit_cast(float, (__builtin_bit_cast(int32_t, t) - 0x4B400000 + 127) << 23);
  const int32_t eb = __builtin_bit_cast(int32_t, p * scale * (1.f - lo));
  // masks, not branches: a branch would make the float arithmetic above conditional, which
  // GCC (trapping math) then does not vectorize
  const int32_t in_range = -(int32_t)(sb < kLim), nan = -(int32_t)(sb > 0x7f800000);
  return __builtin_bit_cast(float, (eb & in_range) | (0x7fc00000 & nan));
}

// Erf: 2/sqrt(pi) exp(-x^2) g in float, vectorized (the reference makes a double libm call
// per element): 2x faster at 1 thread.
void erf_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(in[0]->dtype == DType::F32 && out[0]->dtype == DType::F32, "float32 only");
  const float* X = in[0]->data<float>();
  const float* G = gout[0]->data<float>();
  float* R = gin[0]->data<float>();
  const int64_t cnt = gin[0]->numel();
#pragma omp parallel for simd schedule(static) if (cnt > kParallelMin)
  for (int64_t i = 0; i < cnt; ++i) R[i] = G[i] * (1.12837917f * exp_neg_square(X[i]));
}

// dst = src permuted: dst (shape ds) element c reads src at sum c[d] * sst[d]. Adjacent dims
// that stay adjacent in src are merged; rows of the innermost dim are parallel, one index
// decomposition per row.
void permute_f32(const float* src, const Shape& ds, const std::vector<int64_t>& sst, float* dst) {
  std::vector<int64_t> dims, st;
  for (size_t d = 0; d < ds.size(); ++d) {
    if (ds[d] == 1) continue;
    if (!dims.empty() && st.back() == sst[d] * ds[d]) {
      dims.back() *= ds[d];
      st.back() = sst[d];
    } else {
      dims.push_back(ds[d]);
      st.push_back(sst[d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    st.push_back(1);
  }
  // rows of the innermost dim, two innermost dims when that one is short (window shuffles:
  // runs of 2 elements)
  const int m = (int)dims.size();
  const int64_t L = dims[m - 1], ls = st[m - 1], total = numel(ds);
  const int inner = m >= 2 && L < 64 ? 2 : 1;
  const int64_t L2 = inner == 2 ? dims[m - 2] : 1, ls2 = inner == 2 ? st[m - 2] : 0;
  const int64_t rows = total ? total / (L * L2) : 0;
  const int outer = m - inner;  // dims walked by an odometer, one division per chunk of rows
  const int64_t chunks = std::min<int64_t>(rows, 64);
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    std::vector<int64_t> idx((size_t)outer);
    int64_t rem = r0, so = 0;
    for (int d = outer - 1; d >= 0; --d) {
      idx[d] = rem % dims[d];
      so += idx[d] * st[d];
      rem /= dims[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      float* o = dst + r * L * L2;
      for (int64_t i = 0; i < L2; ++i) {
        const float* s = src + so + i * ls2;
        for (int64_t j = 0; j < L; ++j) o[i * L + j] = s[j * ls];
      }
      for (int d = outer - 1; d >= 0; --d) {  // next row
        so += st[d];
        if (++idx[d] < dims[d]) break;
        so -= dims[d] * st[d];
        idx[d] = 0;
      }
    }
  }
}

// Transpose: the gradient transposed back (gx[x] = gy[y] where y[i] = x[perm[i]]). The fast
// Transpose kernel when the permutation swaps two blocks of axes (its 8x8 tiles), else a
// strided copy.
void transpose_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const int64_t r = in[0]->rank();
  std::vector<int64_t> perm = n.ints("perm");
  if (!n.has("perm"))
    for (int64_t d = r - 1; d >= 0; --d) perm.push_back(d);
  NCHECK((int64_t)perm.size() == r, "perm has ", perm.size(), " entries for rank ", r);
  std::vector<int64_t> inv((size_t)r);
  for (int64_t d = 0; d < r; ++d) inv[perm[d]] = d;
  // inverse permutation a block swap (p fixed axes, then blocks of a and r - p - a axes)?
  int64_t p = 0;
  while (p < r && inv[p] == p) ++p;
  bool swap = p < r;
  const int64_t a = swap ? inv[p] - p : 0;
  for (int64_t i = p; i < r && swap; ++i) swap = inv[i] == (i < r - a ? i + a : p + i - (r - a));
  if (swap) {
    Node t;
    t.op = "Transpose";
    t.name = n.name + "/grad";
    t.attrs["perm"] = attr_ints(inv);
    t.inputs = {0};
    t.outputs = {1};
    kernel_for("Transpose", KernelKind::Fast)(t, {gout[0]}, {gin[0]});
    return;
  }
  const std::vector<int64_t> yst = strides_of(out[0]->shape);
  std::vector<int64_t> sst((size_t)r);
  for (int64_t i = 0; i < r; ++i) sst[perm[i]] = yst[i];
  permute_f32(gout[0]->data<float>(), in[0]->shape, sst, gin[0]->data<float>());
}

// Concat: each input's gradient is its slab of the output gradient.
void concat_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const Shape& os = out[0]->shape;
  const int64_t axis = norm_axis(n.i("axis", 0), (int64_t)os.size(), n);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  for (size_t d = axis + 1; d < os.size(); ++d) inner *= os[d];
  const int64_t out_row = os[axis] * inner;
  const float* G = gout[0]->data<float>();
  int64_t col = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t row = in[k]->shape[axis] * inner;
    if (gin[k]) {
      float* dst = gin[k]->data<float>();
#pragma omp parallel for schedule(static) if (outer * row > kParallelMin)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + o * row, G + o * out_row + col, (size_t)row * sizeof(float));
    }
    col += row;
  }
}

// PlaneGather (data_ops.cpp): each plane's gradient scattered back through the map, summed where
// the map repeats an index (padding copies), in map order.
void plane_gather_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const Shape& xs = in[0]->shape;
  const int64_t plane = xs[xs.size() - 2] * xs[xs.size() - 1], q = in[1]->numel();
  const int64_t planes = plane ? gin[0]->numel() / plane : 0;
  const int32_t* map = in[1]->data<int32_t>();
  const float* gy = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
#pragma omp parallel for schedule(static) if (planes * q > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    float* d = gx + p * plane;
    const float* s = gy + p * q;
    std::fill(d, d + plane, 0.f);
    for (int64_t i = 0; i < q; ++i) d[map[i]] += s[i];
  }
}

// DepthToSpace (a permutation): the gradient copied back row by row, the forward's loop
// (fast.cpp) with its sides swapped: gx[n, ic(c, i, j), h, w] = gy[n, c, h b + i, w b + j],
// CRD: ic = c b^2 + i b + j, DCR: ic = (i b + j) C_out + c.
void depth_to_space_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const std::string mode = n.s("mode", "DCR");
  const int64_t b = n.i("blocksize", 0);
  if (in[0]->rank() != 4 || b <= 0 || (mode != "CRD" && mode != "DCR")) return first_input_bw<true>(n, in, out, gout, gin);
  const Shape& s = in[0]->shape;
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3], Co = C / (b * b), Wo = W * b;
  const bool crd = mode == "CRD";
  const float* gy = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N * Co * H; ++row) {
    const int64_t h = row % H, nc = row / H, c = nc % Co, bn = nc / Co;
    for (int64_t i = 0; i < b; ++i) {
      const float* g = gy + ((nc * H + h) * b + i) * Wo;
      for (int64_t j = 0; j < b; ++j) {
        const int64_t ic = crd ? c * b * b + i * b + j : (i * b + j) * Co + c;
        float* d = gx + ((bn * C + ic) * H + h) * W;
        for (int64_t w = 0; w < W; ++w) d[w] = g[w * b + j];
      }
    }
  }
}

// Zeros in parallel (a whole-tensor gradient of tens of MB).
void zero_parallel(Tensor* t) {
  const int64_t cnt = t->numel();
  float* p = t->data<float>();
  constexpr int64_t kBlock = 1 << 16;
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
  for (int64_t b = 0; b < (cnt + kBlock - 1) / kBlock; ++b)
    std::memset(p + b * kBlock, 0, sizeof(float) * (size_t)std::min(kBlock, cnt - b * kBlock));
}

// Slice: zeros, and the gradient's rows copied to where the forward read them (slice_plan:
// the forward's own clamping of starts, ends and steps).
// Zeroes what of gx the slice's copy will not write: with one axis cut at step 1 (CREDIT's crops)
// only the rows before and after the slice, else all of gx.
void zero_outside_slice(Tensor* gx, const std::vector<SliceDim>& plan) {
  const Shape& s = gx->shape;
  int cut = -1;
  for (size_t d = 0; d < plan.size(); ++d)
    if (plan[d].start != 0 || plan[d].step != 1 || plan[d].len != s[d]) {
      if (cut >= 0 || plan[d].step != 1) return zero_parallel(gx);
      cut = (int)d;
    }
  if (cut < 0) return;  // the whole tensor
  const int64_t inner = prod(s, cut + 1, s.size()), outer = prod(s, 0, cut), row = s[cut] * inner;
  const int64_t a = plan[cut].start * inner, b = a + plan[cut].len * inner;
  float* g = gx->data<float>();
#pragma omp parallel for schedule(static) if (outer * (row - (b - a)) > (1 << 16))
  for (int64_t o = 0; o < outer; ++o) {
    std::fill(g + o * row, g + o * row + a, 0.f);
    std::fill(g + o * row + b, g + (o + 1) * row, 0.f);
  }
}

void slice_bw_fast(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // starts, ends, axes, steps: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const std::vector<SliceDim> plan = slice_plan(n, in[0]->shape, in[1]->to_i64(), in[2]->to_i64(), opt_ints(in, 3),
                                                opt_ints(in, 4));
  zero_outside_slice(gx, plan);
  const std::vector<int64_t> st = strides_of(in[0]->shape);
  std::vector<int64_t> dims, gst = strides_of(gout[0]->shape), dst;
  int64_t base = 0;
  for (size_t d = 0; d < plan.size(); ++d) {
    base += plan[d].start * st[d];
    dims.push_back(plan[d].len);
    dst.push_back(plan[d].step * st[d]);
  }
  if (gout[0]->numel() > 0) strided_copy_f32(dims, gout[0]->data<float>(), gst, gx->data<float>() + base, dst);
}

// Resize: the per-axis taps' transposes applied one axis at a time, last axis first (each a
// scatter along one axis, parallel over the others, so no two threads add into one element);
// axes the forward leaves as they are are skipped.
void resize_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // roi, scales, sizes: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const Shape& xs = in[0]->shape;
  Shape cur = out[0]->shape;
  const int r = (int)xs.size();
  if (numel(cur) == 0 || numel(xs) == 0) return zero(gx);
  const std::vector<ResizeAxisTaps> taps = resize_axis_taps(n, in, cur);
  std::vector<int> axes;
  for (int d = r - 1; d >= 0; --d)
    if (!resize_axis_is_identity(taps[d], xs[d], cur[d])) axes.push_back(d);
  if (axes.empty()) {
    std::memcpy(gx->raw(), gout[0]->raw(), gx->nbytes());
    return;
  }
  const int64_t planes = r >= 2 ? numel(xs) / (xs[r - 1] * xs[r - 2]) : 0;
  if (axes.back() >= r - 2 && planes >= omp_get_max_threads()) {
    // only the last two axes resized (CREDIT's interpolation): per plane, each output row's
    // gradient scattered along its row, then added into the input rows it read
    const ResizeAxisTaps &th = taps[r - 2], &tw = taps[r - 1];
    const int64_t H = xs[r - 2], W = xs[r - 1], OH = cur[r - 2], OW = cur[r - 1];
    const float* dy = gout[0]->data<float>();
    float* dx = gx->data<float>();
#pragma omp parallel
    {
      std::vector<float> row((size_t)W);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < planes; ++p) {
        float* dxp = dx + p * H * W;
        std::fill(dxp, dxp + H * W, 0.f);
        for (int64_t oh = 0; oh < OH; ++oh) {
          std::fill(row.begin(), row.end(), 0.f);
          const float* dyr = dy + (p * OH + oh) * OW;
          for (int64_t ow = 0; ow < OW; ++ow)
            for (int k = 0; k < tw.k; ++k) row[tw.idx[ow * tw.k + k]] += tw.w[ow * tw.k + k] * dyr[ow];
          for (int k = 0; k < th.k; ++k) {
            const float w = th.w[oh * th.k + k];
            float* dxr = dxp + th.idx[oh * th.k + k] * W;
            for (int64_t c = 0; c < W; ++c) dxr[c] += w * row[c];
          }
        }
      }
    }
    return;
  }
  Tensor a, b;  // ping-pong buffers; the last pass writes into gx
  const Tensor* src = gout[0];
  for (size_t i = 0; i < axes.size(); ++i) {
    const int d = axes[i];
    Shape next = cur;
    next[d] = xs[d];
    Tensor* dst = gx;
    if (i + 1 < axes.size()) {
      Tensor& t = src == &a ? b : a;
      t = Tensor(DType::F32, next);
      dst = &t;
    }
    zero_parallel(dst);
    int64_t outer = 1, inner = 1;
    for (int e = 0; e < d; ++e) outer *= cur[e];
    for (int e = d + 1; e < r; ++e) inner *= cur[e];
    const int64_t L = cur[d], Li = xs[d];
    const ResizeAxisTaps& t = taps[d];
    const float* S = src->data<float>();
    float* D = dst->data<float>();
#pragma omp parallel for schedule(static) if (outer * L * inner > kParallelMin)
    for (int64_t q = 0; q < outer; ++q)
      for (int64_t o = 0; o < L; ++o)
        for (int j = 0; j < t.k; ++j) {
          const float w = t.w[o * t.k + j];
          if (w == 0.f) continue;
          const float* s = S + (q * L + o) * inner;
          float* dd = D + (q * Li + t.idx[o * t.k + j]) * inner;
          for (int64_t e = 0; e < inner; ++e) dd[e] += w * s[e];
        }
    cur = next;
    src = dst;
  }
}

// Op -> (reference, fast) for the ops with a fast path.
const std::map<std::string, std::pair<BackwardFn, BackwardFn>>& fast_table() {
  static const std::map<std::string, std::pair<BackwardFn, BackwardFn>> t = {
      {"Add", {checked<binary_bw<Bin::Add>>, checked<binary_bw_fast<Bin::Add>>}},
      {"Sub", {checked<binary_bw<Bin::Sub>>, checked<binary_bw_fast<Bin::Sub>>}},
      {"Mul", {checked<binary_bw<Bin::Mul>>, checked<binary_bw_fast<Bin::Mul>>}},
      {"Div", {checked<binary_bw<Bin::Div>>, checked<binary_bw_fast<Bin::Div>>}},
      {"Pow", {checked<binary_bw<Bin::Pow>>, checked<binary_bw_fast<Bin::Pow>>}},
      {"Max", {checked<binary_bw<Bin::Max>>, checked<binary_bw_fast<Bin::Max>>}},
      {"Min", {checked<binary_bw<Bin::Min>>, checked<binary_bw_fast<Bin::Min>>}},
      {"Erf", {checked<unary_bw<Un::Erf>>, checked<erf_bw_fast>}},
      {"Transpose", {checked<first_input_bw<true>>, checked<transpose_bw_fast>}},
      {"DepthToSpace", {checked<first_input_bw<true>>, checked<depth_to_space_bw_fast>}},
      {"Concat", {checked<concat_bw>, checked<concat_bw_fast>}},
      {"PlaneGather", {checked<first_input_bw<false>>, checked<plane_gather_bw_fast>}},
      {"Slice", {checked<first_input_bw<true>>, checked<slice_bw_fast>}},
      {"Resize", {checked<resize_bw>, checked<resize_bw_fast>}},
  };
  return t;
}

}  // namespace

BackwardFn pointwise_backward_kernel(const std::string& op, KernelKind kind) {
  auto it = fast_table().find(op);
  if (it == fast_table().end()) return backward_kernel(op);
  return kind == KernelKind::Fast ? it->second.second : it->second.first;
}

void register_pointwise_backward() {
  for (const auto& [op, fns] : fast_table()) register_backward(op, fns.second);
  // What these backward kernels read of the forward: shapes only (the data movements number
  // their data inputs and run the forward on the numbers, scatter_bw; Add and Sub pass the
  // gradient through; the copies copy it); index, pad and shape inputs are read.
  for (const char* op : {"Add", "Sub", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "CastLike",
                         "Transpose", "Concat"})
    register_backward_reads(op, {0u, false});
  for (const char* op : {"Slice", "Split", "DepthToSpace", "Expand", "Tile", "Pad", "Gather", "GatherND", "Resize",
                         "PlaneGather"})
    register_backward_reads(op, {~1u, false});  // all but the data input 0
  // the operands, not the output (which is only the broadcast shape); Where: the condition
  for (const char* op : {"Mul", "Div", "Pow", "Max", "Min", "Erf"}) register_backward_reads(op, {~0u, false});
  register_backward_reads("Where", {1u, false});
  // the output's gradient itself for Add's full-shape inputs and Sub's first (engine/ir/ops.h)
  register_gradient_passthrough("Add", 3u);
  register_gradient_passthrough("Sub", 1u);
  register_backward_reads("Sum", {0u, false});
  register_backward("Sum", checked<sum_bw>);
  register_backward("Where", checked<where_bw>);
  register_backward("Sqrt", checked<unary_bw<Un::Sqrt>>);
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
  register_backward("Split", checked<first_input_bw<true>>);
  register_backward("Gather", checked<first_input_bw<false>>);    // repeated indices
  register_backward("GatherND", checked<first_input_bw<false>>);
  register_backward("Expand", checked<first_input_bw<false>>);
  register_backward("Tile", checked<first_input_bw<false>>);
  register_backward("Pad", checked<pad_bw>);
}

}  // namespace wxe::cpu
