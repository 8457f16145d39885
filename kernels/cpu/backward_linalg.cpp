// Backward kernels of MatMul, Gemm, Einsum and Linear (linalg.cpp): the reference loops
// (double accumulation) and the fast path, oneDNN matmuls on strided views (float
// accumulation, as the forward fast path; a Linear with precision = "bf16" multiplies in
// bfloat16). backward_layers.h lets tests pick either.
#include "kernels/cpu/backward_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/transpose.h"

namespace wxe::cpu {

// oneDNN's eltwise gelu_erf backward, vectorised (float; within about 1e-6 of the double
// formula gelu_grad). A wxformer_v2026 step has 33M GELU elements; the scalar double erf and
// exp take about 30 ns each on this machine.
onednn::PrimCache<dnnl::eltwise_backward> gelu_bwd_cache;

void gelu_grad_fast(const Node& n, const float* x, const float* gy, float* gx, int64_t count) {
  using namespace onednn;
  if (count == 0) return;
  const memory::desc md = plain_md({count});
  auto p = gelu_bwd_cache.get(str("gelu_erf_bwd", count), [&] {
    const dnnl::algorithm gelu = dnnl::algorithm::eltwise_gelu_erf;
    dnnl::eltwise_forward::primitive_desc hint(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, gelu, md, 0.f, 0.f), eng());
    return dnnl::eltwise_backward(
        dnnl::eltwise_backward::primitive_desc(dnnl::eltwise_backward::desc(gelu, md, md, 0.f, 0.f), eng(), hint));
  });
  execute(n, *p, {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DIFF_DST, mem(md, gy)}, {DNNL_ARG_DIFF_SRC, mem(md, gx)}});
}

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements


// ---------------------------------------------------------------------------------------
// MatMul: A (..., M, K) x B (..., K, N) with broadcast batch dims; a 1-D A is (1, K), a 1-D B
// is (K, 1) (the flat layouts of the operands and of Y agree with those views).
// gA[ab] = sum over output batches b reading ab of gY[b] B[b]^T; gB likewise with A^T gY.

// Flat index into src for every flat index of out when src broadcasts to out.
std::vector<int64_t> broadcast_index(const Shape& src, const Shape& out) {
  const size_t r = out.size();
  Shape s(r, 1);
  for (size_t i = 0; i < src.size(); ++i) s[r - src.size() + i] = src[i];
  const std::vector<int64_t> sst = strides_of(s);
  std::vector<int64_t> idx((size_t)numel(out));
  for (int64_t f = 0; f < (int64_t)idx.size(); ++f) {
    int64_t rem = f, off = 0;
    for (size_t d = r; d-- > 0;) {
      const int64_t c = rem % out[d];
      rem /= out[d];
      if (s[d] != 1) off += c * sst[d];
    }
    idx[f] = off;
  }
  return idx;
}

// For each operand batch, the output batches that read it.
std::vector<std::vector<int64_t>> readers(const std::vector<int64_t>& idx, int64_t n_src) {
  std::vector<std::vector<int64_t>> r((size_t)n_src);
  for (int64_t b = 0; b < (int64_t)idx.size(); ++b) r[idx[b]].push_back(b);
  return r;
}

