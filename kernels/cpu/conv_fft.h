// Conv by FFT for kernels much wider than their stride (CREDIT's first-layer cross-embeddings:
// kernel 32, stride 2, 80 -> 4 channels, 16 GFLOP direct on the 1-degree grid; kernel 32, stride
// 4 on the 640 x 1280 grid). The plan (tiles, transform size, when it pays) is
// engine/math/fft_conv_plan.h. The transforms are radix 4 (and 2), vectorized across the columns
// of a tile, with a transpose between the axes; float32 throughout. The reference Conv kernel and
// backward loops are the oracle (tests/grad_conv_test.cpp).
#pragma once
#include <cstddef>

#include "engine/math/fft_conv_plan.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

// The plan for g (F = 0: not by FFT): Conv (not transposed), group 1, dilation 1, 2 spatial axes,
// the same stride on both.
FftConvPlan fft_conv_plan(const ConvGeom& g, bool weights_known);

// Floats of the kernels' spectra, and the spectra of w (C_out, C_in, KH, KW).
size_t fft_conv_spectra_floats(const ConvGeom& g, const FftConvPlan& p);
void fft_conv_spectra(const ConvGeom& g, const FftConvPlan& p, const float* w, float* spectra);

// y = conv(x) + bias (may be null), with the kernels' spectra (made by fft_conv_spectra) or
// without (spectra null: made here from w a chunk of channels at a time); x is (N, C, H, W), or
// (N, H, W, C) with x_nhwc; y likewise with y_nhwc.
void fft_conv_forward(const ConvGeom& g, const FftConvPlan& p, const float* x, bool x_nhwc, const float* w,
                      const float* spectra, const float* bias, float* y, bool y_nhwc);

// dw (C_out, C_in, KH, KW) from x (N, C, H, W) and dy (N, C_out, OH, OW).
void fft_conv_weight_grad(const ConvGeom& g, const FftConvPlan& p, const float* x, const float* dy, float* dw);

}  // namespace wxe::cpu
