// Backward kernels of the CUDA backend for the ops that touch each element a bounded number of
// times: elementwise arithmetic with broadcasting, activations, the data-movement ops
// (Transpose, Slice, Concat, Split, DepthToSpace, Expand, Pad, Resize, Identity), Reduce*
// over sums, Softmax, and the normalizations (InstanceNormalization, GroupNormalization,
// LayerNormalization). Same contract as the CPU backward kernels (engine/ir/ops.h BackwardFn):
// gin[i] is overwritten, a missing gout is zero. Gradients of broadcast inputs are summed to
// their shape by a deterministic reduction (no atomics), so two runs give equal bits; only
// Pad with reflect/edge/wrap modes and Resize scatter with atomicAdd.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

using Gouts = std::vector<const Tensor*>;
using Gins = std::vector<Tensor*>;

void zero(Tensor* t) {
  if (t && t->nbytes()) CUDA_CHECK(cudaMemsetAsync(t->raw(), 0, t->nbytes(), ctx().stream));
}
void zero_from(const Gins& gin, size_t first) {
  for (size_t i = first; i < gin.size(); ++i) zero(gin[i]);
}

// ---------------------------------------------------------------- sum to a broadcast shape
// y (kept) = sum over the reduced elements of x (double accumulation, fixed order).
__global__ void sum_thread_kernel(ReduceIndex r, int64_t nout, const float* x, float* y, float scale) {
  GRID_LOOP(i, nout) {
    double acc = 0;
    for (int64_t j = 0; j < r.red.count; ++j) acc += x[reduce_offset(r, i, j)];
    y[i] = (float)(acc * scale);
  }
}

__device__ double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += shared[w];
  return t;
}

// One block per output element when the reduced extent is long.
__global__ void sum_block_kernel(ReduceIndex r, const float* x, float* y, float scale) {
  __shared__ double sh[32];
  const int64_t i = blockIdx.x;
  double acc = 0;
  for (int64_t j = threadIdx.x; j < r.red.count; j += blockDim.x) acc += x[reduce_offset(r, i, j)];
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) y[i] = (float)(acc * scale);
}

