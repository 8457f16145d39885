// Fast kernels without oneDNN for existing ops (the reference kernels are the oracle):
//   DepthToSpace  row-wise for 4-byte elements (the reference copies element by element)
//   Transpose     of 4-byte elements when the permutation swaps two blocks of axes
//                 ((0, 2, 3, 1): NCHW -> NHWC, ...): transpose_planes
//   Add, Sub, Mul, Div  float32 of one shape (or a one-element second operand), in parallel
// and transpose_planes itself (transpose.h).

#include <algorithm>
#include <cstring>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/transpose.h"

namespace wxe::cpu {

namespace {

// d[c][r] = s[r][c] for an 8 x 8 block (row strides ls, ld).
void transpose8x8(const float* s, int64_t ls, float* d, int64_t ld) {
  const float* src[8];
  float* dst[8];
  for (int i = 0; i < 8; ++i) {
    src[i] = s + i * ls;
    dst[i] = d + i * ld;
  }
  transpose8x8_rows(src, dst);
}

}  // namespace

// dst[c] = src[c] over an N-d index c, with element strides for both sides.
void strided_copy_f32(const std::vector<int64_t>& dims, const float* src,
                  const std::vector<int64_t>& sst, float* dst, const std::vector<int64_t>& dstr) {
  const size_t r = dims.size();
  if (r == 0) {
    dst[0] = src[0];
    return;
  }
  const int64_t inner = dims[r - 1], si = sst[r - 1], di = dstr[r - 1];
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < r; ++k) rows *= dims[k];
#pragma omp parallel for schedule(static) if (rows * inner > (1 << 15))
  for (int64_t row = 0; row < rows; ++row) {
    int64_t so = 0, doff = 0, rem = row;
    for (size_t k = r - 1; k-- > 0;) {
      const int64_t c = rem % dims[k];
      rem /= dims[k];
      so += c * sst[k];
      doff += c * dstr[k];
    }
    const float* s = src + so;
    float* d = dst + doff;
    if (si == 1 && di == 1)
      std::memcpy(d, s, sizeof(float) * (size_t)inner);
    else
      for (int64_t j = 0; j < inner; ++j) d[j * di] = s[j * si];
  }
}

// In 64 x 64 tiles of 8 x 8 blocks: 3.5-4 ms for 84 x 98304 floats either way (one thread).
void transpose_planes(const float* src, float* dst, int64_t N, int64_t rows, int64_t cols) {
  constexpr int64_t B = 64;
  const int64_t rt = (rows + B - 1) / B, ct = (cols + B - 1) / B;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N * rt * ct; ++t) {
    const int64_t n = t / (rt * ct), r0 = t / ct % rt * B, c0 = t % ct * B;
    const int64_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
    const float* s = src + n * rows * cols;
    float* d = dst + n * rows * cols;
    const int64_t r8 = r0 + (r1 - r0) / 8 * 8, c8 = c0 + (c1 - c0) / 8 * 8;
    // 8 destination rows at a time: with a power-of-two row stride more would share cache sets
    for (int64_t c = c0; c < c8; c += 8)
      for (int64_t r = r0; r < r8; r += 8) transpose8x8(s + r * cols + c, cols, d + c * rows + r, rows);
    for (int64_t c = c0; c < c1; ++c)  // the edges
      for (int64_t r = c < c8 ? r8 : r0; r < r1; ++r) d[c * rows + r] = s[r * cols + c];
  }
}

