// CUDA kernels that touch each element once: elementwise arithmetic with broadcasting,
// activations, and the ops that move data by index arithmetic (Transpose, Slice, Concat,
// Split, DepthToSpace, Expand, Pad, Resize). Float32 arithmetic; the copies move elements of
// any dtype. Attributes are read by the CPU helpers (kernels/cpu/cpu_ops.h), so both
// backends read them the same way; the index math is kernels/cuda/index_math.h.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

// ---------------------------------------------------------------- copies
template <class T>
__global__ void copy_kernel(Walk w, const T* src, T* dst) {
  GRID_LOOP(i, w.count) {
    int64_t a, b;
    walk_offsets(w, i, &a, &b);
    dst[b] = src[a];
  }
}

// ---------------------------------------------------------------- elementwise
enum class Bin : int { Add, Sub, Mul, Div, Pow, Max, Min };
enum class Un : int { Erf, Sigmoid, Sqrt, Relu, Neg, Exp, Log, Tanh, Abs, Reciprocal, Gelu, GeluTanh };

__device__ inline float bin_apply(Bin op, float a, float b) {
  switch (op) {
    case Bin::Add: return a + b;
    case Bin::Sub: return a - b;
    case Bin::Mul: return a * b;
    case Bin::Div: return a / b;
    case Bin::Pow: return (float)pow((double)a, (double)b);
    case Bin::Max: return a > b ? a : b;
    case Bin::Min: return a < b ? a : b;
  }
  return a;
}

__device__ inline float un_apply(Un op, float v) {
  switch (op) {
    case Un::Erf: return erff(v);
    case Un::Sigmoid: return 1.f / (1.f + expf(-v));
    case Un::Sqrt: return sqrtf(v);
    case Un::Relu: return v > 0.f ? v : 0.f;
    case Un::Neg: return -v;
    case Un::Exp: return expf(v);
    case Un::Log: return logf(v);
    case Un::Tanh: return tanhf(v);
    case Un::Abs: return fabsf(v);
    case Un::Reciprocal: return 1.f / v;
    case Un::Gelu: return gelu_erf(v);
    case Un::GeluTanh: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
  return v;
}

// out[i] = op(a[walk a], b[walk b]), out contiguous.
__global__ void binary_kernel(Bin op, Walk w, const float* a, const float* b, float* out) {
  GRID_LOOP(i, w.count) {
    int64_t ia, ib;
    walk_offsets(w, i, &ia, &ib);
    out[i] = bin_apply(op, a[ia], b[ib]);
  }
}

// The common case: both operands have the output's shape.
__global__ void binary_same_kernel(Bin op, int64_t n, const float* a, const float* b, float* out) {
  GRID_LOOP(i, n) out[i] = bin_apply(op, a[i], b[i]);
}

template <class T>
__global__ void to_float_kernel(int64_t n, const T* x, float* y) {
  GRID_LOOP(i, n) y[i] = (float)x[i];
}

__global__ void unary_kernel(Un op, int64_t n, const float* x, float* y) {
  GRID_LOOP(i, n) y[i] = un_apply(op, x[i]);
}

__global__ void bias_act_kernel(float* y, const float* bias, int64_t N, int64_t Q, int64_t total, bool gelu) {
  GRID_LOOP(i, total) {
    float v = y[i];
    if (bias) v += bias[(i / Q) % N];
    y[i] = gelu ? gelu_erf(v) : v;
  }
}

__global__ void pad_kernel(PadIndex p, int64_t total, const float* x, float* y, float value) {
  GRID_LOOP(i, total) {
    const int64_t s = pad_offset(p, i);
    y[i] = s < 0 ? value : x[s];
  }
}

__global__ void resize_kernel(ResizeIndex r, int64_t total, const int64_t* idx, const float* w,
                              const float* x, float* y) {
  GRID_LOOP(i, total) y[i] = resize_at(r, idx, w, x, i);
}

Bin bin_of(const std::string& op) {
  if (op == "Add") return Bin::Add;
  if (op == "Sub") return Bin::Sub;
  if (op == "Mul") return Bin::Mul;
  if (op == "Div") return Bin::Div;
  if (op == "Pow") return Bin::Pow;
  if (op == "Max") return Bin::Max;
  return Bin::Min;
}

Un un_of(const Node& n) {
  const std::string& op = n.op;
  if (op == "Erf") return Un::Erf;
  if (op == "Sigmoid") return Un::Sigmoid;
  if (op == "Sqrt") return Un::Sqrt;
  if (op == "Relu") return Un::Relu;
  if (op == "Neg") return Un::Neg;
  if (op == "Exp") return Un::Exp;
  if (op == "Log") return Un::Log;
  if (op == "Tanh") return Un::Tanh;
  if (op == "Abs") return Un::Abs;
  if (op == "Reciprocal") return Un::Reciprocal;
  const std::string a = n.s("approximate", "none");
  NCHECK(a == "none" || a == "tanh", "unsupported approximate '", a, "'");
  return a == "tanh" ? Un::GeluTanh : Un::Gelu;
}

void binary_op(const Node& n, const Ins& in, const Outs& out) {
  NCHECK(in.size() == 2, "the cuda kernel takes 2 inputs, got ", in.size());
  const Bin op = bin_of(n.op);
  // Pow with an integer exponent (as the CPU kernel allows): the exponent as float32
  const Tensor& e = *in[1];
  const bool int_exp = op == Bin::Pow && (e.dtype == DType::I64 || e.dtype == DType::I32);
  require_f32(n, int_exp ? Ins{in[0]} : in);
  const Shape& os = out[0]->shape;
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  const float* a = in[0]->data<float>();
  const float* b = in[1]->data<float>();
  if (int_exp) {
    float* f = (float*)workspace(std::max<int64_t>(e.numel(), 1) * sizeof(float));
    if (e.dtype == DType::I64)
      to_float_kernel<<<blocks_for(e.numel()), kThreads, 0, ctx().stream>>>(e.numel(), e.data<int64_t>(), f);
    else
      to_float_kernel<<<blocks_for(e.numel()), kThreads, 0, ctx().stream>>>(e.numel(), e.data<int32_t>(), f);
    CUDA_LAUNCHED();
    b = f;
  }
  float* y = out[0]->data<float>();
  if (in[0]->shape == os && in[1]->shape == os) {
    binary_same_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(op, total, a, b, y);
  } else {
    const Walk w = broadcast_walk(n, in[0]->shape, in[1]->shape, os);
    binary_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(op, w, a, b, y);
  }
  CUDA_LAUNCHED();
}

void unary_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, in);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  unary_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(un_of(n), total, in[0]->data<float>(),
                                                                 out[0]->data<float>());
  CUDA_LAUNCHED();
}