void sum_to(const Node& n, const float* full, const Shape& from, float* dst, const Shape& to, float scale = 1.f) {
  const int64_t total = numel(from), nout = numel(to);
  if (nout == 0) return;
  if (total == nout && scale == 1.f) {
    if (full != dst) CUDA_CHECK(cudaMemcpyAsync(dst, full, total * 4, cudaMemcpyDeviceToDevice, ctx().stream));
    return;
  }
  ReduceIndex ri;
  NCHECK(make_sum_to(from, to, &ri), "cannot sum ", shape_str(from), " to ", shape_str(to), " (too many dims?)");
  if (ri.red.count >= 256 && nout <= 65535LL * 32)
    sum_block_kernel<<<(unsigned)nout, kThreads, 0, ctx().stream>>>(ri, full, dst, scale);
  else
    sum_thread_kernel<<<blocks_for(nout), kThreads, 0, ctx().stream>>>(ri, nout, full, dst, scale);
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- binary arithmetic
enum class Bin : int { Add, Sub, Mul, Div, Pow, Max, Min };

Bin bin_of(const std::string& op) {
  if (op == "Add") return Bin::Add;
  if (op == "Sub") return Bin::Sub;
  if (op == "Mul") return Bin::Mul;
  if (op == "Div") return Bin::Div;
  if (op == "Pow") return Bin::Pow;
  if (op == "Max") return Bin::Max;
  return Bin::Min;
}

// dL/da (k = 0) or dL/db (k = 1) of out = a OP b, as kernels/cpu/backward_pointwise.cpp.
__device__ inline float binary_grad(Bin op, int k, double a, double b, double g) {
  switch (op) {
    case Bin::Add: return (float)g;
    case Bin::Sub: return (float)(k == 0 ? g : -g);
    case Bin::Mul: return (float)(k == 0 ? g * b : g * a);
    case Bin::Div: return (float)(k == 0 ? g / b : -g * a / (b * b));
    case Bin::Pow:
      if (k == 0) return b == 0 ? 0.f : (float)(g * b * pow(a, b - 1));
      return a > 0 ? (float)(g * pow(a, b) * log(a)) : 0.f;
    case Bin::Max:
      if (a == b) return (float)(g / 2);
      return (k == 0) == (a > b) ? (float)g : 0.f;
    case Bin::Min:
      if (a == b) return (float)(g / 2);
      return (k == 0) == (a < b) ? (float)g : 0.f;
  }
  return 0.f;
}

// dst (output-shaped, contiguous) = the gradient of operand k at each output element.
__global__ void binary_grad_kernel(Bin op, int k, Walk w, const float* a, const float* b, const float* g,
                                   float* dst) {
  GRID_LOOP(i, w.count) {
    int64_t ia, ib;
    walk_offsets(w, i, &ia, &ib);
    dst[i] = binary_grad(op, k, a ? a[ia] : 0.f, b ? b[ib] : 0.f, g[i]);  // Add, Sub: no operands
  }
}

template <class T>
__global__ void to_float_kernel(int64_t n, const T* x, float* y) {
  GRID_LOOP(i, n) y[i] = (float)x[i];
}

void binary_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(in.size() == 2, "the cuda kernel takes 2 inputs, got ", in.size());
  if (!gout[0]) return zero_from(gin, 0);
  const Bin op = bin_of(n.op);
  const Shape& os = out[0]->shape;
  const int64_t total = numel(os);
  const Tensor& e = *in[1];
  const bool int_exp = op == Bin::Pow && (e.dtype == DType::I64 || e.dtype == DType::I32);
  require_f32(n, int_exp ? Ins{in[0]} : in);
  // Add's and Sub's operands are not kept for the backward (engine/ir/ops.h BackwardReads)
  const float* A = in[0]->defined() ? in[0]->data<float>() : nullptr;
  const float* B = int_exp || !in[1]->defined() ? nullptr : in[1]->data<float>();
  Scratch bf(int_exp ? e.numel() * sizeof(float) : 0);
  if (int_exp) {
    if (e.dtype == DType::I64)
      to_float_kernel<<<blocks_for(e.numel()), kThreads, 0, ctx().stream>>>(e.numel(), e.data<int64_t>(), bf.f());
    else
      to_float_kernel<<<blocks_for(e.numel()), kThreads, 0, ctx().stream>>>(e.numel(), e.data<int32_t>(), bf.f());
    CUDA_LAUNCHED();
    B = bf.f();
  }
  const Walk w = broadcast_walk(n, in[0]->shape, in[1]->shape, os);
  for (int k = 0; k < 2; ++k) {
    Tensor* gi = gin[k];
    if (!gi || gi->numel() == 0) continue;
    if (total == 0) {
      zero(gi);
      continue;
    }
    const bool direct = gi->numel() == total;  // same shape as the output: no sum
    Scratch tmp(direct ? 0 : total * sizeof(float));
    float* dst = direct ? gi->data<float>() : tmp.f();
    binary_grad_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(op, k, w, A, B, gout[0]->data<float>(), dst);
    CUDA_LAUNCHED();
    if (!direct) sum_to(n, dst, os, gi->data<float>(), in[k]->shape);
  }
}

// Sum(x0, x1, ...): each input gets the output gradient summed to its shape.
void sum_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gout[0]) return zero_from(gin, 0);
  for (size_t k = 0; k < in.size(); ++k)
    if (gin[k]) sum_to(n, gout[0]->data<float>(), out[0]->shape, gin[k]->data<float>(), in[k]->shape);
}

// ---------------------------------------------------------------- unary ops
enum class Un : int { Sqrt, Erf, Relu, Sigmoid, Tanh, Exp, Log, Neg, Abs, Reciprocal, Sin, Cos, Softplus, Gelu, GeluTanh };

Un un_of(const Node& n) {
  const std::string& op = n.op;
  if (op == "Sqrt") return Un::Sqrt;
  if (op == "Erf") return Un::Erf;
  if (op == "Relu") return Un::Relu;
  if (op == "Sigmoid") return Un::Sigmoid;
  if (op == "Tanh") return Un::Tanh;
  if (op == "Exp") return Un::Exp;
  if (op == "Log") return Un::Log;
  if (op == "Neg") return Un::Neg;
  if (op == "Abs") return Un::Abs;
  if (op == "Reciprocal") return Un::Reciprocal;
  if (op == "Sin") return Un::Sin;
  if (op == "Cos") return Un::Cos;
  if (op == "Softplus") return Un::Softplus;
  const std::string a = n.s("approximate", "none");
  NCHECK(a == "none" || a == "tanh", "unsupported approximate '", a, "'");
  return a == "tanh" ? Un::GeluTanh : Un::Gelu;
}