void matmul_backward_ref(const Node& n, const Ins& in, const Ins& gout, const Outs& gin) {
  const Shape& as = in[0]->shape;
  const Shape& bs = in[1]->shape;
  const Shape a2 = as.size() == 1 ? Shape{1, as[0]} : as;
  const Shape b2 = bs.size() == 1 ? Shape{bs[0], 1} : bs;
  const int64_t M = a2[a2.size() - 2], K = a2.back(), N = b2.back();
  const Shape ab(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const Shape batch = broadcast_shapes(ab, bb, n);
  const std::vector<int64_t> ai = broadcast_index(ab, batch), bi = broadcast_index(bb, batch);
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  const float* G = gout[0]->data<float>();  // (batch, M, N)
  if (Tensor* ga = gin[0]) {
    const auto rd = readers(ai, numel(ab));
    float* GA = ga->data<float>();
    const int64_t na = (int64_t)rd.size();
#pragma omp parallel
    {
      std::vector<double> acc((size_t)K);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < na * M; ++t) {
        const int64_t a = t / M, i = t % M;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t b : rd[a]) {
          const float* g = G + (b * M + i) * N;
          const float* bm = B + bi[b] * K * N;
          for (int64_t k = 0; k < K; ++k) {
            double s = 0;
            for (int64_t j = 0; j < N; ++j) s += (double)g[j] * bm[k * N + j];
            acc[k] += s;
          }
        }
        for (int64_t k = 0; k < K; ++k) GA[(a * M + i) * K + k] = (float)acc[k];
      }
    }
  }
  if (Tensor* gb = opt_gin(gin, 1)) {
    const auto rd = readers(bi, numel(bb));
    float* GB = gb->data<float>();
    const int64_t nbb = (int64_t)rd.size();
#pragma omp parallel
    {
      std::vector<double> acc((size_t)N);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < nbb * K; ++t) {
        const int64_t bq = t / K, k = t % K;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t b : rd[bq]) {
          const float* am = A + ai[b] * M * K;
          const float* g = G + b * M * N;
          for (int64_t i = 0; i < M; ++i) {
            const double av = am[i * K + k];
            for (int64_t j = 0; j < N; ++j) acc[j] += av * g[i * N + j];
          }
        }
        for (int64_t j = 0; j < N; ++j) GB[(bq * K + k) * N + j] = (float)acc[j];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Gemm: Y = alpha op(A) op(B) + beta C. g_opA = alpha gY op(B)^T (M, K), g_opB = alpha op(A)^T gY
// (K, N), transposed back where transA/transB; gC = beta gY summed over C's broadcast dims
// (zero when beta is 0: the forward ignores C then).

// gC = beta gY summed over C's broadcast dims (zero when beta is 0).
void gemm_bias_backward(const Node& n, const Tensor& C, const float* G, int64_t M, int64_t N, Tensor* gc) {
  const double beta = n.f("beta", 1.f);
  int64_t cm = 1, cn = 1;
  if (C.rank() == 2) cm = C.shape[0];
  if (C.rank() >= 1) cn = C.shape.back();
  std::vector<double> acc((size_t)(cm * cn), 0.0);
  if (beta != 0)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) acc[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)] += G[i * N + j];
  for (int64_t e = 0; e < cm * cn; ++e) gc->data<float>()[e] = (float)(beta * acc[e]);
}

void gemm_backward_ref(const Node& n, const Ins& in, const Ins& gout, const Outs& gin) {
  const Tensor* C = opt_t(in, 2);
  Tensor* gc = opt_gin(gin, 2);
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const double alpha = n.f("alpha", 1.f);
  const Shape& as = in[0]->shape;
  const Shape& bs = in[1]->shape;
  const int64_t M = ta ? as[1] : as[0], K = ta ? as[0] : as[1], N = tb ? bs[0] : bs[1];
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  const float* G = gout[0]->data<float>();  // (M, N)
  auto a_at = [&](int64_t i, int64_t k) { return (double)(ta ? A[k * M + i] : A[i * K + k]); };
  auto b_at = [&](int64_t k, int64_t j) { return (double)(tb ? B[j * K + k] : B[k * N + j]); };
  if (Tensor* ga = gin[0]) {
    float* GA = ga->data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t j = 0; j < N; ++j) s += (double)G[i * N + j] * b_at(k, j);
        GA[ta ? k * M + i : i * K + k] = (float)(alpha * s);
      }
  }
  if (Tensor* gb = opt_gin(gin, 1)) {
    float* GB = gb->data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t i = 0; i < M; ++i) s += a_at(i, k) * G[i * N + j];
        GB[tb ? j * K + k : k * N + j] = (float)(alpha * s);
      }
  }
  if (gc) gemm_bias_backward(n, *C, G, M, N, gc);
}