// ---------------------------------------------------------------- data movement ops
void copy_walk(const Node& n, const Shape& size, const std::vector<int64_t>& src_strides, int64_t src_off,
               const std::vector<int64_t>& dst_strides, int64_t dst_off, const Tensor& src, Tensor& dst) {
  Walk w;
  NCHECK(make_walk(size, src_strides, dst_strides, src_off, dst_off, &w), "more than ", kMaxRank,
         " dims after merging");
  launch_copy(w, src.raw(), dst.raw(), dtype_size(src.dtype));
}

void identity_op(const Node& n, const Ins& in, const Outs& out) {
  const Shape s{out[0]->numel()};
  copy_walk(n, s, {1}, 0, {1}, 0, *in[0], *out[0]);
}

void transpose_op(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  std::vector<int64_t> perm = n.ints("perm");
  if (!n.has("perm"))
    for (int64_t d = x.rank() - 1; d >= 0; --d) perm.push_back(d);
  NCHECK((int)perm.size() == x.rank(), "perm has ", perm.size(), " entries for rank ", x.rank());
  Walk w;
  NCHECK(transpose_walk(x.shape, perm, &w), "more than ", kMaxRank, " dims after merging");
  launch_copy(w, x.raw(), out[0]->raw(), dtype_size(x.dtype));
}

void slice_op(const Node& n, const Ins& in, const Outs& out) {
  const StridedView v = slice_view(n, in);
  NCHECK(v.shape == out[0]->shape, "output shape mismatch");
  if (out[0]->numel()) copy_walk(n, v.shape, v.strides, v.base, strides_of(v.shape), 0, *in[0], *out[0]);
}

