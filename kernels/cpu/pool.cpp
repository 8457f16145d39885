// AveragePool (1-D, 2-D, 3-D, ONNX semantics): shape rule, reference kernel and backward.
// Attributes: kernel_shape (required), strides, pads, auto_pad (NOTSET, VALID, SAME_UPPER,
// SAME_LOWER), dilations, ceil_mode, count_include_pad. Output size per spatial axis:
// floor (or with ceil_mode ceil) of (in + pads - ((k - 1) d + 1)) / s + 1, where a ceil_mode
// window must start inside the input or its begin padding. The divisor is the number of
// window taps inside the input, or with count_include_pad inside the padded input.
// CREDIT's nextgen column attention pools with stride > 1.
// MaxPool shares the geometry (its window's largest tap inside the input; the gradient goes to
// the first largest tap), GlobalAveragePool is the mean over all spatial axes (CREDIT's "unet"
// model type: segmentation_models_pytorch's encoder and attention blocks).
#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

namespace {

struct PoolGeom {
  int nsp = 0;
  int64_t N = 0, C = 0;
  // spatial axes right-aligned in 3 (unused leading axes have size 1, kernel 1)
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, pe{0, 0, 0};
  bool include_pad = false;
};

PoolGeom pool_geometry(const Node& n, const Shape& x) {
  WXE_CHECK(x.size() >= 3 && x.size() <= 5, "node ", n.name,
            " (", n.op, "): input must be (N, C, spatial...) with 1 to 3 spatial dims, got ", shape_str(x));
  PoolGeom g;
  g.nsp = (int)x.size() - 2;
  const size_t ns = (size_t)g.nsp;
  g.N = x[0];
  g.C = x[1];
  const std::vector<int64_t> ks = n.ints("kernel_shape");
  WXE_CHECK(ks.size() == ns, "node ", n.name, " (", n.op, "): kernel_shape has ", ks.size(), " values, expected ", ns);
  const std::vector<int64_t> strides = ints_attr(n, "strides", ns, 1), dil = ints_attr(n, "dilations", ns, 1),
                             pads = ints_attr(n, "pads", 2 * ns, 0);
  const std::string ap = auto_pad_of(n);
  const bool ceil_mode = n.i("ceil_mode", 0) != 0;
  g.include_pad = n.i("count_include_pad", 0) != 0;
  const int f = 3 - g.nsp;
  for (size_t i = 0; i < ns; ++i) {
    const int a = f + (int)i;
    g.in[a] = x[2 + i];
    g.k[a] = ks[i];
    g.s[a] = strides[i];
    g.d[a] = dil[i];
    WXE_CHECK(g.k[a] >= 1 && g.s[a] >= 1 && g.d[a] >= 1, "node ", n.name,
              " (", n.op, "): kernel sizes, strides and dilations must be >= 1");
    const int64_t ext = (g.k[a] - 1) * g.d[a] + 1;
    window_pads(n, n.op, ap, pads[i], pads[i + ns], g.in[a], g.s[a], ext, &g.pb[a], &g.pe[a]);
    if (ap == "NOTSET")
      WXE_CHECK(g.pb[a] < ext && g.pe[a] < ext, "node ", n.name, " (", n.op, "): pads must be smaller than the kernel");
    const int64_t span = g.in[a] + g.pb[a] + g.pe[a] - ext;
    WXE_CHECK(span >= 0, "node ", n.name, " (", n.op, "): kernel extent ", ext, " larger than the padded input ",
              g.in[a] + g.pb[a] + g.pe[a]);
    g.out[a] = (ceil_mode ? (span + g.s[a] - 1) / g.s[a] : span / g.s[a]) + 1;
    if (ceil_mode && (g.out[a] - 1) * g.s[a] >= g.in[a] + g.pb[a]) --g.out[a];
  }
  return g;
}

std::vector<TypeShape> pool_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0], "node ", n.name, " (", n.op, "): expects 1 input");
  WXE_CHECK(in[0]->dtype == DType::F32, "node ", n.name, " (", n.op, "): float32 only, got ", dtype_name(in[0]->dtype));
  PoolGeom g = pool_geometry(n, in[0]->shape);
  Shape os = {g.N, g.C};
  for (int a = 3 - g.nsp; a < 3; ++a) os.push_back(g.out[a]);
  return {{DType::F32, os}};
}

// For output position (o0, o1, o2): calls f(input offset within the plane) for every tap inside
// the input, and returns the divisor.
template <class F>
int64_t window(const PoolGeom& g, int64_t o0, int64_t o1, int64_t o2, F&& f) {
  const int64_t o[3] = {o0, o1, o2};
  int64_t lo[3], cnt_pad = 1;
  for (int a = 0; a < 3; ++a) {
    lo[a] = o[a] * g.s[a] - g.pb[a];
    int64_t taps = 0;  // taps inside [-pb, in + pe)
    for (int64_t t = 0; t < g.k[a]; ++t) {
      const int64_t i = lo[a] + t * g.d[a];
      taps += i < g.in[a] + g.pe[a];
    }
    cnt_pad *= taps;
  }
  int64_t cnt = 0;
  for (int64_t t0 = 0; t0 < g.k[0]; ++t0) {
    const int64_t i0 = lo[0] + t0 * g.d[0];
    if (i0 < 0 || i0 >= g.in[0]) continue;
    for (int64_t t1 = 0; t1 < g.k[1]; ++t1) {
      const int64_t i1 = lo[1] + t1 * g.d[1];
      if (i1 < 0 || i1 >= g.in[1]) continue;
      for (int64_t t2 = 0; t2 < g.k[2]; ++t2) {
        const int64_t i2 = lo[2] + t2 * g.d[2];
        if (i2 < 0 || i2 >= g.in[2]) continue;
        f((i0 * g.in[1] + i1) * g.in[2] + i2);
        ++cnt;
      }
    }
  }
  return g.include_pad ? cnt_pad : cnt;
}

