// Backward kernels of backward_layers.cpp with an explicit choice of path, for tests that
// compare the fast path with the reference loops (the oracle). Each follows the BackwardFn
// contract (engine/ir/ops.h); the registered kernels run KernelKind::Fast.
//
// Reference: plain loops with double accumulation (Einsum: the reference Einsum kernel).
// Fast: Linear, MatMul and Gemm as oneDNN matmuls on strided views (cached per shape);
// Einsum on the fast Einsum kernel, written straight into the gradient where operand and
// gradient layouts agree; ReduceSum / ReduceMean as a broadcast copy (broadcast.h). Shapes
// or attributes the fast path does not take run the reference.
#pragma once
#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

void linear_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind);
void matmul_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind);
void gemm_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind);
void einsum_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind);
void reduce_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin, KernelKind kind);
// The backward of a Linear over an inner features axis on oneDNN matmuls: x (P, K, Q), w (N, K)
// (or any shape of that layout: a 1x1 Conv's (N, K, 1, 1)), the output gradient gz (P, N, Q);
// gin: gx, gw, gb (each may be null). False where oneDNN has no primitive (nothing to trust in
// gin then). backward_conv.cpp runs 1x1 convolutions' backward on it.
bool linear_backward_pkq(const Node& n, const Ins& in, const float* gz, int64_t P, int64_t K, int64_t Q, int64_t N,
                         const Outs& gin);
// gx = gy * Gelu'(x), erf form, on oneDNN (backward_linalg.cpp): the fast path of Gelu's and of a
// Linear with activation "gelu"'s backward.
void gelu_grad_fast(const Node& n, const float* x, const float* gy, float* gx, int64_t count);

}  // namespace wxe::cpu
