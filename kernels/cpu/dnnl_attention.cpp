// WindowAttention on oneDNN (the fused attention block, kernels/cpu/window_attention.h).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/transpose.h"
#include "kernels/cpu/window_attention.h"

namespace wxe::cpu {

namespace {

using namespace onednn;  // engine, stream, PrimCache, Scratch, make_matmul (dnnl_util.h)

// ---------------------------------------------------------------- WindowAttention
// In chunks of whole windows (about 8192 tokens, so the buffers stay small): the chunk's
// tokens gathered to a token-major (tokens, D) buffer; q, k, v by three matmuls into one
// (tokens, 3I) buffer; the scores of every (window, head) by one batched matmul on strided
// views of it (scale as output scale; the position bias written first and added by a sum
// post-op, as a binary post-op sends oneDNN 2.6 to its slow reference matmul); softmax in
// place; o = P v by a batched matmul into (tokens, I); y = o Wo^T + bo; y scattered back to
// the tokens' pixels, plus the residual. Windows of fewer than 8 tokens do the scores and
// P v in plain loops instead: there oneDNN's per-(window, head) cost dominates (measured:
// 3x slower at 4 tokens, 2-4x faster from 8 tokens on).
struct AttnPrims {
  bool use_ref = false;
  bool loops = false;  // scores and P v in plain loops
  MatMulPrim proj, scores, pv, out;
  dnnl::softmax_forward softmax;
  memory::desc scores_md;
};

// fused_qkv: one projection by the (3I, D) weight writes q, k and v at once.
AttnPrims make_attention(const WindowGeom& g, int64_t cw, bool has_bo, float scale, bool fused_qkv) {
  const int64_t T = g.T, D = g.D, I = g.I, H = g.heads, dh = I / H, M = cw * T, P = fused_qkv ? 3 * I : I;
  AttnPrims r;
  r.loops = T < 8;
  r.proj = make_matmul(plain_md({M, D}), memory::desc({D, P}, dt::f32, Dims{1, D}), nullptr,
                       memory::desc({M, P}, dt::f32, Dims{3 * I, 1}));
  memory::desc mb = plain_md({1, D});
  r.out = make_matmul(plain_md({M, I}), memory::desc({I, D}, dt::f32, Dims{1, I}), has_bo ? &mb : nullptr,
                      plain_md({M, D}));
  r.use_ref = r.proj.use_ref || r.out.use_ref;
  if (!r.loops) {
    dnnl::primitive_attr sa;
    sa.set_output_scales(0, {scale});
    dnnl::post_ops po;
    po.append_sum(1.f);
    sa.set_post_ops(po);
    const memory::desc q_md({cw, H, T, dh}, dt::f32, Dims{T * 3 * I, dh, 3 * I, 1});
    r.scores = make_matmul(q_md, memory::desc({cw, H, dh, T}, dt::f32, Dims{T * 3 * I, dh, 1, 3 * I}), nullptr,
                           plain_md({cw, H, T, T}), sa);
    r.pv = make_matmul(plain_md({cw, H, T, T}), q_md, nullptr,
                       memory::desc({cw, H, T, dh}, dt::f32, Dims{T * I, dh, I, 1}));
    r.use_ref = r.use_ref || r.scores.use_ref || r.pv.use_ref;
  }
  try {
    r.scores_md = plain_md({cw * H * T, T});
    dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, r.scores_md, 1);
    r.softmax = dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(d, eng()));
  } catch (const dnnl::error&) {
    r.use_ref = true;
  }
  return r;
}

PrimCache<AttnPrims> attention_cache;

// scores[h][i][j] = scale q_i . k_j + bias[h][i][j] for one window; qkv rows of 3I floats.
// bstride: floats between two heads' biases (0: one bias for all).
void window_scores(const float* qkv, int64_t T, int64_t I, int64_t heads, float scale, const float* bias,
                   int64_t bstride, float* scores) {
  const int64_t dh = I / heads;
  std::vector<float> kt(dh * T), acc(T);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < T; ++j)
      for (int64_t d = 0; d < dh; ++d) kt[d * T + j] = qkv[j * 3 * I + I + h * dh + d];
    for (int64_t i = 0; i < T; ++i) {
      const float* q = qkv + i * 3 * I + h * dh;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t d = 0; d < dh; ++d) {
        const float qd = q[d];
        const float* kd = kt.data() + d * T;
#pragma omp simd
        for (int64_t j = 0; j < T; ++j) acc[j] += qd * kd[j];
      }
      const float* b = bias + h * bstride + i * T;
      float* s = scores + (h * T + i) * T;
#pragma omp simd
      for (int64_t j = 0; j < T; ++j) s[j] = acc[j] * scale + b[j];
    }
  }
}

// o_i = sum_j P[h][i][j] v_j for one window; o rows of I floats.
void window_pv(const float* probs, const float* qkv, int64_t T, int64_t I, int64_t heads, float* o) {
  const int64_t dh = I / heads;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < T; ++i) {
      float* oi = o + i * I + h * dh;
      std::fill(oi, oi + dh, 0.f);
      const float* p = probs + (h * T + i) * T;
      for (int64_t j = 0; j < T; ++j) {
        const float pj = p[j];
        const float* v = qkv + j * 3 * I + 2 * I + h * dh;
#pragma omp simd
        for (int64_t d = 0; d < dh; ++d) oi[d] += pj * v[d];
      }
    }
}

