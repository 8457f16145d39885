// Ops that move data by index arithmetic: Slice, Gather, GatherND, ScatterND, Transpose, Pad, DepthToSpace,
// Split, Tile, Flatten (ONNX opsets 13-20; Resize is resize.cpp). Reference kernels: plain loops, the
// oracle for faster paths. All but Resize's linear/cubic modes are dtype-generic: elements
// are copied as dtype_size(dtype) bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/op_args.h"

namespace wxe::cpu {

void register_resize();  // resize.cpp

namespace {

// Copies one element of ES bytes (ES known at compile time for the common sizes).
template <size_t ES>
void copy_row_t(uint8_t* dst, const uint8_t* src, int64_t stride, int64_t len) {
  for (int64_t i = 0; i < len; ++i) std::memcpy(dst + i * ES, src + i * stride * (int64_t)ES, ES);
}
void copy_row(uint8_t* dst, const uint8_t* src, int64_t stride, int64_t len, size_t es) {
  if (stride == 1) {
    std::memcpy(dst, src, (size_t)len * es);
    return;
  }
  switch (es) {
    case 1: copy_row_t<1>(dst, src, stride, len); break;
    case 2: copy_row_t<2>(dst, src, stride, len); break;
    case 4: copy_row_t<4>(dst, src, stride, len); break;
    case 8: copy_row_t<8>(dst, src, stride, len); break;
    default:
      for (int64_t i = 0; i < len; ++i)
        std::memcpy(dst + i * es, src + i * stride * (int64_t)es, es);
  }
}

constexpr int64_t kParallelMin = 1 << 15;  // elements; below this OpenMP costs more than it saves

// dst (contiguous, `shape`) at multi-index i = src[base + sum_d i_d * sstride[d]], in
// elements; strides may be negative or zero.
void strided_copy(const uint8_t* src, int64_t base, const std::vector<int64_t>& sstride,
                  uint8_t* dst, const Shape& shape, size_t es) {
  const int64_t total = numel(shape);
  if (total == 0) return;
  // Drop size-1 dims and merge neighbours that are contiguous in the source too (the
  // destination always is): fewer, longer rows.
  Shape s;
  std::vector<int64_t> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!s.empty() && st.back() == sstride[d] * shape[d]) {
      s.back() *= shape[d];
      st.back() = sstride[d];
    } else {
      s.push_back(shape[d]);
      st.push_back(sstride[d]);
    }
  }
  if (s.empty()) {
    std::memcpy(dst, src + base * (int64_t)es, es);
    return;
  }
  const int r = (int)s.size();
  const int64_t L = s[r - 1], rows = total / L, ls = st[r - 1];
  const int64_t chunk = std::max<int64_t>(1, 4096 / L);  // rows per task
  const int64_t tasks = (rows + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
    // multi-index of row r0 over dims 0..r-2, then an odometer
    std::vector<int64_t> idx(r, 0);
    int64_t off = base, rem = r0;
    for (int d = r - 2; d >= 0; --d) {
      idx[d] = rem % s[d];
      rem /= s[d];
      off += idx[d] * st[d];
    }
    for (int64_t row = r0; row < r1; ++row) {
      copy_row(dst + row * L * (int64_t)es, src + off * (int64_t)es, ls, L, es);
      for (int d = r - 2; d >= 0; --d) {
        off += st[d];
        if (++idx[d] < s[d]) break;
        off -= st[d] * s[d];
        idx[d] = 0;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Slice (opset 13): inputs data, starts, ends, axes?, steps?

}  // namespace

std::vector<SliceDim> slice_plan(const Node& n, const Shape& s, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps) {
  const int64_t r = (int64_t)s.size();
  NCHECK(starts.size() == ends.size(), "starts has ", starts.size(), " values but ends has ",
         ends.size());
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back((int64_t)i);
  if (steps.empty()) steps.assign(starts.size(), 1);
  NCHECK(axes.size() == starts.size(), "axes has ", axes.size(), " values but starts has ",
         starts.size());
  NCHECK(steps.size() == starts.size(), "steps has ", steps.size(), " values but starts has ",
         starts.size());
  axes = norm_axes(n, axes, r);
  std::vector<SliceDim> plan(r);
  for (int64_t d = 0; d < r; ++d) plan[d] = {0, 1, s[d]};
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t d = axes[k], dim = s[d];
    int64_t step = steps[k];
    NCHECK(step != 0, "step 0 on axis ", d);
    if (step == std::numeric_limits<int64_t>::min()) step = -std::numeric_limits<int64_t>::max();
    int64_t st = starts[k], en = ends[k];
    if (st < 0) st += dim;  // no overflow: dim >= 0
    if (en < 0) en += dim;
    int64_t len;
    if (dim == 0) {
      st = 0;
      len = 0;
    } else if (step > 0) {
      st = std::clamp<int64_t>(st, 0, dim);
      en = std::clamp<int64_t>(en, 0, dim);
      len = en > st ? (en - st - 1) / step + 1 : 0;
    } else {
      st = std::clamp<int64_t>(st, 0, dim - 1);
      en = std::clamp<int64_t>(en, -1, dim - 1);
      len = st > en ? (st - en - 1) / (-step) + 1 : 0;
    }
    plan[d] = {st, step, len};
  }
  return plan;
}

namespace {

std::vector<TypeShape> slice_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  auto plan = slice_plan(n, x.shape, const_ints(n, in, 1), const_ints(n, in, 2),
                         opt_const_ints(n, in, 3), opt_const_ints(n, in, 4));
  Shape out;
  for (auto& p : plan) out.push_back(p.len);
  return {{x.dtype, out}};
}

void slice_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  auto plan = slice_plan(n, x.shape, in[1]->to_i64(), in[2]->to_i64(), opt_ints(in, 3),
                         opt_ints(in, 4));
  auto st = strides_of(x.shape);
  int64_t base = 0;
  std::vector<int64_t> sstride(plan.size());
  Shape shape(plan.size());
  for (size_t d = 0; d < plan.size(); ++d) {
    base += plan[d].start * st[d];
    sstride[d] = plan[d].step * st[d];
    shape[d] = plan[d].len;
  }
  WXE_ASSERT(shape == out[0]->shape);
  strided_copy((const uint8_t*)x.raw(), base, sstride, (uint8_t*)out[0]->raw(), shape,
               dtype_size(x.dtype));
}

// ---------------------------------------------------------------------------------------
// Gather (opset 13): data, indices (int32/int64); axis attr.

std::vector<TypeShape> gather_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const Value& idx = req_v(n, in, 1);
  const int64_t r = (int64_t)x.shape.size();
  NCHECK(r >= 1, "data must have rank >= 1");
  NCHECK(idx.dtype == DType::I64 || idx.dtype == DType::I32, "indices must be int32 or int64, got ",
         dtype_name(idx.dtype));
  const int64_t axis = norm_axis(n.i("axis", 0), r, n);
  if (idx.is_const()) {
    const int64_t dim = x.shape[axis];
    for (int64_t v : idx.constant->to_i64())
      NCHECK(v >= -dim && v < dim, "index ", v, " out of range for axis ", axis, " of size ", dim);
  }
  Shape out(x.shape.begin(), x.shape.begin() + axis);
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + axis + 1, x.shape.end());
  return {{x.dtype, out}};
}

