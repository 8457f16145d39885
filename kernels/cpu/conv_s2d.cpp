// Strided convolutions on a space-to-depth copy of the input: see conv_s2d.h.
#include "kernels/cpu/conv_s2d.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace wxe::cpu {

namespace {

// Axis 1 is H, axis 2 is W; qh x qw kernel blocks of sh x sw taps.
struct S2d {
  int64_t N, C, OC, H, W, OH, OW, sh, sw, ph, pw, qh, qw;
  int64_t rows;  // output rows per task
  int64_t cs() const { return C * sh * sw; }      // the copy's channels
  int64_t cols() const { return OW + qw - 1; }    // the copy's columns that one output row reads
  int64_t blocks() const { return (OH + rows - 1) / rows; }
  int64_t wsize() const { return qh * qw * OC * cs(); }
};

S2d dims_of(const ConvGeom& g) {
  S2d d{g.N, g.C_in, g.C_out, g.in[1], g.in[2], g.out[1], g.out[2], g.s[1], g.s[2], g.pb[1], g.pb[2],
        g.k[1] / g.s[1], g.k[2] / g.s[2], 1};
  // a task's copy (rows + qh - 1 rows of the copy) in about 12 MB, at most 4 output rows
  const int64_t row_bytes = d.cs() * d.cols() * (int64_t)sizeof(float);
  d.rows = std::clamp<int64_t>((12 << 20) / std::max<int64_t>(row_bytes, 1) - (d.qh - 1), 1, 4);
  return d;
}

// Rows [r0, r0 + nr) of the copy of image x (C, H, W): buf[((c sh + i) sw + j) nr + rr][q] =
// x[c, (r0 + rr) sh + i - ph, q sw + j - pw], zero outside x.
void copy_rows(const S2d& d, const float* x, int64_t r0, int64_t nr, float* buf) {
  const int64_t cols = d.cols();
  for (int64_t c = 0; c < d.C; ++c)
    for (int64_t i = 0; i < d.sh; ++i)
      for (int64_t rr = 0; rr < nr; ++rr) {
        const int64_t ih = (r0 + rr) * d.sh + i - d.ph;
        const bool inside = ih >= 0 && ih < d.H;
        const float* src = inside ? x + (c * d.H + ih) * d.W : nullptr;
        for (int64_t j = 0; j < d.sw; ++j) {
          float* dst = buf + (((c * d.sh + i) * d.sw + j) * nr + rr) * cols;
          if (!inside) {
            std::memset(dst, 0, cols * sizeof(float));
            continue;
          }
          for (int64_t q = 0; q < cols; ++q) {
            const int64_t iw = q * d.sw + j - d.pw;
            dst[q] = iw >= 0 && iw < d.W ? src[iw] : 0.f;
          }
        }
      }
}

// Task t (of N blocks()): image n, output rows [r0, r0 + rows), their copy (rows + qh - 1 rows
// of it) made into buf.
struct Task {
  int64_t n, r0, rows, copied;
};
Task copy_task(const S2d& d, const float* x, int64_t t, float* buf) {
  Task k{t / d.blocks(), t % d.blocks() * d.rows, 0, 0};
  k.rows = std::min(d.rows, d.OH - k.r0);
  k.copied = k.rows + d.qh - 1;
  copy_rows(d, x + k.n * d.C * d.H * d.W, k.r0, k.copied, buf);
  return k;
}

// Position of element (a, b, o, (c, i, j)) of the block layout in w's (o, c, a sh + i, b sw + j).
inline int64_t w_index(const S2d& d, int64_t e) {
  const int64_t cs = d.cs(), KH = d.qh * d.sh, KW = d.qw * d.sw;
  const int64_t ch = e % cs, o = e / cs % d.OC, ab = e / cs / d.OC;
  const int64_t c = ch / (d.sh * d.sw), i = ch / d.sw % d.sh, j = ch % d.sw, a = ab / d.qw, b = ab % d.qw;
  return ((o * d.C + c) * KH + a * d.sh + i) * KW + b * d.sw + j;
}

// C (m x n, ldc) = alpha A op(B) + beta C, row-major, on the calling thread (inside a parallel
// region oneDNN's gemm runs single-threaded).
bool gemm(char tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
          float beta, float* C, int64_t ldc) {
  return dnnl_sgemm('N', tb, m, n, k, 1.f, A, lda, B, ldb, beta, C, ldc) == dnnl_success;
}

}  // namespace

