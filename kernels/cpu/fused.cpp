// Fused ops made by the CPU fusion passes (engine/passes/fuse.h): shape rules, plain reference
// kernels (double accumulators, the oracle; each equals the subgraph it replaces up to float
// rounding) and the fast kernels that do not use oneDNN.
#include <algorithm>
#include <cmath>

#include "engine/ir/ops.h"
#include "kernels/cpu/channel_norm.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/window_attention.h"

namespace wxe::cpu {

namespace {


// ---------------------------------------------------------------------------------------
// ChannelLayerNorm(x, g, b; epsilon): x (N, C, spatial...), g and b with C elements;
// y = (x - mean) / sqrt(var + eps) * g + b, mean and (biased) var over axis 1.

std::vector<TypeShape> channel_layernorm_shape(const Node& n, const Values& in) {
  NCHECK(in.size() == 3 && in[0] && in[1] && in[2], "needs inputs x, g, b");
  const Shape& x = in[0]->shape;
  NCHECK(x.size() >= 2, "x must be (N, C, ...), got ", shape_str(x));
  NCHECK(in[0]->dtype == DType::F32 && in[1]->dtype == DType::F32 && in[2]->dtype == DType::F32,
         "float32 only");
  NCHECK(numel(in[1]->shape) == x[1] && numel(in[2]->shape) == x[1], "g ", shape_str(in[1]->shape), " and b ",
         shape_str(in[2]->shape), " must have ", x[1], " elements");
  return {{DType::F32, x}};
}

struct ChannelDims {
  int64_t N, C, S;  // batch, channels, spatial positions
};

ChannelDims channel_dims(const Tensor& x) {
  ChannelDims d{x.shape[0], x.shape[1], 1};
  for (int i = 2; i < x.rank(); ++i) d.S *= x.shape[i];
  return d;
}

void channel_layernorm_ref(const Node& n, const Ins& in, const Outs& out) {
  const ChannelDims d = channel_dims(*in[0]);
  const double eps = n.f("epsilon", 1e-5f);
  const float* x = in[0]->data<float>();
  const float* g = in[1]->data<float>();
  const float* b = in[2]->data<float>();
  float* y = out[0]->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < d.N * d.S; ++p) {
    const float* xp = x + (p / d.S) * d.C * d.S + p % d.S;
    float* yp = y + (p / d.S) * d.C * d.S + p % d.S;
    double s = 0, v = 0;
    for (int64_t c = 0; c < d.C; ++c) s += xp[c * d.S];
    const double mean = s / d.C;
    for (int64_t c = 0; c < d.C; ++c) v += (xp[c * d.S] - mean) * (xp[c * d.S] - mean);
    const double sd = std::sqrt(v / d.C + eps);
    for (int64_t c = 0; c < d.C; ++c) yp[c * d.S] = (float)((xp[c * d.S] - mean) / sd * g[c] + b[c]);
  }
}

// Fast: tiles of positions, channels strided; float accumulators (C is at most a few
// hundred), vectorised over the positions of a tile.
void channel_layernorm_fast(const Node& n, const Ins& in, const Outs& out) {
  const ChannelDims d = channel_dims(*in[0]);
  const float eps = n.f("epsilon", 1e-5f);
  const float* x = in[0]->data<float>();
  const float* g = in[1]->data<float>();
  const float* b = in[2]->data<float>();
  float* y = out[0]->data<float>();
  constexpr int64_t T = 64;
  const int64_t tiles = (d.S + T - 1) / T;
  const float invC = 1.f / (float)d.C;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < d.N * tiles; ++t) {
    const int64_t s0 = (t % tiles) * T, len = std::min(T, d.S - s0);
    const float* xp = x + (t / tiles) * d.C * d.S + s0;
    float* yp = y + (t / tiles) * d.C * d.S + s0;
    float mean[T], var[T];
    channel_tile_moments(xp, d.C, d.S, len, mean, var);
#pragma omp simd
    for (int64_t i = 0; i < T; ++i) var[i] = std::sqrt(var[i] * invC + eps);  // now the std dev
    for (int64_t c = 0; c < d.C; ++c) {
      const float* xc = xp + c * d.S;
      float* yc = yp + c * d.S;
      const float gc = g[c], bc = b[c];
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) yc[i] = (xc[i] - mean[i]) / var[i] * gc + bc;
    }
  }
}

