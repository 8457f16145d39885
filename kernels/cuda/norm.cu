// CUDA kernels that reduce: Reduce*, Softmax, InstanceNormalization, GroupNormalization,
// LayerNormalization, ChannelLayerNorm (the fused CREDIT channel LayerNorm), and the generic
// Einsum (any equation; linalg.cpp sends the matmul-shaped ones to cuBLAS). Sums accumulate in
// double where the CPU reference does, so both backends agree to float rounding.
#include <cfloat>

#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

// ---------------------------------------------------------------- Reduce*
enum class Red : int { Sum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp };

__global__ void reduce_kernel(Red kind, ReduceIndex r, int64_t nout, const float* x, float* y) {
  const int64_t nred = r.red.count;
  GRID_LOOP(i, nout) {
    double acc = kind == Red::Prod ? 1.0 : 0.0;
    float mx = -FLT_MAX, mn = FLT_MAX;
    if (kind == Red::LogSumExp)
      for (int64_t j = 0; j < nred; ++j) mx = fmaxf(mx, x[reduce_offset(r, i, j)]);
    for (int64_t j = 0; j < nred; ++j) {
      const float v = x[reduce_offset(r, i, j)];
      switch (kind) {
        case Red::Sum: case Red::Mean: case Red::LogSum: acc += v; break;
        case Red::Max: mx = fmaxf(mx, v); break;
        case Red::Min: mn = fminf(mn, v); break;
        case Red::Prod: acc *= v; break;
        case Red::L1: acc += fabs((double)v); break;
        case Red::L2: case Red::SumSquare: acc += (double)v * v; break;
        case Red::LogSumExp: acc += exp((double)v - mx); break;
      }
    }
    float out = 0;
    switch (kind) {
      case Red::Mean: out = (float)(acc / (double)nred); break;
      case Red::Max: out = mx; break;
      case Red::Min: out = mn; break;
      case Red::L2: out = (float)sqrt(acc); break;
      case Red::LogSum: out = (float)log(acc); break;
      case Red::LogSumExp: out = (float)(mx + log(acc)); break;
      default: out = (float)acc;
    }
    y[i] = out;
  }
}

Red red_kind(const std::string& op) {
  if (op == "ReduceSum") return Red::Sum;
  if (op == "ReduceMean") return Red::Mean;
  if (op == "ReduceMax") return Red::Max;
  if (op == "ReduceMin") return Red::Min;
  if (op == "ReduceProd") return Red::Prod;
  if (op == "ReduceL1") return Red::L1;
  if (op == "ReduceL2") return Red::L2;
  if (op == "ReduceSumSquare") return Red::SumSquare;
  if (op == "ReduceLogSum") return Red::LogSum;
  return Red::LogSumExp;
}

void reduce_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, {in[0]});
  const Tensor& x = *in[0];
  const int r = x.rank();
  std::vector<int64_t> axes;
  if (in.size() > 1 && in[1]) axes = in[1]->to_i64();
  else if (n.has("axes")) axes = n.ints("axes");
  if (axes.empty() && n.i("noop_with_empty_axes", 0)) {  // the input as it is (as the CPU kernel)
    Walk w;
    make_walk({x.numel()}, {1}, {1}, 0, 0, &w);
    launch_copy(w, x.raw(), out[0]->raw(), 4);
    return;
  }
  std::vector<bool> reduced(r, axes.empty());
  for (int64_t a : axes) reduced[norm_axis(a, r, n)] = true;
  ReduceIndex ri;
  NCHECK(make_reduce(x.shape, reduced, &ri), "too many dims");
  const int64_t nout = out[0]->numel();
  if (nout == 0) return;
  reduce_kernel<<<blocks_for(nout), kThreads, 0, ctx().stream>>>(red_kind(n.op), ri, nout, x.data<float>(),
                                                                 out[0]->data<float>());
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- block reductions
__device__ double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += shared[w];
  return t;
}

