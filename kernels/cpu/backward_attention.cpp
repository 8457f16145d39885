// Backward kernel of the fused WindowAttention (kernels/cpu/window_attention.h), which the
// training graph runs since fuse_for_training (engine/passes/fuse.h fuse_window_attention_training).
// See engine/ir/ops.h (BackwardFn) for the contract.
//
// The forward keeps nothing of its own: the backward reads x, the weights and the position
// bias (BackwardReads below), and recomputes, one chunk of whole windows at a time, what it
// needs of the forward (q, k, v by one GEMM, the softmax rows, o = P v). Per chunk of M tokens,
// with the tokens gathered row-major (xt (M, D), gyt (M, D)):
//   qkv = xt Wqkv^T                      (M, 3I)
//   per window and head: P = softmax(scale q k^T + bias),  o = P v
//   gWo += gyt^T o,  go = gyt Wo         (D, I), (M, I)
//   per window and head: dP = go v^T,  dS = P (dP - rowsum(P dP)),
//                        dq = scale dS k,  dk = scale dS^T q,  dv = P^T go,  gbias += dS
//   gWqkv += gqkv^T xt,  gxt = gqkv Wqkv  (3I, D), (M, D), gxt scattered to the tokens' pixels
// gbo is the per-channel sum of gy, the residual's gradient gy itself. The GEMMs are oneDNN
// matmuls (plain loops where oneDNN has no primitive); the per-window products are oneDNN batched
// matmuls over strided views of the chunk's buffers for windows of 8 tokens or more, loops below. gbias and gbo are summed in double in a fixed order: the same bits at any
// thread count; the weight gradients are oneDNN's sums.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/window_attention.h"

namespace wxe::cpu {

namespace {

using namespace onednn;

PrimCache<MatMulPrim> attn_bwd_cache;

// Windows of this many tokens or more do the per-head products as oneDNN batched matmuls; below,
// plain loops (oneDNN's cost per (window, head) dominates there, as in the forward:
// dnnl_attention.cpp).
constexpr int64_t kBatchedTokens = 8;

// (rows, cols) view of a row-major matrix stored (rows, cols) or, transposed, (cols, rows).
memory::desc view(int64_t rows, int64_t cols, bool transposed) {
  return memory::desc({rows, cols}, dt::f32, transposed ? Dims{1, rows} : Dims{cols, 1});
}

// C (M, N) = A (M, K) B (K, N), or C += A B with `accumulate`; A and B stored as given or
// transposed (ta, tb). oneDNN, else plain loops (double accumulators).
void gemm(const Node& n, int64_t M, int64_t K, int64_t N, const float* A, bool ta, const float* B, bool tb, float* C,
          bool accumulate) {
  if (M == 0 || N == 0) return;
  const std::string key = str("attn_bwd", M, "x", K, "x", N, ta ? "t" : "n", tb ? "t" : "n", accumulate ? "+" : "");
  auto p = attn_bwd_cache.get(key, [&] {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
    return make_matmul(view(M, K, ta), view(K, N, tb), nullptr, view(M, N, false), attr);
  });
  if (!p->use_ref) {
    execute(n, p->prim, {{DNNL_ARG_SRC, mem(p->src, A)}, {DNNL_ARG_WEIGHTS, mem(p->wei, B)}, {DNNL_ARG_DST, mem(p->dst, C)}});
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double a = accumulate ? C[i * N + j] : 0.0;
      for (int64_t k = 0; k < K; ++k) a += (double)A[ta ? k * M + i : i * K + k] * B[tb ? j * K + k : k * N + j];
      C[i * N + j] = (float)a;
    }
}

// A (windows, heads, rows, cols) view of strided data: dims and strides in floats.
struct View4 {
  const float* p;
  Dims strides;
};

// Per window and head: C (R, N) = alpha A (R, K) B (K, N) (+ C with `accumulate`), each a strided
// view over cnt windows and H heads. oneDNN's batched matmul, else plain loops.
void batched(const Node& n, int64_t cnt, int64_t H, int64_t R, int64_t K, int64_t N, View4 A, View4 B, float* C,
             const Dims& cs, float alpha, bool accumulate) {
  auto key = [](const Dims& d) { return str(d[0], ",", d[1], ",", d[2], ",", d[3]); };
  const std::string k = str("attn_bmm", cnt, "x", H, "x", R, "x", K, "x", N, "a", key(A.strides), "b", key(B.strides), "c",
                            key(cs), float_bits(alpha), accumulate ? "+" : "");
  auto p = attn_bwd_cache.get(k, [&] {
    dnnl::primitive_attr attr;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.f);
      attr.set_post_ops(po);
    }
    return make_matmul(memory::desc({cnt, H, R, K}, dt::f32, A.strides), memory::desc({cnt, H, K, N}, dt::f32, B.strides),
                       nullptr, memory::desc({cnt, H, R, N}, dt::f32, cs), attr);
  });
  if (!p->use_ref) {
    execute(n, p->prim, {{DNNL_ARG_SRC, mem(p->src, A.p)}, {DNNL_ARG_WEIGHTS, mem(p->wei, B.p)}, {DNNL_ARG_DST, mem(p->dst, C)}});
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t wh = 0; wh < cnt * H; ++wh) {
    const int64_t w = wh / H, h = wh % H;
    const float* a = A.p + w * A.strides[0] + h * A.strides[1];
    const float* b = B.p + w * B.strides[0] + h * B.strides[1];
    float* c = C + w * cs[0] + h * cs[1];
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t q = 0; q < K; ++q) s += (double)a[i * A.strides[2] + q * A.strides[3]] * b[q * B.strides[2] + j * B.strides[3]];
        float& o = c[i * cs[2] + j * cs[3]];
        o = (float)(alpha * s + (accumulate ? o : 0.0));
      }
  }
}