// ---------------------------------------------------------------------------------------
// WindowAttention(x, Wq, Wk, Wv, Wo, bo?, bias, residual?; heads, scale, window, strided)
// (window_attention.h has the geometry and the semantics).

std::vector<TypeShape> window_attention_shape(const Node& n, const Values& in) {
  NCHECK(in.size() == 8 && in[0] && in[1] && in[4] && in[6] && !in[2] == !in[3],
         "needs inputs x, Wq, Wk?, Wv?, Wo, bo?, bias, residual? (Wk and Wv both or neither)");
  for (const Value* v : in) NCHECK(!v || v->dtype == DType::F32, "float32 only");
  const bool fused = !in[2];
  WindowGeom g = window_geometry(n, in[0]->shape, in[1]->shape, fused);
  int64_t r = 0, c = 0;
  for (int i = 1; i <= (fused ? 1 : 3); ++i)
    NCHECK(weight_matrix(in[i]->shape, &r, &c) && r == (fused ? 3 : 1) * g.I && c == g.D, "W", "qkv"[i - 1], " ",
           shape_str(in[i]->shape), " must be (", (fused ? 3 : 1) * g.I, ", ", g.D, ")");
  NCHECK(weight_matrix(in[4]->shape, &r, &c) && r == g.D && c == g.I, "Wo ", shape_str(in[4]->shape), " must be (",
         g.D, ", ", g.I, ")");
  NCHECK(!in[5] || numel(in[5]->shape) == g.D, "bo must have ", g.D, " elements");
  const Shape& bs = in[6]->shape;
  NCHECK(bs.size() >= 2 && bs[bs.size() - 2] == g.T && bs.back() == g.T &&
             (numel(bs) == g.heads * g.T * g.T || numel(bs) == g.T * g.T),
         "bias ", shape_str(bs), " must be (", g.heads, ", ", g.T, ", ", g.T, ") or (", g.T, ", ", g.T, ")");
  NCHECK(!in[7] || in[7]->shape == in[0]->shape, "residual must have the shape of x");
  return {{DType::F32, in[0]->shape}};
}

