// Linear algebra on the CUDA backend: Linear, MatMul, Gemm and matmul-shaped Einsum on cuBLAS
// (float32, no TF32: the default math mode), Conv and ConvTranspose on cuDNN (FMA math only,
// no TF32). With precision = "bf16" (engine/passes/fuse.h use_bf16, --precision bf16) a Linear
// multiplies bfloat16-rounded inputs with float32 accumulation (cuBLAS compute type
// 32F_FAST_16BF), as the CPU's oneDNN bf16 kernel does, and a Conv may use TF32 tensor cores
// (cuDNN default math; a 10-bit mantissa, finer than bf16's 7). Host code only; the small kernels it needs (bias, copies, padding, the generic
// Einsum) are launched through cuda_util.h. Attributes are read by the CPU helpers
// (kernels/cpu/dnnl_util.h: parse_einsum, conv_geometry), so both backends agree on them.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "kernels/cpu/dnnl_util.h"
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

// C (row-major, per batch M x N) = A (M x K, or K x M if ta) * B (K x N, or N x K if tb),
// batched with element strides (0: shared by every batch).
// bf16: products of bfloat16-rounded A and B, accumulated in float32.
void gemm_rowmajor(int64_t batch, int64_t M, int64_t N, int64_t K, const float* A, bool ta, int64_t sa,
                   const float* B, bool tb, int64_t sb, float* C, int64_t sc, float alpha = 1.f, float beta = 0.f,
                   bool bf16 = false) {
  // row-major C = A B  <=>  column-major C^T = B^T A^T
  const cublasOperation_t opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ldb = (int)(tb ? K : N), lda = (int)(ta ? M : K), ldc = (int)N;
  // float32: cublasSgemm's compute type under the handle's pedantic math mode; bf16: the
  // default math mode, which the pedantic one would hold to float32 products
  const cublasComputeType_t ct = bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  if (bf16) CUBLAS_CHECK(cublas().set_math_mode(ctx().blas, CUBLAS_DEFAULT_MATH));
  if (batch == 1)
    CUBLAS_CHECK(cublas().gemm_ex(ctx().blas, opB, opA, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F,
                              lda, &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_CHECK(cublas().gemm_strided_batched_ex(ctx().blas, opB, opA, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, ldb,
                                            sb, A, CUDA_R_32F, lda, sa, &beta, C, CUDA_R_32F, ldc, sc, (int)batch, ct,
                                            CUBLAS_GEMM_DEFAULT));
  if (bf16) CUBLAS_CHECK(cublas().set_math_mode(ctx().blas, CUBLAS_PEDANTIC_MATH));
}

// ---------------------------------------------------------------- Linear
// y (P, N, Q) = W (N, K) x (P, K, Q) + b, then GELU when asked: the forward, and the backward's
// recompute of its pre-activation.
void linear_product(const float* x, const float* w, const float* bias, int64_t P, int64_t N, int64_t K, int64_t Q,
                    float* y, bool gelu, bool bf16) {
  if (Q == 1)  // Y (P, N) = X (P, K) W^T
    gemm_rowmajor(1, P, N, K, x, false, 0, w, true, 0, y, 0, 1.f, 0.f, bf16);
  else  // per p: Y_p (N, Q) = W (N, K) X_p (K, Q)
    gemm_rowmajor(P, N, Q, K, w, false, 0, x, false, K * Q, y, N * Q, 1.f, 0.f, bf16);
  launch_bias_act(y, bias, P, N, Q, gelu);
}

// Y (P, N, Q) = W (N, K) X (P, K, Q) + b, X viewed around `axis` (kernels/cpu/linalg.cpp).
void linear_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor& x = *in[0];
  const Tensor& w = *in[1];
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  const std::string act = n.s("activation", "");
  NCHECK(act.empty() || act == "gelu", "unknown activation '", act, "'");
  NCHECK(w.rank() == 2, "W must be 2-D");
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const int64_t K = x.shape[axis], N = w.shape[0];
  NCHECK(w.shape[1] == K, "X ", shape_str(x.shape), " and W ", shape_str(w.shape), " disagree on K");
  int64_t P = 1, Q = 1;
  for (int64_t d = 0; d < axis; ++d) P *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) Q *= x.shape[d];
  if (P * N * Q == 0) return;
  linear_product(x.data<float>(), w.data<float>(), bias ? bias->data<float>() : nullptr, P, N, K, Q,
                 out[0]->data<float>(), act == "gelu", n.s("precision", "") == "bf16");
}

// ---------------------------------------------------------------- WindowAttention
// The fused window attention (kernels/cpu/window_attention.h): tokens gathered into rows,
// three cuBLAS projections, the attention rows (attention.cu), the output projection, and the
// rows scattered back with bo and the residual.
void window_attention_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const bool fused = !in[2];  // Wq the fused (3I, D) projection
  const cpu::WindowGeom g = cpu::window_geometry(n, in[0]->shape, in[1]->shape, fused);
  const int64_t R = g.B * g.nW * g.T, D = g.D, I = g.I;
  NCHECK(in[6]->numel() == g.heads * g.T * g.T || in[6]->numel() == g.T * g.T, "the position bias ",
         shape_str(in[6]->shape), " is neither (heads, T, T) nor (T, T) for ", g.heads, " heads of ", g.T, " tokens");
  if (R * D == 0) return;
  Scratch rows(R * D * sizeof(float)), q(R * I * sizeof(float)), k(R * I * sizeof(float)), v(R * I * sizeof(float));
  launch_window_gather(g, in[0]->data<float>(), rows.f());
  float* qkv[3] = {q.f(), k.f(), v.f()};
  for (int m = 0; m < 3; ++m)
    gemm_rowmajor(1, R, I, D, rows.f(), false, 0, fused ? in[1]->data<float>() + m * I * D : in[1 + m]->data<float>(),
                  true, 0, qkv[m], 0);
  Scratch o(R * I * sizeof(float));
  launch_window_attention(g, n.f("scale", 1.f), q.f(), k.f(), v.f(), in[6]->data<float>(), in[6]->numel(), o.f());
  gemm_rowmajor(1, R, D, I, o.f(), false, 0, in[4]->data<float>(), true, 0, rows.f(), 0);
  launch_window_scatter(g, rows.f(), in[5] ? in[5]->data<float>() : nullptr, in[7] ? in[7]->data<float>() : nullptr,
                        out[0]->data<float>());
}