// dy/dx from x and y = f(x), as the CPU backward kernels compute it.
__device__ inline double unary_grad(Un op, double x, double y) {
  switch (op) {
    case Un::Sqrt: return 0.5 / y;
    case Un::Erf: return 1.1283791670955126 * exp(-x * x);
    case Un::Relu: return x > 0 ? 1 : 0;
    case Un::Sigmoid: return y * (1 - y);
    case Un::Tanh: return 1 - y * y;
    case Un::Exp: return y;
    case Un::Log: return 1 / x;
    case Un::Neg: return -1;
    case Un::Abs: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case Un::Reciprocal: return -y * y;
    case Un::Sin: return cos(x);
    case Un::Cos: return -sin(x);
    case Un::Softplus: return x > 20 ? 1 : 1 / (1 + exp(-x));
    case Un::Gelu: return 0.5 * (1 + erf(x * 0.70710678118654752)) + x * exp(-0.5 * x * x) * 0.3989422804014327;
    case Un::GeluTanh: {
      const double k = 0.7978845608028654, c = 0.044715;
      const double t = tanh(k * (x + c * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
    }
  }
  return 0;
}

// y: nullptr where the output was not kept (ops whose derivative needs only x: Erf, Gelu; engine/ir/ops.h
// BackwardReads)
__global__ void unary_grad_kernel(Un op, int64_t n, const float* x, const float* y, const float* g, float* gx) {
  GRID_LOOP(i, n) gx[i] = (float)(g[i] * unary_grad(op, x[i], y ? y[i] : 0.f));
}

void unary_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  require_f32(n, {in[0]});
  const int64_t total = in[0]->numel();
  if (total == 0) return;
  unary_grad_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(
      un_of(n), total, in[0]->data<float>(), out[0]->defined() ? out[0]->data<float>() : nullptr,
      gout[0]->data<float>(), gin[0]->data<float>());
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- data movement
// The forward walk read the input at side a and wrote the output at side b; the backward
// walk (index_math.h reversed_walk) reads the output gradient at side b and writes the input
// gradient at side a (the forward map is one-to-one for these ops: no collisions).
Walk reversed(const Walk& w) { return reversed_walk(w); }

void copy_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  zero_from(gin, 1);
  if (gin[0]->nbytes())
    CUDA_CHECK(cudaMemcpyAsync(gin[0]->raw(), gout[0]->raw(), gin[0]->nbytes(), cudaMemcpyDeviceToDevice, ctx().stream));
}

void transpose_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  const Tensor& x = *in[0];
  std::vector<int64_t> perm = n.ints("perm");
  if (!n.has("perm"))
    for (int64_t d = x.rank() - 1; d >= 0; --d) perm.push_back(d);
  NCHECK((int)perm.size() == x.rank(), "perm has ", perm.size(), " entries for rank ", x.rank());
  Walk w;
  NCHECK(transpose_walk(x.shape, perm, &w), "more than ", kMaxRank, " dims after merging");
  launch_copy(reversed(w), gout[0]->raw(), gin[0]->raw(), 4);
}

void slice_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);
  if (!gin[0]) return;
  zero(gin[0]);
  if (!gout[0] || out[0]->numel() == 0) return;
  const StridedView v = slice_view(n, in);  // gx[view] = gy
  Walk w;
  NCHECK(make_walk(v.shape, strides_of(v.shape), v.strides, 0, v.base, &w), "more than ", kMaxRank,
         " dims after merging");
  launch_copy(w, gout[0]->raw(), gin[0]->raw(), 4);
}

void concat_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const int64_t axis = norm_axis(n.i("axis", 0), out[0]->rank(), n);
  int64_t start = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (gin[k]) {
      if (gout[0])
        part_copy(n, *gout[0], *gin[k], axis, start, false);
      else
        zero(gin[k]);
    }
    start += in[k]->shape[axis];
  }
}

void split_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);
  if (!gin[0]) return;
  const int64_t axis = norm_axis(n.i("axis", 0), in[0]->rank(), n);
  bool all = true;
  for (const Tensor* g : gout) all = all && g;
  if (!all) zero(gin[0]);
  int64_t start = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    if (gout[k]) part_copy(n, *gin[0], *gout[k], axis, start, true);
    start += out[k]->shape[axis];
  }
}