void window_attention_ref(const Node& n, const Ins& in, const Outs& out) {
  const bool fused = !in[2];
  const WindowGeom g = window_geometry(n, in[0]->shape, in[1]->shape, fused);
  const double scale = n.f("scale", 1.f);
  const float* x = in[0]->data<float>();
  const int64_t ID = g.I * g.D;
  const float* wqkv[3] = {in[1]->data<float>(), fused ? in[1]->data<float>() + ID : in[2]->data<float>(),
                          fused ? in[1]->data<float>() + 2 * ID : in[3]->data<float>()};
  const float* wo = in[4]->data<float>();
  const float* bo = in[5] ? in[5]->data<float>() : nullptr;
  const float* bias = in[6]->data<float>();
  const int64_t bstride = bias_head_stride(g, in[6]->numel());
  const float* res = in[7] ? in[7]->data<float>() : nullptr;
  float* y = out[0]->data<float>();
  const int64_t T = g.T, D = g.D, I = g.I, dh = g.I / g.heads, HW = g.H * g.W;
#pragma omp parallel for schedule(dynamic)
  for (int64_t bw = 0; bw < g.B * g.nW; ++bw) {
    const int64_t b = bw / g.nW, wy = bw % g.nW / g.nwx, wx = bw % g.nW % g.nwx;
    std::vector<int64_t> pix(T);  // offset of each token's pixel in a channel plane
    for (int64_t t = 0; t < T; ++t) pix[t] = g.pixel(wy, wx, t);
    std::vector<double> qkv(3 * T * I), o(T * I, 0.0), s(T);
    for (int m = 0; m < 3; ++m)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) {
          double a = 0;
          for (int64_t c = 0; c < D; ++c) a += (double)wqkv[m][i * D + c] * x[(b * D + c) * HW + pix[t]];
          qkv[(m * T + t) * I + i] = a;
        }
    const double* q = qkv.data();
    const double* k = q + T * I;
    const double* v = k + T * I;
    for (int64_t h = 0; h < g.heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < T; ++j) {
          double a = 0;
          for (int64_t d = 0; d < dh; ++d) a += q[i * I + h * dh + d] * k[j * I + h * dh + d];
          s[j] = a * scale + bias[h * bstride + i * T + j];
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < T; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < T; ++j)
          for (int64_t d = 0; d < dh; ++d) o[i * I + h * dh + d] += s[j] / sum * v[j * I + h * dh + d];
      }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) {
        double a = bo ? bo[c] : 0.0;
        for (int64_t i = 0; i < I; ++i) a += (double)wo[c * I + i] * o[t * I + i];
        const int64_t at = (b * D + c) * HW + pix[t];
        y[at] = (float)(res ? (float)a + res[at] : a);
      }
  }
}

// ---------------------------------------------------------------------------------------
// ConvChannelsLast(x, W, b?; the Conv attributes, channels_last_output): a 2-D Conv whose
// input x is channels-last (N, H, W, C); W and b as Conv's; the output is (N, C_out, OH, OW),
// or (N, OH, OW, C_out) with channels_last_output = 1. Made by conv_channels_last
// (engine/passes/fuse.h): the layout changes become Transpose nodes the memory plan sees and convs
// reading one tensor share.

// (N, H, W, C) <-> (N, C, H, W) of float32 data
void to_channels_first(const float* x, float* y, int64_t N, int64_t HW, int64_t C) {
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) y[(b * C + c) * HW + p] = x[(b * HW + p) * C + c];
}

void to_channels_last(const float* x, float* y, int64_t N, int64_t HW, int64_t C) {
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p) y[(b * HW + p) * C + c] = x[(b * C + c) * HW + p];
}

Shape nchw_of(const Node& n, const Shape& nhwc) {
  NCHECK(nhwc.size() == 4, "x must be (N, H, W, C), got ", shape_str(nhwc));
  return {nhwc[0], nhwc[3], nhwc[1], nhwc[2]};
}

std::vector<TypeShape> conv_channels_last_shape(const Node& n, const Values& in) {
  NCHECK(in.size() >= 2 && in[0] && in[1], "needs inputs x and W");
  for (const Value* v : in) NCHECK(!v || v->dtype == DType::F32, "float32 only");
  ConvGeom g = conv_geometry(n, nchw_of(n, in[0]->shape), in[1]->shape, false);
  if (in.size() > 2 && in[2]) NCHECK(in[2]->shape == Shape{g.C_out}, "bias must be (", g.C_out, ")");
  const Shape o = g.out_shape();
  return {{DType::F32, n.i("channels_last_output", 0) ? Shape{o[0], o[2], o[3], o[1]} : o}};
}

void conv_channels_last_ref(const Node& n, const Ins& in, const Outs& out) {
  const Shape xs = nchw_of(n, in[0]->shape);
  Tensor x(DType::F32, xs);
  to_channels_first(in[0]->data<float>(), x.data<float>(), xs[0], xs[2] * xs[3], xs[1]);
  std::vector<const Tensor*> conv_in = in;
  conv_in[0] = &x;
  if (!n.i("channels_last_output", 0)) return kernel_for("Conv", KernelKind::Reference)(n, conv_in, out);
  const Shape& os = out[0]->shape;  // (N, OH, OW, C_out)
  Tensor y(DType::F32, {os[0], os[3], os[1], os[2]});
  std::vector<Tensor*> conv_out{&y};
  kernel_for("Conv", KernelKind::Reference)(n, conv_in, conv_out);
  to_channels_last(y.data<float>(), out[0]->data<float>(), os[0], os[1] * os[2], os[3]);
}

