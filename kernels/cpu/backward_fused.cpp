// Backward kernels of the ops the fusion passes make (engine/passes/fuse.h), which the
// training graph runs since fuse_for_training: ChannelLayerNorm here; Gelu is
// backward_layers.cpp, Linear with activation "gelu" (inference's fusion) backward_linalg.cpp.
// See engine/ir/ops.h (BackwardFn) for the contract.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/channel_norm.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/backward_util.h"

namespace wxe::cpu {

namespace {

// ---------------------------------------------------------------------------------------
// ChannelLayerNorm(x, g, b; epsilon), x (N, C, S...): per position (n, s), over the C channels,
// xhat = (x - mean) * rstd and y = xhat g + b. The backward reads x only (and g): mean and rstd
// are recomputed in float32 as the fast forward computes them (fused.cpp). With gxhat = gy g,
//   gx = rstd (gxhat - mean_c(gxhat) - xhat mean_c(gxhat xhat)),
//   gg_c = sum over (n, s) of gy xhat,  gb_c = sum over (n, s) of gy.
// One pass over tiles of 64 positions (the channels are strided by S, the positions of a tile
// contiguous, a tile's x and gy stay in L1 across its loops); gg and gb are summed per tile and
// channel, then per channel over the tiles in order, in double: the same bits at any thread count.
// gx is added to the gradient gin[0] holds when backward_accumulates(0) (the residual stream's,
// summed there by the executor otherwise: the same float additions, one pass fewer).

void channel_layernorm_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  Tensor* gx_t = gin[0];
  Tensor* gg_t = opt_gin(gin, 1);
  Tensor* gb_t = opt_gin(gin, 2);
  if (!gout[0]) {
    for (Tensor* t : {backward_accumulates(0) ? nullptr : gx_t, gg_t, gb_t}) fill_zero(t);
    return;
  }
  const Tensor& xt = *in[0];
  const int64_t N = xt.shape[0], C = xt.shape[1], S = prod(xt.shape, 2, xt.shape.size());
  const float eps = n.f("epsilon", 1e-5f);
  const float* x = xt.data<float>();
  const float* g = in[1]->data<float>();
  const float* gy = gout[0]->data<float>();
  float* gx = gx_t ? gx_t->data<float>() : nullptr;
  const bool add = gx && backward_accumulates(0);  // gx holds the residual stream's gradient so far
  const bool params = gg_t || gb_t;
  constexpr int64_t T = 64;
  const int64_t tiles = (S + T - 1) / T;
  std::vector<double> part((size_t)(params ? N * tiles * C * 2 : 0));  // per tile and channel: gg, gb
  const float invC = 1.f / (float)C;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N * tiles; ++t) {
    const int64_t s0 = (t % tiles) * T, len = std::min(T, S - s0), off = (t / tiles) * C * S + s0;
    float m[T], r[T], a[T] = {}, b[T] = {};
    channel_tile_moments(x + off, C, S, len, m, r);
#pragma omp simd
    for (int64_t i = 0; i < T; ++i) r[i] = 1.f / std::sqrt(r[i] * invC + eps);
    // a: sum_c gxhat, b: sum_c gxhat xhat; per channel: sum_s gy xhat, sum_s gy
    double* pc = params ? part.data() + t * C * 2 : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
      const float* gc = gy + off + c * S;
      const float gain = g[c];
      float sg = 0, sb = 0;
#pragma omp simd reduction(+ : sg, sb)
      for (int64_t i = 0; i < len; ++i) {
        const float xh = (xc[i] - m[i]) * r[i];
        a[i] += gc[i] * gain;
        b[i] += gc[i] * gain * xh;
        sg += gc[i] * xh;
        sb += gc[i];
      }
      if (pc) {
        pc[2 * c] = sg;
        pc[2 * c + 1] = sb;
      }
    }
    if (!gx) continue;
    for (int64_t c = 0; c < C; ++c) {
      const float* xc = x + off + c * S;
      const float* gc = gy + off + c * S;
      float* gxc = gx + off + c * S;
      const float gain = g[c];
      float v[T];  // the tile's gradient first, then added in a loop of its own: the additions
                   // round as the executor's sum of a separate gradient did (no fused multiply-add)
#pragma omp simd
      for (int64_t i = 0; i < len; ++i)
        v[i] = r[i] * (gc[i] * gain - a[i] * invC - (xc[i] - m[i]) * r[i] * b[i] * invC);
      if (add) {
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) gxc[i] += v[i];
      } else {
        std::memcpy(gxc, v, len * sizeof(float));
      }
    }
  }
  if (!params) return;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double sg = 0, sb = 0;
    for (int64_t t = 0; t < N * tiles; ++t) {
      sg += part[(t * C + c) * 2];
      sb += part[(t * C + c) * 2 + 1];
    }
    if (gg_t) gg_t->data<float>()[c] = (float)sg;
    if (gb_t) gb_t->data<float>()[c] = (float)sb;
  }
}

}  // namespace

void register_fused_backward() {
  register_backward("ChannelLayerNorm", channel_layernorm_backward);
  register_backward_reads("ChannelLayerNorm", {~(1u << 2), false});  // x and g; not b, not y
  register_gradient_accumulation("ChannelLayerNorm", 1u);
}

}  // namespace wxe::cpu
