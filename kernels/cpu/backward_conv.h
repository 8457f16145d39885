// Conv / ConvTranspose backward with an explicit choice of path, for tests that compare the
// oneDNN fast path with the reference loops (backward_conv.cpp).
#pragma once
#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

// The backward kernel of a Conv or ConvTranspose node (engine/ir/ops.h BackwardFn contract).
// Reference: plain loops with double accumulation (the oracle). Fast: oneDNN's backward-data
// and backward-weights primitives where they apply, conv_small_oc.h's weight gradient for few
// output channels and wide kernels, conv_winograd.h's gradients for 3x3 stride 1, the loops
// otherwise. Returns true when the fast paths computed dx and dw (the bias gradient is always a plain sum in double).
bool conv_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin,
                   KernelKind kind);

// Whether the float32 oneDNN backward pair the fast path runs for g is oneDNN's reference
// kernel ("ref:any", about 0.1 GFLOP/s): only when no layout offers anything else.
bool conv_backward_on_onednn_reference(const ConvGeom& g);

}  // namespace wxe::cpu