void depth_to_space_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  const std::string mode = n.s("mode", "DCR");
  NCHECK(mode == "DCR" || mode == "CRD", "unsupported mode '", mode, "'");
  Walk w;
  NCHECK(depth_to_space_walk(in[0]->shape, n.i("blocksize", 0), mode == "CRD", &w), "too many dims");
  launch_copy(reversed(w), gout[0]->raw(), gin[0]->raw(), 4);
}

void expand_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  sum_to(n, gout[0]->data<float>(), out[0]->shape, gin[0]->data<float>(), in[0]->shape);
}

// Pad: every output element that reads an input element adds its gradient there (reflect,
// edge and wrap read some input elements more than once: atomics).
__global__ void pad_bw_kernel(PadIndex p, int64_t total, const float* g, float* gx) {
  GRID_LOOP(i, total) {
    const int64_t s = pad_offset(p, i);
    if (s >= 0) atomicAdd(gx + s, g[i]);
  }
}

PadMode pad_mode_of(cpu::PadMode m) {
  switch (m) {
    case cpu::PadMode::Constant: return PadMode::Constant;
    case cpu::PadMode::Reflect: return PadMode::Reflect;
    case cpu::PadMode::Edge: return PadMode::Edge;
    case cpu::PadMode::Wrap: return PadMode::Wrap;
  }
  return PadMode::Constant;
}

void pad_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(gin.size() < 3 || !gin[2], "no cuda backward for the pad value");
  zero_from(gin, 1);
  if (!gin[0]) return;
  zero(gin[0]);
  if (!gout[0]) return;
  const Tensor& x = *in[0];
  const bool pads_in = in.size() > 1 && in[1];
  const std::vector<int64_t> pads = pads_in ? in[1]->to_i64() : n.ints("pads");
  const std::vector<int64_t> axes = in.size() > 3 && in[3] ? in[3]->to_i64() : std::vector<int64_t>{};
  const cpu::PadPlan p = cpu::pad_plan(n, x.shape, pads, axes);
  PadIndex pi;
  NCHECK(make_pad(x.shape, p.begin, p.end, pad_mode_of(cpu::pad_mode(n)), &pi), "rank ", x.rank(), " > ", kMaxRank);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  pad_bw_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(pi, total, gout[0]->data<float>(),
                                                                  gin[0]->data<float>());
  CUDA_LAUNCHED();
}

// Resize: the transpose of the forward's taps (index_math.h resize_at), scattered.
__global__ void resize_bw_kernel(ResizeIndex r, int64_t total, const int64_t* idx, const float* w, const float* g,
                                 float* gx) {
  GRID_LOOP(i0, total) {
    int64_t c[kMaxRank];
    int64_t combos = 1, i = i0;
    for (int d = r.rank - 1; d >= 0; --d) {
      c[d] = i % r.out[d];
      i /= r.out[d];
      combos *= r.k[d];
    }
    const float gi = g[i0];
    for (int64_t t = 0; t < combos; ++t) {
      int64_t rem = t, off = 0;
      float wt = 1.f;
      for (int d = r.rank - 1; d >= 0; --d) {
        const int64_t e = r.tap[d] + c[d] * r.k[d] + rem % r.k[d];
        rem /= r.k[d];
        off += idx[e] * r.stride[d];
        wt *= w[e];
      }
      if (wt != 0.f) atomicAdd(gx + off, wt * gi);
    }
  }
}

void resize_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);
  if (!gin[0]) return;
  zero(gin[0]);
  if (!gout[0]) return;
  const ResizeTaps t = resize_taps(n, in, out[0]->shape);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  Scratch buf(t.bytes());
  t.upload(buf.p);
  resize_bw_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(t.r, total, (const int64_t*)buf.p,
                                                                     t.weights(buf.p), gout[0]->data<float>(),
                                                                     gin[0]->data<float>());
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- ReduceSum / ReduceMean
// gx = g broadcast back over the reduced axes (times 1/count for the mean).
__global__ void reduce_sum_bw_kernel(ReduceIndex r, int64_t nout, const float* g, float* gx, float scale) {
  GRID_LOOP(t, nout * r.red.count) {
    const int64_t i = t / r.red.count, j = t % r.red.count;
    gx[reduce_offset(r, i, j)] = g[i] * scale;
  }
}