bool s2d_conv_applies(const ConvGeom& g) {
  if (g.transpose || g.group != 1 || g.nsp != 2 || g.C_out < 16 || g.C_in % 16 == 0 || g.N * g.C_in == 0)
    return false;
  for (int a = 1; a < 3; ++a)
    if (g.d[a] != 1 || g.s[a] < 2 || g.k[a] % g.s[a] != 0 || g.pb[a] < 0 || g.pe[a] < 0 || g.out[a] < 1)
      return false;
  return true;
}

void s2d_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y) {
  const S2d d = dims_of(g);
  const int64_t cs = d.cs(), cols = d.cols(), plane = d.OH * d.OW, tasks = d.N * d.blocks();
  float* wb = onednn::scratch_slot(0).floats(d.wsize());  // the kernel's blocks W_ab
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < d.wsize(); ++e) wb[e] = w[w_index(d, e)];
  bool ok = true;
#pragma omp parallel reduction(&& : ok)
  {
    float* buf = onednn::scratch_slot(1).floats(cs * (d.rows + d.qh - 1) * cols);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const Task k = copy_task(d, x, t, buf);
      for (int64_t rr = 0; rr < k.rows; ++rr) {
        float* yr = y + k.n * d.OC * plane + (k.r0 + rr) * d.OW;
        for (int64_t a = 0; a < d.qh; ++a)
          for (int64_t b = 0; b < d.qw; ++b)
            ok = gemm('N', d.OC, d.OW, cs, wb + (a * d.qw + b) * d.OC * cs, cs, buf + (rr + a) * cols + b,
                      k.copied * cols, a || b ? 1.f : 0.f, yr, plane) && ok;
        if (bias)
          for (int64_t o = 0; o < d.OC; ++o)
            for (int64_t q = 0; q < d.OW; ++q) yr[o * plane + q] += bias[o];
      }
    }
  }
  WXE_CHECK(ok, "Conv (space-to-depth): oneDNN's sgemm failed");
}

void s2d_conv_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw) {
  const S2d d = dims_of(g);
  const int64_t cs = d.cs(), cols = d.cols(), plane = d.OH * d.OW, tasks = d.N * d.blocks(), ws = d.wsize();
  std::vector<float*> parts(omp_get_max_threads(), nullptr);  // per thread: its sum over its tasks
  bool ok = true;
#pragma omp parallel reduction(&& : ok)
  {
    float* acc = onednn::scratch_slot(0).floats(ws);
    std::memset(acc, 0, ws * sizeof(float));
    parts[omp_get_thread_num()] = acc;
    float* buf = onednn::scratch_slot(1).floats(cs * (d.rows + d.qh - 1) * cols);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const Task k = copy_task(d, x, t, buf);
      for (int64_t rr = 0; rr < k.rows; ++rr) {
        const float* dyr = dy + k.n * d.OC * plane + (k.r0 + rr) * d.OW;
        for (int64_t a = 0; a < d.qh; ++a)
          for (int64_t b = 0; b < d.qw; ++b)
            ok = gemm('T', d.OC, cs, d.OW, dyr, plane, buf + (rr + a) * cols + b, k.copied * cols, 1.f,
                      acc + (a * d.qw + b) * d.OC * cs, cs) && ok;
      }
    }
  }
  WXE_CHECK(ok, "Conv backward (space-to-depth): oneDNN's sgemm failed");
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < ws; ++e) {
    float s = 0.f;
    for (const float* p : parts)
      if (p) s += p[e];
    dw[w_index(d, e)] = s;
  }
}

bool s2d_conv_transpose_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw) {
  if (!g.transpose || g.nsp != 2) return false;
  ConvGeom c = g;
  c.transpose = false;
  std::swap(c.C_in, c.C_out);
  for (int a = 1; a < 3; ++a) {
    std::swap(c.in[a], c.out[a]);
    // the Conv's rows: out = (in + pb + pe - k) / s + 1 with the ConvTranspose's output rows as
    // its input (output_padding adds fewer than s rows, which no output reads)
    const int64_t span = c.in[a] + c.pb[a] + c.pe[a] - c.k[a];  // strides are >= 1 (conv_geometry)
    if (span < 0 || span / c.s[a] + 1 != c.out[a]) return false;
  }
  if (!s2d_conv_applies(c)) return false;
  s2d_conv_weight_grad(c, dy, x, dw);
  return true;
}

}  // namespace wxe::cpu