// ---------------------------------------------------------------- MatMul
// numpy matmul; batch dims must be equal or one side's batch a single matrix.
void matmul_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  Shape a = in[0]->shape, b = in[1]->shape;
  NCHECK(!a.empty() && !b.empty(), "scalar operands");
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
  NCHECK(b[b.size() - 2] == K, "inner dims differ: ", shape_str(in[0]->shape), " and ", shape_str(in[1]->shape));
  const int64_t ba = numel(Shape(a.begin(), a.end() - 2)), bb = numel(Shape(b.begin(), b.end() - 2));
  const int64_t batch = out[0]->numel() / std::max<int64_t>(M * N, 1);
  if (out[0]->numel() == 0) return;
  if (!((ba == batch || ba == 1) && (bb == batch || bb == 1))) {  // partial broadcast: one GEMM per batch
    const Shape& os = out[0]->shape;
    const Shape ob(os.begin(), os.end() - 2);
    Walk w;
    NCHECK(make_walk(ob, broadcast_strides(Shape(a.begin(), a.end() - 2), ob),
                     broadcast_strides(Shape(b.begin(), b.end() - 2), ob), 0, 0, &w),
           "too many batch dims");
    for (int64_t i = 0; i < batch; ++i) {
      int64_t ia, ib;
      walk_offsets(w, i, &ia, &ib);
      gemm_rowmajor(1, M, N, K, in[0]->data<float>() + ia * M * K, false, 0, in[1]->data<float>() + ib * K * N,
                    false, 0, out[0]->data<float>() + i * M * N, 0);
    }
    return;
  }
  gemm_rowmajor(batch, M, N, K, in[0]->data<float>(), false, ba == 1 ? 0 : M * K, in[1]->data<float>(), false,
                bb == 1 ? 0 : K * N, out[0]->data<float>(), M * N);
}

// ---------------------------------------------------------------- Gemm
void gemm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const float alpha = n.f("alpha", 1.f), beta = n.f("beta", 1.f);
  const Tensor &A = *in[0], &B = *in[1];
  NCHECK(A.rank() == 2 && B.rank() == 2, "A and B must be 2-D");
  const int64_t M = ta ? A.shape[1] : A.shape[0], K = ta ? A.shape[0] : A.shape[1];
  const int64_t N = tb ? B.shape[0] : B.shape[1];
  float* y = out[0]->data<float>();
  const Tensor* C = in.size() > 2 ? in[2] : nullptr;
  if (M * N == 0) return;
  if (C) {  // Y = broadcast C, then Y = alpha A B + beta Y
    const Shape os{M, N};
    Walk w;
    NCHECK(make_walk(os, broadcast_strides(C->shape, os), strides_of(os), 0, 0, &w), "C does not broadcast");
    launch_copy(w, C->raw(), y, 4);
  }
  gemm_rowmajor(1, M, N, K, A.data<float>(), ta, 0, B.data<float>(), tb, 0, y, 0, alpha, C ? beta : 0.f);
}

// ---------------------------------------------------------------- Einsum
// Two operands whose letters split into batch (both inputs and output), m (A and output),
// n (B and output) and k (both inputs, summed): a batched GEMM over operands staged into
// (batch, m, k), (batch, k, n) or (batch, n, k) order when they are not already in one of
// them. Anything else runs the generic kernel.
struct Letters {
  std::map<char, int64_t> size;
  std::string batch, m, nn, k;
};

bool matmul_letters(const cpu::EinsumEq& eq, const Ins& in, Letters* L) {
  if (eq.in.size() != 2) return false;
  const std::string &la = eq.in[0], &lb = eq.in[1], &lo = eq.out;
  auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  for (const std::string* s : {&la, &lb, &lo}) {
    std::string t = *s;
    std::sort(t.begin(), t.end());
    if (std::adjacent_find(t.begin(), t.end()) != t.end()) return false;  // diagonals
  }
  for (size_t i = 0; i < la.size(); ++i) L->size[la[i]] = in[0]->shape[i];
  for (size_t i = 0; i < lb.size(); ++i) L->size[lb[i]] = in[1]->shape[i];
  for (char c : lo) {
    if (has(la, c) && has(lb, c)) L->batch.push_back(c);
    else if (has(la, c)) L->m.push_back(c);
    else L->nn.push_back(c);
  }
  for (char c : la)
    if (!has(lo, c)) {
      if (!has(lb, c)) return false;  // summed over one operand only
      L->k.push_back(c);
    }
  for (char c : lb)
    if (!has(la, c) && !has(lo, c)) return false;
  return true;
}

// Element strides of each letter of `sub` in a contiguous tensor of that shape.
std::map<char, int64_t> letter_strides(const std::string& sub, const Shape& s) {
  std::map<char, int64_t> r;
  auto st = strides_of(s);
  for (size_t i = 0; i < sub.size(); ++i) r[sub[i]] = st[i];
  return r;
}