void window_attention_fast(const Node& n, const std::vector<const Tensor*>& in,
                           const std::vector<Tensor*>& out) {
  if (!all_f32(in, out)) return reference(n, in, out);
  const bool fused = !in[2];
  const WindowGeom g = window_geometry(n, in[0]->shape, in[1]->shape, fused);
  const int64_t T = g.T, D = g.D, I = g.I, H = g.heads, HW = g.H * g.W;
  const int64_t windows = g.B * g.nW, cw = std::min(windows, std::max<int64_t>(1, 8192 / T));
  const float scale = n.f("scale", 1.f);
  const float* x = in[0]->data<float>();
  const float* bias = in[6]->data<float>();
  const int64_t bstride = bias_head_stride(g, in[6]->numel());
  const float* res = in[7] ? in[7]->data<float>() : nullptr;
  float* y = out[0]->data<float>();
  // pixel of token t of window w: base(w) + off[t]
  std::vector<int64_t> off(T);
  for (int64_t t = 0; t < T; ++t) off[t] = g.pixel(0, 0, t);
  auto base = [&](int64_t w) {
    const int64_t wy = w % g.nW / g.nwx, wx = w % g.nW % g.nwx;
    return (w / g.nW) * D * HW + (g.strided ? wy * g.W + wx : wy * g.th * g.W + wx * g.tw);
  };
  float* tok = static_cast<float*>(scratch_slot(0).get(cw * T * std::max(D, I) * sizeof(float)));
  float* qkv = static_cast<float*>(scratch_slot(1).get(cw * T * 3 * I * sizeof(float)));
  float* sc = static_cast<float*>(scratch_slot(2).get(cw * H * T * T * sizeof(float)));
  float* yt = static_cast<float*>(scratch_slot(3).get(cw * T * D * sizeof(float)));
  for (int64_t w0 = 0; w0 < windows; w0 += cw) {
    const int64_t cnt = std::min(cw, windows - w0);
    auto p = attention_cache.get(str("WindowAttention", cnt, "x", T, "x", D, ">", I, "h", H, in[5] ? "b" : "",
                                     fused ? "f" : "", float_bits(scale)),
                                 [&] { return make_attention(g, cnt, in[5] != nullptr, scale, fused); });
    if (p->use_ref) return reference(n, in, out);
#pragma omp parallel for schedule(static)
    for (int64_t wi = 0; wi < cnt; ++wi) {
      const float* xb = x + base(w0 + wi);
      float* tw = tok + wi * T * D;
      for (int64_t c = 0; c < D; ++c)
        for (int64_t t = 0; t < T; ++t) tw[t * D + c] = xb[c * HW + off[t]];
    }
    for (int m = 0; m < (fused ? 1 : 3); ++m)
      execute(n, p->proj.prim, {{DNNL_ARG_SRC, mem(p->proj.src, tok)},
                                {DNNL_ARG_WEIGHTS, mem(p->proj.wei, in[1 + m]->raw())},
                                {DNNL_ARG_DST, mem(p->proj.dst, qkv + m * I)}});
    if (p->loops) {
#pragma omp parallel for schedule(static)
      for (int64_t wi = 0; wi < cnt; ++wi)
        window_scores(qkv + wi * T * 3 * I, T, I, H, scale, bias, bstride, sc + wi * H * T * T);
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t wi = 0; wi < cnt; ++wi)
        for (int64_t h = 0; h < H; ++h) std::copy(bias + h * bstride, bias + h * bstride + T * T, sc + (wi * H + h) * T * T);
      execute(n, p->scores.prim, {{DNNL_ARG_SRC, mem(p->scores.src, qkv)},
                                  {DNNL_ARG_WEIGHTS, mem(p->scores.wei, qkv + I)},
                                  {DNNL_ARG_DST, mem(p->scores.dst, sc)}});
    }
    execute(n, p->softmax, {{DNNL_ARG_SRC, mem(p->scores_md, sc)}, {DNNL_ARG_DST, mem(p->scores_md, sc)}});
    if (p->loops) {
#pragma omp parallel for schedule(static)
      for (int64_t wi = 0; wi < cnt; ++wi)
        window_pv(sc + wi * H * T * T, qkv + wi * T * 3 * I, T, I, H, tok + wi * T * I);
    } else {
      execute(n, p->pv.prim, {{DNNL_ARG_SRC, mem(p->pv.src, sc)},
                              {DNNL_ARG_WEIGHTS, mem(p->pv.wei, qkv + 2 * I)},
                              {DNNL_ARG_DST, mem(p->pv.dst, tok)}});
    }
    Args args{{DNNL_ARG_SRC, mem(p->out.src, tok)},
              {DNNL_ARG_WEIGHTS, mem(p->out.wei, in[4]->raw())},
              {DNNL_ARG_DST, mem(p->out.dst, yt)}};
    if (in[5]) args.emplace(DNNL_ARG_BIAS, mem(p->out.bias, in[5]->raw()));
    execute(n, p->out.prim, args);
#pragma omp parallel for schedule(static)
    for (int64_t wi = 0; wi < cnt; ++wi) {
      const int64_t at = base(w0 + wi);
      const float* tw = yt + wi * T * D;
      for (int64_t c = 0; c < D; ++c)
        for (int64_t t = 0; t < T; ++t) {
          const int64_t o = at + c * HW + off[t];
          y[o] = res ? tw[t * D + c] + res[o] : tw[t * D + c];
        }
    }
  }
}

}  // namespace

void register_dnnl_attention() { register_fast_kernel("WindowAttention", window_attention_fast); }

}  // namespace wxe::cpu
