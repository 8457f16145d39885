// Ops that move or describe data without arithmetic: Shape, Size, Reshape, Squeeze,
// Unsqueeze, Concat, ConstantOfShape, Identity, Expand, Range. dtype-generic.
#include <cmath>
#include <cstring>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {


std::vector<TypeShape> identity_shape(const Node& n, const std::vector<const Value*>& in) {
  return {{in[0]->dtype, in[0]->shape}};
}

// Shape (opset 15: start/end attributes)
std::vector<TypeShape> shape_shape(const Node& n, const std::vector<const Value*>& in) {
  int64_t r = (int64_t)in[0]->shape.size();
  int64_t start = n.i("start", 0), end = n.i("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::min(std::max<int64_t>(start, 0), r);
  end = std::min(std::max<int64_t>(end, 0), r);
  return {{DType::I64, {std::max<int64_t>(end - start, 0)}}};
}
void shape_kernel(const Node& n, const std::vector<const Tensor*>& in,
                  const std::vector<Tensor*>& out) {
  int64_t r = in[0]->rank();
  int64_t start = n.i("start", 0);
  if (start < 0) start += r;
  start = std::min(std::max<int64_t>(start, 0), r);
  for (int64_t i = 0; i < out[0]->numel(); ++i)
    out[0]->data<int64_t>()[i] = in[0]->shape[start + i];
}

std::vector<TypeShape> size_shape(const Node& n, const std::vector<const Value*>& in) {
  return {{DType::I64, {}}};
}
void size_kernel(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  *out[0]->data<int64_t>() = in[0]->numel();
}

// Reshape: 0 copies the input dim (unless allowzero), -1 is inferred.
std::vector<TypeShape> reshape_shape(const Node& n, const std::vector<const Value*>& in) {
  std::vector<int64_t> target = const_ints(n, in, 1);
  const Shape& s = in[0]->shape;
  bool allowzero = n.i("allowzero", 0) != 0;
  Shape out(target.size());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t d = target[i];
    if (d == 0 && !allowzero) {
      WXE_CHECK(i < s.size(), "node ", n.name, " (Reshape): 0 at position ", i,
                " but input has rank ", s.size());
      d = s[i];
    }
    if (d == -1) {
      WXE_CHECK(infer < 0, "node ", n.name, " (Reshape): more than one -1 in target shape");
      infer = (int)i;
      continue;
    }
    WXE_CHECK(d >= 0, "node ", n.name, " (Reshape): invalid dimension ", d);
    out[i] = d;
    WXE_CHECK(!__builtin_mul_overflow(known, d, &known), "node ", n.name, " (Reshape): target shape ",
              shape_str(target), " has too many elements");
  }
  if (infer >= 0) {
    WXE_CHECK(known != 0 && numel(s) % known == 0, "node ", n.name, " (Reshape): cannot reshape ",
              shape_str(s), " to ", shape_str(target));
    out[infer] = numel(s) / known;
  }
  WXE_CHECK(numel(out) == numel(s), "node ", n.name, " (Reshape): cannot reshape ", shape_str(s),
            " (", numel(s), " elements) to ", shape_str(out));
  return {{in[0]->dtype, out}};
}

// Squeeze / Unsqueeze: axes from the input (opset 13+) or the attribute (older).
std::vector<int64_t> axes_of(const Node& n, const std::vector<const Value*>& in, size_t idx) {
  if (in.size() > idx && in[idx]) return const_ints(n, in, idx);
  return n.ints("axes");
}

std::vector<TypeShape> squeeze_shape(const Node& n, const std::vector<const Value*>& in) {
  const Shape& s = in[0]->shape;
  std::vector<int64_t> axes = axes_of(n, in, 1);
  std::vector<bool> drop(s.size(), false);
  if (axes.empty()) {
    for (size_t i = 0; i < s.size(); ++i) drop[i] = s[i] == 1;
  }
  for (int64_t a : axes) {
    a = norm_axis(a, (int64_t)s.size(), n);
    WXE_CHECK(s[a] == 1, "node ", n.name, " (Squeeze): dimension ", a, " of ", shape_str(s),
              " is not 1");
    drop[a] = true;
  }
  Shape out;
  for (size_t i = 0; i < s.size(); ++i)
    if (!drop[i]) out.push_back(s[i]);
  return {{in[0]->dtype, out}};
}