// Copies a tensor with subscripts `from` into contiguous order `to` (src -> dst), or the
// reverse (scatter: contiguous `to` order -> tensor `from`).
void permute_copy(const Node& n, const Letters& L, const std::string& from, const Shape& from_shape,
                  const std::string& to, const float* src, float* dst, bool scatter) {
  const auto fs = letter_strides(from, from_shape);
  Shape tshape;
  for (char c : to) tshape.push_back(L.size.at(c));
  const auto tst = strides_of(tshape);
  std::vector<int64_t> fst;
  for (char c : to) fst.push_back(fs.at(c));
  Walk w;
  NCHECK(make_walk(tshape, scatter ? tst : fst, scatter ? fst : tst, 0, 0, &w), "too many dims");
  launch_copy(w, src, dst, 4);
}

void einsum_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const cpu::EinsumEq eq = cpu::parse_einsum(n, in.size());
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  Letters L;
  if (matmul_letters(eq, in, &L)) {
    auto prod = [&](const std::string& s) {
      int64_t p = 1;
      for (char c : s) p *= L.size.at(c);
      return p;
    };
    const int64_t nb = prod(L.batch), M = prod(L.m), N = prod(L.nn), K = prod(L.k);
    const std::string a_mk = L.batch + L.m + L.k, a_km = L.batch + L.k + L.m;
    const std::string b_kn = L.batch + L.k + L.nn, b_nk = L.batch + L.nn + L.k;
    const std::string o_mn = L.batch + L.m + L.nn;
    const bool a_ok = eq.in[0] == a_mk || eq.in[0] == a_km, b_ok = eq.in[1] == b_kn || eq.in[1] == b_nk;
    const bool o_ok = eq.out == o_mn;
    const size_t need = (a_ok ? 0 : in[0]->numel()) + (b_ok ? 0 : in[1]->numel()) + (o_ok ? 0 : total);
    float* ws = need ? (float*)workspace(need * sizeof(float)) : nullptr;
    const float* A = in[0]->data<float>();
    const float* B = in[1]->data<float>();
    bool ta = eq.in[0] == a_km, tb = eq.in[1] == b_nk;
    if (!a_ok) {
      permute_copy(n, L, eq.in[0], in[0]->shape, a_mk, A, ws, false);
      A = ws;
      ws += in[0]->numel();
      ta = false;
    }
    if (!b_ok) {
      permute_copy(n, L, eq.in[1], in[1]->shape, b_kn, B, ws, false);
      B = ws;
      ws += in[1]->numel();
      tb = false;
    }
    float* C = o_ok ? out[0]->data<float>() : ws;
    gemm_rowmajor(nb, M, N, K, A, ta, M * K, B, tb, K * N, C, M * N);
    if (!o_ok) permute_copy(n, L, eq.out, out[0]->shape, o_mn, C, out[0]->data<float>(), true);
    return;
  }
  // generic: any equation of up to 3 operands
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const float*> src;
  for (const Tensor* t : in) {
    shapes.push_back(t->shape);
    src.push_back(t->data<float>());
  }
  EinsumIndex e;
  NCHECK(make_einsum(eq.in, eq.out, shapes, &e), "the cuda kernel takes at most 3 operands and ", kMaxRank,
         " output and summed letters");
  launch_einsum_generic(e, src, out[0]->data<float>(), total);
}

// ---------------------------------------------------------------- Conv, ConvTranspose
// cuDNN descriptors and algorithm per geometry, made once: the first of cuDNN's heuristic
// choices that is float32 FMA math (no TF32) and deterministic (runs give equal bits).
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;  // cudnnConvolutionFwdAlgo_t or cudnnConvolutionBwdDataAlgo_t
  cudnnMathType_t math = CUDNN_FMA_MATH;  // the algorithm's
  size_t ws = 0;
};


// One pass of a planned convolution: the forward, the backward to the data (also a
// ConvTranspose's forward), the backward to the filter.
enum class Pass { Fwd, Data, Filter };

struct Algo {
  int algo = -1;                          // the pass's cudnnConvolution*Algo_t
  cudnnMathType_t math = CUDNN_FMA_MATH;  // the math type it was timed with
  size_t ws = 0;                          // workspace bytes
};

// The first (fastest) algorithm of cuDNN's list that succeeded, is deterministic, needs at
// most 1 GiB of workspace and computes in float32 FMA (or any math with tf32).
template <class Perf>
bool pick(const Perf* perf, int found, bool tf32, Algo* a) {
  constexpr size_t kMaxWs = size_t(1) << 30;
  for (int i = 0; i < found; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && (tf32 || perf[i].mathType == CUDNN_FMA_MATH) &&
        perf[i].determinism == CUDNN_DETERMINISTIC && perf[i].memory <= kMaxWs) {
      a->algo = (int)perf[i].algo;
      a->math = perf[i].mathType;
      return true;
    }
  return false;
}

// WXE_CUDNN_FIND=1: the algorithms ranked by cuDNN timing each of them once per geometry
// (cudnnFind*, as PyTorch's cudnn.benchmark) instead of by its heuristics. Off by default: a
// timed choice can differ between runs and between ranks, and with it the float32 rounding.
bool timed_choice() {
  static const bool on = [] {
    const char* e = std::getenv("WXE_CUDNN_FIND");
    return e && std::string(e) == "1";
  }();
  return on;
}