void concat_op(const Node& n, const Ins& in, const Outs& out) {
  const int64_t axis = norm_axis(n.i("axis", 0), out[0]->rank(), n);
  int64_t start = 0;
  for (const Tensor* t : in) {
    part_copy(n, *out[0], *t, axis, start, true);
    start += t->shape[axis];
  }
}

void split_op(const Node& n, const Ins& in, const Outs& out) {
  const int64_t axis = norm_axis(n.i("axis", 0), in[0]->rank(), n);
  int64_t start = 0;
  for (Tensor* t : out) {
    NCHECK(t, "every output must be given");
    part_copy(n, *in[0], *t, axis, start, false);
    start += t->shape[axis];
  }
}

void expand_op(const Node& n, const Ins& in, const Outs& out) {
  const Shape& os = out[0]->shape;
  if (out[0]->numel()) copy_walk(n, os, broadcast_strides(in[0]->shape, os), 0, strides_of(os), 0, *in[0], *out[0]);
}

void depth_to_space_op(const Node& n, const Ins& in, const Outs& out) {
  const Tensor& x = *in[0];
  const std::string mode = n.s("mode", "DCR");
  NCHECK(mode == "DCR" || mode == "CRD", "unsupported mode '", mode, "'");
  NCHECK(x.rank() == 4, "input must be 4-D");
  Walk w;
  NCHECK(depth_to_space_walk(x.shape, n.i("blocksize", 0), mode == "CRD", &w), "too many dims");
  launch_copy(w, x.raw(), out[0]->raw(), dtype_size(x.dtype));
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

void pad_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, {in[0]});
  const Tensor& x = *in[0];
  NCHECK(x.rank() <= kMaxRank, "rank ", x.rank(), " > ", kMaxRank);
  const bool pads_in = in.size() > 1 && in[1];
  const std::vector<int64_t> pads = pads_in ? in[1]->to_i64() : n.ints("pads");
  const std::vector<int64_t> axes = in.size() > 3 && in[3] ? in[3]->to_i64() : std::vector<int64_t>{};
  const cpu::PadPlan p = cpu::pad_plan(n, x.shape, pads, axes);
  float value = 0;
  if (in.size() > 2 && in[2] && in[2]->numel()) value = in[2]->to_f32().data<float>()[0];
  if (!pads_in && n.has("value")) value = n.f("value", 0.f);  // opset < 11
  PadIndex pi;
  NCHECK(make_pad(x.shape, p.begin, p.end, pad_mode_of(cpu::pad_mode(n)), &pi), "rank ", x.rank(), " > ", kMaxRank);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  pad_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(pi, total, x.data<float>(), out[0]->data<float>(), value);
  CUDA_LAUNCHED();
}

void resize_op(const Node& n, const Ins& in, const Outs& out) {
  require_f32(n, {in[0]});
  const Tensor& x = *in[0];
  const ResizeTaps t = resize_taps(n, in, out[0]->shape);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  uint8_t* buf = (uint8_t*)workspace(t.bytes());
  t.upload(buf);
  resize_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(t.r, total, (const int64_t*)buf,
                                                                  t.weights(buf), x.data<float>(),
                                                                  out[0]->data<float>());
  CUDA_LAUNCHED();
}

}  // namespace

// Concat and Split: each part is a block of the big tensor along `axis`.
void part_copy(const Node& n, const Tensor& big, const Tensor& part, int64_t axis, int64_t start, bool to_big) {
  if (part.numel() == 0) return;
  const auto bst = strides_of(big.shape), pst = strides_of(part.shape);
  const int64_t off = start * bst[axis];
  if (to_big)
    copy_walk(n, part.shape, pst, 0, bst, off, part, const_cast<Tensor&>(big));
  else
    copy_walk(n, part.shape, bst, off, pst, 0, big, const_cast<Tensor&>(part));
}

StridedView slice_view(const Node& n, const Ins& in) {
  const Tensor& x = *in[0];
  auto opt = [&](size_t i) { return i < in.size() && in[i] ? in[i]->to_i64() : std::vector<int64_t>{}; };
  auto plan = cpu::slice_plan(n, x.shape, in[1]->to_i64(), in[2]->to_i64(), opt(3), opt(4));
  const auto st = strides_of(x.shape);
  StridedView v;
  v.strides.resize(plan.size());
  v.shape.resize(plan.size());
  for (size_t d = 0; d < plan.size(); ++d) {
    v.base += plan[d].start * st[d];
    v.strides[d] = plan[d].step * st[d];
    v.shape[d] = plan[d].len;
  }
  return v;
}

