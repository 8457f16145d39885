// Resize (opset 13-19): the reference kernel and its per-axis taps (cpu_ops.h resize_axis_taps,
// which the fast path and the backward read).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/op_args.h"

namespace wxe::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements; below this OpenMP costs more than it saves

// ---------------------------------------------------------------------------------------
// Resize (opset 13-19): X, roi?, scales?, sizes?. Modes nearest, linear, cubic; coordinate
// transformation modes half_pixel, pytorch_half_pixel, align_corners, asymmetric,
// half_pixel_symmetric. Every output coordinate along an axis reads a few input positions
// ("taps") with weights; the N-D result is the tensor product over axes.

enum class RMode { Nearest, Linear, Cubic };
enum class RCoord { HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric, HalfPixelSymmetric };
enum class RNearest { RoundPreferFloor, RoundPreferCeil, Floor, Ceil };

struct ResizeCfg {
  RMode mode;
  RCoord coord;
  RNearest nearest;
  float cubic_a;
  bool exclude_outside;
};

ResizeCfg resize_cfg(const Node& n) {
  ResizeCfg c;
  const std::string m = n.s("mode", "nearest");
  if (m == "nearest") c.mode = RMode::Nearest;
  else if (m == "linear") c.mode = RMode::Linear;
  else if (m == "cubic") c.mode = RMode::Cubic;
  else fail("node ", n.name, " (", n.op, "): unsupported mode '", m, "'");
  const std::string t = n.s("coordinate_transformation_mode", "half_pixel");
  if (t == "half_pixel") c.coord = RCoord::HalfPixel;
  else if (t == "pytorch_half_pixel") c.coord = RCoord::PytorchHalfPixel;
  else if (t == "align_corners") c.coord = RCoord::AlignCorners;
  else if (t == "asymmetric") c.coord = RCoord::Asymmetric;
  else if (t == "half_pixel_symmetric") c.coord = RCoord::HalfPixelSymmetric;
  else fail("node ", n.name, " (", n.op, "): unsupported coordinate_transformation_mode '", t, "'");
  const std::string nm = n.s("nearest_mode", "round_prefer_floor");
  if (nm == "round_prefer_floor") c.nearest = RNearest::RoundPreferFloor;
  else if (nm == "round_prefer_ceil") c.nearest = RNearest::RoundPreferCeil;
  else if (nm == "floor") c.nearest = RNearest::Floor;
  else if (nm == "ceil") c.nearest = RNearest::Ceil;
  else fail("node ", n.name, " (", n.op, "): unsupported nearest_mode '", nm, "'");
  NCHECK(n.i("antialias", 0) == 0, "antialias is not supported");
  c.cubic_a = n.f("cubic_coeff_a", -0.75f);
  c.exclude_outside = n.i("exclude_outside", 0) != 0;
  return c;
}

struct ResizePlan {
  Shape out;
  std::vector<float> scale;  // per axis, output / input
};

// scales or sizes (exactly one non-empty) apply to `axes` attr (default: all axes).
ResizePlan resize_plan(const Node& n, const Shape& s, const std::vector<float>& scales,
                       const std::vector<int64_t>& sizes) {
  const int64_t r = (int64_t)s.size();
  NCHECK(scales.empty() != sizes.empty(), "exactly one of scales and sizes must be given");
  std::vector<int64_t> axes = n.ints("axes");
  if (!n.has("axes"))
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);
  axes = norm_axes(n, axes, r);
  ResizePlan p;
  p.out = s;
  p.scale.assign(r, 1.f);
  if (!scales.empty()) {
    NCHECK(scales.size() == axes.size(), "scales has ", scales.size(), " values, expected ",
           axes.size());
    for (size_t k = 0; k < axes.size(); ++k) {
      NCHECK(scales[k] > 0, "scale ", scales[k], " must be positive");
      p.scale[axes[k]] = scales[k];
      // float product as onnx shape inference and onnxruntime compute it
      p.out[axes[k]] = (int64_t)std::floor((float)s[axes[k]] * scales[k]);
    }
  } else {
    NCHECK(sizes.size() == axes.size(), "sizes has ", sizes.size(), " values, expected ",
           axes.size());
    const std::string policy = n.s("keep_aspect_ratio_policy", "stretch");
    NCHECK(policy == "stretch", "keep_aspect_ratio_policy '", policy, "' is not supported");
    for (size_t k = 0; k < axes.size(); ++k) {
      const int64_t d = axes[k];
      NCHECK(sizes[k] >= 0, "negative size ", sizes[k]);
      NCHECK(s[d] > 0 || sizes[k] == 0, "cannot resize empty axis ", d, " to ", sizes[k]);
      p.out[d] = sizes[k];
      p.scale[d] = s[d] > 0 ? (float)sizes[k] / (float)s[d] : 1.f;
    }
  }
  return p;
}

