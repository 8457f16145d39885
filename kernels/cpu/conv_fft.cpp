// Conv by FFT: see conv_fft.h.
//
// A tile's F x F complex array is stored as rows of F re then F im (split). The forward
// transform is decimation in frequency along the rows' axis, vectorized over the F columns; a
// transpose that takes the rows in bit-reversed order; the same again. The spectrum comes out
// transposed, [p][q] holding frequency (fx, fy) = (rev p, q): bit-reversed rows, natural
// columns, so that -fy is a reversal within a row. The inverse (decimation in time, bit-reversed
// in, natural out) undoes it, its transpose writing rows in bit-reversed order. Two real channels
// share a transform (z = a + i b); their spectra are separated on the half of the frequencies
// that a real signal needs (fx <= F / 2: rows p even, and p = 1), unscaled (twice the true
// spectra), and the scale 1 / (4 F^2) is applied once, on the way out.
#include "kernels/cpu/conv_fft.h"

#include "kernels/cpu/simd.h"
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/transpose.h"

namespace wxe::cpu {

namespace {

struct Tables {
  int64_t F = 0, SR = 0;          // transform size; rows of a half spectrum (F / 2 + 1)
  std::vector<float> cr, ci;      // exp(-2 pi i k / F), k < F / 2
  std::vector<int64_t> rev, iota;  // bit reversal of a row index; the identity
  std::vector<int64_t> neg;       // the row of frequency -fx
  std::vector<int64_t> hrow;      // half-spectrum row h -> row p
  std::vector<int64_t> hidx;      // row p -> half-spectrum row, or -1
  explicit Tables(int64_t F_)
      : F(F_), SR(F_ / 2 + 1), cr(F_ / 2), ci(F_ / 2), rev(F_), iota(F_), neg(F_), hidx(F_, -1) {
    int64_t bits = 0;
    while ((int64_t(1) << bits) < F) ++bits;
    for (int64_t i = 0; i < F; ++i) {
      int64_t r = 0;
      for (int64_t b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
      rev[i] = r;
      iota[i] = i;
    }
    for (int64_t k = 0; k < F / 2; ++k) {
      const double a = -2.0 * 3.14159265358979323846 * double(k) / double(F);
      cr[k] = (float)std::cos(a);
      ci[k] = (float)std::sin(a);
    }
    for (int64_t p = 0; p < F; ++p) neg[p] = rev[(F - rev[p]) % F];  // rev is its own inverse
    for (int64_t p = 0; p < F; ++p)
      if (rev[p] <= F / 2) {
        hidx[p] = (int64_t)hrow.size();
        hrow.push_back(p);
      }
  }
};

// The radix-2 stage whose twiddles are all 1 (rows 2k and 2k + 1): the last of a forward
// transform, the first of an inverse, when the number of stages is odd.
void radix2_untwiddled(const Tables& t, float* re, float* im) {
  const int64_t F = t.F;
  for (int64_t st = 0; st < F; st += 2) {
    float *r0 = re + st * F, *r1 = r0 + F, *i0 = im + st * F, *i1 = i0 + F;
#pragma omp simd
    for (int64_t l = 0; l < F; ++l) {
      const float xr = r0[l], xi = i0[l];
      r0[l] = xr + r1[l];
      i0[l] = xi + i1[l];
      r1[l] = xr - r1[l];
      i1[l] = xi - i1[l];
    }
  }
}

// Along the rows' axis of F rows of F lanes: forward, natural order in, bit-reversed out. Two
// radix-2 stages at a time (rows r, r + q, r + 2q, r + 3q): half the passes over the array.
void dif(const Tables& t, float* re, float* im) {
  const int64_t F = t.F;
  int64_t len = F;
  for (; len >= 4; len >>= 2) {
    const int64_t q = len / 4, step = F / len;
    for (int64_t st = 0; st < F; st += len)
      for (int64_t k = 0; k < q; ++k) {
        // stage len: (r0, r2) by w1, (r1, r3) by w1 (-i); stage len / 2: (r0, r1), (r2, r3) by w2
        const float w1r = t.cr[k * step], w1i = t.ci[k * step], w2r = t.cr[2 * k * step], w2i = t.ci[2 * k * step];
        float *r0 = re + (st + k) * F, *r1 = r0 + q * F, *r2 = r1 + q * F, *r3 = r2 + q * F;
        float *i0 = im + (st + k) * F, *i1 = i0 + q * F, *i2 = i1 + q * F, *i3 = i2 + q * F;
#pragma omp simd
        for (int64_t l = 0; l < F; ++l) {
          const float a0r = r0[l] + r2[l], a0i = i0[l] + i2[l], a1r = r1[l] + r3[l], a1i = i1[l] + i3[l];
          const float d0r = r0[l] - r2[l], d0i = i0[l] - i2[l];
          const float d1r = i1[l] - i3[l], d1i = r3[l] - r1[l];  // (x1 - x3) (-i)
          const float b0r = d0r * w1r - d0i * w1i, b0i = d0r * w1i + d0i * w1r;
          const float b1r = d1r * w1r - d1i * w1i, b1i = d1r * w1i + d1i * w1r;
          r0[l] = a0r + a1r;
          i0[l] = a0i + a1i;
          const float e0r = a0r - a1r, e0i = a0i - a1i;
          r1[l] = e0r * w2r - e0i * w2i;
          i1[l] = e0r * w2i + e0i * w2r;
          r2[l] = b0r + b1r;
          i2[l] = b0i + b1i;
          const float e1r = b0r - b1r, e1i = b0i - b1i;
          r3[l] = e1r * w2r - e1i * w2i;
          i3[l] = e1r * w2i + e1i * w2r;
        }
      }
  }
  if (len == 2) radix2_untwiddled(t, re, im);  // an odd number of stages: the last one
}

// The inverse (unscaled): bit-reversed in, natural out; a first radix-2 stage when the number
// of stages is odd, then two at a time.
void dit_inverse(const Tables& t, float* re, float* im) {
  const int64_t F = t.F;
  int64_t bits = 0;
  while ((int64_t(1) << bits) < F) ++bits;
  int64_t q = 1;
  if (bits % 2) {
    radix2_untwiddled(t, re, im);
    q = 2;
  }
  for (; 4 * q <= F; q *= 4) {
    const int64_t len = 4 * q;
    for (int64_t st = 0; st < F; st += len)
      for (int64_t k = 0; k < q; ++k) {
        // stage 2q: (r0, r1), (r2, r3) by w2; stage 4q: (r0, r2) by w1, (r1, r3) by w1 (+i); w = conj
        const float w2r = t.cr[k * F / (2 * q)], w2i = -t.ci[k * F / (2 * q)];
        const float w1r = t.cr[k * F / len], w1i = -t.ci[k * F / len];
        float *r0 = re + (st + k) * F, *r1 = r0 + q * F, *r2 = r1 + q * F, *r3 = r2 + q * F;
        float *i0 = im + (st + k) * F, *i1 = i0 + q * F, *i2 = i1 + q * F, *i3 = i2 + q * F;
#pragma omp simd
        for (int64_t l = 0; l < F; ++l) {
          const float ur = r1[l] * w2r - i1[l] * w2i, ui = r1[l] * w2i + i1[l] * w2r;
          const float a0r = r0[l] + ur, a0i = i0[l] + ui, a1r = r0[l] - ur, a1i = i0[l] - ui;
          const float vr = r3[l] * w2r - i3[l] * w2i, vi = r3[l] * w2i + i3[l] * w2r;
          const float a2r = r2[l] + vr, a2i = i2[l] + vi, a3r = r2[l] - vr, a3i = i2[l] - vi;
          const float tr = a2r * w1r - a2i * w1i, ti = a2r * w1i + a2i * w1r;
          const float sr = -(a3r * w1i + a3i * w1r), si = a3r * w1r - a3i * w1i;  // (+i) w1 a3
          r0[l] = a0r + tr;
          i0[l] = a0i + ti;
          r2[l] = a0r - tr;
          i2[l] = a0i - ti;
          r1[l] = a1r + sr;
          i1[l] = a1i + si;
          r3[l] = a1r - sr;
          i3[l] = a1i - si;
        }
      }
  }
}

// b[to[j]][i] = a[from[i]][j], F x F (F a multiple of 8), by 8 x 8 blocks.
void transpose(int64_t F, const float* a, float* b, const int64_t* from, const int64_t* to) {
  for (int64_t i = 0; i < F; i += 8)
    for (int64_t j = 0; j < F; j += 8) {
      const float* src[8];
      float* dst[8];
      for (int k = 0; k < 8; ++k) {
        src[k] = a + from[i + k] * F + j;
        dst[k] = b + to[j + k] * F + i;
      }
      transpose8x8_rows(src, dst);
    }
}

// One thread's buffers: two F x F complex arrays and two half spectra.
struct Work {
  std::vector<float> a, b, h;
  int64_t FF, HS;
  explicit Work(const Tables& t) : a(4 * t.F * t.F), b(4 * t.F * t.F), h(4 * t.SR * t.F), FF(t.F * t.F), HS(t.SR * t.F) {}
  float* are() { return a.data(); }
  float* aim() { return a.data() + FF; }
  float* bre() { return b.data(); }
  float* bim() { return b.data() + FF; }
  float* h1() { return h.data(); }           // re (HS) then im (HS)
  float* h2() { return h.data() + 2 * HS; }
};

// Forward 2-D transform of the complex array in w.a; the spectrum in w.b.
void fft2(const Tables& t, Work& w) {
  dif(t, w.are(), w.aim());
  transpose(t.F, w.are(), w.bre(), t.rev.data(), t.iota.data());
  transpose(t.F, w.aim(), w.bim(), t.rev.data(), t.iota.data());
  dif(t, w.bre(), w.bim());
}

// Inverse 2-D transform of the spectrum in w.b; the array in w.a.
void ifft2(const Tables& t, Work& w) {
  dit_inverse(t, w.bre(), w.bim());
  transpose(t.F, w.bre(), w.are(), t.iota.data(), t.rev.data());
  transpose(t.F, w.bim(), w.aim(), t.iota.data(), t.rev.data());
  dit_inverse(t, w.are(), w.aim());
}

// The half spectra of the two real signals packed in w.b, into w.h1 and w.h2 (twice the true
// spectra); conj: their conjugates. Column q's partner is column (F - q) mod F.
void unpack(const Tables& t, Work& w, bool conj) {
  const int64_t F = t.F, HS = w.HS;
  const float sg = conj ? -1.f : 1.f;
  for (int64_t h = 0; h < t.SR; ++h) {
    const int64_t p = t.hrow[h], pn = t.neg[p];
    const float *rp = w.bre() + p * F, *ip = w.bim() + p * F, *rn = w.bre() + pn * F, *in = w.bim() + pn * F;
    float *h1r = w.h1() + h * F, *h1i = h1r + HS, *h2r = w.h2() + h * F, *h2i = h2r + HS;
    h1r[0] = rp[0] + rn[0];
    h1i[0] = sg * (ip[0] - in[0]);
    h2r[0] = ip[0] + in[0];
    h2i[0] = sg * (rn[0] - rp[0]);
#pragma omp simd
    for (int64_t q = 1; q < F; ++q) {
      const float a = rp[q], b = ip[q], c = rn[F - q], d = in[F - q];
      h1r[q] = a + c;
      h1i[q] = sg * (b - d);
      h2r[q] = b + d;
      h2i[q] = sg * (c - a);
    }
  }
}

// The full spectrum of y1 + i y2 in w.b from their half spectra.
void pack(const Tables& t, Work& w, const float* y1, const float* y2) {
  const int64_t F = t.F, HS = w.HS;
  for (int64_t p = 0; p < F; ++p) {
    float *re = w.bre() + p * F, *im = w.bim() + p * F;
    const int64_t h = t.hidx[p];
    if (h >= 0) {
      const float *r1 = y1 + h * F, *i1 = r1 + HS, *r2 = y2 + h * F, *i2 = r2 + HS;
#pragma omp simd
      for (int64_t q = 0; q < F; ++q) {
        re[q] = r1[q] - i2[q];
        im[q] = i1[q] + r2[q];
      }
    } else {  // the conjugates of frequency -f
      const int64_t hn = t.hidx[t.neg[p]];
      const float *r1 = y1 + hn * F, *i1 = r1 + HS, *r2 = y2 + hn * F, *i2 = r2 + HS;
      re[0] = r1[0] + i2[0];
      im[0] = r2[0] - i1[0];
#pragma omp simd
      for (int64_t q = 1; q < F; ++q) {
        re[q] = r1[F - q] + i2[F - q];
        im[q] = r2[F - q] - i1[F - q];
      }
    }
  }
}

// acc += a * b (complex, split halves of HS).
inline void mul_acc(int64_t HS, const float* a, const float* b, float* acc) {
#pragma omp simd
  for (int64_t e = 0; e < HS; ++e) {
    const float ar = a[e], ai = a[HS + e], br = b[e], bi = b[HS + e];
    acc[e] += ar * br - ai * bi;
    acc[HS + e] += ar * bi + ai * br;
  }
}

struct Geo {
  int64_t N, C, OC, H, W, OH, OW, KH, KW, s, ph, pw, Cp;
};

Geo geo_of(const ConvGeom& g, const FftConvPlan& p) {
  return {g.N, g.C_in, g.C_out, g.in[1], g.in[2], g.out[1], g.out[2], g.k[1], g.k[2], p.s, g.pb[1], g.pb[2],
          g.C_in * p.s * p.s};
}

// The F x F input patch of phase channel cp (c, row phase, column phase) at tile origin (i0, j0)
// of image n, into out (zeros past the input and for cp >= Cp, the lone last channel's partner).
void gather_patch(const Tables& t, const Geo& d, const float* x, bool nhwc, int64_t n, int64_t cp, int64_t i0,
                  int64_t j0, float* out) {
  const int64_t F = t.F, s = d.s;
  std::fill(out, out + F * F, 0.f);
  if (cp >= d.Cp) return;
  const int64_t c = cp / (s * s), pa = cp / s % s, pb = cp % s;
  const int64_t sc = nhwc ? 1 : d.H * d.W, sh = nhwc ? d.W * d.C : d.W, sw = nhwc ? d.C : 1;
  const float* xc = x + n * d.C * d.H * d.W + c * sc;
  // the patch's columns v0 <= v < v1 are inside the input: 0 <= s (j0 + v) + pb - pw < W
  int64_t v0 = 0, v1 = F;
  while (v0 < F && s * (j0 + v0) + pb - d.pw < 0) ++v0;
  while (v1 > v0 && s * (j0 + v1 - 1) + pb - d.pw >= d.W) --v1;
  const int64_t step = s * sw;
  for (int64_t u = 0; u < F; ++u) {
    const int64_t h = s * (i0 + u) + pa - d.ph;
    if (h < 0 || h >= d.H) continue;
    const float* xr = xc + h * sh + (s * (j0 + v0) + pb - d.pw) * sw;
    float* o = out + u * F;
    for (int64_t v = v0; v < v1; ++v) o[v] = xr[(v - v0) * step];
  }
}

// The tile (ti, tj) of image n: its origin.
struct Tile {
  int64_t n, i0, j0;
};
Tile tile_of(const FftConvPlan& p, int64_t t) {
  const int64_t per = p.tiles_h * p.tiles_w, r = t % per;
  return {t / per, r / p.tiles_w * p.Th, r % p.tiles_w * p.Tw};
}

// Stride 2, channels first: the pair (c, pa, 0), (c, pa, 1) reads each source row's 2F
// consecutive columns from 2 j0 - pw, the even ones to re and the odd ones to im.
void gather_pair_s2(const Tables& t, const Geo& d, const float* x, int64_t n, int64_t cp, int64_t i0, int64_t j0,
                    float* re, float* im) {
  const int64_t F = t.F, c = cp / 4, pa = cp / 2 % 2, w0 = 2 * j0 - d.pw;
  const int64_t m0 = std::max<int64_t>(0, -w0), m1 = std::min<int64_t>(2 * F, d.W - w0);  // inside: m0 <= m < m1
  const float* xc = x + (n * d.C + c) * d.H * d.W;
  alignas(32) float row[2 * 64];
  for (int64_t u = 0; u < F; ++u) {
    const int64_t h = 2 * (i0 + u) + pa - d.ph;
    float *o0 = re + u * F, *o1 = im + u * F;
    if (h < 0 || h >= d.H || m1 <= m0) {
      std::fill(o0, o0 + F, 0.f);
      std::fill(o1, o1 + F, 0.f);
      continue;
    }
    if (h + 8 < d.H)  // the row 4 patch rows on: the rows are 2 W apart, too far for the prefetcher
      for (int64_t m = m0; m < m1; m += 16) __builtin_prefetch(xc + (h + 8) * d.W + w0 + m);
    std::fill(row, row + m0, 0.f);
    std::memcpy(row + m0, xc + h * d.W + w0 + m0, sizeof(float) * (m1 - m0));
    std::fill(row + m1, row + 2 * F, 0.f);
    for (int64_t v = 0; v < F; v += 4) {  // 8 columns to 4 even, 4 odd
      const __m256 a = _mm256_load_ps(row + 2 * v);
      const __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
      _mm_storeu_ps(o0 + v, _mm_shuffle_ps(lo, hi, 0x88));
      _mm_storeu_ps(o1 + v, _mm_shuffle_ps(lo, hi, 0xDD));
    }
  }
}

// The transform of the input patch pair (cp, cp + 1) of a tile, separated into w.h1 / w.h2.
void patch_spectra(const Tables& t, const Geo& d, const float* x, bool nhwc, const Tile& tl, int64_t cp, Work& w) {
  if (d.s == 2 && !nhwc && cp + 1 < d.Cp && t.F <= 64) {
    gather_pair_s2(t, d, x, tl.n, cp, tl.i0, tl.j0, w.are(), w.aim());
  } else {
    gather_patch(t, d, x, nhwc, tl.n, cp, tl.i0, tl.j0, w.are());
    gather_patch(t, d, x, nhwc, tl.n, cp + 1, tl.i0, tl.j0, w.aim());
  }
  fft2(t, w);
  unpack(t, w, false);
}

// The taps of phase kernel cp (input channel c, row phase pa, column phase pb) of output o:
// fn(index in w (OC, C, KH, KW), index in an F x F tile) for each tap (a, b) inside the kernel.
template <class Fn>
void phase_taps(const Geo& d, const FftConvPlan& p, int64_t F, int64_t o, int64_t cp, Fn fn) {
  const int64_t c = cp / (d.s * d.s), pa = cp / d.s % d.s, pb = cp % d.s;
  for (int64_t a = 0; a < p.Ka && d.s * a + pa < d.KH; ++a)
    for (int64_t b = 0; b < p.Kb && d.s * b + pb < d.KW; ++b)
      fn(((o * d.C + c) * d.KH + d.s * a + pa) * d.KW + d.s * b + pb, a * F + b);
}

// The conjugate half spectra of phase kernels (o, cp) and (o, cp + 1), to out and out + 2 HS
// (the second only when cp + 1 < Cp).
void kernel_spectra(const Tables& t, const Geo& d, const FftConvPlan& p, const float* w, int64_t o, int64_t cp,
                    Work& wk, float* out) {
  for (int k = 0; k < 2; ++k) {
    float* z = k ? wk.aim() : wk.are();
    std::fill(z, z + t.F * t.F, 0.f);
    if (cp + k < d.Cp) phase_taps(d, p, t.F, o, cp + k, [&](int64_t wi, int64_t zi) { z[zi] = w[wi]; });
  }
  fft2(t, wk);
  unpack(t, wk, true);
  std::memcpy(out, wk.h1(), sizeof(float) * 2 * wk.HS);
  if (cp + 1 < d.Cp) std::memcpy(out + 2 * wk.HS, wk.h2(), sizeof(float) * 2 * wk.HS);
}

}  // namespace

FftConvPlan fft_conv_plan(const ConvGeom& g, bool weights_known) {
  if (g.transpose || g.group != 1 || g.nsp != 2 || g.d[1] != 1 || g.d[2] != 1 || g.s[1] != g.s[2])
    return FftConvPlan{};
  return plan_fft_conv(g.N, g.C_in, g.C_out, g.out[1], g.out[2], g.k[1], g.k[2], g.s[1], weights_known);
}

size_t fft_conv_spectra_floats(const ConvGeom& g, const FftConvPlan& p) {
  return (size_t)fft_spectra_floats(g.C_out, g.C_in * p.s * p.s, p.F);
}

// spectra[o][cp]: the conjugate half spectrum of phase kernel cp of output o (re, then im).
void fft_conv_spectra(const ConvGeom& g, const FftConvPlan& p, const float* w, float* spectra) {
  const Geo d = geo_of(g, p);
  const Tables t(p.F);
  const int64_t HS = t.SR * t.F, pairs = (d.Cp + 1) / 2;
#pragma omp parallel
  {
    Work wk(t);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < d.OC * pairs; ++task) {
      const int64_t o = task / pairs, cp = task % pairs * 2;
      kernel_spectra(t, d, p, w, o, cp, wk, spectra + (o * d.Cp + cp) * 2 * HS);
    }
  }
}

void fft_conv_forward(const ConvGeom& g, const FftConvPlan& p, const float* x, bool x_nhwc, const float* w,
                      const float* spectra, const float* bias, float* y, bool y_nhwc) {
  const Geo d = geo_of(g, p);
  const Tables t(p.F);
  const int64_t HS = t.SR * t.F, tiles = d.N * p.tiles_h * p.tiles_w;
  const float scale = 1.f / float(4 * t.F * t.F);
  // without spectra, those of 64 phase channels at a time, made here: a chunk is an even count
  const int64_t chunk = spectra ? d.Cp + d.Cp % 2 : std::min<int64_t>(d.Cp + d.Cp % 2, 64);
  std::vector<float> own(spectra ? 0 : size_t(d.OC * chunk * 2 * HS));
#pragma omp parallel
  {
    // each thread takes a run of tiles and sums their spectra over channels, so that a channel
    // pair's kernel spectra are read once per run
    const int64_t nth = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t t0 = tiles * id / nth, t1 = tiles * (id + 1) / nth;
    Work wk(t);
    const int64_t OCe = d.OC + d.OC % 2;  // an even count: a lone last output pairs with zeros
    std::vector<float> acc(size_t(std::max<int64_t>(t1 - t0, 0) * OCe * 2 * HS), 0.f);
    for (int64_t c0 = 0; c0 < d.Cp; c0 += chunk) {
      const int64_t c1 = std::min(d.Cp, c0 + chunk);
      // the spectrum of (o, cp) at G + (o * gs + cp - c0) * 2 HS
      const float* G = spectra ? spectra + c0 * 2 * HS : own.data();
      const int64_t gs = spectra ? d.Cp : chunk;
      if (!spectra) {
#pragma omp barrier
        const int64_t pairs = (c1 - c0 + 1) / 2;
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < d.OC * pairs; ++task) {
          const int64_t o = task / pairs, cp = c0 + task % pairs * 2;
          kernel_spectra(t, d, p, w, o, cp, wk, own.data() + (o * chunk + cp - c0) * 2 * HS);
        }
      }
      for (int64_t cp = c0; cp < c1; cp += 2)
        for (int64_t ti = t0; ti < t1; ++ti) {
          patch_spectra(t, d, x, x_nhwc, tile_of(p, ti), cp, wk);
          for (int64_t o = 0; o < d.OC; ++o) {
            float* a = acc.data() + ((ti - t0) * OCe + o) * 2 * HS;
            const float* go = G + (o * gs + cp - c0) * 2 * HS;
            mul_acc(HS, wk.h1(), go, a);
            if (cp + 1 < d.Cp) mul_acc(HS, wk.h2(), go + 2 * HS, a);
          }
        }
    }
    for (int64_t ti = t0; ti < t1; ++ti) {
      const Tile tl = tile_of(p, ti);
      for (int64_t o = 0; o < d.OC; o += 2) {
        const float* a = acc.data() + ((ti - t0) * OCe + o) * 2 * HS;
        pack(t, wk, a, a + 2 * HS);
        ifft2(t, wk);
        for (int k = 0; k < 2 && o + k < d.OC; ++k) {
          const float* z = k ? wk.aim() : wk.are();
          const float b = bias ? bias[o + k] : 0.f;
          for (int64_t u = 0; u < p.Th && tl.i0 + u < d.OH; ++u)
            for (int64_t v = 0; v < p.Tw && tl.j0 + v < d.OW; ++v) {
              const int64_t i = tl.i0 + u, j = tl.j0 + v;
              const int64_t at = y_nhwc ? ((tl.n * d.OH + i) * d.OW + j) * d.OC + o + k
                                        : ((tl.n * d.OC + o + k) * d.OH + i) * d.OW + j;
              y[at] = z[u * t.F + v] * scale + b;
            }
        }
      }
    }
  }
}