void reduce_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  NCHECK(n.op == "ReduceSum" || n.op == "ReduceMean", "no cuda backward for ", n.op);
  zero_from(gin, 1);
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  const Tensor& x = *in[0];
  const int r = x.rank();
  std::vector<int64_t> axes;
  if (in.size() > 1 && in[1]) axes = in[1]->to_i64();
  else if (n.has("axes")) axes = n.ints("axes");
  if (axes.empty() && n.i("noop_with_empty_axes", 0)) return copy_bw(n, in, out, gout, gin);
  std::vector<bool> reduced(r, axes.empty());
  for (int64_t a : axes) reduced[norm_axis(a, r, n)] = true;
  ReduceIndex ri;
  NCHECK(make_reduce(x.shape, reduced, &ri), "too many dims");
  const int64_t nout = numel(out[0]->shape), total = x.numel();
  if (total == 0) return;
  const float scale = n.op == "ReduceMean" ? (float)(1.0 / (double)ri.red.count) : 1.f;
  reduce_sum_bw_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(ri, nout, gout[0]->data<float>(),
                                                                         gin[0]->data<float>(), scale);
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- Softmax
// gx = y * (g - sum_axis(g * y)); one thread per (outer, inner) line along the axis.
__global__ void softmax_bw_kernel(int64_t outer, int64_t len, int64_t inner, const float* y, const float* g,
                                  float* gx) {
  GRID_LOOP(t, outer * inner) {
    const int64_t o = t / inner, i = t % inner, base = o * len * inner + i;
    double s = 0;
    for (int64_t k = 0; k < len; ++k) s += (double)g[base + k * inner] * y[base + k * inner];
    for (int64_t k = 0; k < len; ++k) {
      const int64_t e = base + k * inner;
      gx[e] = (float)(y[e] * (g[e] - s));
    }
  }
}

// inner == 1: one warp per row.
__global__ void softmax_bw_rows(int64_t rows, int64_t len, const float* y, const float* g, float* gx) {
  const int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* yr = y + row * len;
  const float* gr = g + row * len;
  float* xr = gx + row * len;
  double s = 0;
  for (int64_t k = lane; k < len; k += 32) s += (double)gr[k] * yr[k];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  for (int64_t k = lane; k < len; k += 32) xr[k] = (float)(yr[k] * (gr[k] - s));
}

void softmax_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  if (!gin[0]) return;
  if (!gout[0]) return zero(gin[0]);
  const Shape& s = in[0]->shape;
  const int64_t axis = norm_axis(n.i("axis", -1), (int64_t)s.size(), n);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s.empty() ? 1 : s[axis];
  if (outer * inner * len == 0) return;
  const float* y = out[0]->data<float>();
  const float* g = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
  if (inner == 1) {
    const int64_t rows = outer, per_block = kThreads / 32;
    softmax_bw_rows<<<(unsigned)((rows + per_block - 1) / per_block), kThreads, 0, ctx().stream>>>(rows, len, y, g, gx);
  } else {
    softmax_bw_kernel<<<blocks_for(outer * inner), kThreads, 0, ctx().stream>>>(outer, len, inner, y, g, gx);
  }
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- normalizations
// Rows of M elements normalized by their own mean and variance (InstanceNormalization,
// GroupNormalization: a row is one (sample, group); LayerNormalization: one outer index). The
// affine scale and bias act per channel: element e of a row has channel ch(row, e), given by
// (row % groups) * cpg + e / S for the group norms (cpg channels of S elements per group), or
// e for LayerNormalization (scale over the normalized dims, cpg = 0).
// xhat = (x - mean) * rstd; gx = rstd * (gs - mean(gs) - xhat * mean(gs * xhat)), gs = g * scale.
struct NormIndex {
  int64_t M = 0;    // elements per row
  int64_t G = 1;    // rows per sample (groups); 1 for LayerNormalization
  int64_t S = 1;    // elements per channel within a row (group norms)
  int64_t cpg = 0;  // channels per group; 0: the scale is indexed by the element (LayerNormalization)
  float eps = 1e-5f;
};

__device__ inline int64_t norm_channel(const NormIndex& p, int64_t row, int64_t e) {
  return p.cpg ? (row % p.G) * p.cpg + e / p.S : e;
}