// A buffer of floats left uninitialized (every use writes it first), freed with the call.
struct Floats {
  std::unique_ptr<float[]> p;
  explicit Floats(int64_t n) : p(new float[(size_t)std::max<int64_t>(n, 1)]) {}
  float* data() { return p.get(); }
};

// One window's attention rows, forward: P[h][i][j] (softmax of scale q_i . k_j + bias) and
// o_i = sum_j P_ij v_j. qkv rows of 3I floats, o rows of I; head h adds bias + h bstride;
// kt scratch of dh * T floats.
void window_forward(const float* qkv, int64_t T, int64_t I, int64_t heads, float scale, const float* bias,
                    int64_t bstride, float* P, float* o, float* kt) {
  const int64_t dh = I / heads;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < T; ++j)
      for (int64_t d = 0; d < dh; ++d) kt[d * T + j] = qkv[j * 3 * I + I + h * dh + d];
    for (int64_t i = 0; i < T; ++i) {
      const float* q = qkv + i * 3 * I + h * dh;
      float* s = P + (h * T + i) * T;
      const float* b = bias + h * bstride + i * T;
      std::fill(s, s + T, 0.f);
      for (int64_t d = 0; d < dh; ++d) {
        const float qd = q[d];
        const float* kd = kt + d * T;
#pragma omp simd
        for (int64_t j = 0; j < T; ++j) s[j] += qd * kd[j];
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j < T; ++j) mx = std::max(mx, s[j] = s[j] * scale + b[j]);
      float sum = 0;
      for (int64_t j = 0; j < T; ++j) sum += (s[j] = std::exp(s[j] - mx));
      const float inv = 1.f / sum;
#pragma omp simd
      for (int64_t j = 0; j < T; ++j) s[j] *= inv;
      float* oi = o + i * I + h * dh;
      std::fill(oi, oi + dh, 0.f);
      for (int64_t j = 0; j < T; ++j) {
        const float pj = s[j];
        const float* v = qkv + j * 3 * I + 2 * I + h * dh;
#pragma omp simd
        for (int64_t d = 0; d < dh; ++d) oi[d] += pj * v[d];
      }
    }
  }
}