Walk broadcast_walk(const Node& n, const Shape& a, const Shape& b, const Shape& out) {
  Walk w;
  NCHECK(make_walk(out, broadcast_strides(a, out), broadcast_strides(b, out), 0, 0, &w), "broadcast of ",
         shape_str(a), " and ", shape_str(b), " has too many dims");
  return w;
}

ResizeTaps resize_taps(const Node& n, const Ins& in, const Shape& out) {
  const Tensor& x = *in[0];
  NCHECK(x.rank() <= kMaxRank, "rank ", x.rank(), " > ", kMaxRank);
  // the taps read only the input's shape and the host inputs (roi, scales, sizes)
  Tensor shape_only;
  shape_only.dtype = x.dtype;
  shape_only.shape = x.shape;
  Ins hin = in;
  hin[0] = &shape_only;
  std::vector<int> k;
  std::vector<std::vector<int64_t>> ti;
  std::vector<std::vector<float>> tw;
  for (const auto& t : cpu::resize_axis_taps(n, hin, out)) {
    k.push_back(t.k);
    ti.push_back(t.idx);
    tw.push_back(t.w);
  }
  ResizeTaps t;
  NCHECK(make_resize(x.shape, out, k, ti, tw, &t.r, &t.idx, &t.w), "rank ", x.rank(), " > ", kMaxRank);
  return t;
}

void ResizeTaps::upload(void* dev) const {
  uint8_t* b = (uint8_t*)dev;
  CUDA_CHECK(cudaMemcpyAsync(b, idx.data(), idx.size() * sizeof(int64_t), cudaMemcpyHostToDevice, ctx().stream));
  CUDA_CHECK(cudaMemcpyAsync(b + idx_bytes(), w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice, ctx().stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx().stream));  // pageable sources: wait before the vectors go
}

void launch_copy(const Walk& w, const void* src, void* dst, size_t es) {
  if (w.count == 0) return;
  const unsigned g = blocks_for(w.count);
  cudaStream_t s = ctx().stream;
  switch (es) {
    case 1: copy_kernel<<<g, kThreads, 0, s>>>(w, (const uint8_t*)src, (uint8_t*)dst); break;
    case 2: copy_kernel<<<g, kThreads, 0, s>>>(w, (const uint16_t*)src, (uint16_t*)dst); break;
    case 4: copy_kernel<<<g, kThreads, 0, s>>>(w, (const uint32_t*)src, (uint32_t*)dst); break;
    case 8: copy_kernel<<<g, kThreads, 0, s>>>(w, (const uint64_t*)src, (uint64_t*)dst); break;
    default: fail("cuda copy: element size ", es, " unsupported");
  }
  CUDA_LAUNCHED();
}

void launch_pad(const PadIndex& p, int64_t total, const float* x, float* y, float value) {
  if (total == 0) return;
  pad_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(p, total, x, y, value);
  CUDA_LAUNCHED();
}

void launch_bias_act(float* y, const float* bias, int64_t P, int64_t N, int64_t Q, bool gelu) {
  const int64_t total = P * N * Q;
  if (total == 0 || (!bias && !gelu)) return;
  bias_act_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(y, bias, N, Q, total, gelu);
  CUDA_LAUNCHED();
}

void register_pointwise(TableBackend& b) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}) b.register_kernel(op, binary_op);
  for (const char* op : {"Erf", "Sigmoid", "Sqrt", "Relu", "Neg", "Exp", "Log", "Tanh", "Abs", "Reciprocal", "Gelu"})
    b.register_kernel(op, unary_op);
  b.register_kernel("Identity", identity_op);
  b.register_kernel("Transpose", transpose_op);
  b.register_kernel("Slice", slice_op, 0b11110);
  b.register_kernel("Concat", concat_op);
  b.register_kernel("Split", split_op, 0b10);
  b.register_kernel("Expand", expand_op, 0b10);
  b.register_kernel("DepthToSpace", depth_to_space_op);
  b.register_kernel("Pad", pad_op, 0b1110);
  b.register_kernel("Resize", resize_op, 0b1110);
}

}  // namespace wxe::cuda