// ---------------------------------------------------------------------------------------
// Linear (linalg.cpp): X viewed as (P, K, Q), W (N, K), b (N), Y (P, N, Q); with activation
// "gelu" the pre-activation Z (the float result before Gelu) is recomputed and gZ = gY Gelu'(Z).

struct LinearShape {
  int64_t P, K, Q, N;
};

LinearShape linear_shape_of(const Node& n, const Ins& in) {
  const Shape& xs = in[0]->shape;
  const int64_t axis = norm_axis(n.i("axis", -1), (int64_t)xs.size(), n);
  return {prod(xs, 0, axis), xs[axis], prod(xs, axis + 1, xs.size()), in[1]->shape[0]};
}

// gZ (P, N, Q) from gY: gY itself without activation, else gY Gelu'(Z) with Z recomputed in
// double (reference) or by the forward fast kernel without its activation (fast), into store.
const float* linear_gz(const Node& n, const Ins& in, const float* gy, const LinearShape& d, KernelKind kind,
                       std::vector<float>& store) {
  const std::string act = n.s("activation", "");
  NCHECK(act.empty() || act == "gelu", "unknown activation '", act, "'");
  if (act.empty()) return gy;
  const int64_t P = d.P, K = d.K, Q = d.Q, N = d.N;
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  const Tensor* bias = opt_t(in, 2);
  store.resize((size_t)(P * N * Q));
  if (kind == KernelKind::Fast) {
    Node m = n;
    m.attrs.erase("activation");  // precision stays: Z as the forward computed it
    Tensor z(DType::F32, {P, N, Q});
    kernel_for("Linear", KernelKind::Fast)(m, in, {&z});
    gelu_grad_fast(n, z.data<float>(), gy, store.data(), P * N * Q);
    return store.data();
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < P * N; ++t) {
    const int64_t p = t / N, j = t % N;
    for (int64_t q = 0; q < Q; ++q) {
      double z = bias ? (double)bias->data<float>()[j] : 0.0;
      for (int64_t k = 0; k < K; ++k) z += (double)W[j * K + k] * X[(p * K + k) * Q + q];
      const int64_t e = (p * N + j) * Q + q;
      store[e] = (float)(gy[e] * gelu_grad((float)z, false));
    }
  }
  return store.data();
}

void linear_backward_ref(const Node& n, const Ins& in, const float* gz, const LinearShape& d, const Outs& gin) {
  const int64_t P = d.P, K = d.K, Q = d.Q, N = d.N;
  Tensor* gw_t = opt_gin(gin, 1);
  Tensor* gb_t = opt_t(in, 2) ? opt_gin(gin, 2) : nullptr;
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  if (Tensor* gx_t = gin[0]) {
    float* GX = gx_t->data<float>();
#pragma omp parallel
    {
      std::vector<double> acc((size_t)Q);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < P * K; ++t) {
        const int64_t p = t / K, k = t % K;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < N; ++j) {
          const double wv = W[j * K + k];
          const float* g = gz + (p * N + j) * Q;
          for (int64_t q = 0; q < Q; ++q) acc[q] += wv * g[q];
        }
        for (int64_t q = 0; q < Q; ++q) GX[(p * K + k) * Q + q] = (float)acc[q];
      }
    }
  }
  if (gw_t || gb_t) {
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < N; ++j) {
      double sb = 0;
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q) sb += gz[(p * N + j) * Q + q];
      if (gb_t) gb_t->data<float>()[j] = (float)sb;
      if (!gw_t) continue;
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t p = 0; p < P; ++p) {
          const float* g = gz + (p * N + j) * Q;
          const float* x = X + (p * K + k) * Q;
          for (int64_t q = 0; q < Q; ++q) s += (double)g[q] * x[q];
        }
        gw_t->data<float>()[j * K + k] = (float)s;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Fast path: the products as oneDNN matmuls. Every one is C = alpha op(A) op(B) on row-major
