// Elementwise ops with numpy broadcasting: arithmetic, comparisons, activations, Cast, Where.
#include <cmath>
#include <cstring>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {

const Shape& shape_of(const Value* v, const Node& n, size_t i) {
  WXE_CHECK(v, "node ", n.name, " (", n.op, "): missing input ", i);
  return v->shape;
}

// Output shape of a broadcasting op over all its inputs.
Shape broadcast_all(const Node& n, const std::vector<const Value*>& in) {
  Shape s = shape_of(in[0], n, 0);
  for (size_t i = 1; i < in.size(); ++i) s = broadcast_shapes(s, shape_of(in[i], n, i), n);
  return s;
}

// Iterates over an output of shape `out` with up to three broadcast inputs, calling
// f(out_index, in0_index, in1_index, in2_index) for the inner run of the last dimension.
// Strides of broadcast dimensions are 0.
struct BroadcastPlan {
  Shape out;
  std::vector<std::vector<int64_t>> strides;  // per input, per out dim
  BroadcastPlan(const Shape& o, const std::vector<Shape>& ins) : out(o) {
    for (const Shape& s : ins) {
      std::vector<int64_t> st(o.size(), 0);
      std::vector<int64_t> cs = strides_of(s);
      size_t off = o.size() - s.size();
      for (size_t d = 0; d < s.size(); ++d) st[off + d] = s[d] == 1 ? 0 : cs[d];
      strides.push_back(st);
    }
    // collapse adjacent dims when every input steps through them the same way
    Shape co;
    std::vector<std::vector<int64_t>> cst(strides.size());
    for (size_t d = 0; d < o.size(); ++d) {
      if (o[d] == 1) continue;
      bool merge = !co.empty();
      for (size_t k = 0; k < strides.size() && merge; ++k)
        merge = cst[k].back() == strides[k][d] * o[d];
      if (merge) {
        co.back() *= o[d];
        for (size_t k = 0; k < strides.size(); ++k) cst[k].back() = strides[k][d];
      } else {
        co.push_back(o[d]);
        for (size_t k = 0; k < strides.size(); ++k) cst[k].push_back(strides[k][d]);
      }
    }
    if (co.empty()) {
      co.push_back(1);
      for (auto& s : cst) s.push_back(0);
    }
    out = co;
    strides = cst;
  }
  template <class F>
  void run(F f) const {
    int r = (int)out.size();
    int64_t inner = out[r - 1], outer = numel(out) / std::max<int64_t>(inner, 1);
    if (inner == 0) return;
#pragma omp parallel for if (outer * inner > 32768)
    for (int64_t o = 0; o < outer; ++o) {
      int64_t rem = o, off[3] = {0, 0, 0};
      for (int d = r - 2; d >= 0; --d) {
        int64_t idx = rem % out[d];
        rem /= out[d];
        for (size_t k = 0; k < strides.size(); ++k) off[k] += idx * strides[k][d];
      }
      int64_t s[3] = {0, 0, 0};
      for (size_t k = 0; k < strides.size(); ++k) s[k] = strides[k][r - 1];
      f(o * inner, inner, off, s);
    }
  }
};

std::vector<Shape> in_shapes(const std::vector<const Tensor*>& in) {
  std::vector<Shape> s;
  for (auto* t : in) s.push_back(t->shape);
  return s;
}

// ---- binary arithmetic ----
enum class Bin { Add, Sub, Mul, Div, Pow, Max, Min, Mod };

template <class T>
inline T apply(Bin op, T a, T b) {
  switch (op) {
    case Bin::Add: return a + b;
    case Bin::Sub: return a - b;
    case Bin::Mul: return a * b;
    case Bin::Div:
      if constexpr (std::is_integral_v<T>) {
        if (b == 0) return 0;
        if constexpr (std::is_signed_v<T>)  // INT_MIN / -1 overflows (SIGFPE): wrap instead
          if (b == -1) return (T)(0 - (std::make_unsigned_t<T>)a);
        return a / b;
      } else {
        return a / b;
      }
    case Bin::Pow: return (T)std::pow((double)a, (double)b);
    case Bin::Max: return a > b ? a : b;
    case Bin::Min: return a < b ? a : b;
    case Bin::Mod:
      if constexpr (std::is_integral_v<T>) {
        if (b == 0) return 0;
        if constexpr (std::is_signed_v<T>)
          if (b == -1) return 0;  // INT_MIN % -1 traps
        T m = a % b;
        return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;  // fmod=0: sign of divisor
      } else {
        return std::fmod(a, b);
      }
  }
  return a;
}