// ---------------------------------------------------------------------------------------
// DepthToSpaceChannelsLast(x; blocksize, mode): DepthToSpace of a channels-last tensor,
// (N, H, W, C) -> (N, H b, W b, C / b^2), the channel of output (h b + i, w b + j, c) being
// c b^2 + i b + j (mode CRD) or (i b + j) C / b^2 + c (DCR), as DepthToSpace's. Made by
// depth_to_space_channels_last (engine/passes/fuse.h) between two channels-last convs.

std::vector<TypeShape> d2s_channels_last_shape(const Node& n, const Values& in) {
  NCHECK(in.size() == 1 && in[0], "needs input x");
  const Shape& x = in[0]->shape;
  const int64_t b = n.i("blocksize", 0);
  const std::string mode = n.s("mode", "DCR");
  NCHECK(mode == "CRD" || mode == "DCR", "unsupported mode '", mode, "'");
  NCHECK(x.size() == 4 && b > 0 && x[3] % (b * b) == 0, "x ", shape_str(x), " with blocksize ", b,
         ": must be (N, H, W, C) with C divisible by blocksize^2");
  return {{in[0]->dtype, {x[0], x[1] * b, x[2] * b, x[3] / (b * b)}}};
}

template <class T>  // T: an element type of the tensor's size
void d2s_channels_last_typed(const Tensor& x, Tensor& y, int64_t b, bool crd) {
  const int64_t N = x.shape[0], H = x.shape[1], W = x.shape[2], C = x.shape[3], Co = C / (b * b);
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  // one output row (h b + i) of one image per iteration; its pixels in order
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N * H * b; ++row) {
    const int64_t nb = row / (H * b), h = row % (H * b) / b, i = row % b;
    for (int64_t w = 0; w < W; ++w)
      for (int64_t j = 0; j < b; ++j) {
        const T* s = src + ((nb * H + h) * W + w) * C + (crd ? i * b + j : (i * b + j) * Co);
        T* d = dst + ((row * W + w) * b + j) * Co;
        const int64_t step = crd ? b * b : 1;
        for (int64_t c = 0; c < Co; ++c) d[c] = s[c * step];
      }
  }
}

void d2s_channels_last_kernel(const Node& n, const Ins& in, const Outs& out) {
  const int64_t b = n.i("blocksize", 0);
  const bool crd = n.s("mode", "DCR") == "CRD";
  switch (dtype_size(in[0]->dtype)) {
    case 1: return d2s_channels_last_typed<uint8_t>(*in[0], *out[0], b, crd);
    case 2: return d2s_channels_last_typed<uint16_t>(*in[0], *out[0], b, crd);
    case 4: return d2s_channels_last_typed<uint32_t>(*in[0], *out[0], b, crd);
    case 8: return d2s_channels_last_typed<uint64_t>(*in[0], *out[0], b, crd);
  }
  fail("node ", n.name, " (", n.op, "): unsupported dtype ", dtype_name(in[0]->dtype));
}

}  // namespace

void register_fused_ops() {
  register_op("DepthToSpaceChannelsLast", d2s_channels_last_shape, d2s_channels_last_kernel);
  register_op("ConvChannelsLast", conv_channels_last_shape, conv_channels_last_ref);
  register_op("WindowAttention", window_attention_shape, window_attention_ref);
  register_op("ChannelLayerNorm", channel_layernorm_shape, channel_layernorm_ref);
  register_fast_kernel("ChannelLayerNorm", channel_layernorm_fast);
}

}  // namespace wxe::cpu