// data, op(A) (M, K) stored as (M, K) or, transposed, as (K, M) (likewise op(B) (K, N)):
// a transposed operand is a strided view, no copy. Batched over `batch` consecutive
// matrices of each operand. Primitives are cached per shape and views.

using namespace onednn;

PrimCache<MatMulPrim> bwd_matmul_cache;

// (batch, rows, cols) view of consecutive matrices stored (rows, cols) or, transposed, (cols, rows).
memory::desc matrix_view(int64_t batch, int64_t rows, int64_t cols, bool transposed, dt type = dt::f32) {
  const Dims st = transposed ? Dims{1, rows} : Dims{cols, 1};
  if (batch == 1) return memory::desc({rows, cols}, type, st);
  return memory::desc({batch, rows, cols}, type, Dims{rows * cols, st[0], st[1]});
}

// Returns false when oneDNN has no primitive for it (the caller runs its loops). With bf16, A
// and B are bfloat16 (uint16_t) arrays; the products accumulate in float32 and C is float32.
bool matmul_views(const Node& n, int64_t batch, int64_t M, int64_t K, int64_t N, const void* A, bool ta,
                  const void* B, bool tb, float* C, float alpha = 1.f, bool bf16 = false) {
  if (batch == 0 || M == 0 || N == 0) return true;
  if (K == 0) {
    std::fill(C, C + batch * M * N, 0.f);
    return true;
  }
  uint32_t abits;
  std::memcpy(&abits, &alpha, 4);
  const std::string key =
      str("bwd", batch, "x", M, "x", K, "x", N, ta ? "t" : "n", tb ? "t" : "n", abits, bf16 ? "bf16" : "");
  auto p = bwd_matmul_cache.get(key, [&] {
    dnnl::primitive_attr attr;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    const dt in_type = bf16 ? dt::bf16 : dt::f32;
    return make_matmul(matrix_view(batch, M, K, ta, in_type), matrix_view(batch, K, N, tb, in_type), nullptr,
                       matrix_view(batch, M, N, false), attr);
  });
  if (p->use_ref) return false;
  execute(n, p->prim, {{DNNL_ARG_SRC, mem(p->src, A)}, {DNNL_ARG_WEIGHTS, mem(p->wei, B)},
                       {DNNL_ARG_DST, mem(p->dst, C)}});
  return true;
}

// out[c] = sum over rows of g (rows, cols)[., c], double accumulators; parallel over columns.
void column_sums(const float* g, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t j0 = c * kChunk, m = std::min(kChunk, cols - j0);
    double acc[kChunk] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = g + r * cols + j0;
#pragma omp simd
      for (int64_t j = 0; j < m; ++j) acc[j] += x[j];
    }
    for (int64_t j = 0; j < m; ++j) out[j0 + j] = (float)acc[j];
  }
}

// out[r] = sum of row r of g (rows, cols), double accumulators; parallel over rows.
void row_sums(const float* g, int64_t rows, int64_t cols, float* out) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = g + r * cols;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; ++j) s += x[j];
    out[r] = (float)s;
  }
}

// dst[b][a][q] = src[a][b][q] for a < A, b < B: swaps the two outer dims of (A, B, Q).
void swap_outer(const float* src, int64_t A, int64_t B, int64_t Q, float* dst) {
  if (Q == 1) return transpose_planes(src, dst, 1, A, B);
#pragma omp parallel for schedule(static) if (A * B * Q > kParallelMin)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t a = 0; a < A; ++a) std::memcpy(dst + (b * A + a) * Q, src + (a * B + b) * Q, (size_t)Q * sizeof(float));
}