__global__ void norm_bw_rows(NormIndex p, const float* x, const float* scale, const float* g, float* gx) {
  __shared__ double sh[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * p.M;
  const float* gr = g + row * p.M;
  double s = 0, ss = 0;
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) s += xr[e];
  const double mean = block_sum(s, sh) / (double)p.M;
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) {
    const double d = xr[e] - mean;
    ss += d * d;
  }
  const double var = block_sum(ss, sh) / (double)p.M;
  const double rstd = 1.0 / sqrt(var + (double)p.eps);
  double a = 0, b = 0;  // sum gs, sum gs * xhat
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) {
    const double gs = (double)gr[e] * (scale ? scale[norm_channel(p, row, e)] : 1.f);
    a += gs;
    b += gs * (xr[e] - mean) * rstd;
  }
  a = block_sum(a, sh) / (double)p.M;
  b = block_sum(b, sh) / (double)p.M;
  if (!gx) return;
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) {
    const double gs = (double)gr[e] * (scale ? scale[norm_channel(p, row, e)] : 1.f);
    const double xh = (xr[e] - mean) * rstd;
    gx[row * p.M + e] = (float)(rstd * (gs - a - xh * b));
  }
}

// Per-row mean and rstd (for the scale gradient).
__global__ void norm_stats(NormIndex p, const float* x, float* mean_rstd) {
  __shared__ double sh[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * p.M;
  double s = 0, ss = 0;
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) s += xr[e];
  const double mean = block_sum(s, sh) / (double)p.M;
  for (int64_t e = threadIdx.x; e < p.M; e += blockDim.x) {
    const double d = xr[e] - mean;
    ss += d * d;
  }
  const double var = block_sum(ss, sh) / (double)p.M;
  if (threadIdx.x == 0) {
    mean_rstd[2 * row] = (float)mean;
    mean_rstd[2 * row + 1] = (float)(1.0 / sqrt(var + (double)p.eps));
  }
}

// Scale and bias gradients: one block per channel c, summing g * xhat and g over every
// element of that channel (rows r with channel c, elements e of the row).
// Group norms: channel c is in group c / cpg; rows n * G + c / cpg; elements (c % cpg) * S ..+S.
// LayerNormalization (cpg = 0): every row, element c.
__global__ void norm_affine_bw(NormIndex p, int64_t rows, const float* x, const float* g, const float* mean_rstd,
                               float* gscale, float* gbias) {
  __shared__ double sh[32];
  const int64_t c = blockIdx.x;
  double a = 0, b = 0;
  if (p.cpg) {
    const int64_t grp = c / p.cpg, e0 = (c % p.cpg) * p.S, nsamp = rows / p.G;
    for (int64_t t = threadIdx.x; t < nsamp * p.S; t += blockDim.x) {
      const int64_t row = (t / p.S) * p.G + grp, e = row * p.M + e0 + t % p.S;
      const double xh = (x[e] - mean_rstd[2 * row]) * mean_rstd[2 * row + 1];
      a += g[e] * xh;
      b += g[e];
    }
  } else {
    for (int64_t row = threadIdx.x; row < rows; row += blockDim.x) {
      const int64_t e = row * p.M + c;
      const double xh = (x[e] - mean_rstd[2 * row]) * mean_rstd[2 * row + 1];
      a += g[e] * xh;
      b += g[e];
    }
  }
  a = block_sum(a, sh);
  b = block_sum(b, sh);
  if (threadIdx.x == 0) {
    if (gscale) gscale[c] = (float)a;
    if (gbias) gbias[c] = (float)b;
  }
}

void norm_bw(const Node& n, const NormIndex& p, int64_t rows, int64_t channels, const Ins& in, const Gouts& gout,
             const Gins& gin) {
  Tensor* gs = gin.size() > 1 ? gin[1] : nullptr;
  Tensor* gb = gin.size() > 2 ? gin[2] : nullptr;
  if (!gout[0]) {
    zero_from(gin, 0);
    return;
  }
  if (rows * p.M == 0) return zero_from(gin, 1);
  const float* x = in[0]->data<float>();
  const float* scale = in.size() > 1 && in[1] ? in[1]->data<float>() : nullptr;
  const float* g = gout[0]->data<float>();
  if (gin[0]) {
    norm_bw_rows<<<(unsigned)rows, kThreads, 0, ctx().stream>>>(p, x, scale, g, gin[0]->data<float>());
    CUDA_LAUNCHED();
  }
  if (gs || gb) {
    Scratch st(rows * 2 * sizeof(float));
    norm_stats<<<(unsigned)rows, kThreads, 0, ctx().stream>>>(p, x, st.f());
    CUDA_LAUNCHED();
    norm_affine_bw<<<(unsigned)channels, kThreads, 0, ctx().stream>>>(p, rows, x, g, st.f(),
                                                                      gs ? gs->data<float>() : nullptr,
                                                                      gb ? gb->data<float>() : nullptr);
    CUDA_LAUNCHED();
  }
}

