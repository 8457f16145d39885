// Conv with few output channels and a wide kernel: see conv_small_oc.h.
#include "kernels/cpu/conv_small_oc.h"

#include "kernels/cpu/simd.h"

#include <algorithm>

namespace wxe::cpu {

namespace {

// Axis 1 is H, axis 2 is W (ConvGeom right-aligns the spatial axes; 1-D: H is 1).
struct Dims2 {
  int64_t N, C, OC, H, W, OH, OW, KH, KW, sh, sw;
};

Dims2 dims_of(const ConvGeom& g) {
  return {g.N, g.C_in, g.C_out, g.in[1], g.in[2], g.out[1], g.out[2], g.k[1], g.k[2], g.s[1], g.s[2]};
}

// The weight gradient of output channels [ob, ob + OCB) and kernel row a of input channel c,
// accumulated in OCB x NV vectors of 8 kernel columns each (all of them: KW = 8 NV):
//   dw[o, c, a, b] = sum_{n, qh, qw} dy[n, o, qh, qw] * x[n, c, qh sh + a, qw sw + b].
template <int NV, int OCB>
void weight_grad_rows(const Dims2& d, const float* x, const float* dy, float* dw) {
  const int64_t tasks = d.C * d.KH;
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t c = t / d.KH, a = t % d.KH;
    for (int64_t ob = 0; ob < d.OC; ob += OCB) {
      __m256 acc[OCB][NV];
      #pragma GCC unroll 8
      for (int o = 0; o < OCB; ++o)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[o][v] = _mm256_setzero_ps();
      // each output row's sum is added to a running total: a float sum over one row, then
      // over rows, instead of one float sum over every output element (24k terms on CREDIT's
      // stage-0 grid), whose rounding grows with its length
      __m256 tot[OCB][NV];
      #pragma GCC unroll 8
      for (int o = 0; o < OCB; ++o)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) tot[o][v] = _mm256_setzero_ps();
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t qh = 0; qh < d.OH; ++qh) {
          #pragma GCC unroll 8
          for (int o = 0; o < OCB; ++o)
            #pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) {
              tot[o][v] = _mm256_add_ps(tot[o][v], acc[o][v]);
              acc[o][v] = _mm256_setzero_ps();
            }
          const float* xr = x + ((n * d.C + c) * d.H + qh * d.sh + a) * d.W;
          const float* dr[OCB];
          #pragma GCC unroll 8
          for (int o = 0; o < OCB; ++o) dr[o] = dy + ((n * d.OC + ob + o) * d.OH + qh) * d.OW;
          for (int64_t qw = 0; qw < d.OW; ++qw) {
            const float* xs = xr + qw * d.sw;
            __m256 xv[NV];
            #pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) xv[v] = _mm256_loadu_ps(xs + 8 * v);
            #pragma GCC unroll 8
            for (int o = 0; o < OCB; ++o) {
              const __m256 g = _mm256_broadcast_ss(dr[o] + qw);
              #pragma GCC unroll 8
              for (int v = 0; v < NV; ++v) acc[o][v] = _mm256_fmadd_ps(g, xv[v], acc[o][v]);
            }
          }
        }
      #pragma GCC unroll 8
      for (int o = 0; o < OCB; ++o)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          _mm256_storeu_ps(dw + (((ob + o) * d.C + c) * d.KH + a) * d.KW + 8 * v, _mm256_add_ps(tot[o][v], acc[o][v]));
    }
  }
}

// The largest of 8, 4, 2, 1 that divides OC with OCB * NV <= 8 (eight accumulators).
template <int NV>
void weight_grad_nv(const Dims2& d, const float* x, const float* dy, float* dw) {
  if constexpr (NV == 1)
    if (d.OC % 8 == 0) return weight_grad_rows<1, 8>(d, x, dy, dw);
  if constexpr (NV <= 2)
    if (d.OC % 4 == 0) return weight_grad_rows<NV, 4>(d, x, dy, dw);
  if (d.OC % 2 == 0) return weight_grad_rows<NV, 2>(d, x, dy, dw);
  weight_grad_rows<NV, 1>(d, x, dy, dw);
}