// dst[b][a][q] = bf16_bits(src[a][b][q]): swap_outer and the conversion to bfloat16 in one pass.
void swap_outer_bf16(const float* src, int64_t A, int64_t B, int64_t Q, uint16_t* dst) {
#pragma omp parallel for collapse(2) schedule(static) if (A * B * Q > kParallelMin)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t a = 0; a < A; ++a) {
      const float* s = src + (a * B + b) * Q;
      uint16_t* d = dst + (b * A + a) * Q;
      for (int64_t q = 0; q < Q; ++q) d[q] = bf16_bits(s[q]);
    }
}

// out[j] = sum over p and q of g (P, N, Q)[p, j, q], double accumulators; parallel over j.
void middle_sums(const float* g, int64_t P, int64_t N, int64_t Q, float* out) {
#pragma omp parallel for schedule(static) if (P * N * Q > kParallelMin)
  for (int64_t j = 0; j < N; ++j) {
    double s = 0;
    for (int64_t p = 0; p < P; ++p) {
      const float* x = g + (p * N + j) * Q;
#pragma omp simd reduction(+ : s)
      for (int64_t q = 0; q < Q; ++q) s += x[q];
    }
    out[j] = (float)s;
  }
}

enum { kGzT, kXT, kDxT };

// Linear: with Q == 1, dX (P, K) = gZ (P, N) W and dW = gZ^T X. Otherwise the contraction runs
// over (p, q): gZ and X viewed as (N, M) and (K, M), M = P Q (themselves when P == 1, else
// copies with the outer dims swapped), dW = gZ' X'^T, dX' = W^T gZ', dX = dX' swapped back.
// One big matmul each, whatever the window count (P) or the spatial size (Q).
// With precision = "bf16" (as the forward): gZ, X and W are converted to bfloat16 once each
// (with P > 1 in the same pass as the swap) and both products multiply in bfloat16 with
// float32 accumulation; dX and dW are float32. The bias gradient sums the float32 gZ.
bool linear_backward_fast(const Node& n, const Ins& in, const float* gz, const LinearShape& d, const Outs& gin) {
  const int64_t P = d.P, K = d.K, Q = d.Q, N = d.N;
  Tensor* gx = gin[0];
  Tensor* gw = opt_gin(gin, 1);
  Tensor* gb = opt_t(in, 2) ? opt_gin(gin, 2) : nullptr;
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  const bool bf16 = runs_bf16(n);
  // the operand as the matmul reads it: itself, or its bfloat16 copy in scratch_slot(3 + slot)
  auto operand = [&](const float* p, int64_t count, int slot) -> const void* {
    if (!bf16) return p;
    auto* h = static_cast<uint16_t*>(scratch_slot(3 + slot).get((size_t)count * sizeof(uint16_t)));
    to_bf16(p, count, h);
    return h;
  };
  const void* w_op = gx ? operand(W, N * K, 2) : nullptr;
  if (Q == 1) {
    const void* gz_op = operand(gz, P * N, 0);
    if (gx && !matmul_views(n, 1, P, N, K, gz_op, false, w_op, false, gx->data<float>(), 1.f, bf16)) return false;
    if (gw && !matmul_views(n, 1, N, P, K, gz_op, true, operand(X, P * K, 1), false, gw->data<float>(), 1.f, bf16))
      return false;
    if (gb) column_sums(gz, P, N, gb->data<float>());
    return true;
  }
  const int64_t M = P * Q;
  if (bf16 && P > 1) {  // gZ' and X' straight into bfloat16
    auto* gzh = static_cast<uint16_t*>(scratch_slot(3 + 0).get((size_t)(N * M) * sizeof(uint16_t)));
    swap_outer_bf16(gz, P, N, Q, gzh);
    if (gx) {
      float* dxm = scratch_slot(kDxT).floats(K * M);
      if (!matmul_views(n, 1, K, N, M, w_op, true, gzh, false, dxm, 1.f, true)) return false;
      swap_outer(dxm, K, P, Q, gx->data<float>());
    }
    if (gw) {
      auto* xh = static_cast<uint16_t*>(scratch_slot(3 + 1).get((size_t)(K * M) * sizeof(uint16_t)));
      swap_outer_bf16(X, P, K, Q, xh);
      if (!matmul_views(n, 1, N, M, K, gzh, false, xh, true, gw->data<float>(), 1.f, true)) return false;
    }
    if (gb) middle_sums(gz, P, N, Q, gb->data<float>());
    return true;
  }
  const float* gzm = gz;  // (N, M)
  const float* xm = X;    // (K, M)
  if (P > 1) {
    float* t = scratch_slot(kGzT).floats(N * M);
    swap_outer(gz, P, N, Q, t);
    gzm = t;
    if (gw) {
      float* u = scratch_slot(kXT).floats(K * M);
      swap_outer(X, P, K, Q, u);
      xm = u;
    }
  }
  const void* gz_op = operand(gzm, N * M, 0);
  if (gx) {
    float* dxm = P > 1 ? scratch_slot(kDxT).floats(K * M) : gx->data<float>();
    if (!matmul_views(n, 1, K, N, M, w_op, true, gz_op, false, dxm, 1.f, bf16)) return false;
    if (P > 1) swap_outer(dxm, K, P, Q, gx->data<float>());
  }
  if (gw && !matmul_views(n, 1, N, M, K, gz_op, false, operand(xm, K * M, 1), true, gw->data<float>(), 1.f, bf16))
    return false;
  if (gb) row_sums(gzm, N, M, gb->data<float>());
  return true;
}