void gather_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", 0), x.rank(), n);
  std::vector<int64_t> idx = in[1]->to_i64();
  const int64_t dim = x.shape[axis];
  for (auto& v : idx) {
    NCHECK(v >= -dim && v < dim, "index ", v, " out of range for axis ", axis, " of size ", dim);
    if (v < 0) v += dim;
  }
  const size_t es = dtype_size(x.dtype);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t ni = (int64_t)idx.size();
  const size_t chunk = (size_t)inner * es;
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
#pragma omp parallel for schedule(static) if (outer * ni * inner > kParallelMin)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < ni; ++j)
      std::memcpy(dst + (o * ni + j) * chunk, src + (o * dim + idx[j]) * chunk, chunk);
}

// ---------------------------------------------------------------------------------------
// GatherND (opset 13): data, indices (int64, last dim k = index tuple length); batch_dims b.
// Output: data.shape[:b] + indices.shape[b:-1] + data.shape[b+k:].

struct GatherNDPlan {
  int64_t b = 0, k = 0;
  Shape out;
};

GatherNDPlan gathernd_plan(const Node& n, const Shape& ds, const Shape& is) {
  GatherNDPlan p;
  const int64_t r = (int64_t)ds.size(), q = (int64_t)is.size();
  p.b = n.i("batch_dims", 0);
  NCHECK(r >= 1 && q >= 1, "data and indices must have rank >= 1");
  NCHECK(p.b >= 0 && p.b < std::min(r, q), "batch_dims ", p.b, " out of range");
  p.k = is[q - 1];
  NCHECK(p.k >= 1 && p.k <= r - p.b, "index tuples of length ", p.k, " for data of rank ", r,
         " and batch_dims ", p.b);
  for (int64_t d = 0; d < p.b; ++d)
    NCHECK(ds[d] == is[d], "batch dim ", d, " differs: data ", shape_str(ds), ", indices ",
           shape_str(is));
  p.out.assign(ds.begin(), ds.begin() + p.b);
  p.out.insert(p.out.end(), is.begin() + p.b, is.end() - 1);
  p.out.insert(p.out.end(), ds.begin() + p.b + p.k, ds.end());
  return p;
}