std::vector<TypeShape> unsqueeze_shape(const Node& n, const std::vector<const Value*>& in) {
  const Shape& s = in[0]->shape;
  std::vector<int64_t> axes = axes_of(n, in, 1);
  int64_t r = (int64_t)(s.size() + axes.size());
  std::vector<bool> ins(r, false);
  for (int64_t a : axes) {
    a = norm_axis(a, r, n);
    WXE_CHECK(!ins[a], "node ", n.name, " (Unsqueeze): repeated axis ", a);
    ins[a] = true;
  }
  Shape out;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) out.push_back(ins[i] ? 1 : s[k++]);
  return {{in[0]->dtype, out}};
}

// Concat
std::vector<TypeShape> concat_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(!in.empty() && in[0], "node ", n.name, " (Concat): no inputs");
  Shape out = in[0]->shape;
  int64_t axis = norm_axis(n.i("axis", 0), (int64_t)out.size(), n);
  out[axis] = 0;
  for (const Value* v : in) {
    WXE_CHECK(v->shape.size() == out.size() && v->dtype == in[0]->dtype, "node ", n.name,
              " (Concat): input '", v->name, "' ", shape_str(v->shape), " does not match ",
              shape_str(in[0]->shape));
    for (size_t d = 0; d < out.size(); ++d)
      WXE_CHECK((int64_t)d == axis || v->shape[d] == in[0]->shape[d], "node ", n.name,
                " (Concat): input '", v->name, "' ", shape_str(v->shape), " does not match ",
                shape_str(in[0]->shape), " outside axis ", axis);
    out[axis] += v->shape[axis];
  }
  return {{in[0]->dtype, out}};
}

void concat_kernel(const Node& n, const std::vector<const Tensor*>& in,
                   const std::vector<Tensor*>& out) {
  const Shape& os = out[0]->shape;
  int64_t axis = norm_axis(n.i("axis", 0), (int64_t)os.size(), n);
  size_t es = dtype_size(out[0]->dtype);
  int64_t outer = 1, inner = (int64_t)es;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  for (size_t d = axis + 1; d < os.size(); ++d) inner *= os[d];
  int64_t out_row = os[axis] * inner, col = 0;
  uint8_t* dst = (uint8_t*)out[0]->raw();
  for (const Tensor* t : in) {
    int64_t row = t->shape[axis] * inner;
    const uint8_t* src = (const uint8_t*)t->raw();
#pragma omp parallel for if (outer * row > 65536)
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * out_row + col, src + o * row, row);
    col += row;
  }
}

// ConstantOfShape
std::vector<TypeShape> cos_shape(const Node& n, const std::vector<const Value*>& in) {
  auto it = n.attrs.find("value");
  DType t = it != n.attrs.end() && it->second.t ? it->second.t->dtype : DType::F32;
  return {{t, const_ints(n, in, 0)}};
}
void cos_kernel(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  auto it = n.attrs.find("value");
  size_t es = dtype_size(out[0]->dtype);
  uint8_t zero[8] = {0};
  const uint8_t* v = it != n.attrs.end() && it->second.t ? (const uint8_t*)it->second.t->raw() : zero;
  uint8_t* d = (uint8_t*)out[0]->raw();
  for (int64_t i = 0; i < out[0]->numel(); ++i) std::memcpy(d + i * es, v, es);
}

// Expand: numpy broadcast of the input to the given shape.
std::vector<TypeShape> expand_shape(const Node& n, const std::vector<const Value*>& in) {
  std::vector<int64_t> target = const_ints(n, in, 1);
  return {{in[0]->dtype, broadcast_shapes(in[0]->shape, target, n)}};
}
void expand_kernel(const Node& n, const std::vector<const Tensor*>& in,
                   const std::vector<Tensor*>& out) {
  const Shape& os = out[0]->shape;
  const Shape& is = in[0]->shape;
  size_t r = os.size(), off = r - is.size(), es = dtype_size(in[0]->dtype);
  std::vector<int64_t> ist = strides_of(is), st(r, 0);
  for (size_t d = 0; d < is.size(); ++d) st[off + d] = is[d] == 1 ? 0 : ist[d];
  const uint8_t* src = (const uint8_t*)in[0]->raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
  int64_t total = out[0]->numel();
#pragma omp parallel for if (total > 65536)
  for (int64_t i = 0; i < total; ++i) {
    int64_t rem = i, so = 0;
    for (size_t d = r; d-- > 0;) {
      so += (rem % os[d]) * st[d];
      rem /= os[d];
    }
    std::memcpy(dst + i * es, src + so * es, es);
  }
}