// One window's attention rows, backward: from P (forward) and go (rows of I), dS (into P's
// place: P is not needed after) and gqkv (rows of 3I: dq, dk, dv). vt scratch of dh * T floats,
// dp of T.
void window_backward(const float* qkv, const float* go, int64_t T, int64_t I, int64_t heads, float scale, float* P,
                     float* gqkv, float* vt, float* dp) {
  const int64_t dh = I / heads;
  for (int64_t t = 0; t < T; ++t) std::fill(gqkv + t * 3 * I, gqkv + (t + 1) * 3 * I, 0.f);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < T; ++j)
      for (int64_t d = 0; d < dh; ++d) vt[d * T + j] = qkv[j * 3 * I + 2 * I + h * dh + d];
    for (int64_t i = 0; i < T; ++i) {
      const float* g = go + i * I + h * dh;
      float* p = P + (h * T + i) * T;
      std::fill(dp, dp + T, 0.f);
      for (int64_t d = 0; d < dh; ++d) {
        const float gd = g[d];
        const float* vd = vt + d * T;
#pragma omp simd
        for (int64_t j = 0; j < T; ++j) dp[j] += gd * vd[j];
      }
      // dv_j += P_ij go_i (before p becomes dS)
      for (int64_t j = 0; j < T; ++j) {
        const float pj = p[j];
        float* dv = gqkv + j * 3 * I + 2 * I + h * dh;
#pragma omp simd
        for (int64_t d = 0; d < dh; ++d) dv[d] += pj * g[d];
      }
      float r = 0;
      for (int64_t j = 0; j < T; ++j) r += p[j] * dp[j];
#pragma omp simd
      for (int64_t j = 0; j < T; ++j) p[j] *= dp[j] - r;  // dS
      // dq_i = scale sum_j dS_ij k_j; dk_j += scale dS_ij q_i
      float* dq = gqkv + i * 3 * I + h * dh;
      const float* q = qkv + i * 3 * I + h * dh;
      for (int64_t j = 0; j < T; ++j) {
        const float s = scale * p[j];
        const float* k = qkv + j * 3 * I + I + h * dh;
        float* dk = gqkv + j * 3 * I + I + h * dh;
#pragma omp simd
        for (int64_t d = 0; d < dh; ++d) {
          dq[d] += s * k[d];
          dk[d] += s * q[d];
        }
      }
    }
  }
}