std::vector<TypeShape> gathernd_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const Value& idx = req_v(n, in, 1);
  NCHECK(idx.dtype == DType::I64 || idx.dtype == DType::I32, "indices must be int32 or int64, got ",
         dtype_name(idx.dtype));
  return {{x.dtype, gathernd_plan(n, x.shape, idx.shape).out}};
}

void gathernd_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const GatherNDPlan p = gathernd_plan(n, x.shape, in[1]->shape);
  std::vector<int64_t> idx = in[1]->to_i64();
  const int64_t B = numel(Shape(x.shape.begin(), x.shape.begin() + p.b));
  const int64_t M = (int64_t)idx.size() / p.k / std::max<int64_t>(B, 1);  // tuples per batch
  const int64_t S = numel(Shape(x.shape.begin() + p.b + p.k, x.shape.end()));
  const int64_t batch_elems = numel(Shape(x.shape.begin() + p.b, x.shape.end()));
  const auto st = strides_of(x.shape);
  std::vector<int64_t> off((size_t)(B * M));
  for (int64_t t = 0; t < B * M; ++t) {
    int64_t o = (t / std::max<int64_t>(M, 1)) * batch_elems;
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t dim = x.shape[p.b + j];
      int64_t v = idx[t * p.k + j];
      NCHECK(v >= -dim && v < dim, "index ", v, " out of range for axis ", p.b + j, " of size ",
             dim);
      if (v < 0) v += dim;
      o += v * st[p.b + j];
    }
    off[t] = o;
  }
  const size_t es = dtype_size(x.dtype), chunk = (size_t)S * es;
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
  if (!chunk) return;
#pragma omp parallel for schedule(static) if (B * M * S > kParallelMin)
  for (int64_t t = 0; t < B * M; ++t) std::memcpy(dst + t * chunk, src + off[t] * (int64_t)es, chunk);
}

// ScatterND (opset 11-18, reduction "none"): data, indices (int64, last dim k), updates of shape
// indices.shape[:-1] + data.shape[k:]. Output: data with the slices indices name replaced by
// updates, in order (a repeated index: the last wins; ONNX leaves it undefined).
std::vector<TypeShape> scatternd_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const Value& idx = req_v(n, in, 1);
  const Value& up = req_v(n, in, 2);
  NCHECK(idx.dtype == DType::I64 || idx.dtype == DType::I32, "indices must be int32 or int64, got ",
         dtype_name(idx.dtype));
  NCHECK(up.dtype == x.dtype, "updates are ", dtype_name(up.dtype), ", data ", dtype_name(x.dtype));
  const std::string red = n.s("reduction", "none");
  NCHECK(red == "none", "reduction '", red, "' is not implemented (none)");
  const int64_t r = (int64_t)x.shape.size(), q = (int64_t)idx.shape.size();
  NCHECK(q >= 1 && idx.shape[q - 1] >= 1 && idx.shape[q - 1] <= r, "index tuples of length ",
         q ? idx.shape[q - 1] : 0, " for data of rank ", r);
  Shape want(idx.shape.begin(), idx.shape.end() - 1);
  want.insert(want.end(), x.shape.begin() + idx.shape[q - 1], x.shape.end());
  NCHECK(up.shape == want, "updates ", shape_str(up.shape), ", expected ", shape_str(want), " for data ",
         shape_str(x.shape), " and indices ", shape_str(idx.shape));
  return {{x.dtype, x.shape}};
}