// MatMul: B without batch dims (A's batch and rows flatten to R rows): gA (R, K) = gY B^T,
// gB = A^T gY. Equal batch dims: the same per batch. Other broadcasts: false.
bool matmul_backward_fast(const Node& n, const Ins& in, const Ins& gout, const Outs& gin) {
  const Shape& as = in[0]->shape;
  const Shape& bs = in[1]->shape;
  const Shape a2 = as.size() == 1 ? Shape{1, as[0]} : as;
  const Shape b2 = bs.size() == 1 ? Shape{bs[0], 1} : bs;
  const int64_t M = a2[a2.size() - 2], K = a2.back(), N = b2.back();
  Shape ab(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const size_t r = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), r - ab.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  const float* G = gout[0]->data<float>();
  Tensor* ga = gin[0];
  Tensor* gb = opt_gin(gin, 1);
  if (numel(bb) == 1) {
    const int64_t R = numel(ab) * M;
    if (ga && !matmul_views(n, 1, R, N, K, G, false, B, true, ga->data<float>())) return false;
    if (gb && !matmul_views(n, 1, K, R, N, A, true, G, false, gb->data<float>())) return false;
    return true;
  }
  if (ab != bb) return false;
  const int64_t batch = numel(ab);
  if (ga && !matmul_views(n, batch, M, N, K, G, false, B, true, ga->data<float>())) return false;
  if (gb && !matmul_views(n, batch, K, M, N, A, true, G, false, gb->data<float>())) return false;
  return true;
}

// Gemm: g_opA = alpha gY op(B)^T (M, K), g_opB = alpha op(A)^T gY (K, N); a transposed input
// gets the transposed product (gA^T = alpha op(B) gY^T, gB^T = alpha gY^T op(A)).
bool gemm_backward_fast(const Node& n, const Ins& in, const Ins& gout, const Outs& gin) {
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const float alpha = n.f("alpha", 1.f);
  const Shape& as = in[0]->shape;
  const Shape& bs = in[1]->shape;
  if (as.size() != 2 || bs.size() != 2) return false;
  const int64_t M = ta ? as[1] : as[0], K = ta ? as[0] : as[1], N = tb ? bs[0] : bs[1];
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  const float* G = gout[0]->data<float>();  // (M, N)
  if (Tensor* ga = gin[0]) {
    const bool ok = ta ? matmul_views(n, 1, K, N, M, B, tb, G, true, ga->data<float>(), alpha)
                       : matmul_views(n, 1, M, N, K, G, false, B, !tb, ga->data<float>(), alpha);
    if (!ok) return false;
  }
  if (Tensor* gb = opt_gin(gin, 1)) {
    const bool ok = tb ? matmul_views(n, 1, N, M, K, G, true, A, ta, gb->data<float>(), alpha)
                       : matmul_views(n, 1, K, M, N, A, !ta, G, false, gb->data<float>(), alpha);
    if (!ok) return false;
  }
  if (Tensor* gc = opt_gin(gin, 2)) gemm_bias_backward(n, *in[2], G, M, N, gc);
  return true;
}