// ---------------------------------------------------------------- Softmax
// Rows along the softmax axis with inner == 1: one warp per row.
__global__ void softmax_rows(int64_t rows, int64_t len, const float* x, float* y) {
  const int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* a = x + row * len;
  float* b = y + row * len;
  float m = -INFINITY;
  for (int64_t k = lane; k < len; k += 32) m = fmaxf(m, a[k]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  double s = 0;
  for (int64_t k = lane; k < len; k += 32) {
    const float e = expf(a[k] - m);
    b[k] = e;
    s += e;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  const float inv = (float)(1.0 / s);
  for (int64_t k = lane; k < len; k += 32) b[k] *= inv;
}

// inner > 1: one thread per (outer, inner) position, walking the axis with stride inner.
__global__ void softmax_strided(int64_t outer, int64_t len, int64_t inner, const float* x, float* y) {
  GRID_LOOP(t, outer * inner) {
    const int64_t o = t / inner, i = t % inner;
    const float* a = x + o * len * inner + i;
    float* b = y + o * len * inner + i;
    float m = -INFINITY;
    for (int64_t k = 0; k < len; ++k) m = fmaxf(m, a[k * inner]);
    double s = 0;
    for (int64_t k = 0; k < len; ++k) {
      const float e = expf(a[k * inner] - m);
      b[k * inner] = e;
      s += e;
    }
    const float inv = (float)(1.0 / s);
    for (int64_t k = 0; k < len; ++k) b[k * inner] *= inv;
  }
}

void softmax_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t len = x.rank() ? x.shape[axis] : 1;
  if (x.numel() == 0) return;
  if (inner == 1) {
    const int warps = kThreads / 32;
    softmax_rows<<<(unsigned)((outer + warps - 1) / warps), kThreads, 0, ctx().stream>>>(outer, len, x.data<float>(),
                                                                                        out[0]->data<float>());
  } else {
    softmax_strided<<<blocks_for(outer * inner), kThreads, 0, ctx().stream>>>(outer, len, inner, x.data<float>(),
                                                                              out[0]->data<float>());
  }
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- group / instance / layer norm
// One block per group of M contiguous elements; parameters per channel (cpg channels of S
// elements per group) or per group (per_channel false), or none (g == nullptr: LayerNorm
// passes per-element parameters via pe_g/pe_b).
__global__ void group_norm_kernel(const float* x, float* y, int64_t G, int64_t M, int64_t S, int64_t cpg,
                                  bool per_channel, float eps, const float* g, const float* b,
                                  const float* pe_g, const float* pe_b, float* mean_out, float* inv_out) {
  __shared__ double shared[32];
  const int64_t ng = blockIdx.x;
  const float* a = x + ng * M;
  float* o = y + ng * M;
  double s = 0;
  for (int64_t k = threadIdx.x; k < M; k += blockDim.x) s += a[k];
  const double mean = M ? block_sum(s, shared) / M : 0;
  double v = 0;
  for (int64_t k = threadIdx.x; k < M; k += blockDim.x) v += (a[k] - mean) * (a[k] - mean);
  const double var = M ? block_sum(v, shared) / M : 0;
  const float inv = (float)(1.0 / sqrt(var + eps));
  const float m = (float)mean;
  if (threadIdx.x == 0 && mean_out) mean_out[ng] = m;
  if (threadIdx.x == 0 && inv_out) inv_out[ng] = inv;
  const int64_t grp = ng % G;
  for (int64_t k = threadIdx.x; k < M; k += blockDim.x) {
    float gs = 1.f, bs = 0.f;
    if (g) {
      const int64_t pi = per_channel ? grp * cpg + k / S : grp;
      gs = g[pi];
      bs = b[pi];
    } else if (pe_g) {
      gs = pe_g[k];
      bs = pe_b ? pe_b[k] : 0.f;
    }
    o[k] = (a[k] - m) * inv * gs + bs;
  }
}

void group_norm(const Node& n, const Tensor& x, Tensor& y, int64_t G, float eps, const Tensor& g, const Tensor& b) {
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel() / std::max<int64_t>(N * C, 1);
  NCHECK(G > 0 && C % G == 0, "groups ", G, " do not divide ", C, " channels");
  const int64_t cpg = C / G;
  NCHECK(g.numel() == b.numel() && (g.numel() == C || g.numel() == G), "scale and bias must have ", C, " or ", G,
         " values");
  if (x.numel() == 0) return;
  group_norm_kernel<<<(unsigned)(N * G), kThreads, 0, ctx().stream>>>(
      x.data<float>(), y.data<float>(), G, cpg * S, S, cpg, g.numel() == C, eps, g.data<float>(), b.data<float>(),
      nullptr, nullptr, nullptr, nullptr);
  CUDA_LAUNCHED();
}

void instnorm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  group_norm(n, *in[0], *out[0], in[0]->shape[1], n.f("epsilon", 1e-5f), *in[1], *in[2]);
}

void groupnorm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  group_norm(n, *in[0], *out[0], n.i("num_groups", 0), n.f("epsilon", 1e-5f), *in[1], *in[2]);
}

