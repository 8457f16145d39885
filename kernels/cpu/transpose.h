// Fast 2-D transposes of float32 planes (fast.cpp), shared by the Transpose fast kernel and
// the oneDNN convolution path (NCHW <-> NHWC).
#pragma once
#include <cstdint>

namespace wxe::cpu {

// dst[n][c][r] = src[n][r][c] for N planes of (rows, cols) floats; parallel over tiles.
void transpose_planes(const float* src, float* dst, int64_t N, int64_t rows, int64_t cols);

}  // namespace wxe::cpu