// x (N, C, spatial...), scale and bias (C); groups of C / G channels.
void group_norm_bw(const Node& n, const Ins& in, const Gouts& gout, const Gins& gin, int64_t G) {
  require_f32(n, in);
  const Shape& s = in[0]->shape;
  NCHECK(s.size() >= 2, "input must be at least 2-D");
  const int64_t N = s[0], C = s[1];
  NCHECK(G > 0 && C % G == 0, "channels ", C, " not divisible by groups ", G);
  const int64_t params = in.size() > 1 && in[1] ? in[1]->numel() : C;  // per channel, or per group
  for (size_t i = 1; i < 3 && i < in.size(); ++i)
    NCHECK(!in[i] || in[i]->numel() == params, "no cuda backward for scale and bias of ", in[1]->numel(), " and ",
           in[i]->numel(), " values");
  NCHECK(params == C || params == G, "no cuda backward for ", params, " scale values (", C, " channels, ", G,
         " groups)");
  NormIndex p;
  p.G = G;
  p.cpg = C / G;
  p.S = C ? numel(s) / (N * C) : 0;
  p.M = p.cpg * p.S;
  p.eps = n.f("epsilon", 1e-5f);
  if (params != C) {  // one scale per group: a group is one "channel" of M elements
    p.cpg = 1;
    p.S = p.M;
  }
  norm_bw(n, p, N * G, params, in, gout, gin);
}

// ChannelLayerNorm (x (N, C, S...), statistics over C per position; scale g and bias b (C)), as
// the CPU's backward (kernels/cpu/backward_fused.cpp): one thread per position computes its mean
// and 1/std and gx = r (g gy - mean_c(g gy) - xhat mean_c(g gy xhat)); one block per channel sums
// the scale's and the bias's gradients over the positions (fixed order: deterministic).
__global__ void channel_ln_bw_kernel(const float* x, const float* gy, const float* scale, float* gx, float* stats,
                                     int64_t N, int64_t C, int64_t S, float eps) {
  GRID_LOOP(p, N * S) {
    const int64_t off = (p / S) * C * S + p % S;
    const float *xp = x + off, *gp = gy + off;
    double s = 0, ss = 0, a = 0, b = 0;
    for (int64_t c = 0; c < C; ++c) s += xp[c * S];
    const double mean = s / (double)C;
    for (int64_t c = 0; c < C; ++c) ss += (xp[c * S] - mean) * (xp[c * S] - mean);
    const double r = 1.0 / sqrt(ss / (double)C + (double)eps);
    if (stats) {
      stats[2 * p] = (float)mean;
      stats[2 * p + 1] = (float)r;
    }
    if (!gx) continue;
    for (int64_t c = 0; c < C; ++c) {
      const double gh = (double)gp[c * S] * scale[c];
      a += gh;
      b += gh * (xp[c * S] - mean) * r;
    }
    for (int64_t c = 0; c < C; ++c)
      gx[off + c * S] = (float)(r * ((double)gp[c * S] * scale[c] - a / (double)C - (xp[c * S] - mean) * r * b / (double)C));
  }
}

__global__ void channel_ln_affine_kernel(const float* x, const float* gy, const float* stats, float* gscale, float* gbias,
                                         int64_t N, int64_t C, int64_t S) {
  __shared__ double sh[32];
  const int64_t c = blockIdx.x;
  double a = 0, b = 0;
  for (int64_t p = threadIdx.x; p < N * S; p += blockDim.x) {
    const int64_t e = (p / S) * C * S + c * S + p % S;
    a += (double)gy[e] * ((double)x[e] - stats[2 * p]) * stats[2 * p + 1];
    b += gy[e];
  }
  a = block_sum(a, sh);
  b = block_sum(b, sh);
  if (threadIdx.x == 0) {
    if (gscale) gscale[c] = (float)a;
    if (gbias) gbias[c] = (float)b;
  }
}