void scatternd_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const Tensor& up = *in[2];
  const std::vector<int64_t> idx = in[1]->to_i64();
  const int64_t k = in[1]->shape.back(), M = k ? (int64_t)idx.size() / k : 0;
  const int64_t S = numel(Shape(x.shape.begin() + k, x.shape.end()));
  const auto st = strides_of(x.shape);
  const size_t es = dtype_size(x.dtype), chunk = (size_t)S * es;
  uint8_t* dst = (uint8_t*)out[0]->raw();
  if (dst != x.raw()) std::memcpy(dst, x.raw(), (size_t)x.numel() * es);
  const uint8_t* src = (const uint8_t*)up.raw();
  for (int64_t t = 0; t < M; ++t) {
    int64_t o = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t dim = x.shape[j];
      int64_t v = idx[t * k + j];
      NCHECK(v >= -dim && v < dim, "index ", v, " out of range for axis ", j, " of size ", dim);
      if (v < 0) v += dim;
      o += v * st[j];
    }
    if (chunk) std::memcpy(dst + o * (int64_t)es, src + t * (int64_t)chunk, chunk);
  }
}

// ---------------------------------------------------------------------------------------
// Transpose: perm attr (default: reverse).

std::vector<int64_t> transpose_perm(const Node& n, int64_t r) {
  std::vector<int64_t> perm = n.ints("perm");
  if (!n.has("perm"))
    for (int64_t d = r - 1; d >= 0; --d) perm.push_back(d);
  NCHECK((int64_t)perm.size() == r, "perm has ", perm.size(), " entries for rank ", r);
  std::vector<bool> seen(r, false);
  for (int64_t p : perm) {
    NCHECK(p >= 0 && p < r && !seen[p], "perm is not a permutation of 0..", r - 1);
    seen[p] = true;
  }
  return perm;
}

std::vector<TypeShape> transpose_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  auto perm = transpose_perm(n, (int64_t)x.shape.size());
  Shape out;
  for (int64_t p : perm) out.push_back(x.shape[p]);
  return {{x.dtype, out}};
}

void transpose_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  auto perm = transpose_perm(n, x.rank());
  auto st = strides_of(x.shape);
  std::vector<int64_t> sstride;
  for (int64_t p : perm) sstride.push_back(st[p]);
  strided_copy((const uint8_t*)x.raw(), 0, sstride, (uint8_t*)out[0]->raw(), out[0]->shape,
               dtype_size(x.dtype));
}

// ---------------------------------------------------------------------------------------
// Pad (opset 13-19): data, pads, constant_value?, axes? (18); mode constant/reflect/edge/wrap.
// Negative pads crop first; the positive pads then extend the cropped tensor.

}  // namespace

PadMode pad_mode(const Node& n) {
  std::string m = n.s("mode", "constant");
  if (m == "constant") return PadMode::Constant;
  if (m == "reflect") return PadMode::Reflect;
  if (m == "edge") return PadMode::Edge;
  if (m == "wrap") return PadMode::Wrap;
  fail("node ", n.name, " (", n.op, "): unsupported mode '", m, "'");
}

PadPlan pad_plan(const Node& n, const Shape& s, const std::vector<int64_t>& pads,
                 std::vector<int64_t> axes) {
  const int64_t r = (int64_t)s.size();
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  axes = norm_axes(n, axes, r);
  NCHECK(pads.size() == 2 * axes.size(), "pads has ", pads.size(), " values, expected ",
         2 * axes.size());
  const PadMode mode = pad_mode(n);
  PadPlan p;
  p.begin.assign(r, 0);
  p.end.assign(r, 0);
  const size_t k = axes.size();
  for (size_t i = 0; i < k; ++i) {
    p.begin[axes[i]] = pads[i];
    p.end[axes[i]] = pads[i + k];
  }
  for (int64_t d = 0; d < r; ++d) {
    const int64_t o = s[d] + p.begin[d] + p.end[d];
    NCHECK(o >= 0, "pads ", p.begin[d], ", ", p.end[d], " make axis ", d, " of size ", s[d],
           " negative");
    const int64_t kept = s[d] - std::max<int64_t>(-p.begin[d], 0) - std::max<int64_t>(-p.end[d], 0);
    NCHECK(mode == PadMode::Constant || o == 0 || kept > 0, "cannot pad axis ", d,
           " with mode ", n.s("mode", "constant"), ": nothing left to copy from");
    p.out.push_back(o);
  }
  return p;
}

namespace {

std::vector<int64_t> pads_of(const Node& n, const Values& in) {
  if (opt_v(in, 1)) return const_ints(n, in, 1);
  NCHECK(n.has("pads"), "missing pads");  // opset < 11 had pads as an attribute
  return n.ints("pads");
}

std::vector<TypeShape> pad_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  if (given_v(in, 2)) {
    const Value& cv = *in[2];
    NCHECK(!cv.shape_known || numel(cv.shape) == 1, "constant_value must be a scalar");
  }
  PadPlan p = pad_plan(n, x.shape, pads_of(n, in), opt_const_ints(n, in, 3));
  return {{x.dtype, p.out}};
}