// The algorithm and workspace of one pass over p's descriptors; false when cuDNN has none.
bool find_algo(const ConvPlan& p, Pass pass, bool tf32, Algo* a) {
  int found = 0;
  const bool timed = timed_choice();
  if (pass == Pass::Fwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    if (timed)
      CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(ctx().dnn, p.x, p.w, p.conv, p.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
    else
      CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(ctx().dnn, p.x, p.w, p.conv, p.y,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
    if (!pick(perf, found, tf32, a)) return false;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(ctx().dnn, p.x, p.w, p.conv, p.y,
                                                        (cudnnConvolutionFwdAlgo_t)a->algo, &a->ws));
  } else if (pass == Pass::Data) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    if (timed)
      CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(ctx().dnn, p.w, p.y, p.conv, p.x,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
    else
      CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx().dnn, p.w, p.y, p.conv, p.x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
    if (!pick(perf, found, tf32, a)) return false;
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx().dnn, p.w, p.y, p.conv, p.x,
                                                             (cudnnConvolutionBwdDataAlgo_t)a->algo, &a->ws));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    if (timed)
      CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(ctx().dnn, p.x, p.y, p.conv, p.w,
                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf));
    else
      CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx().dnn, p.x, p.y, p.conv, p.w,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf));
    if (!pick(perf, found, tf32, a)) return false;
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx().dnn, p.x, p.y, p.conv, p.w,
                                                               (cudnnConvolutionBwdFilterAlgo_t)a->algo, &a->ws));
  }
  return true;
}

std::mutex plan_mu;
std::map<std::string, ConvPlan>& plans() {
  static std::map<std::string, ConvPlan> p;
  return p;
}

std::vector<int> dims_of(const Shape& s) { return std::vector<int>(s.begin(), s.end()); }

// Shapes with at least 2 spatial dims (a 1-D conv gets a leading spatial dim of 1).
Shape nd(const Shape& s) {
  Shape r = s;
  if (r.size() == 3) r.insert(r.begin() + 2, 1);
  return r;
}

void set_tensor(cudnnTensorDescriptor_t d, const Shape& s) {
  auto dims = dims_of(s);
  auto st = strides_of(s);
  std::vector<int> sti(st.begin(), st.end());
  CUDNN_CHECK(cudnnSetTensorNdDescriptor(d, CUDNN_DATA_FLOAT, (int)dims.size(), dims.data(), sti.data()));
}

// Conv: x (N, C_in, sp...) -> y (N, C_out, sp...), w (C_out, C_in/g, k...).
// ConvTranspose as cuDNN's backward data: "x" is the transposed conv's output, "y" its input.
const ConvPlan& conv_plan(const Node& n, const cpu::ConvGeom& g, const Shape& xs, const Shape& ws, const Shape& ys) {
  const bool tf32 = n.s("precision", "") == "bf16";
  const cudnnMathType_t math = tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  const std::string key = std::string(g.transpose ? "T" : "F") + (tf32 ? "tf32" : "") + shape_str(xs) + shape_str(ws) + shape_str(ys) +
                          str(g.group, "|", g.s[0], ",", g.s[1], ",", g.s[2], "|", g.d[0], ",", g.d[1], ",", g.d[2],
                              "|", g.pb[0], ",", g.pb[1], ",", g.pb[2]);
  std::lock_guard<std::mutex> lk(plan_mu);
  auto it = plans().find(key);
  if (it != plans().end()) return it->second;
  ConvPlan p;
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.x));
  CUDNN_CHECK(cudnnCreateTensorDescriptor(&p.y));
  CUDNN_CHECK(cudnnCreateFilterDescriptor(&p.w));
  CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
  set_tensor(p.x, nd(xs));
  set_tensor(p.y, nd(ys));
  auto wd = dims_of(nd(ws));
  CUDNN_CHECK(cudnnSetFilterNdDescriptor(p.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)wd.size(), wd.data()));
  const int nsp = (int)wd.size() - 2, f = 3 - nsp;
  std::vector<int> pad, stride, dil;
  for (int i = f; i < 3; ++i) {
    pad.push_back((int)g.pb[i]);
    stride.push_back((int)g.s[i]);
    dil.push_back((int)g.d[i]);
  }
  CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(p.conv, nsp, pad.data(), stride.data(), dil.data(),
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CUDNN_CHECK(cudnnSetConvolutionGroupCount(p.conv, (int)g.group));
  CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, math));  // FMA: no TF32
  Algo a;
  const bool ok = find_algo(p, g.transpose ? Pass::Data : Pass::Fwd, tf32, &a);
  p.algo = a.algo;
  p.math = a.math;
  p.ws = a.ws;
  NCHECK(ok, "cuDNN has no deterministic float32 algorithm for this convolution");
  // the algorithm runs with the math type it was timed with
  CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv, p.math));
  return plans().emplace(key, p).first->second;
}

void conv_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor &x = *in[0], &w = *in[1];
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  cpu::ConvGeom g = cpu::conv_geometry(n, x.shape, w.shape, false);
  NCHECK(g.out_shape() == out[0]->shape, "output shape mismatch");
  if (out[0]->numel() == 0) return;
  // asymmetric pads: pad the input explicitly first, then a conv without pads
  bool asym = false;
  for (int i = 0; i < 3; ++i) asym = asym || g.pb[i] != g.pe[i];
  const float* xp = x.data<float>();
  Shape xs = x.shape;
  size_t pad_bytes = 0;
  PadIndex pi;
  if (asym) {
    pi.rank = x.rank();
    const auto st = strides_of(x.shape);
    for (int d = 0; d < pi.rank; ++d) {
      const int a = d < 2 ? -1 : g.first() + d - 2;
      const int64_t b = a < 0 ? 0 : g.pb[a], e = a < 0 ? 0 : g.pe[a];
      xs[d] = x.shape[d] + b + e;
      pi.out[d] = xs[d];
      pi.stride[d] = st[d];
      pi.begin[d] = b;
      pi.len[d] = x.shape[d];
      if (a >= 0) g.pb[a] = g.pe[a] = 0;
    }
    pad_bytes = ((size_t)numel(xs) * 4 + 255) / 256 * 256;
  }
  const ConvPlan& p = conv_plan(n, g, xs, w.shape, out[0]->shape);
  uint8_t* ws = (uint8_t*)workspace(pad_bytes + p.ws + 256);
  if (asym) {
    launch_pad(pi, numel(xs), xp, (float*)ws, 0.f);
    xp = (const float*)ws;
  }
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionForward(ctx().dnn, &one, p.x, xp, p.w, w.data<float>(), p.conv,
                                      (cudnnConvolutionFwdAlgo_t)p.algo, ws + pad_bytes, p.ws, &zero, p.y,
                                      out[0]->data<float>()));
  const Shape& os = out[0]->shape;
  launch_bias_act(out[0]->data<float>(), bias ? bias->data<float>() : nullptr, os[0], os[1],
                  out[0]->numel() / std::max<int64_t>(os[0] * os[1], 1), false);
}

