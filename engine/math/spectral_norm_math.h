// The spectral-norm math of SpectralNorm (kernels/cpu/spectral_norm.cpp) and of SpectralNormTP
// (parallel/collective_spectral_norm.cpp), which runs it on a tensor-parallel rank's block of
// weight_orig. Pure math, no mesh: each product over the matrix is this block's part, written
// into a whole-length vector and then reduced by the caller's `sum` (nothing on one process;
// over tp, the sum over the ranks, which makes it the product of the whole matrix).
//
// W_mat is weight_orig with dimension `dim` moved first, reshaped to (rows, cols). The forward
// runs `iterations` steps of { v = normalize(W_mat^T u); u = normalize(W_mat v) } with
// normalize(x) = x / max(||x||_2, eps), u and v updated in place, then sigma = u . (W_mat v)
// (double accumulation, rounded to float as PyTorch's float32 sigma) and W = weight_orig / sigma.
// The backward treats u and v as constants (PyTorch detaches them):
//   dL/dweight_orig = (g - sum(g * W) * u v^T) / sigma, u v^T laid out like weight_orig.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/math/host_device.h"
#include "engine/ir/tensor.h"

namespace wxe::sn {

// weight_orig viewed as (d0, d1, rest); W_mat rows are dim `dim` of (d0, d1). A block holds
// (l0, l1, rest) of it: block `index` of `parts` along axis `axis` (0 or 1) within each of
// `groups` equal groups of that axis (engine/io/safetensors.h TensorSlice); the whole matrix is
// one block of one part.
struct Geometry {
  int dim = 0, axis = 0;
  int64_t d0 = 1, d1 = 1, rest = 1;  // whole
  int64_t l0 = 1, l1 = 1;            // block
  int64_t rows = 1, cols = 1;        // whole W_mat
  std::vector<int64_t> global;       // local index along `axis` -> whole index (empty: the same)