// Source index for output position o along an axis, or -1 for the constant value.
int64_t pad_src(PadMode mode, int64_t o, int64_t begin, int64_t dim, int64_t crop_lo, int64_t len) {
  int64_t p = o - std::max<int64_t>(begin, 0);  // position in the cropped range [0, len)
  if (p < 0 || p >= len) {
    switch (mode) {
      case PadMode::Constant: return -1;
      case PadMode::Edge: p = std::clamp<int64_t>(p, 0, len - 1); break;
      case PadMode::Reflect: {
        if (len == 1) {
          p = 0;
          break;
        }
        const int64_t per = 2 * (len - 1);
        p = ((p % per) + per) % per;
        if (p >= len) p = per - p;
        break;
      }
      case PadMode::Wrap: p = ((p % len) + len) % len; break;
    }
  }
  return crop_lo + p;
}

void pad_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  std::vector<int64_t> pads = opt_t(in, 1) ? in[1]->to_i64() : n.ints("pads");
  PadPlan p = pad_plan(n, x.shape, pads, opt_ints(in, 3));
  const PadMode mode = pad_mode(n);
  const size_t es = dtype_size(x.dtype);
  Tensor cv = Tensor::zeros(x.dtype, {});
  if (given_t(in, 2)) {
    Tensor tmp(x.dtype, in[2]->shape);
    convert(*in[2], tmp);
    std::memcpy(cv.raw(), tmp.raw(), es);
  }
  if (mode == PadMode::Constant && n.has("value") && !opt_t(in, 1)) {  // opset < 11
    Tensor f = Tensor::scalar_f32(n.f("value", 0.f));
    convert(f, cv);
  }
  const int r = x.rank();
  // per-axis map from output position to source position (-1: constant)
  std::vector<std::vector<int64_t>> map(r);
  for (int d = 0; d < r; ++d) {
    const int64_t crop_lo = std::max<int64_t>(-p.begin[d], 0);
    const int64_t len = x.shape[d] - crop_lo - std::max<int64_t>(-p.end[d], 0);
    map[d].resize(p.out[d]);
    for (int64_t o = 0; o < p.out[d]; ++o)
      map[d][o] = pad_src(mode, o, p.begin[d], x.shape[d], crop_lo, len);
  }
  const int64_t total = numel(p.out);
  if (total == 0) return;
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
  const uint8_t* cval = (const uint8_t*)cv.raw();
  if (r == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  auto st = strides_of(x.shape);
  const int64_t L = p.out[r - 1], rows = total / L;
  const auto& lmap = map[r - 1];
  const int64_t ilo = std::max<int64_t>(p.begin[r - 1], 0);
  const int64_t ihi = ilo + x.shape[r - 1] - std::max<int64_t>(-p.begin[r - 1], 0) -
                      std::max<int64_t>(-p.end[r - 1], 0);
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0, rem = row;
    bool constant = false;
    for (int d = r - 2; d >= 0; --d) {
      const int64_t s = map[d][rem % p.out[d]];
      rem /= p.out[d];
      if (s < 0) constant = true;
      off += s * st[d];
    }
    uint8_t* o = dst + row * L * (int64_t)es;
    if (constant) {
      for (int64_t j = 0; j < L; ++j) std::memcpy(o + j * es, cval, es);
      continue;
    }
    // interior [ilo, ihi) maps to consecutive source elements: one memcpy
    if (ihi > ilo)
      std::memcpy(o + ilo * (int64_t)es, src + (off + lmap[ilo]) * (int64_t)es,
                  (size_t)(ihi - ilo) * es);
    auto border = [&](int64_t j) {
      const int64_t s = lmap[j];
      std::memcpy(o + j * es, s < 0 ? cval : src + (off + s) * (int64_t)es, es);
    };
    for (int64_t j = 0; j < ilo; ++j) border(j);
    for (int64_t j = std::max(ihi, ilo); j < L; ++j) border(j);
  }
}

// ---------------------------------------------------------------------------------------
// DepthToSpace: (N, C, H, W) -> (N, C/b^2, H*b, W*b); mode DCR (default) or CRD.

bool d2s_crd(const Node& n) {
  std::string m = n.s("mode", "DCR");
  NCHECK(m == "DCR" || m == "CRD", "unsupported mode '", m, "'");
  return m == "CRD";
}

