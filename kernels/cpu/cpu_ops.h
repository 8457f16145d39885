// Layer: kernels/ register into engine/'s op tables; they know no file format, mesh or command.
// Registration entry points of the CPU op groups; register_cpu_kernels() calls them all.
#pragma once
#include <vector>

#include "engine/ir/ops.h"

// Bad-input check in a shape rule or kernel, naming the node and its op.
#define NCHECK(cond, ...) WXE_CHECK(cond, "node ", n.name, " (", n.op, "): ", __VA_ARGS__)

namespace wxe::cpu {

using Values = std::vector<const Value*>;
using Ins = std::vector<const Tensor*>;
using Outs = std::vector<Tensor*>;

// Output = input bytes (Identity, Reshape, Squeeze, Unsqueeze, Flatten); shape_ops.cpp.
void copy_kernel(const Node& n, const Ins& in, const Outs& out);
void register_elementwise();  // elementwise.cpp: arithmetic, activations, Cast, Where, compare
void register_shape_ops();    // shape_ops.cpp: Shape, Reshape, (Un)Squeeze, Concat, Expand, ...
void register_data_ops();     // data_ops.cpp: Slice, Gather, Transpose, Pad, DepthToSpace, Resize, Split
void register_norm_ops();     // norm.cpp: Softmax, LayerNormalization, InstanceNormalization, ReduceMean, ...
void register_linalg_ops();   // linalg.cpp: MatMul, Gemm, Einsum, Linear
void register_conv_ops();     // conv.cpp: Conv, ConvTranspose
void register_pool_ops();     // pool.cpp: AveragePool (forward and backward)
void register_fused_ops();    // fused.cpp: ops made by the fusion passes (engine/passes/fuse.h): ChannelLayerNorm, ...
void register_fast_kernels(); // fast.cpp: fast kernels without oneDNN: DepthToSpace, Transpose, Add, ...
void register_dnnl_kernels(); // dnnl.cpp: oneDNN fast path for MatMul, Gemm, Einsum, Linear, Conv, ConvTranspose, Gelu, Softmax
// Resize as a product of per-axis taps (data_ops.cpp): output coordinate o of an axis reads
// input positions idx[o * k + j] with weights w[o * k + j], j < k. `in` are the node's inputs,
// `out` its output shape. The forward kernel and the backward (its transpose) share them.
struct ResizeAxisTaps {
  int k = 1;                 // taps per output coordinate
  std::vector<int64_t> idx;  // [out_len * k]
  std::vector<float> w;      // [out_len * k]
};
std::vector<ResizeAxisTaps> resize_axis_taps(const Node& n, const Ins& in, const Shape& out);
// Whether taps t take an axis of in_len to out_len unchanged (each output its own input).
bool resize_axis_is_identity(const ResizeAxisTaps& t, int64_t in_len, int64_t out_len);
// Slice (data_ops.cpp): per dim of the input, the first index, the step and the output length
// (starts/ends clamped as ONNX says); the GPU kernels read attributes through it too.
struct SliceDim {
  int64_t start = 0, step = 1, len = 0;
};
std::vector<SliceDim> slice_plan(const Node& n, const Shape& s, const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps);
// Pad (data_ops.cpp): mode attribute and per-dim begin/end pads (negative: crop), output shape.
enum class PadMode { Constant, Reflect, Edge, Wrap };
PadMode pad_mode(const Node& n);
struct PadPlan {
  std::vector<int64_t> begin, end;  // per dim, may be negative
  Shape out;
};
PadPlan pad_plan(const Node& n, const Shape& s, const std::vector<int64_t>& pads,
                 std::vector<int64_t> axes);
// Backward kernels (engine/ir/ops.h BackwardFn), checked by tests/grad_test.cpp:
void register_pointwise_backward();  // backward_pointwise.cpp, backward_movement.cpp: elementwise, shape and data ops
void register_layer_backward();      // backward_layers.cpp: norms, reductions, linalg, SpectralNorm, fused ops
void register_conv_backward();       // backward_conv.cpp: Conv, ConvTranspose
}  // namespace wxe::cpu
