// 3x3 stride-1 Conv on oneDNN's Winograd kernel (F(4x4, 3x3), jit_wino_4x3, AVX-512), forward
// and backward, in bands of output rows. The Winograd transforms do 2.25x fewer products than
// the direct kernel: measured on CREDIT's convs (oneDNN 2.6, AVX-512, 2 threads) 380-580
// GFLOP/s-equivalent against 160-240 for the direct kernel, forward, backward-data and
// backward-weights alike, at the direct kernel's accuracy (relative L2 error 8e-7 against a
// double-precision sum, direct 5e-7).
// Bands: on one whole 256 x 384 plane of 84 channels the kernel's scratchpad is 177 MB (the
// transformed input and output of every tile); a band of rows needs a fraction of that at the
// same speed, so the rows are split until a band's scratchpad and staged operands fit in
// 32 MiB. A band reads its input rows plus the kernel's halo from the caller's
// tensors (nchw or nhwc) through oneDNN reorders into the kernel's blocked layout, as the
// whole-tensor path reorders them too. Backward-data computes a band of input rows from the
// output rows that reach it and keeps the band's exact rows; the weight gradient sums its bands.
// The reference loops and kernels are the oracle (tests/grad_conv_test.cpp).
#pragma once
#include <cstdint>

#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

// A float32 Conv this path takes: 2-D, group 1, kernel 3 x 3, stride 1, dilation 1, pads at
// most 1, at least 16 channels on either side and 1e8 multiply-adds x 2 or more (below that
// oneDNN's direct kernel is as fast: 32 channels of 16 x 16 take 0.03 ms either way). False
// when winograd is off (set_winograd) or the CPU (or ONEDNN_MAX_CPU_ISA) lacks avx512_core,
// which oneDNN 2.6's Winograd kernel needs (cpu_isa.h: then the direct kernel runs).
bool winograd_applies(const ConvGeom& g);

// y = conv(x, w) + bias (may be null). x and y are nchw, or nhwc where the flag says so.
// False (nothing written) when oneDNN has no Winograd kernel for the geometry or its bands
// would still need more than 48 MiB (then the transformed weights of many channels on a small
// grid fill the scratchpad, e.g. 256 -> 512 channels on 16 x 24: the direct kernel runs).
bool winograd_conv_forward(const Node& n, const ConvGeom& g, const float* x, bool x_nhwc, const float* w,
                           const float* bias, float* y, bool y_nhwc);

// The forward's output rows [rows.lo, rows.hi) only (x and y nchw), the others zero: a Conv
// node's attribute rows (engine/passes/fuse.h mark_needed_rows). False as winograd_conv_forward.
struct RowRange {
  int64_t lo = 0, hi = 0;
};
bool winograd_conv_forward_rows(const Node& n, const ConvGeom& g, const float* x, const float* w, const float* bias,
                                float* y, RowRange rows);

// Whether the forward of output rows [rows.lo, rows.hi) (x and y nchw, or nhwc where the flags
// say) runs here: winograd_applies and its bands fit (what winograd_conv_forward_rows and,
// for all rows, winograd_conv_forward then do).
bool winograd_forward_plans(const ConvGeom& g, bool bias, bool x_nhwc, bool y_nhwc, RowRange rows);

// Zero rows [0, lo) and [hi, H) of every image and channel of t (N, C, H, W, nchw).
void zero_rows_outside(float* t, int64_t N, int64_t C, int64_t H, int64_t W, int64_t lo, int64_t hi);

// The rows [lo, hi) of t (N, C, H, W, nchw) outside which every image's every channel is zero
// (lo == hi: all of it). A loss over a crop of the grid (CREDIT's padding) leaves the last
// convolutions' output gradients zero above and below the crop; their backward skips those rows.
RowRange nonzero_rows(const float* t, int64_t N, int64_t C, int64_t H, int64_t W);

// dx from w and dy; dw from x and dy; all nchw; dy_rows: nonzero_rows of dy (the bands cover
// those rows of dy only, and the rows of dx they reach). False (nothing written) as for the forward,
// and for backward-data also with unequal pads on an axis in any band (oneDNN 2.6's Winograd
// backward-data is wrong there; pads 1 all round, the common case, always qualify). With pads 1
// on both sides of each axis backward-data runs as the forward of dy with the kernel flipped
// (oneDNN's forward kernel is 15-20 % faster than its backward-data one).
bool winograd_conv_backward_data(const Node& n, const ConvGeom& g, const float* w, const float* dy, float* dx,
                                 RowRange dy_rows);
bool winograd_conv_weight_grad(const Node& n, const ConvGeom& g, const float* x, const float* dy, float* dw,
                               RowRange dy_rows);

// Process-wide switches for tests and benchmarks: off runs the direct kernels; band rows > 0
// fixes the rows per band (0: the tallest bands within 32 MiB of scratchpad and staged operands).
void set_winograd(bool on);
bool winograd_enabled();
void set_winograd_band_rows(int64_t rows);

}  // namespace wxe::cpu
