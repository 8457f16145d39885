// Strided convolutions whose kernel is a whole number of strides (CREDIT's cross-embeddings:
// kernels 4, 8, 16 at stride 4 on the 640 x 1280 CrossFormer's 74 input channels) as matrix
// products on a space-to-depth copy of the input made a few rows at a time:
//   x_s2d[c, i, j][r, q] = x[c, r s_h + i - p_h, q s_w + j - p_w]   (zero outside x)
//   y[:, r, q] = sum over a < k_h / s_h, b < k_w / s_w of W_ab x_s2d[:, r + a, q + b]
// where W_ab (C_out x C_in s_h s_w) is the kernel's block (a, b). oneDNN stages such an input
// whole in its blocked layout when the channels are not a multiple of 16 (242 MB there, with a
// scratchpad as large for the weight gradient); here each thread holds a few rows' copy. The
// reference Conv kernel and loops are the oracle (tests/grad_conv_test.cpp).
#pragma once
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

// Conv (not ConvTranspose), group 1, dilation 1, 2 spatial axes, strides of at least 2 that
// divide the kernel on both axes, at least 16 output channels, and input channels that are
// not a multiple of 16 (with them oneDNN reads the input in place).
bool s2d_conv_applies(const ConvGeom& g);

// y (N, C_out, OH, OW) = conv(x (N, C_in, H, W), w (C_out, C_in, KH, KW)) + bias (may be null).
void s2d_conv_forward(const ConvGeom& g, const float* x, const float* w, const float* bias, float* y);

// dw (C_out, C_in, KH, KW) from x and dy (N, C_out, OH, OW). The sum's order is fixed for a
// given thread count (static schedule, per-thread partial sums added in thread order).
void s2d_conv_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw);

// A ConvTranspose's weight gradient (w: (C_in, C_out, KH, KW)) is that of the Conv which reads
// its output gradient and makes its input's shape: x as that Conv's output gradient, dy as its
// input (CREDIT's last decoder layer, 256 -> 71 channels at kernel 4, stride 2: oneDNN's
// scratchpad for it is 237 MB on the 640 x 1280 grid). False (nothing written) where that Conv
// is not one s2d_conv_applies to.
bool s2d_conv_transpose_weight_grad(const ConvGeom& g, const float* x, const float* dy, float* dw);

}  // namespace wxe::cpu
