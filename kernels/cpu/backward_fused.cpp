// Backward kernels of the ops the fusion passes make (engine/passes/fuse.h), which the
// training graph runs since fuse_for_training: ChannelLayerNorm here; Gelu is
// backward_layers.cpp, Linear with activation "gelu" (inference's fusion) backward_linalg.cpp.
// See engine/ir/ops.h (BackwardFn) for the contract.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/backward_util.h"

namespace wxe::cpu {

namespace {

// ---------------------------------------------------------------------------------------
// ChannelLayerNorm(x, g, b; epsilon), x (N, C, S...): per position (n, s), over the C channels,
// xhat = (x - mean) * rstd and y = xhat g + b. The backward reads x only (and g): mean and rstd
// are recomputed, in double, as the reference forward computes them. With gxhat = gy g,
//   gx = rstd (gxhat - mean_c(gxhat) - xhat mean_c(gxhat xhat)),
//   gg_c = sum over (n, s) of gy xhat,  gb_c = sum over (n, s) of gy.
// Positions go in tiles of 64 (the channels are strided by S, the positions of a tile
// contiguous); gg and gb are summed per channel in a fixed order: the same bits at any thread
// count.

void channel_layernorm_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  Tensor* gx_t = gin[0];
  Tensor* gg_t = opt_gin(gin, 1);
  Tensor* gb_t = opt_gin(gin, 2);
  if (!gout[0]) {
    for (Tensor* t : {gx_t, gg_t, gb_t}) fill_zero(t);
    return;
  }
  const Tensor& xt = *in[0];
  const int64_t N = xt.shape[0], C = xt.shape[1], S = prod(xt.shape, 2, xt.shape.size());
  const double eps = n.f("epsilon", 1e-5f);
  const float* x = xt.data<float>();
  const float* g = in[1]->data<float>();
  const float* gy = gout[0]->data<float>();
  constexpr int64_t T = 64;
  const int64_t tiles = (S + T - 1) / T;
  std::vector<double> mean((size_t)(N * S)), rstd((size_t)(N * S));  // per position
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N * tiles; ++t) {
    const int64_t s0 = (t % tiles) * T, len = std::min(T, S - s0), off = (t / tiles) * C * S + s0;
    double* m = mean.data() + (t / tiles) * S + s0;
    double* r = rstd.data() + (t / tiles) * S + s0;
    double a[T] = {}, b[T] = {};
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) a[i] += xc[i];
    }
    for (int64_t i = 0; i < len; ++i) m[i] = a[i] / C;
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) b[i] += (xc[i] - m[i]) * (xc[i] - m[i]);
    }
    for (int64_t i = 0; i < len; ++i) r[i] = 1.0 / std::sqrt(b[i] / C + eps);
    if (!gx_t) continue;
    // a: sum_c gxhat, b: sum_c gxhat xhat
    std::fill(a, a + T, 0.0);
    std::fill(b, b + T, 0.0);
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
      const float* gc = gy + off + c * S;
      const double gain = g[c];
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        const double gh = gc[i] * gain;
        a[i] += gh;
        b[i] += gh * (xc[i] - m[i]) * r[i];
      }
    }
    float* gx = gx_t->data<float>();
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
      const float* gc = gy + off + c * S;
      float* gxc = gx + off + c * S;
      const double gain = g[c];
#pragma omp simd
      for (int64_t i = 0; i < len; ++i)
        gxc[i] = (float)(r[i] * (gc[i] * gain - a[i] / C - (xc[i] - m[i]) * r[i] * b[i] / C));
    }
  }
  if (!gg_t && !gb_t) return;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double sg = 0, sb = 0;
    for (int64_t b = 0; b < N; ++b) {
      const float* xc = x + (b * C + c) * S;
      const float* gc = gy + (b * C + c) * S;
      const double* m = mean.data() + b * S;
      const double* r = rstd.data() + b * S;
#pragma omp simd reduction(+ : sg, sb)
      for (int64_t s = 0; s < S; ++s) {
        sg += gc[s] * (xc[s] - m[s]) * r[s];
        sb += gc[s];
      }
    }
    if (gg_t) gg_t->data<float>()[c] = (float)sg;
    if (gb_t) gb_t->data<float>()[c] = (float)sb;
  }
}

}  // namespace

void register_fused_backward() {
  register_backward("ChannelLayerNorm", channel_layernorm_backward);
  register_backward_reads("ChannelLayerNorm", {~(1u << 2), false});  // x and g; not b, not y
}

}  // namespace wxe::cpu