void conv_transpose_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor &x = *in[0], &w = *in[1];
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  cpu::ConvGeom g = cpu::conv_geometry(n, x.shape, w.shape, true);
  NCHECK(g.out_shape() == out[0]->shape, "output shape mismatch");
  if (out[0]->numel() == 0) return;
  // unequal or negative begin/end pads: compute the natural result (no pads) and pad it to
  // the output (negative pads crop, positive ones, from output_shape, add zeros)
  bool asym = false;
  for (int i = 0; i < 3; ++i) asym = asym || g.pb[i] != g.pe[i] || g.pb[i] < 0;
  const Shape& os = out[0]->shape;
  Shape full = os;
  std::vector<int64_t> begin(os.size(), 0), end(os.size(), 0);
  if (asym) {
    for (int i = g.first(); i < 3; ++i) {
      const size_t d = 2 + i - g.first();
      full[d] = os[d] + g.pb[i] + g.pe[i];
      begin[d] = -g.pb[i];
      end[d] = -g.pe[i];
      g.pb[i] = g.pe[i] = 0;
    }
  }
  const ConvPlan& p = conv_plan(n, g, full, w.shape, x.shape);
  const size_t full_bytes = asym ? ((size_t)numel(full) * 4 + 255) / 256 * 256 : 0;
  uint8_t* ws = (uint8_t*)workspace(full_bytes + p.ws + 256);
  float* y = asym ? (float*)ws : out[0]->data<float>();
  const float one = 1.f, zero = 0.f;
  CUDNN_CHECK(cudnnConvolutionBackwardData(ctx().dnn, &one, p.w, w.data<float>(), p.y, x.data<float>(), p.conv,
                                           (cudnnConvolutionBwdDataAlgo_t)p.algo, ws + full_bytes, p.ws, &zero, p.x,
                                           y));
  if (asym) {
    PadIndex pi;
    NCHECK(make_pad(full, begin, end, PadMode::Constant, &pi), "too many dims");
    launch_pad(pi, out[0]->numel(), y, out[0]->data<float>(), 0.f);
  }
  launch_bias_act(out[0]->data<float>(), bias ? bias->data<float>() : nullptr, os[0], os[1],
                  out[0]->numel() / std::max<int64_t>(os[0] * os[1], 1), false);
}

// ================================================================ backward
// Same contract as the CPU backward kernels (engine/ir/ops.h BackwardFn): gin[i] is overwritten,
// a missing gout is zero.
using Gouts = std::vector<const Tensor*>;
using Gins = std::vector<Tensor*>;

void zero_all(const Gins& gin) {
  for (Tensor* t : gin) launch_zero(t);
}
Tensor* gin_at(const Gins& gin, size_t i) { return i < gin.size() ? gin[i] : nullptr; }