// ---------------------------------------------------------------------------------------
// Einsum: the gradient of operand i is an einsum of gY with the other operands,
// "out,others->t", where t is operand i's distinct letters that appear in the output or
// another operand. Letters only in operand i were summed by the forward, so the gradient is
// constant along them (broadcast); a letter repeated in operand i walked its diagonal, so
// only diagonal elements get the gradient (the rest are zero). Reference: the reference
// Einsum kernel and a scatter into operand i's layout. Fast: the fast Einsum kernel, with the
// two operands of a two-operand gradient ordered so that its matmul writes t's layout
// directly, and no scatter when t is operand i's own subscripts (the common case).

void einsum_backward_one(const Node& n, const Ins& in, const Tensor& gy, const EinsumEq& eq,
                         const std::map<char, int64_t>& size, size_t i, Tensor* gi, KernelKind kind) {
  const std::string& li = eq.in[i];
  std::string elsewhere = eq.out;  // letters of the output and the other operands
  for (size_t j = 0; j < in.size(); ++j)
    if (j != i) elsewhere += eq.in[j];
  std::string t;  // operand i's distinct letters that the gradient einsum produces
  for (char c : li)
    if (t.find(c) == std::string::npos && elsewhere.find(c) != std::string::npos) t.push_back(c);
  // gradient einsum: gY, then the other operands
  std::vector<std::string> subs{eq.out};
  std::vector<const Tensor*> ops{&gy};
  for (size_t j = 0; j < in.size(); ++j)
    if (j != i) {
      subs.push_back(eq.in[j]);
      ops.push_back(in[j]);
    }
  if (kind == KernelKind::Fast && ops.size() == 2) {
    // the matmul's rows come from the first operand: put first the one that owns t's first
    // letter not shared by both
    for (char c : t) {
      const bool in0 = subs[0].find(c) != std::string::npos, in1 = subs[1].find(c) != std::string::npos;
      if (in0 == in1) continue;
      if (in1) {
        std::swap(subs[0], subs[1]);
        std::swap(ops[0], ops[1]);
      }
      break;
    }
  }
  std::string spec = subs[0];
  for (size_t k = 1; k < subs.size(); ++k) spec += "," + subs[k];
  spec += "->" + t;
  Node g;
  g.op = "Einsum";
  g.name = n.name + "/grad" + std::to_string(i);
  g.attrs["equation"] = attr_s(spec);
  for (size_t k = 0; k < ops.size(); ++k) g.inputs.push_back((int)k);
  g.outputs.push_back((int)ops.size());
  Shape ts;
  for (char c : t) ts.push_back(size.at(c));
  if (kind == KernelKind::Fast && t == li) {  // gin[i] has t's layout: no scatter
    Tensor view = gi->reshaped(ts);
    kernel_for("Einsum", KernelKind::Fast)(g, ops, {&view});
    return;
  }
  Tensor tg(DType::F32, ts);
  kernel_for("Einsum", kind)(g, ops, {&tg});
  // scatter tg into operand i's layout: every assignment of operand i's distinct letters
  // is one (diagonal) element of gin[i]
  std::string u;  // distinct letters of operand i
  for (char c : li)
    if (u.find(c) == std::string::npos) u.push_back(c);
  const std::vector<int64_t> ist = strides_of(in[i]->shape), tst = strides_of(ts);
  std::vector<int64_t> usize(u.size()), ustride(u.size(), 0), utstride(u.size(), 0);
  for (size_t k = 0; k < u.size(); ++k) {
    usize[k] = size.at(u[k]);
    for (size_t j = 0; j < li.size(); ++j)
      if (li[j] == u[k]) ustride[k] += ist[j];
    const size_t pos = t.find(u[k]);
    if (pos != std::string::npos) utstride[k] = tst[pos];
  }
  float* G = gi->data<float>();
  if (u.size() < li.size()) fill_zero(gi);  // off-diagonal elements stay zero
  int64_t count = 1;
  for (int64_t s : usize) count *= s;
  for (int64_t f = 0; f < count; ++f) {
    int64_t rem = f, dst = 0, src = 0;
    for (size_t k = u.size(); k-- > 0;) {
      const int64_t c = rem % usize[k];
      rem /= usize[k];
      dst += c * ustride[k];
      src += c * utstride[k];
    }
    G[dst] = tg.data<float>()[src];
  }
}

}  // namespace