std::vector<TypeShape> d2s_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  d2s_crd(n);
  NCHECK(x.shape.size() == 4, "input must be 4-D, got ", shape_str(x.shape));
  const int64_t b = n.i("blocksize", 0);
  NCHECK(b > 0 && b <= x.shape[1], "blocksize ", b, " must be in 1..channels (", x.shape[1], ")");
  int64_t bb = 0, ho = 0, wo = 0;
  NCHECK(!__builtin_mul_overflow(b, b, &bb) && !__builtin_mul_overflow(x.shape[2], b, &ho) &&
             !__builtin_mul_overflow(x.shape[3], b, &wo),
         "blocksize ", b, " overflows the output shape");
  NCHECK(x.shape[1] % bb == 0, "channels ", x.shape[1], " not divisible by blocksize^2 = ", bb);
  return {{x.dtype, {x.shape[0], x.shape[1] / bb, ho, wo}}};
}

void d2s_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const bool crd = d2s_crd(n);
  const int64_t b = n.i("blocksize", 0);
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Co = C / (b * b), Ho = H * b, Wo = W * b;
  const size_t es = dtype_size(x.dtype);
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (int64_t nc = 0; nc < N * Co; ++nc) {
    const int64_t bn = nc / Co, c = nc % Co;
    for (int64_t h = 0; h < Ho; ++h) {
      const int64_t bh = h % b, ih = h / b;
      uint8_t* orow = dst + ((nc * Ho + h) * Wo) * (int64_t)es;
      for (int64_t w = 0; w < Wo; ++w) {
        const int64_t bw = w % b, iw = w / b;
        const int64_t ic = crd ? c * b * b + bh * b + bw : (bh * b + bw) * Co + c;
        std::memcpy(orow + w * es, src + (((bn * C + ic) * H + ih) * W + iw) * (int64_t)es, es);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Split (opset 13-18): input, split? (13+; attr before 13); axis; num_outputs (18).

std::vector<int64_t> split_sizes(const Node& n, int64_t dim, std::vector<int64_t> split,
                                 size_t nout) {
  NCHECK(nout >= 1, "no outputs");
  if (split.empty() && n.has("split")) split = n.ints("split");
  if (!split.empty()) {
    NCHECK(split.size() == nout, "split has ", split.size(), " values for ", nout, " outputs");
    int64_t sum = 0;
    for (int64_t v : split) {
      NCHECK(v >= 0, "negative split size ", v);
      sum += v;
    }
    NCHECK(sum == dim, "split sizes sum to ", sum, " but the axis has size ", dim);
    return split;
  }
  if (n.has("num_outputs")) {
    const int64_t k = n.i("num_outputs", 0);
    NCHECK(k == (int64_t)nout, "num_outputs ", k, " but the node has ", nout, " outputs");
    const int64_t chunk = (dim + k - 1) / k;  // the last chunk may be smaller
    std::vector<int64_t> r;
    int64_t left = dim;
    for (int64_t i = 0; i < k; ++i) {
      r.push_back(std::min(chunk, left));
      left -= r.back();
    }
    return r;
  }
  NCHECK(dim % (int64_t)nout == 0, "axis of size ", dim, " does not split evenly into ", nout,
         " outputs");
  return std::vector<int64_t>(nout, dim / (int64_t)nout);
}

std::vector<TypeShape> split_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const int64_t axis = norm_axis(n.i("axis", 0), (int64_t)x.shape.size(), n);
  auto sizes = split_sizes(n, x.shape[axis], opt_const_ints(n, in, 1), n.outputs.size());
  std::vector<TypeShape> r;
  for (int64_t s : sizes) {
    Shape o = x.shape;
    o[axis] = s;
    r.push_back({x.dtype, o});
  }
  return r;
}

void split_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", 0), x.rank(), n);
  auto sizes = split_sizes(n, x.shape[axis], opt_ints(in, 1), out.size());
  const size_t es = dtype_size(x.dtype);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t dim = x.shape[axis];
  const uint8_t* src = (const uint8_t*)x.raw();
  int64_t start = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t chunk = (size_t)(sizes[k] * inner) * es;
    if (out[k] && chunk) {
      uint8_t* dst = (uint8_t*)out[k]->raw();
#pragma omp parallel for schedule(static) if (outer * sizes[k] * inner > kParallelMin)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + o * chunk, src + ((o * dim + start) * inner) * (int64_t)es, chunk);
    }
    start += sizes[k];
  }
}