namespace {

void reference(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  kernel_for(n.op, KernelKind::Reference)(n, in, out);
}

// out[n, c, h*b + i, w*b + j] = in[n, ic(c, i, j), h, w], CRD: ic = c b^2 + i b + j,
// DCR: ic = (i b + j) C_out + c.
void depth_to_space_fast(const Node& n, const std::vector<const Tensor*>& in,
                         const std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  const std::string mode = n.s("mode", "DCR");
  const int64_t b = n.i("blocksize", 0);
  if (dtype_size(x.dtype) != 4 || x.rank() != 4 || b <= 0 || (mode != "CRD" && mode != "DCR"))
    return reference(n, in, out);  // it reports bad attributes
  const bool crd = mode == "CRD";
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Co = C / (b * b), Wo = W * b;
  const uint32_t* src = x.data<uint32_t>();
  uint32_t* dst = out[0]->data<uint32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N * Co * H; ++row) {  // one input row index h per (n, c)
    const int64_t h = row % H, nc = row / H, c = nc % Co, bn = nc / Co;
    for (int64_t i = 0; i < b; ++i) {
      uint32_t* o = dst + ((nc * H + h) * b + i) * Wo;
      for (int64_t j = 0; j < b; ++j) {
        const int64_t ic = crd ? c * b * b + i * b + j : (i * b + j) * Co + c;
        const uint32_t* s = src + ((bn * C + ic) * H + h) * W;
        for (int64_t w = 0; w < W; ++w) o[w * b + j] = s[w];
      }
    }
  }
}

// perm = (0, ..., p-1, p+a, ..., r-1, p, ..., p+a-1): the axes after a prefix of p are two
// blocks, [p, p+a) and [p+a, r), that trade places; x is then N = prod(prefix) planes of
// (rows = prod(first block), cols = prod(second block)).
void transpose_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  const int64_t r = x.rank();
  std::vector<int64_t> perm = n.ints("perm");
  if (dtype_size(x.dtype) != 4 || (int64_t)perm.size() != r) return reference(n, in, out);
  int64_t p = 0;
  while (p < r && perm[p] == p) ++p;
  if (p == r) return reference(n, in, out);  // identity
  const int64_t a = perm[p] - p;  // size of the first block (it moves behind the second)
  for (int64_t i = p; i < r; ++i)
    if (perm[i] != (i < r - a ? i + a : p + i - (r - a))) return reference(n, in, out);
  int64_t N = 1, rows = 1, cols = 1;
  for (int64_t i = 0; i < p; ++i) N *= x.shape[i];
  for (int64_t i = p; i < p + a; ++i) rows *= x.shape[i];
  for (int64_t i = p + a; i < r; ++i) cols *= x.shape[i];
  transpose_planes(x.data<float>(), out[0]->data<float>(), N, rows, cols);
}

// Add, Sub, Mul, Div of float32 tensors of one shape, or with a one-element second operand:
// parallel over chunks (the reference kernel parallelises over rows, and a same-shape
// operation is one row).
template <class F>
void binary_same_shape(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out, F f) {
  const Tensor &a = *in[0], &b = *in[1];
  const bool scalar_b = b.numel() == 1 && b.rank() <= a.rank();
  if (a.dtype != DType::F32 || b.dtype != DType::F32 || (a.shape != b.shape && !scalar_b) ||
      out[0]->shape != a.shape)
    return reference(n, in, out);
  const int64_t N = a.numel(), chunk = 1 << 14;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* z = out[0]->data<float>();
#pragma omp parallel for schedule(static) if (N > chunk)
  for (int64_t c = 0; c < (N + chunk - 1) / chunk; ++c) {
    const int64_t i1 = std::min(N, (c + 1) * chunk);
    if (scalar_b) {
      const float yv = y[0];
#pragma omp simd
      for (int64_t i = c * chunk; i < i1; ++i) z[i] = f(x[i], yv);
    } else {
#pragma omp simd
      for (int64_t i = c * chunk; i < i1; ++i) z[i] = f(x[i], y[i]);
    }
  }
}

void add_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  binary_same_shape(n, in, out, [](float a, float b) { return a + b; });
}
void sub_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  binary_same_shape(n, in, out, [](float a, float b) { return a - b; });
}
void mul_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  binary_same_shape(n, in, out, [](float a, float b) { return a * b; });
}
void div_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  binary_same_shape(n, in, out, [](float a, float b) { return a / b; });
}

}  // namespace

void register_fast_kernels() {
  register_fast_kernel("Add", add_fast);
  register_fast_kernel("Sub", sub_fast);
  register_fast_kernel("Mul", mul_fast);
  register_fast_kernel("Div", div_fast);
  register_fast_kernel("DepthToSpace", depth_to_space_fast);
  register_fast_kernel("Transpose", transpose_fast);
}

}  // namespace wxe::cpu