std::vector<TypeShape> resize_shape(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  ResizeCfg c = resize_cfg(n);
  NCHECK(c.mode == RMode::Nearest || x.dtype == DType::F32, "mode ", n.s("mode", "nearest"),
         " supports float32 only, got ", dtype_name(x.dtype));
  std::vector<float> scales;
  if (given_v(in, 2)) scales = const_floats(n, in, 2);
  ResizePlan p = resize_plan(n, x.shape, scales, opt_const_ints(n, in, 3));
  return {{x.dtype, p.out}};
}

// Source coordinate of output coordinate x along an axis.
float resize_coord(RCoord c, float x, float scale, int64_t in_len, int64_t out_len) {
  switch (c) {
    case RCoord::HalfPixel: return (x + 0.5f) / scale - 0.5f;
    case RCoord::PytorchHalfPixel: return out_len > 1 ? (x + 0.5f) / scale - 0.5f : 0.f;
    case RCoord::AlignCorners:
      return out_len == 1 ? 0.f : x * (float)(in_len - 1) / (float)(out_len - 1);
    case RCoord::Asymmetric: return x / scale;
    case RCoord::HalfPixelSymmetric: {
      const float adj = (float)out_len / (scale * (float)in_len);
      const float center = (float)in_len / 2;
      return center * (1 - adj) + (x + 0.5f) / scale - 0.5f;
    }
  }
  return 0;
}

using AxisTaps = ResizeAxisTaps;  // cpu_ops.h

AxisTaps axis_taps(const ResizeCfg& c, float scale, int64_t in_len, int64_t out_len) {
  AxisTaps t;
  const int K = c.mode == RMode::Nearest ? 1 : c.mode == RMode::Linear ? 2 : 4;
  std::vector<int64_t> idx(out_len * K);
  std::vector<float> w(out_len * K);
  auto clampi = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in_len - 1); };
  for (int64_t o = 0; o < out_len; ++o) {
    const float x = resize_coord(c.coord, (float)o, scale, in_len, out_len);
    int64_t* I = &idx[o * K];
    float* W = &w[o * K];
    if (c.mode == RMode::Nearest) {
      float fl = std::floor(x), v;
      switch (c.nearest) {
        case RNearest::RoundPreferFloor: v = x == fl + 0.5f ? fl : std::round(x); break;
        case RNearest::RoundPreferCeil: v = x == fl + 0.5f ? fl + 1 : std::round(x); break;
        case RNearest::Floor: v = fl; break;
        default: v = std::ceil(x); break;
      }
      I[0] = clampi((int64_t)v);
      W[0] = 1.f;
    } else if (c.mode == RMode::Linear) {
      // neighbours floor(x), floor(x)+1 clamped to the edge (= clamping x into [0, len-1])
      const float fl = std::floor(x), r = x - fl;
      I[0] = clampi((int64_t)fl);
      I[1] = clampi((int64_t)fl + 1);
      W[0] = 1.f - r;
      W[1] = r;
    } else {
      const float fl = std::floor(x), r = x - fl, A = c.cubic_a;
      const float a = r + 1, b = r, cc = 1 - r, d = 2 - r;
      W[0] = ((A * a - 5 * A) * a + 8 * A) * a - 4 * A;
      W[1] = ((A + 2) * b - (A + 3)) * b * b + 1;
      W[2] = ((A + 2) * cc - (A + 3)) * cc * cc + 1;
      W[3] = ((A * d - 5 * A) * d + 8 * A) * d - 4 * A;
      float sum = 0;
      for (int j = 0; j < 4; ++j) {
        const int64_t i = (int64_t)fl - 1 + j;
        if (c.exclude_outside && (i < 0 || i >= in_len)) W[j] = 0;
        sum += W[j];
        I[j] = clampi(i);
      }
      if (c.exclude_outside && sum != 0)
        for (int j = 0; j < 4; ++j) W[j] /= sum;
    }
  }
  // Drop taps whose weight is zero for every output coordinate (e.g. axes not resized).
  std::vector<int> keep;
  for (int j = 0; j < K; ++j) {
    bool any = false;
    for (int64_t o = 0; o < out_len && !any; ++o) any = w[o * K + j] != 0.f;
    if (any) keep.push_back(j);
  }
  if (keep.empty()) keep.push_back(0);
  t.k = (int)keep.size();
  t.idx.resize(out_len * t.k);
  t.w.resize(out_len * t.k);
  for (int64_t o = 0; o < out_len; ++o)
    for (int j = 0; j < t.k; ++j) {
      t.idx[o * t.k + j] = idx[o * K + keep[j]];
      t.w[o * t.k + j] = w[o * K + keep[j]];
    }
  return t;
}