// Column-major C (m x n, ldc m) = beta C + the sum over b < nb of op(A + b sa) op(B + b sb), each
// product over a reduction of kk: the products as strided-batched partials (in groups whose
// partials take at most 16 MB), summed by a product with a vector of ones. One launch per group
// instead of one per product; fixed groups and calls: deterministic.
void gemm_sum(cublasOperation_t opA, cublasOperation_t opB, int64_t m, int64_t n, int64_t kk, const float* A,
              int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, int64_t nb, float* C, float beta) {
  const float one = 1.f, zero = 0.f;
  const int64_t G = std::clamp<int64_t>(((int64_t)1 << 22) / std::max<int64_t>(m * n, 1), 1, nb);
  if (G == 1) {  // one product at a time, accumulated in C
    for (int64_t b = 0; b < nb; ++b) {
      const float bt = b == 0 ? beta : 1.f;
      CUBLAS_CHECK(cublas().gemm_ex(ctx().blas, opA, opB, (int)m, (int)n, (int)kk, &one, A + b * sa, CUDA_R_32F,
                                    (int)lda, B + b * sb, CUDA_R_32F, (int)ldb, &bt, C, CUDA_R_32F, (int)m,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return;
  }
  Scratch part(G * m * n * sizeof(float)), ones(G * sizeof(float));
  train_kernels().fill(ones.f(), G, 1.f);
  for (int64_t b0 = 0; b0 < nb; b0 += G) {
    const int64_t g = std::min(G, nb - b0);
    const float bt = b0 == 0 ? beta : 1.f;
    CUBLAS_CHECK(cublas().gemm_strided_batched_ex(ctx().blas, opA, opB, (int)m, (int)n, (int)kk, &one, A + b0 * sa,
                                                  CUDA_R_32F, (int)lda, sa, B + b0 * sb, CUDA_R_32F, (int)ldb, sb, &zero,
                                                  part.f(), CUDA_R_32F, (int)m, m * n, (int)g, CUBLAS_COMPUTE_32F,
                                                  CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublas().gemm_ex(ctx().blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)(m * n), 1, (int)g, &one, part.f(),
                                  CUDA_R_32F, (int)(m * n), ones.f(), CUDA_R_32F, (int)g, &bt, C, CUDA_R_32F,
                                  (int)(m * n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// Column-major C (m x n) = beta C + op(A) op(B) with a long reduction (length kk) and few outputs
// (a weight gradient summed over every pixel), which one cuBLAS call runs on too few blocks: the
// reduction in chunks of at least 2048 (at most 64), summed by gemm_sum. a_step, b_step: floats
// between neighbouring reduction indices of A and B.
void gemm_long_reduction(cublasOperation_t opA, cublasOperation_t opB, int64_t m, int64_t n, int64_t kk, const float* A,
                         int64_t lda, int64_t a_step, const float* B, int64_t ldb, int64_t b_step, float* C, float beta) {
  const int64_t S = std::clamp<int64_t>(kk / 2048, 1, 64), c = (kk + S - 1) / S, full = kk / c, rem = kk - full * c;
  gemm_sum(opA, opB, m, n, c, A, lda, c * a_step, B, ldb, c * b_step, full, C, beta);
  if (rem) gemm_sum(opA, opB, m, n, rem, A + full * c * a_step, lda, 0, B + full * c * b_step, ldb, 0, 1, C, 1.f);
}

// Linear: Y (P, N, Q) = W (N, K) X (P, K, Q) + b, with activation "gelu" Y = GELU(Z) of that
// Z, which the backward recomputes (as the CPU's: the pre-activation is not kept) to take
// gZ = gY GELU'(Z) through the product.
void linear_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  const std::string act = n.s("activation", "");
  NCHECK(act.empty() || act == "gelu", "no cuda backward for activation '", act, "'");
  const Tensor& x = *in[0];
  const Tensor& w = *in[1];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  const int64_t K = x.shape[axis], N = w.shape[0];
  int64_t P = 1, Q = 1;
  for (int64_t d = 0; d < axis; ++d) P *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) Q *= x.shape[d];
  const float* gy = gout[0]->data<float>();
  Tensor *gx = gin[0], *gw = gin_at(gin, 1), *gb = gin_at(gin, 2);
  if (P * Q == 0 || N == 0 || K == 0) return zero_all(gin);
  Scratch gz(act.empty() ? 0 : P * N * Q * sizeof(float));
  if (!act.empty()) {  // Z again, as the forward made it, then gZ in its place
    const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
    linear_product(x.data<float>(), w.data<float>(), bias ? bias->data<float>() : nullptr, P, N, K, Q, gz.f(), false,
                   n.s("precision", "") == "bf16");
    launch_gelu_grad(gz.f(), gy, gz.f(), P * N * Q);
    gy = gz.f();
  }
  if (Q == 1) {
    if (gx) gemm_rowmajor(1, P, K, N, gy, false, 0, w.data<float>(), false, 0, gx->data<float>(), 0);  // gY W
    // gW (N, K) = gY^T X, summed over the P rows: column-major gW^T (K x N) = X^T (K x P) gY (P x N)
    if (gw) gemm_long_reduction(CUBLAS_OP_N, CUBLAS_OP_T, K, N, P, x.data<float>(), K, K, gy, N, N, gw->data<float>(), 0.f);
  } else {
    if (gx)  // per p: gX_p (K, Q) = W^T gY_p
      gemm_rowmajor(P, K, Q, N, w.data<float>(), true, 0, gy, false, N * Q, gx->data<float>(), K * Q);
    // sum over p of gY_p (N, Q) X_p^T: column-major gW^T (K x N) = sum_p X_p^T (K x Q) gY_p (Q x N); one
    // image: its pixels in chunks; many small ones (window tokens): batched over p
    if (gw && P == 1)
      gemm_long_reduction(CUBLAS_OP_T, CUBLAS_OP_N, K, N, Q, x.data<float>(), Q, 1, gy, Q, 1, gw->data<float>(), 0.f);
    else if (gw)
      gemm_sum(CUBLAS_OP_T, CUBLAS_OP_N, K, N, Q, x.data<float>(), Q, K * Q, gy, Q, N * Q, P, gw->data<float>(), 0.f);
  }
  if (gb) launch_sum_to(n, gy, {P, N, Q}, gb->data<float>(), {N, 1});
}

// MatMul with batch dims equal or one side a single matrix (as the forward's batched path).
void matmul_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  Shape a = in[0]->shape, b = in[1]->shape;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
  const int64_t ba = numel(Shape(a.begin(), a.end() - 2)), bb = numel(Shape(b.begin(), b.end() - 2));
  const int64_t batch = out[0]->numel() / std::max<int64_t>(M * N, 1);
  NCHECK((ba == batch || ba == 1) && (bb == batch || bb == 1), "no cuda backward for partly broadcast batch dims ",
         shape_str(in[0]->shape), " x ", shape_str(in[1]->shape));
  if (out[0]->numel() == 0 || K == 0) return zero_all(gin);
  const float* gy = gout[0]->data<float>();
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  if (Tensor* ga = gin[0]) {  // gA_b (M, K) = gY_b B_b^T, summed over b when A is shared
    if (ba == batch)
      gemm_rowmajor(batch, M, K, N, gy, false, M * N, B, true, bb == 1 ? 0 : K * N, ga->data<float>(), M * K);
    else
      for (int64_t i = 0; i < batch; ++i)
        gemm_rowmajor(1, M, K, N, gy + i * M * N, false, 0, B + (bb == 1 ? 0 : i * K * N), true, 0, ga->data<float>(),
                      0, 1.f, i == 0 ? 0.f : 1.f);
  }
  if (Tensor* gb = gin_at(gin, 1)) {  // gB_b (K, N) = A_b^T gY_b, summed over b when B is shared
    if (bb == batch)
      gemm_rowmajor(batch, K, N, M, A, true, ba == 1 ? 0 : M * K, gy, false, M * N, gb->data<float>(), K * N);
    else if (ba == batch)  // A and gY stacked: (batch M, K)^T (batch M, N)
      gemm_rowmajor(1, K, N, batch * M, A, true, 0, gy, false, 0, gb->data<float>(), 0);
    else
      for (int64_t i = 0; i < batch; ++i)
        gemm_rowmajor(1, K, N, M, A, true, 0, gy + i * M * N, false, 0, gb->data<float>(), 0, 1.f, i == 0 ? 0.f : 1.f);
  }
}

// Gemm: Y = alpha A' B' + beta C, A' = A or A^T, B' = B or B^T.
void gemm_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const float alpha = n.f("alpha", 1.f), beta = n.f("beta", 1.f);
  const Tensor &A = *in[0], &B = *in[1];
  const int64_t M = ta ? A.shape[1] : A.shape[0], K = ta ? A.shape[0] : A.shape[1];
  const int64_t N = tb ? B.shape[0] : B.shape[1];
  const float* gy = gout[0]->data<float>();
  if (M * N == 0 || K == 0) return zero_all(gin);
  if (Tensor* ga = gin[0]) {
    if (!ta)  // gA (M, K) = alpha gY B'^T
      gemm_rowmajor(1, M, K, N, gy, false, 0, B.data<float>(), !tb, 0, ga->data<float>(), 0, alpha);
    else  // gA (K, M) = alpha B' gY^T
      gemm_rowmajor(1, K, M, N, B.data<float>(), tb, 0, gy, true, 0, ga->data<float>(), 0, alpha);
  }
  if (Tensor* gb = gin_at(gin, 1)) {
    if (!tb)  // gB (K, N) = alpha A'^T gY
      gemm_rowmajor(1, K, N, M, A.data<float>(), !ta, 0, gy, false, 0, gb->data<float>(), 0, alpha);
    else  // gB (N, K) = alpha gY^T A'
      gemm_rowmajor(1, N, K, M, gy, true, 0, A.data<float>(), ta, 0, gb->data<float>(), 0, alpha);
  }
  if (Tensor* gc = gin_at(gin, 2)) launch_sum_to(n, gy, {M, N}, gc->data<float>(), in[2]->shape, beta);
}

// Einsum: the gradient of operand k is itself an einsum of the output gradient and the other
// operands ("ab,bc->ac": gA = "ac,bc->ab" (gY, B)), run by the forward kernel. Needs every
// letter of operand k, each once, in the output or another operand.
void einsum_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  const cpu::EinsumEq eq = cpu::parse_einsum(n, in.size());
  NCHECK(in.size() <= 2, "no cuda backward for an einsum of ", in.size(), " operands");
  for (size_t k = 0; k < in.size(); ++k) {
    if (!gin[k]) continue;
    std::string others = eq.out;
    Ins args{gout[0]};
    for (size_t j = 0; j < in.size(); ++j)
      if (j != k) {
        others += "," + eq.in[j];
        args.push_back(in[j]);
      }
    std::string seen;
    for (char c : eq.in[k]) {
      NCHECK(seen.find(c) == std::string::npos, "no cuda backward for a repeated letter in '", eq.in[k], "'");
      NCHECK(others.find(c) != std::string::npos, "no cuda backward for letter '", c,
             "' summed within one operand");
      seen.push_back(c);
    }
    Node g = n;
    g.attrs["equation"] = attr_s(others + "->" + eq.in[k]);
    einsum_op(g, args, {gin[k]});
  }
}

// cuDNN algorithms for the backward passes of a plan, picked once per plan: deterministic and
// float32 FMA math, as the forward's.
struct BwdAlgos {
  Algo fwd, data, filter;
};
std::map<const ConvPlan*, BwdAlgos>& bwd_algos() {
  static std::map<const ConvPlan*, BwdAlgos> m;
  return m;
}

Algo algo_for(const Node& n, const ConvPlan& p, Pass pass) {
  std::lock_guard<std::mutex> lk(plan_mu);
  BwdAlgos& b = bwd_algos()[&p];
  Algo& a = pass == Pass::Fwd ? b.fwd : pass == Pass::Data ? b.data : b.filter;
  if (a.algo >= 0) return a;
  const bool ok = find_algo(p, pass, false, &a);
  if (!ok) {
    a.algo = -1;
    NCHECK(false, "cuDNN has no deterministic float32 (FMA) algorithm for this convolution's backward pass");
  }
  return a;
}

// Bias gradient of a conv output y (N, C, spatial...): summed over N and the spatial dims.
void conv_bias_bw(const Node& n, const Tensor& gy, Tensor* gb) {
  if (!gb) return;
  const Shape& s = gy.shape;
  const int64_t N = s[0], C = s[1], S = gy.numel() / std::max<int64_t>(N * C, 1);
  launch_sum_to(n, gy.data<float>(), {N, C, S}, gb->data<float>(), {C, 1});
}

// Conv: gx = cuDNN backward data, gw = cuDNN backward filter (on the explicitly padded input
// when the pads are asymmetric, as the forward), gb = gY summed.
void conv_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  const Tensor &x = *in[0], &w = *in[1];
  cpu::ConvGeom g = cpu::conv_geometry(n, x.shape, w.shape, false);
  if (out[0]->numel() == 0) return zero_all(gin);
  bool asym = false;
  for (int i = 0; i < 3; ++i) asym = asym || g.pb[i] != g.pe[i];
  Shape xs = x.shape;
  std::vector<int64_t> begin(x.rank(), 0), end(x.rank(), 0);
  if (asym)
    for (int d = 2; d < x.rank(); ++d) {
      const int a = g.first() + d - 2;
      begin[d] = g.pb[a];
      end[d] = g.pe[a];
      xs[d] = x.shape[d] + begin[d] + end[d];
      g.pb[a] = g.pe[a] = 0;
    }
  const ConvPlan& p = conv_plan(n, g, xs, w.shape, out[0]->shape);
  const float one = 1.f, zero = 0.f;
  const float* dy = gout[0]->data<float>();
  if (Tensor* gx = gin[0]) {
    const Algo a = algo_for(n, p, Pass::Data);
    Scratch ws(a.ws), full(asym ? numel(xs) * sizeof(float) : 0);
    float* dx = asym ? full.f() : gx->data<float>();
    CUDNN_CHECK(cudnnConvolutionBackwardData(ctx().dnn, &one, p.w, w.data<float>(), p.y, dy, p.conv,
                                             (cudnnConvolutionBwdDataAlgo_t)a.algo, ws.p, a.ws, &zero, p.x, dx));
    if (asym) {  // crop the padded gradient back to x
      std::vector<int64_t> nb(begin.size()), ne(end.size());
      for (size_t d = 0; d < begin.size(); ++d) {
        nb[d] = -begin[d];
        ne[d] = -end[d];
      }
      PadIndex c;
      NCHECK(make_pad(xs, nb, ne, PadMode::Constant, &c), "too many dims");
      launch_pad(c, x.numel(), dx, gx->data<float>(), 0.f);
    }
  }
  if (Tensor* gw = gin_at(gin, 1)) {
    const Algo a = algo_for(n, p, Pass::Filter);
    Scratch ws(a.ws), padded(asym ? numel(xs) * sizeof(float) : 0);
    const float* xp = x.data<float>();
    if (asym) {
      PadIndex pi;
      NCHECK(make_pad(x.shape, begin, end, PadMode::Constant, &pi), "too many dims");
      launch_pad(pi, numel(xs), xp, padded.f(), 0.f);
      xp = padded.f();
    }
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx().dnn, &one, p.x, xp, p.y, dy, p.conv,
                                               (cudnnConvolutionBwdFilterAlgo_t)a.algo, ws.p, a.ws, &zero, p.w,
                                               gw->data<float>()));
  }
  conv_bias_bw(n, *gout[0], gin_at(gin, 2));
}