bool linear_backward_pkq(const Node& n, const Ins& in, const float* gz, int64_t P, int64_t K, int64_t Q, int64_t N,
                         const Outs& gin) {
  return linear_backward_fast(n, in, gz, {P, K, Q, N}, gin);
}

void linear_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin, KernelKind kind) {
  if (!gout[0]) {
    for (size_t i = 0; i < std::min<size_t>(3, gin.size()); ++i) fill_zero(gin[i]);
    return;
  }
  const LinearShape d = linear_shape_of(n, in);
  std::vector<float> store;
  const float* gz = linear_gz(n, in, gout[0]->data<float>(), d, kind, store);
  if (kind == KernelKind::Fast && linear_backward_fast(n, in, gz, d, gin)) return;
  linear_backward_ref(n, in, gz, d, gin);
}

void matmul_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin, KernelKind kind) {
  if (!gout[0]) {
    fill_zero(gin[0]);
    fill_zero(opt_gin(gin, 1));
    return;
  }
  if (kind == KernelKind::Fast && matmul_backward_fast(n, in, gout, gin)) return;
  matmul_backward_ref(n, in, gout, gin);
}

void gemm_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin, KernelKind kind) {
  if (!gout[0]) {
    for (size_t i = 0; i < std::min<size_t>(3, gin.size()); ++i) fill_zero(gin[i]);
    return;
  }
  if (kind == KernelKind::Fast && gemm_backward_fast(n, in, gout, gin)) return;
  gemm_backward_ref(n, in, gout, gin);
}

void einsum_backward(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin, KernelKind kind) {
  const EinsumEq eq = parse_einsum(n, in.size());
  std::map<char, int64_t> size;
  for (size_t i = 0; i < in.size(); ++i)
    for (size_t j = 0; j < eq.in[i].size(); ++j) size[eq.in[i][j]] = in[i]->shape[j];
  for (size_t i = 0; i < in.size(); ++i) {
    if (!gin[i]) continue;
    if (!gout[0]) fill_zero(gin[i]);
    else einsum_backward_one(n, in, *gout[0], eq, size, i, gin[i], kind);
  }
}

namespace {

template <void (*F)(const Node&, const Ins&, const Ins&, const Ins&, const Outs&, KernelKind)>
void fast(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  F(n, in, out, gout, gin, KernelKind::Fast);
}

}  // namespace

void register_linalg_backward() {
  for (const char* op : {"MatMul", "Gemm", "Einsum", "Linear"})  // the operands, not the product
    register_backward_reads(op, {~0u, false});
  register_backward("MatMul", fast<matmul_backward>);
  register_backward("Gemm", fast<gemm_backward>);
  register_backward("Einsum", fast<einsum_backward>);
  register_backward("Linear", fast<linear_backward>);
}

}  // namespace wxe::cpu