template <class T, Bin OP>
void binary_typed(const Tensor& a, const Tensor& b, Tensor& c) {
  BroadcastPlan p(c.shape, {a.shape, b.shape});
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = c.data<T>();
  p.run([&](int64_t o, int64_t n, const int64_t* off, const int64_t* s) {
    const T* x = pa + off[0];
    const T* y = pb + off[1];
    T* z = pc + o;
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) z[i] = apply(OP, x[i], y[i]);
    } else if (s[0] == 1 && s[1] == 0) {
      T yv = *y;
      for (int64_t i = 0; i < n; ++i) z[i] = apply(OP, x[i], yv);
    } else {
      for (int64_t i = 0; i < n; ++i) z[i] = apply(OP, x[i * s[0]], y[i * s[1]]);
    }
  });
}

template <Bin OP>
void binary_kernel(const Node& n, const std::vector<const Tensor*>& in,
                   const std::vector<Tensor*>& out) {
  const Tensor &a = *in[0], &b = *in[1];
  WXE_CHECK(a.dtype == b.dtype, "node ", n.name, " (", n.op, "): input dtypes ",
            dtype_name(a.dtype), " and ", dtype_name(b.dtype), " differ");
  switch (a.dtype) {
    case DType::F32: return binary_typed<float, OP>(a, b, *out[0]);
    case DType::F64: return binary_typed<double, OP>(a, b, *out[0]);
    case DType::I64: return binary_typed<int64_t, OP>(a, b, *out[0]);
    case DType::I32: return binary_typed<int32_t, OP>(a, b, *out[0]);
    default: fail("node ", n.name, " (", n.op, "): dtype ", dtype_name(a.dtype), " unsupported");
  }
}

std::vector<TypeShape> same_as_first_broadcast(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() >= 2, "node ", n.name, " (", n.op, "): needs 2 inputs");
  return {{in[0]->dtype, broadcast_all(n, in)}};
}

// ---- comparisons and logic -> bool ----
enum class Cmp { Eq, Lt, Gt, Le, Ge, And, Or, Xor };

template <class T, Cmp OP>
void compare_typed(const Tensor& a, const Tensor& b, Tensor& c) {
  BroadcastPlan p(c.shape, {a.shape, b.shape});
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  uint8_t* pc = c.data<uint8_t>();
  p.run([&](int64_t o, int64_t n, const int64_t* off, const int64_t* s) {
    for (int64_t i = 0; i < n; ++i) {
      T x = pa[off[0] + i * s[0]], y = pb[off[1] + i * s[1]];
      bool r = false;
      switch (OP) {
        case Cmp::Eq: r = x == y; break;
        case Cmp::Lt: r = x < y; break;
        case Cmp::Gt: r = x > y; break;
        case Cmp::Le: r = x <= y; break;
        case Cmp::Ge: r = x >= y; break;
        case Cmp::And: r = x && y; break;
        case Cmp::Or: r = x || y; break;
        case Cmp::Xor: r = (bool)x != (bool)y; break;
      }
      pc[o + i] = r;
    }
  });
}

template <Cmp OP>
void compare_kernel(const Node& n, const std::vector<const Tensor*>& in,
                    const std::vector<Tensor*>& out) {
  const Tensor &a = *in[0], &b = *in[1];
  WXE_CHECK(a.dtype == b.dtype, "node ", n.name, " (", n.op, "): input dtypes differ");
  switch (a.dtype) {
    case DType::F32: return compare_typed<float, OP>(a, b, *out[0]);
    case DType::F64: return compare_typed<double, OP>(a, b, *out[0]);
    case DType::I64: return compare_typed<int64_t, OP>(a, b, *out[0]);
    case DType::I32: return compare_typed<int32_t, OP>(a, b, *out[0]);
    case DType::Bool: case DType::U8: return compare_typed<uint8_t, OP>(a, b, *out[0]);
    default: fail("node ", n.name, " (", n.op, "): dtype ", dtype_name(a.dtype), " unsupported");
  }
}

std::vector<TypeShape> bool_broadcast(const Node& n, const std::vector<const Value*>& in) {
  return {{DType::Bool, broadcast_all(n, in)}};
}

// ---- unary float ops ----
enum class Un { Sqrt, Erf, Relu, Sigmoid, Tanh, Exp, Log, Neg, Abs, Reciprocal, Floor, Ceil,
                Sin, Cos, Softplus, Identity };

template <Un OP>
inline float unary(float x) {
  switch (OP) {
    case Un::Sqrt: return std::sqrt(x);
    case Un::Erf: return std::erf(x);
    case Un::Relu: return x > 0 ? x : 0;
    case Un::Sigmoid: return 1.f / (1.f + std::exp(-x));
    case Un::Tanh: return std::tanh(x);
    case Un::Exp: return std::exp(x);
    case Un::Log: return std::log(x);
    case Un::Neg: return -x;
    case Un::Abs: return std::fabs(x);
    case Un::Reciprocal: return 1.f / x;
    case Un::Floor: return std::floor(x);
    case Un::Ceil: return std::ceil(x);
    case Un::Sin: return std::sin(x);
    case Un::Cos: return std::cos(x);
    case Un::Softplus: return x > 20 ? x : std::log1p(std::exp(x));
    case Un::Identity: return x;
  }
  return x;
}