void fft_conv_weight_grad(const ConvGeom& g, const FftConvPlan& p, const float* x, const float* dy, float* dw) {
  const Geo d = geo_of(g, p);
  const Tables t(p.F);
  const int64_t HS = t.SR * t.F, tiles = d.N * p.tiles_h * p.tiles_w, opairs = (d.OC + 1) / 2;
  const float scale = 1.f / float(4 * t.F * t.F);
  // the conjugate spectra of the output gradient's tiles: dys[tile][o]
  std::vector<float> dys(size_t(tiles * d.OC * 2 * HS));
#pragma omp parallel
  {
    Work wk(t);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tiles * opairs; ++task) {
      const int64_t ti = task / opairs, o = task % opairs * 2;
      const Tile tl = tile_of(p, ti);
      for (int k = 0; k < 2; ++k) {
        float* z = k ? wk.aim() : wk.are();
        std::fill(z, z + t.F * t.F, 0.f);
        if (o + k >= d.OC) continue;
        const float* dyo = dy + (tl.n * d.OC + o + k) * d.OH * d.OW;
        for (int64_t u = 0; u < p.Th && tl.i0 + u < d.OH; ++u)
          for (int64_t v = 0; v < p.Tw && tl.j0 + v < d.OW; ++v)
            z[u * t.F + v] = dyo[(tl.i0 + u) * d.OW + tl.j0 + v];
      }
      fft2(t, wk);
      unpack(t, wk, true);
      std::memcpy(dys.data() + (ti * d.OC + o) * 2 * HS, wk.h1(), sizeof(float) * 2 * HS);
      if (o + 1 < d.OC) std::memcpy(dys.data() + (ti * d.OC + o + 1) * 2 * HS, wk.h2(), sizeof(float) * 2 * HS);
    }
    // per input channel pair: sum patch spectra x conj(dy spectra) over tiles, back to taps
    std::vector<float> acc(size_t(d.OC * 2 * 2 * HS));
#pragma omp for schedule(dynamic)
    for (int64_t cp = 0; cp < d.Cp; cp += 2) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t ti = 0; ti < tiles; ++ti) {
        patch_spectra(t, d, x, false, tile_of(p, ti), cp, wk);
        for (int64_t o = 0; o < d.OC; ++o) {
          const float* ds = dys.data() + (ti * d.OC + o) * 2 * HS;
          mul_acc(HS, wk.h1(), ds, acc.data() + (o * 2) * 2 * HS);
          mul_acc(HS, wk.h2(), ds, acc.data() + (o * 2 + 1) * 2 * HS);
        }
      }
      for (int64_t o = 0; o < d.OC; ++o) {
        pack(t, wk, acc.data() + (o * 2) * 2 * HS, acc.data() + (o * 2 + 1) * 2 * HS);
        ifft2(t, wk);
        for (int k = 0; k < 2 && cp + k < d.Cp; ++k) {
          const float* z = k ? wk.aim() : wk.are();
          phase_taps(d, p, t.F, o, cp + k, [&](int64_t wi, int64_t zi) { dw[wi] = z[zi] * scale; });
        }
      }
    }
  }
}

}  // namespace wxe::cpu