void channel_layernorm_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  require_f32(n, {in[0], in[1]});
  const Shape& s = in[0]->shape;
  NCHECK(s.size() >= 2, "input must be at least 2-D");
  const int64_t N = s[0], C = s[1], S = C ? numel(s) / std::max<int64_t>(N * C, 1) : 0;
  Tensor* gs = gin.size() > 1 ? gin[1] : nullptr;
  Tensor* gb = gin.size() > 2 ? gin[2] : nullptr;
  if (!gout[0] || N * C * S == 0) return zero_from(gin, 0);
  const float *x = in[0]->data<float>(), *g = gout[0]->data<float>();
  Scratch st(gs || gb ? N * S * 2 * sizeof(float) : 0);
  channel_ln_bw_kernel<<<blocks_for(N * S), kThreads, 0, ctx().stream>>>(
      x, g, in[1]->data<float>(), gin[0] ? gin[0]->data<float>() : nullptr, gs || gb ? st.f() : nullptr, N, C, S,
      n.f("epsilon", 1e-5f));
  CUDA_LAUNCHED();
  if (!gs && !gb) return;
  channel_ln_affine_kernel<<<(unsigned)C, kThreads, 0, ctx().stream>>>(x, g, st.f(), gs ? gs->data<float>() : nullptr,
                                                                       gb ? gb->data<float>() : nullptr, N, C, S);
  CUDA_LAUNCHED();
}

void instnorm_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  group_norm_bw(n, in, gout, gin, in[0]->shape.size() >= 2 ? in[0]->shape[1] : 1);
}

void groupnorm_bw(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  group_norm_bw(n, in, gout, gin, n.i("num_groups", 1));
}

// LayerNormalization over the dims from `axis`; scale and bias of the normalized shape (the
// cuda backward needs them unbroadcast). Gradients flow through output 0 only.
void layernorm_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  require_f32(n, in);
  NCHECK(gout.size() < 2 || (!gout[1] && (gout.size() < 3 || !gout[2])), "no cuda backward through Mean/InvStdDev");
  const Shape& s = in[0]->shape;
  const int64_t axis = norm_axis(n.i("axis", -1), (int64_t)s.size(), n);
  int64_t rows = 1, M = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= s[d];
  for (size_t d = axis; d < s.size(); ++d) M *= s[d];
  for (size_t i = 1; i < 3 && i < in.size(); ++i)
    NCHECK(!in[i] || in[i]->numel() == M, "no cuda backward for a broadcast scale or bias ", shape_str(in[i]->shape));
  NormIndex p;
  p.M = M;
  p.eps = n.f("epsilon", 1e-5f);
  norm_bw(n, p, rows, M, in, gout, gin);
}

}  // namespace

void launch_sum_to(const Node& n, const float* full, const Shape& from, float* dst, const Shape& to, float scale) {
  sum_to(n, full, from, dst, to, scale);
}

void launch_zero(Tensor* t) { zero(t); }

void launch_gelu_grad(const float* z, const float* g, float* gz, int64_t n) {
  if (n == 0) return;
  unary_grad_kernel<<<blocks_for(n), kThreads, 0, ctx().stream>>>(Un::Gelu, n, z, nullptr, g, gz);
  CUDA_LAUNCHED();
}

void register_backward_kernels(TableBackend& b) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}) b.register_backward(op, binary_bw);
  for (const char* op : {"Erf", "Sigmoid", "Sqrt", "Relu", "Neg", "Exp", "Log", "Tanh", "Abs", "Reciprocal", "Gelu"})
    b.register_backward(op, unary_bw);
  b.register_backward("Identity", copy_bw);
  b.register_backward("Transpose", transpose_bw);
  b.register_backward("Slice", slice_bw);
  b.register_backward("Concat", concat_bw);
  b.register_backward("Split", split_bw);
  b.register_backward("Expand", expand_bw);
  b.register_backward("DepthToSpace", depth_to_space_bw);
  b.register_backward("Pad", pad_bw);
  b.register_backward("Resize", resize_bw);
  b.register_backward("ReduceSum", reduce_bw);
  b.register_backward("ReduceMean", reduce_bw);
  b.register_backward("Softmax", softmax_bw);
  b.register_backward("InstanceNormalization", instnorm_bw);
  b.register_backward("GroupNormalization", groupnorm_bw);
  b.register_backward("LayerNormalization", layernorm_bw);
  b.register_backward("ChannelLayerNorm", channel_layernorm_bw);
  (void)sum_bw;  // Sum has no cuda forward kernel yet
}

}  // namespace wxe::cuda