void pool_ref(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const PoolGeom g = pool_geometry(n, in[0]->shape);
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  const float* X = in[0]->data<float>();
  float* Y = out[0]->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < g.N * g.C; ++p) {
    const float* x = X + p * in_plane;
    float* y = Y + p * out_plane;
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
          double sum = 0;
          const int64_t div = window(g, o0, o1, o2, [&](int64_t i) { sum += x[i]; });
          *y++ = div ? (float)(sum / (double)div) : 0.f;
        }
  }
}

// dX[i] = sum over the windows holding tap i of dY / divisor
void pool_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                   const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  const PoolGeom g = pool_geometry(n, in[0]->shape);
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  float* DX = gin[0]->data<float>();
  std::fill(DX, DX + gin[0]->numel(), 0.f);
  if (!gout[0]) return;
  const float* DY = gout[0]->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < g.N * g.C; ++p) {
    float* dx = DX + p * in_plane;
    const float* dy = DY + p * out_plane;
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
          std::vector<int64_t> taps;
          const int64_t div = window(g, o0, o1, o2, [&](int64_t i) { taps.push_back(i); });
          const float v = div ? *dy / (float)div : 0.f;
          for (int64_t i : taps) dx[i] += v;
          ++dy;
        }
  }
}

// MaxPool: the first largest tap of each window inside the input (an all-padding window: -inf)
template <class F>
void max_windows(const PoolGeom& g, const float* x, F&& f) {
  for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
    for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
      for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
        int64_t best = -1;
        window(g, o0, o1, o2, [&](int64_t i) {
          if (best < 0 || x[i] > x[best]) best = i;
        });
        f(best);
      }
}

std::vector<TypeShape> maxpool_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(n.i("storage_order", 0) == 0, "node ", n.name, " (MaxPool): storage_order 1 is not supported");
  return pool_shape(n, in);
}

void maxpool_ref(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const PoolGeom g = pool_geometry(n, in[0]->shape);
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < g.N * g.C; ++p) {
    const float* x = in[0]->data<float>() + p * in_plane;
    float* y = out[0]->data<float>() + p * out_plane;
    max_windows(g, x, [&](int64_t i) { *y++ = i < 0 ? -std::numeric_limits<float>::infinity() : x[i]; });
  }
}

void maxpool_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                      const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  const PoolGeom g = pool_geometry(n, in[0]->shape);
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  std::fill(gin[0]->data<float>(), gin[0]->data<float>() + gin[0]->numel(), 0.f);
  if (!gout[0]) return;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < g.N * g.C; ++p) {
    const float* x = in[0]->data<float>() + p * in_plane;
    const float* dy = gout[0]->data<float>() + p * out_plane;
    float* dx = gin[0]->data<float>() + p * in_plane;
    max_windows(g, x, [&](int64_t i) {
      if (i >= 0) dx[i] += *dy;
      ++dy;
    });
  }
}

// GlobalAveragePool: (N, C, spatial...) -> (N, C, 1...)
std::vector<TypeShape> gap_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0] && in[0]->shape.size() >= 3, "node ", n.name,
            " (GlobalAveragePool): input must be (N, C, spatial...)");
  WXE_CHECK(in[0]->dtype == DType::F32, "node ", n.name, " (GlobalAveragePool): float32 only");
  Shape s = in[0]->shape;
  std::fill(s.begin() + 2, s.end(), 1);
  return {{DType::F32, s}};
}

void gap_ref(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const int64_t planes = in[0]->shape[0] * in[0]->shape[1], plane = planes ? in[0]->numel() / planes : 0;
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < plane; ++i) sum += in[0]->data<float>()[p * plane + i];
    out[0]->data<float>()[p] = plane ? (float)(sum / (double)plane) : 0.f;
  }
}

void gap_backward(const Node&, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                  const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  const int64_t planes = in[0]->shape[0] * in[0]->shape[1], plane = planes ? in[0]->numel() / planes : 0;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < plane; ++i)
      gin[0]->data<float>()[p * plane + i] = gout[0] ? gout[0]->data<float>()[p] / (float)plane : 0.f;
}

}  // namespace

void register_pool_ops() {
  register_op("AveragePool", pool_shape, pool_ref);
  register_backward("AveragePool", pool_backward);
  register_op("MaxPool", maxpool_shape, maxpool_ref);
  register_backward("MaxPool", maxpool_backward);
  register_op("GlobalAveragePool", gap_shape, gap_ref);
  register_backward("GlobalAveragePool", gap_backward);
}

}  // namespace wxe::cpu