// ---------------------------------------------------------------------------------------
// Tile: input, repeats (int64, one per axis).

std::vector<TypeShape> tile_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  auto rep = const_ints(n, in, 1);
  NCHECK(rep.size() == x.shape.size(), "repeats has ", rep.size(), " values for rank ",
         x.shape.size());
  Shape o = x.shape;
  for (size_t d = 0; d < rep.size(); ++d) {
    NCHECK(rep[d] >= 0, "negative repeat ", rep[d]);
    NCHECK(!__builtin_mul_overflow(o[d], rep[d], &o[d]), "repeat ", rep[d], " overflows dim ", d);
  }
  return {{x.dtype, o}};
}

void tile_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const Shape& os = out[0]->shape;
  const int r = x.rank();
  const int64_t total = numel(os);
  if (total == 0) return;
  const size_t es = dtype_size(x.dtype);
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
  if (r == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  auto st = strides_of(x.shape);
  const int64_t L = os[r - 1], rows = total / L, in_l = x.shape[r - 1];
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0, rem = row;
    for (int d = r - 2; d >= 0; --d) {
      off += ((rem % os[d]) % x.shape[d]) * st[d];
      rem /= os[d];
    }
    uint8_t* o = dst + row * L * (int64_t)es;
    for (int64_t j = 0; j < L; j += in_l)
      std::memcpy(o + j * (int64_t)es, src + off * (int64_t)es, (size_t)in_l * es);
  }
}

// ---------------------------------------------------------------------------------------
// Flatten: axis in [-r, r] (default 1) -> 2-D.

std::vector<TypeShape> flatten_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  const int64_t r = (int64_t)x.shape.size();
  int64_t axis = n.i("axis", 1);
  NCHECK(axis >= -r && axis <= r, "axis ", axis, " out of range for rank ", r);
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? a : b) *= x.shape[d];
  return {{x.dtype, {a, b}}};
}


}  // namespace


// RandomNormal (shape attribute) and RandomNormalLike (the input's shape; CREDIT's
// CrossFormerWithNoise draws its noise with torch.randn, which exports as RandomNormalLike):
// float32, mean + scale * N(0, 1). Counter-based: element e is a function of (key, e) alone
// (splitmix64 of the pair index, Box-Muller), so the numbers are the same for any thread count
// and when the node runs again (activation checkpointing's recompute). key mixes the node's
// "stream" attribute (a trainer sets it per forward: engine/ir/ops.h register_random_op; without
// one, the hash of the node's name, so two nodes draw different numbers) with the ONNX `seed`.
namespace {
inline uint64_t mix64(uint64_t z) {  // splitmix64's finaliser: a bijection of 64 bits
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

DType random_dtype(const Node& n, DType like) {
  const int64_t t = n.has("dtype") ? n.i("dtype", 1) : (like == DType::F32 ? 1 : -1);
  WXE_CHECK(t == 1, "node ", n.name, " (", n.op, "): float32 output only, dtype ", t);
  return DType::F32;
}

std::vector<TypeShape> randn_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.empty() && n.has("shape"), "node ", n.name, " (RandomNormal): expects no input and a shape attribute");
  Shape s = n.ints("shape");
  for (int64_t d : s) WXE_CHECK(d >= 0, "node ", n.name, " (RandomNormal): shape ", shape_str(s), " has a negative dimension");
  return {{random_dtype(n, DType::F32), s}};
}

std::vector<TypeShape> randn_like_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0], "node ", n.name, " (RandomNormalLike): expects 1 input");
  return {{random_dtype(n, in[0]->dtype), in[0]->shape}};
}

void randn_kernel(const Node& n, const std::vector<const Tensor*>&, const std::vector<Tensor*>& out) {
  uint64_t stream = 1469598103934665603ull;  // FNV-1a of the name unless the trainer set one
  if (n.has("stream")) {
    stream = (uint64_t)n.i("stream", 0);
  } else {
    for (unsigned char c : n.name) stream = (stream ^ c) * 1099511628211ull;
  }
  const float seed = n.f("seed", 0.f);
  uint32_t seed_bits;
  std::memcpy(&seed_bits, &seed, 4);
  const uint64_t key = mix64(stream ^ mix64(seed_bits));
  const double mean = n.f("mean", 0.f), scale = n.f("scale", 1.f);
  float* y = out[0]->data<float>();
  const int64_t count = out[0]->numel(), pairs = (count + 1) / 2;
#pragma omp parallel for schedule(static) if (count > 65536)
  for (int64_t p = 0; p < pairs; ++p) {
    const uint64_t a = mix64(key ^ (uint64_t)(2 * p)), b = mix64(key ^ (uint64_t)(2 * p + 1));
    const double u1 = (double)((a >> 11) + 1) * 0x1.0p-53, u2 = (double)(b >> 11) * 0x1.0p-53;  // (0, 1], [0, 1)
    const double r = std::sqrt(-2 * std::log(u1)), t = 2 * M_PI * u2;
    y[2 * p] = (float)(mean + scale * r * std::cos(t));
    if (2 * p + 1 < count) y[2 * p + 1] = (float)(mean + scale * r * std::sin(t));
  }
}
}  // namespace