void resize_kernel(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const ResizeCfg c = resize_cfg(n);
  NCHECK(c.mode == RMode::Nearest || x.dtype == DType::F32, "mode ", n.s("mode", "nearest"),
         " supports float32 only");
  std::vector<float> scales;
  if (given_t(in, 2)) scales = floats_of(*in[2]);
  const ResizePlan p = resize_plan(n, x.shape, scales, opt_ints(in, 3));
  WXE_ASSERT(p.out == out[0]->shape);
  const int r = x.rank();
  NCHECK(r >= 1 && r <= 16, "rank ", r, " is not supported (1 to 16)");
  const int64_t total = numel(p.out);
  if (total == 0) return;
  NCHECK(x.numel() > 0, "cannot resize an empty tensor to a non-empty one");
  std::vector<AxisTaps> taps(r);
  int64_t combos = 1;
  for (int d = 0; d < r; ++d) {
    taps[d] = axis_taps(c, p.scale[d], x.shape[d], p.out[d]);
    combos *= taps[d].k;
  }
  const auto st = strides_of(x.shape);
  const size_t es = dtype_size(x.dtype);
  const uint8_t* src = (const uint8_t*)x.raw();
  uint8_t* dst = (uint8_t*)out[0]->raw();
  const bool interp = c.mode != RMode::Nearest;
  const float* xf = interp ? x.data<float>() : nullptr;
  float* of = interp ? out[0]->data<float>() : nullptr;
  // Rows along the last axis: the taps of the other axes give a short list of (offset,
  // weight) per row; each output element then sums its last-axis taps over that list.
  const int64_t L = p.out[r - 1], rows = total / L;
  const AxisTaps& lt = taps[r - 1];
  const int64_t lst = st[r - 1];
  const int64_t row_combos = combos / lt.k;
#pragma omp parallel for schedule(static) if (total * combos > kParallelMin)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t o[16];
    int64_t rem = row;
    for (int d = r - 2; d >= 0; --d) {
      o[d] = rem % p.out[d];
      rem /= p.out[d];
    }
    std::vector<int64_t> coff((size_t)row_combos);
    std::vector<double> cw((size_t)row_combos);
    for (int64_t cmb = 0; cmb < row_combos; ++cmb) {
      int64_t off = 0, cr = cmb;
      double w = 1;
      for (int d = r - 2; d >= 0; --d) {
        const AxisTaps& t = taps[d];
        const int j = (int)(cr % t.k);
        cr /= t.k;
        off += t.idx[o[d] * t.k + j] * st[d];
        w *= t.w[o[d] * t.k + j];
      }
      coff[cmb] = off;
      cw[cmb] = w;
    }
    if (!interp) {  // one tap per axis, weight 1
      uint8_t* orow = dst + row * L * (int64_t)es;
      for (int64_t j = 0; j < L; ++j)
        std::memcpy(orow + j * (int64_t)es, src + (coff[0] + lt.idx[j] * lst) * (int64_t)es, es);
      continue;
    }
    float* orow = of + row * L;
    for (int64_t j = 0; j < L; ++j) {
      double acc = 0;
      for (int64_t cmb = 0; cmb < row_combos; ++cmb) {
        const float* base = xf + coff[cmb];
        double a = 0;
        for (int t = 0; t < lt.k; ++t) a += (double)lt.w[j * lt.k + t] * base[lt.idx[j * lt.k + t] * lst];
        acc += cw[cmb] * a;
      }
      orow[j] = (float)acc;
    }
  }
}

