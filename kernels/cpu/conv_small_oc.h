// Conv with few output channels and a wide kernel (CREDIT's cross-embedding convs of the first
// layer: 80 -> 4 channels, kernels 16 and 32, stride 2): oneDNN 2.6 has no direct kernel for
// them (its jit kernels block output channels by 16; backward it falls back to im2col + gemm,
// about 2 GFLOP/s), so these are plain AVX loops: the forward vectorized over output columns,
// the weight gradient over kernel columns. The reference loops (backward_conv.cpp) and the
// reference Conv kernel are their oracle (tests/grad_conv_test.cpp).
#pragma once
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

// Conv (not ConvTranspose), group 1, dilation 1, at most 2 spatial axes, fewer than 16 output
// channels, kernel width 16 or 32 (at width 8 oneDNN is about as fast). Pads are zeros copied
// per call into a scratch buffer with the column phases (a padded input is not kept: the
// training graph folds the cross-embeddings' explicit Pads into their Convs).
// weight_grad: for the weight gradient alone, 16 output channels too (oneDNN 2.6's direct
// kernels for the forward handle 16, but its backward for 74 -> 16 channels at kernel 16 or 32,
// stride 4 (the 640 x 1280 CrossFormer's first layer) is im2col + gemm at about 30 GFLOP/s).
bool small_oc_conv_applies(const ConvGeom& g, bool weight_grad = false);

// y (N, C_out, OH, OW) = conv(x (N, C_in, H, W), w (C_out, C_in, KH, KW)) + bias (C_out; may
// be null).
void small_oc_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y);

// dw (C_out, C_in, KH, KW) from x and dy (N, C_out, OH, OW).
void small_oc_conv_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw);

}  // namespace wxe::cpu
