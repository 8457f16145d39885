// Backward kernels of the elementwise ops (engine/ir/ops.h BackwardFn), and the table and
// registration of every backward kernel here and in backward_movement.cpp (the shape and data
// ops).
//
// Elementwise ops: each output element's local derivative times its gradient, summed over
// the dims an input was broadcast along (double accumulators).
//
// Fast paths (the registered kernels; backward_pointwise.h gives tests either one): binary
// arithmetic over contiguous arrays (a broadcast operand expanded once, the gradient of a
// broadcast input summed by broadcast_sum, broadcast.h), Erf in float; the data movements'
// in backward_movement.cpp. The code above them stays as the reference.
#include "kernels/cpu/backward_pointwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include <omp.h>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_movement.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

using namespace pointwise_bw;

namespace {

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
  register_backward_reads("ScatterND", {2u, false});  // the indices
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
  register_backward("ScatterND", checked<scatternd_bw>);
  register_backward("Expand", checked<first_input_bw<false>>);
  register_backward("Tile", checked<first_input_bw<false>>);
  register_backward("Pad", checked<pad_bw>);
}

}  // namespace wxe::cpu