// PlaneGather(x, map; lead): out[p, i] = x[p, map[i]] over the planes p of x's last two dims,
// made by fuse_plane_gathers (engine/passes/fuse.h) from chains of Slice and Concat on those
// dims (CREDIT's pole and longitude padding, the crop after the last layer). map (H', W') int32
// indexes a plane of x (row-major, H x W); out is lead + (H', W'), lead holding as many planes as
// x's leading dims.
static std::vector<TypeShape> plane_gather_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 2 && in[0] && in[1], "node ", n.name, " (PlaneGather): expects x and map");
  const Value& x = *in[0];
  const Value& m = *in[1];
  WXE_CHECK(x.shape.size() >= 2 && m.shape.size() == 2 && m.dtype == DType::I32 && dtype_size(x.dtype) == 4,
            "node ", n.name, " (PlaneGather): x ", shape_str(x.shape), " and map ", shape_str(m.shape),
            " must be 4-byte (..., H, W) and int32 (H', W')");
  Shape out = n.ints("lead");
  const int64_t plane = x.shape[x.shape.size() - 2] * x.shape.back(), planes = plane ? numel(x.shape) / plane : 0;
  WXE_CHECK(numel(out) == planes, "node ", n.name, " (PlaneGather): lead ", shape_str(out), " holds ", numel(out),
            " planes, x ", planes);
  if (m.is_const())
    for (int32_t i : m.constant->to_i64()) WXE_CHECK(i >= 0 && i < plane, "node ", n.name, " (PlaneGather): index ", i, " outside the plane");
  out.insert(out.end(), m.shape.begin(), m.shape.end());
  return {{x.dtype, out}};
}

// The map as runs of consecutive elements (padding and crops copy whole row pieces): each plane
// is a few memcpy per row.
static void plane_gather_kernel(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  const int64_t plane = x.shape[x.shape.size() - 2] * x.shape.back(), q = in[1]->numel();
  const int64_t planes = plane ? x.numel() / plane : 0;
  const int32_t* map = in[1]->data<int32_t>();
  std::vector<int64_t> runs;  // (output start, input start, length)
  for (int64_t i = 0; i < q;) {
    int64_t j = i + 1;
    while (j < q && map[j] == map[j - 1] + 1) ++j;
    runs.insert(runs.end(), {i, (int64_t)map[i], j - i});
    i = j;
  }
  const float* src = static_cast<const float*>(x.raw());
  float* dst = static_cast<float*>(out[0]->raw());
#pragma omp parallel for schedule(static) if (planes * q > 65536)
  for (int64_t p = 0; p < planes; ++p)
    for (size_t r = 0; r < runs.size(); r += 3)
      std::memcpy(dst + p * q + runs[r], src + p * plane + runs[r + 1], (size_t)runs[r + 2] * sizeof(float));
}

void register_data_ops() {
  register_op("PlaneGather", plane_gather_shape, plane_gather_kernel);
  register_op("RandomNormal", randn_shape, randn_kernel);
  register_op("RandomNormalLike", randn_like_shape, randn_kernel);
  register_random_op("RandomNormal");
  register_random_op("RandomNormalLike");
  register_op("Slice", slice_shape, slice_kernel);
  register_op("Gather", gather_shape, gather_kernel);
  register_op("GatherND", gathernd_shape, gathernd_kernel);
  register_op("ScatterND", scatternd_shape, scatternd_kernel);
  register_op("Transpose", transpose_shape, transpose_kernel);
  register_op("Pad", pad_shape, pad_kernel);
  register_op("DepthToSpace", d2s_shape, d2s_kernel);
  register_resize();
  register_op("Split", split_shape, split_kernel);
  register_op("Tile", tile_shape, tile_kernel);
  register_op("Flatten", flatten_shape, copy_kernel);
}

}  // namespace wxe::cpu