// LayerNormalization over axes [axis, rank): rows of M elements; scale and bias broadcast to
// the normalized dims (expanded into the workspace when smaller); optional Mean and
// InvStdDev outputs, one value per row.
void layernorm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor& x = *in[0];
  const int64_t axis = norm_axis(n.i("axis", -1), x.rank(), n);
  int64_t rows = 1, M = 1;
  for (int64_t d = 0; d < x.rank(); ++d) (d < axis ? rows : M) *= x.shape[d];
  const Tensor* b = in.size() > 2 ? in[2] : nullptr;
  if (x.numel() == 0) return;
  const Shape inner(x.shape.begin() + axis, x.shape.end());
  float* ws = (float*)workspace(2 * M * sizeof(float));
  auto expanded = [&](const Tensor* t, float* dst) -> const float* {
    if (!t || t->numel() == M) return t ? t->data<float>() : nullptr;
    NCHECK(t->rank() <= (int)inner.size(), "scale/bias ", shape_str(t->shape), " does not broadcast to ",
           shape_str(inner));
    Walk w;
    NCHECK(make_walk(inner, broadcast_strides(t->shape, inner), strides_of(inner), 0, 0, &w), "too many dims");
    launch_copy(w, t->raw(), dst, 4);
    return dst;
  };
  const float* g = expanded(in[1], ws);
  const float* bb = expanded(b, ws + M);
  float* mean = out.size() > 1 && out[1] ? out[1]->data<float>() : nullptr;
  float* inv = out.size() > 2 && out[2] ? out[2]->data<float>() : nullptr;
  group_norm_kernel<<<(unsigned)rows, kThreads, 0, ctx().stream>>>(x.data<float>(), out[0]->data<float>(), 1, M, M, 1,
                                                                   false, n.f("epsilon", 1e-5f), nullptr, nullptr, g,
                                                                   bb, mean, inv);
  CUDA_LAUNCHED();
}

// ChannelLayerNorm: x (N, C, S...), statistics over C per (n, s): one thread per position,
// channels strided by S (neighbouring threads read neighbouring addresses).
__global__ void channel_layernorm_kernel(const float* x, float* y, int64_t N, int64_t C, int64_t S, float eps,
                                         const float* g, const float* b) {
  GRID_LOOP(p, N * S) {
    const float* xp = x + (p / S) * C * S + p % S;
    float* yp = y + (p / S) * C * S + p % S;
    double s = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) s += xp[c * S];
    const double mean = s / C;
    for (int64_t c = 0; c < C; ++c) v += (xp[c * S] - mean) * (xp[c * S] - mean);
    const float inv = (float)(1.0 / sqrt(v / C + eps)), m = (float)mean;
    for (int64_t c = 0; c < C; ++c) yp[c * S] = (xp[c * S] - m) * inv * g[c] + b[c];
  }
}

void channel_layernorm_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const Tensor& x = *in[0];
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel() / std::max<int64_t>(N * C, 1);
  if (x.numel() == 0) return;
  channel_layernorm_kernel<<<blocks_for(N * S), kThreads, 0, ctx().stream>>>(
      x.data<float>(), out[0]->data<float>(), N, C, S, n.f("epsilon", 1e-5f), in[1]->data<float>(),
      in[2]->data<float>());
  CUDA_LAUNCHED();
}

__global__ void einsum_kernel(EinsumIndex e, int64_t total, const float* a, const float* b, const float* c, float* y) {
  GRID_LOOP(i, total) y[i] = einsum_at(e, a, b, c, i);
}

}  // namespace

void launch_einsum_generic(const EinsumIndex& e, const std::vector<const float*>& src, float* y, int64_t total) {
  if (total == 0) return;
  const float* s[3] = {nullptr, nullptr, nullptr};
  for (size_t i = 0; i < src.size() && i < 3; ++i) s[i] = src[i];
  einsum_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(e, total, s[0], s[1], s[2], y);
  CUDA_LAUNCHED();
}

void register_norm(TableBackend& b) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"})
    b.register_kernel(op, reduce_op, 0b10);
  b.register_kernel("Softmax", softmax_op);
  b.register_kernel("InstanceNormalization", instnorm_op);
  b.register_kernel("GroupNormalization", groupnorm_op);
  b.register_kernel("LayerNormalization", layernorm_op);
  b.register_kernel("ChannelLayerNorm", channel_layernorm_op);
}

}  // namespace wxe::cuda