template <Un OP>
void unary_kernel(const Node& n, const std::vector<const Tensor*>& in,
                  const std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  if (x.dtype == DType::I64 && (OP == Un::Neg || OP == Un::Abs || OP == Un::Relu)) {
    const int64_t* a = x.data<int64_t>();
    int64_t* c = out[0]->data<int64_t>();
    for (int64_t i = 0; i < x.numel(); ++i)
      c[i] = OP == Un::Neg ? -a[i] : OP == Un::Abs ? (a[i] < 0 ? -a[i] : a[i]) : (a[i] > 0 ? a[i] : 0);
    return;
  }
  WXE_CHECK(x.dtype == DType::F32, "node ", n.name, " (", n.op, "): dtype ",
            dtype_name(x.dtype), " unsupported (float32 only)");
  const float* a = x.data<float>();
  float* c = out[0]->data<float>();
  int64_t cnt = x.numel();
#pragma omp parallel for if (cnt > 32768)
  for (int64_t i = 0; i < cnt; ++i) c[i] = unary<OP>(a[i]);
}

std::vector<TypeShape> same_as_input(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(!in.empty() && in[0], "node ", n.name, " (", n.op, "): missing input");
  return {{in[0]->dtype, in[0]->shape}};
}

void not_kernel(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  for (int64_t i = 0; i < in[0]->numel(); ++i)
    out[0]->data<uint8_t>()[i] = !in[0]->data<uint8_t>()[i];
}

// ---- LeakyRelu / Clip / HardSigmoid style ops with attributes ----
void leaky_relu_kernel(const Node& n, const std::vector<const Tensor*>& in,
                       const std::vector<Tensor*>& out) {
  float alpha = n.f("alpha", 0.01f);
  const float* a = in[0]->data<float>();
  float* c = out[0]->data<float>();
  for (int64_t i = 0; i < in[0]->numel(); ++i) c[i] = a[i] >= 0 ? a[i] : alpha * a[i];
}

void clip_kernel(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  WXE_CHECK(in[0]->dtype == DType::F32, "node ", n.name, " (Clip): float32 only");
  float lo = in.size() > 1 && in[1] ? in[1]->to_f32().data<float>()[0] : -INFINITY;
  float hi = in.size() > 2 && in[2] ? in[2]->to_f32().data<float>()[0] : INFINITY;
  const float* a = in[0]->data<float>();
  float* c = out[0]->data<float>();
  for (int64_t i = 0; i < in[0]->numel(); ++i) c[i] = std::min(std::max(a[i], lo), hi);
}

// ---- Cast ----
DType onnx_dtype(int64_t t, const Node& n) {
  switch (t) {
    case 1: return DType::F32;
    case 2: return DType::U8;
    case 3: return DType::I8;
    case 6: return DType::I32;
    case 7: return DType::I64;
    case 9: return DType::Bool;
    case 10: return DType::F16;
    case 11: return DType::F64;
    case 16: return DType::BF16;
  }
  fail("node ", n.name, " (", n.op, "): unsupported element type ", t);
}

std::vector<TypeShape> cast_shape(const Node& n, const std::vector<const Value*>& in) {
  if (n.op == "CastLike") return {{in[1]->dtype, in[0]->shape}};
  return {{onnx_dtype(n.i("to", 1), n), in[0]->shape}};
}

void cast_kernel(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  convert(*in[0], *out[0]);
}

// ---- Where ----
std::vector<TypeShape> where_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 3, "node ", n.name, " (Where): needs 3 inputs");
  return {{in[1]->dtype, broadcast_all(n, in)}};
}

void where_kernel(const Node& n, const std::vector<const Tensor*>& in,
                  const std::vector<Tensor*>& out) {
  WXE_CHECK(in[1]->dtype == in[2]->dtype, "node ", n.name, " (Where): branch dtypes differ");
  BroadcastPlan p(out[0]->shape, in_shapes(in));
  size_t es = dtype_size(in[1]->dtype);
  const uint8_t* c = in[0]->data<uint8_t>();
  const uint8_t* x = (const uint8_t*)in[1]->raw();
  const uint8_t* y = (const uint8_t*)in[2]->raw();
  uint8_t* z = (uint8_t*)out[0]->raw();
  p.run([&](int64_t o, int64_t cnt, const int64_t* off, const int64_t* s) {
    for (int64_t i = 0; i < cnt; ++i) {
      bool take = c[off[0] + i * s[0]];
      const uint8_t* src = take ? x + (off[1] + i * s[1]) * es : y + (off[2] + i * s[2]) * es;
      std::memcpy(z + (o + i) * es, src, es);
    }
  });
}