// ConvTranspose (forward = cuDNN backward data from x to the natural output `full`, then
// cropped or padded to the output): gx = cuDNN forward conv of gY (padded back to `full`),
// gw = cuDNN backward filter with gY as the conv's input and x as its output gradient.
void conv_transpose_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_all(gin);
  require_f32(n, in);
  const Tensor &x = *in[0], &w = *in[1];
  cpu::ConvGeom g = cpu::conv_geometry(n, x.shape, w.shape, true);
  const Shape& os = out[0]->shape;
  if (out[0]->numel() == 0) return zero_all(gin);
  bool asym = false;
  for (int i = 0; i < 3; ++i) asym = asym || g.pb[i] != g.pe[i] || g.pb[i] < 0;
  Shape full = os;
  std::vector<int64_t> begin(os.size(), 0), end(os.size(), 0);  // full -> gY's reverse: pad by the crop
  if (asym)
    for (int i = g.first(); i < 3; ++i) {
      const size_t d = 2 + i - g.first();
      full[d] = os[d] + g.pb[i] + g.pe[i];
      begin[d] = g.pb[i];
      end[d] = g.pe[i];
      g.pb[i] = g.pe[i] = 0;
    }
  const ConvPlan& p = conv_plan(n, g, full, w.shape, x.shape);
  Scratch gfull(asym ? numel(full) * sizeof(float) : 0);
  const float* dy = gout[0]->data<float>();
  if (asym) {
    PadIndex pi;
    NCHECK(make_pad(os, begin, end, PadMode::Constant, &pi), "too many dims");
    launch_pad(pi, numel(full), dy, gfull.f(), 0.f);
    dy = gfull.f();
  }
  const float one = 1.f, zero = 0.f;
  if (Tensor* gx = gin[0]) {
    const Algo a = algo_for(n, p, Pass::Fwd);
    Scratch ws(a.ws);
    CUDNN_CHECK(cudnnConvolutionForward(ctx().dnn, &one, p.x, dy, p.w, w.data<float>(), p.conv,
                                        (cudnnConvolutionFwdAlgo_t)a.algo, ws.p, a.ws, &zero, p.y,
                                        gx->data<float>()));
  }
  if (Tensor* gw = gin_at(gin, 1)) {
    const Algo a = algo_for(n, p, Pass::Filter);
    Scratch ws(a.ws);
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx().dnn, &one, p.x, dy, p.y, x.data<float>(), p.conv,
                                               (cudnnConvolutionBwdFilterAlgo_t)a.algo, ws.p, a.ws, &zero, p.w,
                                               gw->data<float>()));
  }
  conv_bias_bw(n, *gout[0], gin_at(gin, 2));
}

}  // namespace

void register_linalg(TableBackend& b) {
  b.register_kernel("Linear", linear_op);
  b.register_kernel("MatMul", matmul_op);
  b.register_kernel("Gemm", gemm_op);
  b.register_kernel("Einsum", einsum_op);
  b.register_kernel("Conv", conv_op);
  b.register_kernel("ConvTranspose", conv_transpose_op);
  b.register_kernel("WindowAttention", window_attention_op);
  b.register_backward("Linear", linear_bw);
  b.register_backward("MatMul", matmul_bw);
  b.register_backward("Gemm", gemm_bw);
  b.register_backward("Einsum", einsum_bw);
  b.register_backward("Conv", conv_bw);
  b.register_backward("ConvTranspose", conv_transpose_bw);
}

}  // namespace wxe::cuda