std::vector<TypeShape> resize_shape_checked(const Node& n, const Values& in) {
  const Value& x = req_v(n, in, 0);
  NCHECK(x.shape.size() >= 1 && x.shape.size() <= 16, "rank ", x.shape.size(),
         " is not supported (1 to 16)");
  return resize_shape(n, in);
}

}  // namespace

std::vector<ResizeAxisTaps> resize_axis_taps(const Node& n, const Ins& in, const Shape& out) {
  const Tensor& x = *in[0];
  const ResizeCfg c = resize_cfg(n);
  std::vector<float> scales;
  if (given_t(in, 2)) scales = floats_of(*in[2]);
  const ResizePlan p = resize_plan(n, x.shape, scales, opt_ints(in, 3));
  NCHECK(p.out == out, "output ", shape_str(out), " differs from the planned ", shape_str(p.out));
  std::vector<ResizeAxisTaps> taps;
  for (int d = 0; d < x.rank(); ++d) taps.push_back(axis_taps(c, p.scale[d], x.shape[d], p.out[d]));
  return taps;
}

bool resize_axis_is_identity(const ResizeAxisTaps& t, int64_t in_len, int64_t out_len) {
  if (in_len != out_len) return false;
  for (int64_t o = 0; o < out_len; ++o)
    for (int j = 0; j < t.k; ++j) {
      const float w = t.w[o * t.k + j];
      if (w != 0.f && !(w == 1.f && t.idx[o * t.k + j] == o)) return false;
    }
  return true;
}

namespace {

// float32, only the last two axes resized (CREDIT's bilinear interpolation to and from the
// grid): each output row blends its input rows into one row (float32), then each output
// column its taps of that row; anything else is the reference kernel's.
void resize_fast(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const int r = x.rank();
  if (x.dtype != DType::F32 || r < 2 || out[0]->numel() == 0 || x.numel() == 0) return resize_kernel(n, in, out);
  const std::vector<ResizeAxisTaps> taps = resize_axis_taps(n, in, out[0]->shape);
  for (int d = 0; d < r - 2; ++d)
    if (!resize_axis_is_identity(taps[d], x.shape[d], out[0]->shape[d])) return resize_kernel(n, in, out);
  const ResizeAxisTaps &th = taps[r - 2], &tw = taps[r - 1];
  const int64_t H = x.shape[r - 2], W = x.shape[r - 1], OH = out[0]->shape[r - 2], OW = out[0]->shape[r - 1];
  const int64_t rows = out[0]->numel() / OW;
  const float* xf = x.data<float>();
  float* of = out[0]->data<float>();
#pragma omp parallel if (rows * OW > kParallelMin)
  {
    std::vector<float> blend((size_t)W);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t plane = row / OH, oh = row % OH;
      const float* xp = xf + plane * H * W;
      const int64_t* hi = th.idx.data() + oh * th.k;
      const float* hw = th.w.data() + oh * th.k;
      for (int64_t w = 0; w < W; ++w) blend[w] = hw[0] * xp[hi[0] * W + w];
      for (int k = 1; k < th.k; ++k)
        for (int64_t w = 0; w < W; ++w) blend[w] += hw[k] * xp[hi[k] * W + w];
      float* o = of + row * OW;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t* wi = tw.idx.data() + ow * tw.k;
        const float* ww = tw.w.data() + ow * tw.k;
        float s = 0.f;
        for (int k = 0; k < tw.k; ++k) s += ww[k] * blend[wi[k]];
        o[ow] = s;
      }
    }
  }
}

}  // namespace

void register_resize() {
  register_op("Resize", resize_shape_checked, resize_kernel);
  register_fast_kernel("Resize", resize_fast);
}

}  // namespace wxe::cpu