void window_attention_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  const bool fused = !in[2];
  const WindowGeom g = window_geometry(n, in[0]->shape, in[1]->shape, fused);
  Tensor* gx_t = gin[0];
  Tensor* gwq_t[3] = {opt_gin(gin, 1), fused ? nullptr : opt_gin(gin, 2), fused ? nullptr : opt_gin(gin, 3)};
  Tensor* gwo_t = opt_gin(gin, 4);
  Tensor* gbo_t = in[5] ? opt_gin(gin, 5) : nullptr;
  Tensor* gbias_t = opt_gin(gin, 6);
  Tensor* gres_t = in[7] ? opt_gin(gin, 7) : nullptr;
  if (!gout[0]) {
    for (Tensor* t : {gx_t, gwq_t[0], gwq_t[1], gwq_t[2], gwo_t, gbo_t, gbias_t, gres_t}) fill_zero(t);
    return;
  }
  const int64_t T = g.T, D = g.D, I = g.I, H = g.heads, HW = g.H * g.W, windows = g.B * g.nW;
  const float scale = n.f("scale", 1.f);
  const float* gy = gout[0]->data<float>();
  if (gres_t) std::memcpy(gres_t->data<float>(), gy, (size_t)gres_t->numel() * sizeof(float));
  if (gbo_t) {  // per channel: sum of gy over batch and pixels
    float* gbo = gbo_t->data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < D; ++c) {
      double s = 0;
      for (int64_t b = 0; b < g.B; ++b) {
        const float* p = gy + (b * D + c) * HW;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < HW; ++i) s += p[i];
      }
      gbo[c] = (float)s;
    }
  }
  const bool need_qkv_grad = gx_t || gwq_t[0] || gwq_t[1] || gwq_t[2] || gbias_t;
  if (!need_qkv_grad && !gwo_t) return;
  // the projection weights as one (3I, D) matrix, and their gradient
  const int64_t ID = I * D;
  std::vector<float> wpack, gwpack;
  const float* wqkv = in[1]->data<float>();
  if (!fused) {
    wpack.resize((size_t)(3 * ID));
    for (int m = 0; m < 3; ++m) std::memcpy(wpack.data() + m * ID, in[1 + m]->data<float>(), (size_t)ID * sizeof(float));
    wqkv = wpack.data();
  }
  float* gwqkv = nullptr;
  if (gwq_t[0] || gwq_t[1] || gwq_t[2]) {
    if (fused) {
      gwqkv = gwq_t[0]->data<float>();
    } else {
      gwpack.resize((size_t)(3 * ID));
      gwqkv = gwpack.data();
    }
  }
  const float* wo = in[4]->data<float>();
  const float* x = in[0]->data<float>();
  const float* bias = in[6]->data<float>();
  const int64_t bstride = bias_head_stride(g, in[6]->numel());
  // chunks of whole windows, about 16 MiB of buffers
  const int64_t per_token = 2 * D + 8 * I + 3 * H * T;
  const int64_t cw = std::min(windows, std::max<int64_t>(1, (4 << 20) / (per_token * T)));
  Floats xt(cw * T * D), qkv(cw * T * 3 * I), o(cw * T * I), gyt(cw * T * D), go(cw * T * I), P(cw * H * T * T),
      gqkv(cw * T * 3 * I), dP(T >= kBatchedTokens ? cw * H * T * T : 0);
  std::vector<double> gbias((size_t)(gbias_t ? H * T * T : 0), 0.0);
  std::vector<int64_t> off(T);
  for (int64_t t = 0; t < T; ++t) off[t] = g.pixel(0, 0, t);
  auto base = [&](int64_t w) {
    const int64_t wy = w % g.nW / g.nwx, wx = w % g.nW % g.nwx;
    return (w / g.nW) * D * HW + (g.strided ? wy * g.W + wx : wy * g.th * g.W + wx * g.tw);
  };
  if (gwo_t) fill_zero(gwo_t);
  if (gwqkv) std::fill(gwqkv, gwqkv + 3 * ID, 0.f);
  for (int64_t w0 = 0; w0 < windows; w0 += cw) {
    const int64_t cnt = std::min(cw, windows - w0), M = cnt * T;
#pragma omp parallel for schedule(static)
    for (int64_t wi = 0; wi < cnt; ++wi) {
      const int64_t at = base(w0 + wi);
      float* xw = xt.data() + wi * T * D;
      float* gw = gyt.data() + wi * T * D;
      for (int64_t c = 0; c < D; ++c)
        for (int64_t t = 0; t < T; ++t) {
          xw[t * D + c] = x[at + c * HW + off[t]];
          gw[t * D + c] = gy[at + c * HW + off[t]];
        }
    }
    gemm(n, M, D, 3 * I, xt.data(), false, wqkv, true, qkv.data(), false);
    // views (windows, heads, tokens, dh) of q, k, v, go, o and gqkv's parts; (.., T, T) of P and dP
    const int64_t dh = I / H;
    const Dims rows3{T * 3 * I, dh, 3 * I, 1}, cols3{T * 3 * I, dh, 1, 3 * I}, rows1{T * I, dh, I, 1},
        sq{H * T * T, T * T, T, 1}, sqt{H * T * T, T * T, 1, T};
    const float* q = qkv.data();
    if (T >= kBatchedTokens) {  // scores by one batched matmul onto the bias, softmax rows, o = P v
#pragma omp parallel for schedule(static)
      for (int64_t wi = 0; wi < cnt; ++wi)
        for (int64_t h = 0; h < H; ++h)
          std::copy(bias + h * bstride, bias + h * bstride + T * T, P.data() + (wi * H + h) * T * T);
      batched(n, cnt, H, T, dh, T, {q, rows3}, {q + I, cols3}, P.data(), sq, scale, true);
      softmax_lines(n, P.data(), P.data(), cnt * H * T, T, 1);  // oneDNN's, as the forward's rows
      batched(n, cnt, H, T, T, dh, {P.data(), sq}, {q + 2 * I, rows3}, o.data(), rows1, 1.f, false);
    } else {
#pragma omp parallel
      {
        std::vector<float> kt((size_t)(T * dh));
#pragma omp for schedule(static)
        for (int64_t wi = 0; wi < cnt; ++wi)
          window_forward(qkv.data() + wi * T * 3 * I, T, I, H, scale, bias, bstride, P.data() + wi * H * T * T,
                         o.data() + wi * T * I, kt.data());
      }
    }
    if (gwo_t) gemm(n, D, M, I, gyt.data(), true, o.data(), false, gwo_t->data<float>(), true);
    if (!need_qkv_grad) continue;
    gemm(n, M, D, I, gyt.data(), false, wo, false, go.data(), false);
    float* dS = P.data();  // where the loops leave dS
    if (T >= kBatchedTokens) {  // dv = P^T go, dP = go v^T, dS, dq = scale dS k, dk = scale dS^T q
      float* gq = gqkv.data();
      batched(n, cnt, H, T, T, dh, {P.data(), sqt}, {go.data(), rows1}, gq + 2 * I, rows3, 1.f, false);
      batched(n, cnt, H, T, dh, T, {go.data(), rows1}, {q + 2 * I, cols3}, dP.data(), sq, 1.f, false);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < cnt * H * T; ++r) {
        const float* p = P.data() + r * T;
        float* d = dP.data() + r * T;
        float sum = 0;
        for (int64_t j = 0; j < T; ++j) sum += p[j] * d[j];
#pragma omp simd
        for (int64_t j = 0; j < T; ++j) d[j] = p[j] * (d[j] - sum);
      }
      dS = dP.data();
      batched(n, cnt, H, T, T, dh, {dS, sq}, {q + I, rows3}, gq, rows3, scale, false);
      batched(n, cnt, H, T, T, dh, {dS, sqt}, {q, rows3}, gq + I, rows3, scale, false);
    } else {
#pragma omp parallel
      {
        std::vector<float> vt((size_t)(T * dh)), dp((size_t)T);
#pragma omp for schedule(static)
        for (int64_t wi = 0; wi < cnt; ++wi)
          window_backward(qkv.data() + wi * T * 3 * I, go.data() + wi * T * I, T, I, H, scale, P.data() + wi * H * T * T,
                          gqkv.data() + wi * T * 3 * I, vt.data(), dp.data());
      }
    }
    if (gbias_t) {  // sum of dS over the chunk's windows, in window order, a block of elements per thread
      const int64_t E = H * T * T, blk = 512;
#pragma omp parallel for schedule(static)
      for (int64_t e0 = 0; e0 < E; e0 += blk) {
        const int64_t len = std::min(blk, E - e0);
        double* acc = gbias.data() + e0;
        for (int64_t wi = 0; wi < cnt; ++wi) {
          const float* d = dS + wi * E + e0;
#pragma omp simd
          for (int64_t e = 0; e < len; ++e) acc[e] += d[e];
        }
      }
    }
    if (gwqkv) gemm(n, 3 * I, M, D, gqkv.data(), true, xt.data(), false, gwqkv, true);
    if (gx_t) {
      float* gxt = gyt.data();  // gy's rows are not needed any more
      gemm(n, M, 3 * I, D, gqkv.data(), false, wqkv, false, gxt, false);
      float* gx = gx_t->data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t wi = 0; wi < cnt; ++wi) {
        const int64_t at = base(w0 + wi);
        const float* gw = gxt + wi * T * D;
        for (int64_t c = 0; c < D; ++c)
          for (int64_t t = 0; t < T; ++t) gx[at + c * HW + off[t]] = gw[t * D + c];
      }
    }
  }
  if (gbias_t) {  // a bias every head shares: the heads' sums added in head order
    float* gb = gbias_t->data<float>();
    const int64_t TT = T * T;
    for (int64_t e = 0; e < gbias_t->numel(); ++e) {
      double s = gbias[e];
      if (bstride == 0)
        for (int64_t h = 1; h < H; ++h) s += gbias[h * TT + e];
      gb[e] = (float)s;
    }
  }
  if (!fused)
    for (int m = 0; m < 3; ++m)
      if (gwq_t[m]) std::memcpy(gwq_t[m]->data<float>(), gwqkv + m * ID, (size_t)ID * sizeof(float));
}

}  // namespace

void register_attention_backward() {
  register_backward("WindowAttention", window_attention_backward);
  // x, the projection weights and the position bias; not bo, the residual or y
  register_backward_reads("WindowAttention", {(1u << 0) | (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 6), false});
  register_gradient_passthrough("WindowAttention", 1u << 7);  // the residual's gradient is gy itself
}

}  // namespace wxe::cpu