// Range(start, limit, delta)
std::vector<TypeShape> range_shape(const Node& n, const std::vector<const Value*>& in) {
  for (int i = 0; i < 3; ++i)
    WXE_CHECK(in[i] && in[i]->is_const() && in[i]->constant->numel() == 1, "node ", n.name,
              " (Range): inputs must be constant scalars");
  Tensor s = in[0]->constant->to_f32(), l = in[1]->constant->to_f32(), d = in[2]->constant->to_f32();
  double start = s.data<float>()[0], limit = l.data<float>()[0], delta = d.data<float>()[0];
  WXE_CHECK(delta != 0, "node ", n.name, " (Range): delta is 0");
  double count = std::ceil((limit - start) / delta);
  WXE_CHECK(std::isfinite(count) && count < 4.6e18, "node ", n.name, " (Range): ", count, " elements");
  int64_t cnt = std::max<int64_t>(0, (int64_t)count);
  return {{in[0]->dtype, {cnt}}};
}
void range_kernel(const Node& n, const std::vector<const Tensor*>& in,
                  const std::vector<Tensor*>& out) {
  Tensor& o = *out[0];
  if (o.dtype == DType::I64 || o.dtype == DType::I32) {
    int64_t start = in[0]->to_i64()[0], delta = in[2]->to_i64()[0];
    Tensor tmp(DType::I64, o.shape);
    for (int64_t i = 0; i < o.numel(); ++i)  // wraps like the int64 arithmetic it models, no UB
      tmp.data<int64_t>()[i] = (int64_t)((uint64_t)start + (uint64_t)i * (uint64_t)delta);
    convert(tmp, o);
  } else {
    float start = in[0]->to_f32().data<float>()[0], delta = in[2]->to_f32().data<float>()[0];
    Tensor tmp(DType::F32, o.shape);
    for (int64_t i = 0; i < o.numel(); ++i) tmp.data<float>()[i] = start + i * delta;
    convert(tmp, o);
  }
}

// Constant: the tensor in its one value attribute.
Tensor constant_value(const Node& n) {
  WXE_CHECK(n.attrs.size() == 1, "node ", n.name, " (Constant): needs exactly one value attribute");
  const std::string& key = n.attrs.begin()->first;
  const Attr& a = n.attrs.begin()->second;
  if (key == "value") {
    WXE_CHECK(a.t, "node ", n.name, " (Constant): attribute 'value' is not a tensor");
    return *a.t;
  }
  if (key == "value_float") return Tensor::scalar_f32(a.f);
  if (key == "value_floats") return Tensor::from_f32({(int64_t)a.floats.size()}, a.floats);
  if (key == "value_int") return Tensor::from_i64({a.i}).reshaped({});
  if (key == "value_ints") return Tensor::from_i64(a.ints);
  fail("node ", n.name, " (Constant): attribute '", key, "' is not supported");
}
std::vector<TypeShape> constant_shape(const Node& n, const std::vector<const Value*>& in) {
  Tensor t = constant_value(n);
  return {{t.dtype, t.shape}};
}
void constant_kernel(const Node& n, const std::vector<const Tensor*>& in,
                     const std::vector<Tensor*>& out) {
  Tensor t = constant_value(n);
  if (t.nbytes()) std::memcpy(out[0]->raw(), t.raw(), t.nbytes());
}

}  // namespace

void copy_kernel(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  WXE_ASSERT(in[0]->nbytes() == out[0]->nbytes());
  if (out[0]->raw() != in[0]->raw() && in[0]->nbytes())
    std::memcpy(out[0]->raw(), in[0]->raw(), in[0]->nbytes());
}

// If: passes::fold_if replaces every If before any shape rule runs (the taken branch inlined,
// or a Where over both); one that reaches a shape rule or a kernel skipped that pass.
static std::vector<TypeShape> if_shape(const Node& n, const std::vector<const Value*>&) {
  fail("node ", n.name, " (If): not lowered by fold_if (run the passes first)");
}
static void if_kernel(const Node& n, const std::vector<const Tensor*>&, const std::vector<Tensor*>&) { if_shape(n, {}); }

void register_shape_ops() {
  register_op("If", if_shape, if_kernel);
  register_op("Constant", constant_shape, constant_kernel);
  register_op("Identity", identity_shape, copy_kernel);
  register_op("Shape", shape_shape, shape_kernel);
  register_op("Size", size_shape, size_kernel);
  register_op("Reshape", reshape_shape, copy_kernel);
  register_op("Squeeze", squeeze_shape, copy_kernel);
  register_op("Unsqueeze", unsqueeze_shape, copy_kernel);
  register_op("Concat", concat_shape, concat_kernel);
  register_op("ConstantOfShape", cos_shape, cos_kernel);
  register_op("Expand", expand_shape, expand_kernel);
  register_op("Range", range_shape, range_kernel);
}

}  // namespace wxe::cpu