  // f(e, row, col) for every element e of the block, in storage order, with its whole W_mat
  // row and col. Element (a, b, r) of the block sits at (a * l1 + b) * rest + r.
  template <class F>
  void for_each(F f) const {
    for (int64_t a = 0; a < l0; ++a) {
      const int64_t ga = axis == 0 && !global.empty() ? global[a] : a;
      for (int64_t b = 0; b < l1; ++b) {
        const int64_t gb = axis == 1 && !global.empty() ? global[b] : b;
        for (int64_t r = 0; r < rest; ++r) {
          const int64_t e = (a * l1 + b) * rest + r;
          if (dim == 0) f(e, ga, gb * rest + r);
          else f(e, gb, ga * rest + r);
        }
      }
    }
  }
};

// The geometry of `block` (rank > max(dim, axis), checked by the caller; its size along `axis`
// a multiple of `groups`). The defaults: the whole matrix.
inline Geometry geometry(int dim, const Shape& block, int axis = 0, int64_t parts = 1, int64_t index = 0,
                         int64_t groups = 1) {
  Geometry d;
  d.dim = dim;
  d.axis = axis;
  d.l0 = block[0];
  d.l1 = block.size() > 1 ? block[1] : 1;
  d.d0 = axis == 0 ? d.l0 * parts : d.l0;
  d.d1 = axis == 1 ? d.l1 * parts : d.l1;
  d.rest = d.l0 * d.l1 != 0 ? numel(block) / (d.l0 * d.l1) : 0;
  d.rows = dim == 0 ? d.d0 : d.d1;
  d.cols = d.rows ? d.d0 * d.d1 * d.rest / d.rows : 0;
  if (parts > 1) {
    const int64_t n_local = axis == 0 ? d.l0 : d.l1, per = n_local / groups;  // of each group, the block holds `per`
    for (int64_t i = 0; i < n_local; ++i) d.global.push_back(i / per * per * parts + index * per + i % per);
  }
  return d;
}

// The whole W_mat's element maps, for kernels (plain data; also in CUDA kernels): weight_orig
// viewed as (d0, d1, rest); dim 0: row a, col b rest + r; dim 1: row b, col a rest + r, for
// element (a, b, r) at (a d1 + b) rest + r.
struct MatrixIndex {
  int dim = 0;
  int64_t d1 = 1, rest = 1, rows = 1, cols = 1;
};

inline MatrixIndex matrix_index(const Geometry& d) {
  MatrixIndex m;
  m.dim = d.dim;
  m.d1 = d.d1;
  m.rest = d.rest;
  m.rows = d.rows;
  m.cols = d.cols;
  return m;
}

// Offset in weight_orig of W_mat element (row, col).
WXE_HD int64_t offset(const MatrixIndex& s, int64_t row, int64_t col) {
  if (s.dim == 0) return row * s.cols + col;
  return ((col / s.rest) * s.d1 + row) * s.rest + col % s.rest;
}

// W_mat row and col of element e of weight_orig.
WXE_HD void row_col(const MatrixIndex& s, int64_t e, int64_t* row, int64_t* col) {
  if (s.dim == 0) {
    *row = e / s.cols;
    *col = e % s.cols;
    return;
  }
  const int64_t r = e % s.rest, b = e / s.rest % s.d1, a = e / (s.rest * s.d1);
  *row = b;
  *col = a * s.rest + r;
}

// Whether the block is the whole matrix (one process, no tensor-parallel slice).
inline bool is_whole(const Geometry& d) { return d.global.empty() && d.l0 == d.d0 && d.l1 == d.d1; }

// The reduction on one process: the block is the whole matrix, nothing to add.
struct NoSum {
  void operator()(std::vector<double>&) const {}
};

// W_mat v (whole rows), in double. The whole matrix's rows in parallel; with dim 0 (rows
// contiguous) each row in eight interleaved sums (they vectorize) added in a fixed order, else
// over its cols in ascending order (as for_each's order, a block's).
template <class Sum>
std::vector<double> wmat_v(const Geometry& d, const float* w, const float* v, Sum sum) {
  std::vector<double> out((size_t)d.rows, 0.0);
  if (is_whole(d) && d.dim == 0) {
    const int64_t cols = d.cols;
#pragma omp parallel for schedule(static) if (d.rows * d.cols > (1 << 13))
    for (int64_t row = 0; row < d.rows; ++row) {
      const float* wr = w + row * cols;
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t col = 0;
      for (; col + 8 <= cols; col += 8)
        for (int l = 0; l < 8; ++l) lane[l] += (double)wr[col + l] * v[col + l];
      for (; col < cols; ++col) lane[col & 7] += (double)wr[col] * v[col];
      out[row] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
  } else if (is_whole(d)) {
    const MatrixIndex m = matrix_index(d);
#pragma omp parallel for schedule(static) if (d.rows * d.cols > (1 << 13))
    for (int64_t row = 0; row < d.rows; ++row) {
      double a = 0;
      for (int64_t col = 0; col < d.cols; ++col) a += (double)w[offset(m, row, col)] * v[col];
      out[row] = a;
    }
  } else {
    d.for_each([&](int64_t e, int64_t row, int64_t col) { out[row] += (double)w[e] * v[col]; });
  }
  sum(out);
  return out;
}

// W_mat^T u (whole cols), in double. Each col sums over its rows in ascending order; the whole
// matrix's cols in parallel blocks, rows outermost within a block.
template <class Sum>
std::vector<double> wmat_t_u(const Geometry& d, const float* w, const float* u, Sum sum) {
  std::vector<double> out((size_t)d.cols, 0.0);
  if (is_whole(d)) {
    const MatrixIndex m = matrix_index(d);
    constexpr int64_t kCols = 256;
    const int64_t blocks = (d.cols + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (d.rows * d.cols > (1 << 13))
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kCols, c1 = std::min(d.cols, c0 + kCols);
      double* o = out.data();
      for (int64_t row = 0; row < d.rows; ++row) {
        const double ur = u[row];
        if (d.dim == 0) {  // rows contiguous
          const float* wr = w + row * d.cols;
#pragma omp simd
          for (int64_t col = c0; col < c1; ++col) o[col] += (double)wr[col] * ur;
        } else {
          for (int64_t col = c0; col < c1; ++col) o[col] += (double)w[offset(m, row, col)] * ur;
        }
      }
    }
  } else {
    d.for_each([&](int64_t e, int64_t row, int64_t col) { out[col] += (double)w[e] * u[row]; });
  }
  sum(out);
  return out;
}

// dst = x / max(||x||_2, eps), rounded to float.
inline void normalize_into(const std::vector<double>& x, double eps, float* dst) {
  double ss = 0;
  for (double a : x) ss += a * a;
  const double scale = 1.0 / std::max(std::sqrt(ss), eps);
  for (size_t i = 0; i < x.size(); ++i) dst[i] = (float)(x[i] * scale);
}

// sum of a[e] * b[e] over n elements in double: fixed chunks of 4096 (four interleaved partial
// sums each), then the chunk sums in order, so the bits do not depend on the thread count.
inline double dot_chunked(const float* a, const float* b, int64_t n) {
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part((size_t)chunks);
#pragma omp parallel for schedule(static) if (n > (1 << 13))
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e0 = c * kChunk, e1 = std::min(n, e0 + kChunk);
    double s[4] = {0, 0, 0, 0};
    int64_t e = e0;
    for (; e + 4 <= e1; e += 4)
      for (int k = 0; k < 4; ++k) s[k] += (double)a[e + k] * b[e + k];
    for (; e < e1; ++e) s[0] += (double)a[e] * b[e];
    part[c] = (s[0] + s[1]) + (s[2] + s[3]);
  }
  double t = 0;
  for (double p : part) t += p;
  return t;
}

// u . wv, accumulated in double and rounded to float.
inline float dot_rounded(const float* u, const std::vector<double>& wv) {
  double s = 0;
  for (size_t i = 0; i < wv.size(); ++i) s += (double)u[i] * wv[i];
  return (float)s;
}

// sigma = u . (W_mat v), accumulated in double and rounded to float.
template <class Sum>
float sigma_of(const Geometry& d, const float* w, const float* u, const float* v, Sum sum) {
  return dot_rounded(u, wmat_v(d, w, v, sum));
}

// The forward on the block w (n elements): u and v (whole) updated in place by `iterations`
// power steps, y = w / sigma. sigma reuses the last step's W_mat v (the same v). Calls `sum`
// max(1, 2 * iterations) times.
template <class Sum>
void forward(const Geometry& d, int64_t iterations, double eps, const float* w, float* u, float* v, float* y,
             int64_t n, Sum sum) {
  std::vector<double> wv;
  for (int64_t it = iterations; it > 0; --it) {
    normalize_into(wmat_t_u(d, w, u, sum), eps, v);
    wv = wmat_v(d, w, v, sum);
    normalize_into(wv, eps, u);
  }
  if (iterations <= 0) wv = wmat_v(d, w, v, sum);
  // No check on sigma: a zero or non-finite sigma gives inf/NaN as in PyTorch, which the
  // training loop's non-finite-loss check reports.
  const float sigma = dot_rounded(u, wv);
#pragma omp parallel for schedule(static) if (n > (1 << 13))
  for (int64_t e = 0; e < n; ++e) y[e] = w[e] / sigma;
}

// The backward on the block: gw = (g - sum(g * W) * u v^T) / sigma, with W the forward's output
// and u, v as the forward left them. g null: no output gradient (gw zero); gw null: none asked.
// Calls `sum` twice whatever is null, so every rank of a group takes part.
template <class Sum>
void backward(const Geometry& d, const float* w, const float* u, const float* v, const float* W, const float* g,
              float* gw, int64_t n, Sum sum) {
  const double sigma = sigma_of(d, w, u, v, sum);
  std::vector<double> gW(1, g ? dot_chunked(g, W, n) : 0.0);  // sum(g * W) over the whole matrix
  sum(gW);
  if (!gw) return;
  if (!g) {
    std::fill(gw, gw + n, 0.f);
    return;
  }
  auto at = [&](int64_t e, int64_t row, int64_t col) { gw[e] = (float)((g[e] - gW[0] * u[row] * v[col]) / sigma); };
  if (!is_whole(d)) return d.for_each(at);
  if (d.dim == 0) {  // rows contiguous: no index arithmetic per element
#pragma omp parallel for schedule(static) if (n > (1 << 13))
    for (int64_t row = 0; row < d.rows; ++row)
      for (int64_t col = 0; col < d.cols; ++col) at(row * d.cols + col, row, col);
    return;
  }
  const MatrixIndex m = matrix_index(d);
#pragma omp parallel for schedule(static) if (n > (1 << 13))
  for (int64_t e = 0; e < n; ++e) {
    int64_t row, col;
    row_col(m, e, &row, &col);
    at(e, row, col);
  }
}

}  // namespace wxe::sn