// ---- Sum / Mean over several inputs (variadic) ----
void sum_kernel(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  Tensor acc = *in[0];
  for (size_t k = 1; k < in.size(); ++k) {
    Tensor next(DType::F32, broadcast_shapes(acc.shape, in[k]->shape, n));
    binary_typed<float, Bin::Add>(acc, *in[k], next);
    acc = next;
  }
  BroadcastPlan p(out[0]->shape, {acc.shape});
  const float* a = acc.data<float>();
  float* z = out[0]->data<float>();
  p.run([&](int64_t o, int64_t cnt, const int64_t* off, const int64_t* s) {
    for (int64_t i = 0; i < cnt; ++i) z[o + i] = a[off[0] + i * s[0]];
  });
}

std::vector<TypeShape> sum_shape(const Node& n, const std::vector<const Value*>& in) {
  return {{in[0]->dtype, broadcast_all(n, in)}};
}

}  // namespace

void register_elementwise() {
  register_op("Add", same_as_first_broadcast, binary_kernel<Bin::Add>);
  register_op("Sub", same_as_first_broadcast, binary_kernel<Bin::Sub>);
  register_op("Mul", same_as_first_broadcast, binary_kernel<Bin::Mul>);
  register_op("Div", same_as_first_broadcast, binary_kernel<Bin::Div>);
  register_op("Pow", same_as_first_broadcast, [](const Node& n, const std::vector<const Tensor*>& in,
                                                 const std::vector<Tensor*>& out) {
    if (in[0]->dtype == in[1]->dtype) return binary_kernel<Bin::Pow>(n, in, out);
    Tensor e(in[0]->dtype, in[1]->shape);  // exponent of another type: convert first
    convert(*in[1], e);
    binary_kernel<Bin::Pow>(n, {in[0], &e}, out);
  });
  register_op("Max", same_as_first_broadcast, binary_kernel<Bin::Max>);
  register_op("Min", same_as_first_broadcast, binary_kernel<Bin::Min>);
  register_op("Mod", same_as_first_broadcast, binary_kernel<Bin::Mod>);
  register_op("Sum", sum_shape, sum_kernel);
  register_op("Equal", bool_broadcast, compare_kernel<Cmp::Eq>);
  register_op("Less", bool_broadcast, compare_kernel<Cmp::Lt>);
  register_op("Greater", bool_broadcast, compare_kernel<Cmp::Gt>);
  register_op("LessOrEqual", bool_broadcast, compare_kernel<Cmp::Le>);
  register_op("GreaterOrEqual", bool_broadcast, compare_kernel<Cmp::Ge>);
  register_op("And", bool_broadcast, compare_kernel<Cmp::And>);
  register_op("Or", bool_broadcast, compare_kernel<Cmp::Or>);
  register_op("Xor", bool_broadcast, compare_kernel<Cmp::Xor>);
  register_op("Not", same_as_input, not_kernel);
  register_op("Sqrt", same_as_input, unary_kernel<Un::Sqrt>);
  register_op("Erf", same_as_input, unary_kernel<Un::Erf>);
  register_op("Relu", same_as_input, unary_kernel<Un::Relu>);
  register_op("Sigmoid", same_as_input, unary_kernel<Un::Sigmoid>);
  register_op("Tanh", same_as_input, unary_kernel<Un::Tanh>);
  register_op("Exp", same_as_input, unary_kernel<Un::Exp>);
  register_op("Log", same_as_input, unary_kernel<Un::Log>);
  register_op("Neg", same_as_input, unary_kernel<Un::Neg>);
  register_op("Abs", same_as_input, unary_kernel<Un::Abs>);
  register_op("Reciprocal", same_as_input, unary_kernel<Un::Reciprocal>);
  register_op("Floor", same_as_input, unary_kernel<Un::Floor>);
  register_op("Ceil", same_as_input, unary_kernel<Un::Ceil>);
  register_op("Sin", same_as_input, unary_kernel<Un::Sin>);
  register_op("Cos", same_as_input, unary_kernel<Un::Cos>);
  register_op("Softplus", same_as_input, unary_kernel<Un::Softplus>);
  register_op("LeakyRelu", same_as_input, leaky_relu_kernel);
  register_op("Clip", same_as_input, clip_kernel);
  register_op("Cast", cast_shape, cast_kernel);
  register_op("CastLike", cast_shape, cast_kernel);
  register_op("Where", where_shape, where_kernel);
}

}  // namespace wxe::cpu