// Output rows of OCB channels, 24 columns at a time (three vectors), from the column phases of
// x (xp[p] holds columns p, p + sw, p + 2 sw, ... of every row: width Wp), so that kernel
// column b reads consecutive floats of phase b % sw from qw + b / sw on:
//   y[n, o, qh, qw] = bias[o] + sum_{c, a, b} w[o, c, a, b] * x[n, c, qh sh + a, qw sw + b].
template <int OCB>
void forward_rows(const Dims2& d, const float* xp, int64_t Wp, const float* w, const float* bias, float* y) {
  constexpr int VB = 3;
  const int64_t ocb = d.OC / OCB, tasks = d.N * ocb * d.OH, phase = d.N * d.C * d.H * Wp;
  const int64_t full = d.OW / (8 * VB) * (8 * VB), KW = d.KW, sw = d.sw;
  const int64_t wo = d.C * d.KH * d.KW;  // from one output channel's weights to the next
#pragma omp parallel for schedule(dynamic)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n = t / (ocb * d.OH), ob = t / d.OH % ocb * OCB, qh = t % d.OH;
    auto xrow = [&](int64_t p, int64_t c, int64_t a) {  // phase p of input row qh sh + a
      return xp + p * phase + ((n * d.C + c) * d.H + qh * d.sh + a) * Wp;
    };
    auto wrow = [&](int64_t c, int64_t a) { return w + ((ob * d.C + c) * d.KH + a) * KW; };
    for (int64_t q0 = 0; q0 < full; q0 += 8 * VB) {
      __m256 acc[OCB][VB];
#pragma GCC unroll 8
      for (int o = 0; o < OCB; ++o)
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) acc[o][v] = _mm256_set1_ps(bias ? bias[ob + o] : 0.f);
      for (int64_t c = 0; c < d.C; ++c)
        for (int64_t a = 0; a < d.KH; ++a) {
          const float* wr = wrow(c, a);
          for (int64_t p = 0; p < sw; ++p) {
            const float* xs = xrow(p, c, a) + q0;
            for (int64_t b = p, j = 0; b < KW; b += sw, ++j) {
              __m256 xv[VB];
#pragma GCC unroll 8
              for (int v = 0; v < VB; ++v) xv[v] = _mm256_loadu_ps(xs + j + 8 * v);
#pragma GCC unroll 8
              for (int o = 0; o < OCB; ++o) {
                const __m256 wv = _mm256_broadcast_ss(wr + o * wo + b);
#pragma GCC unroll 8
                for (int v = 0; v < VB; ++v) acc[o][v] = _mm256_fmadd_ps(wv, xv[v], acc[o][v]);
              }
            }
          }
        }
#pragma GCC unroll 8
      for (int o = 0; o < OCB; ++o)
#pragma GCC unroll 8
        for (int v = 0; v < VB; ++v) _mm256_storeu_ps(y + ((n * d.OC + ob + o) * d.OH + qh) * d.OW + q0 + 8 * v, acc[o][v]);
    }
    for (int64_t qw = full; qw < d.OW; ++qw)  // the last columns, one at a time
      for (int o = 0; o < OCB; ++o) {
        float s = bias ? bias[ob + o] : 0.f;
        for (int64_t c = 0; c < d.C; ++c)
          for (int64_t a = 0; a < d.KH; ++a)
            for (int64_t b = 0; b < KW; ++b) s += wrow(c, a)[o * wo + b] * xrow(b % sw, c, a)[qw + b / sw];
        y[((n * d.OC + ob + o) * d.OH + qh) * d.OW + qw] = s;
      }
  }
}

// x with its zero pads, its columns split into `phases` phases (phase p of a row holds columns
// p, p + phases, ... of the padded row: width Wp), in scratch slot 0; d becomes the padded
// problem's dims. x itself when there is nothing to do.
const float* padded_phases(const ConvGeom& g, Dims2& d, const float* x, int64_t phases, int64_t& Wp) {
  const int64_t pt = g.pb[1], pl = g.pb[2], H = d.H, W = d.W;
  const int64_t Hp = H + pt + g.pe[1], Wpad = W + pl + g.pe[2];
  Wp = (Wpad + phases - 1) / phases;
  if (phases == 1 && Hp == H && Wpad == W) return x;
  const int64_t rows = d.N * d.C * Hp, phase = rows * Wp;
  float* p = onednn::scratch_slot(0).floats(phases * phase);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r % Hp - pt, nc = r / Hp;
    const float* src = h >= 0 && h < H ? x + (nc * H + h) * W : nullptr;
    for (int64_t j = 0; j < Wp * phases; ++j) {
      const int64_t js = j - pl;
      p[(j % phases) * phase + r * Wp + j / phases] = src && js >= 0 && js < W ? src[js] : 0.f;
    }
  }
  d.H = Hp;
  d.W = Wpad;
  return p;
}

}  // namespace

bool small_oc_conv_applies(const ConvGeom& g, bool weight_grad) {
  if (g.transpose || g.group != 1 || g.nsp > 2 || g.C_out > (weight_grad ? 16 : 15) || g.N * g.C_in * g.C_out == 0)
    return false;
  if (g.k[2] % 8 != 0 || g.k[2] < 16 || g.k[2] > 32) return false;  // kernel 8: oneDNN is as fast
  for (int a = 1; a < 3; ++a)
    if (g.d[a] != 1 || g.pb[a] < 0 || g.pe[a] < 0 || g.out[a] < 1 ||
        (g.out[a] - 1) * g.s[a] + g.k[a] > g.pb[a] + g.in[a] + g.pe[a])
      return false;
  return true;
}

void small_oc_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y) {
  Dims2 d = dims_of(g);
  int64_t Wp = 0;
  const float* xp = padded_phases(g, d, x, d.sw, Wp);
  if (d.OC % 4 == 0) return forward_rows<4>(d, xp, Wp, w, bias, y);
  if (d.OC % 2 == 0) return forward_rows<2>(d, xp, Wp, w, bias, y);
  forward_rows<1>(d, xp, Wp, w, bias, y);
}

void small_oc_conv_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw) {
  Dims2 d = dims_of(g);
  int64_t Wp = 0;
  x = padded_phases(g, d, x, 1, Wp);
  if (d.KW == 8) return weight_grad_nv<1>(d, x, dy, dw);
  if (d.KW == 16) return weight_grad_nv<2>(d, x, dy, dw);
  weight_grad_nv<4>(d, x, dy, dw);
}

}  // namespace wxe::cpu
