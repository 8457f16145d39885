// Fast 2-D transposes of float32 planes and strided float32 copies (fast.cpp), shared by the
// Transpose fast kernel, the oneDNN convolution and einsum paths and the Slice backward.
#pragma once
#include <cstdint>
#include <vector>

namespace wxe::cpu {

// dst[i][j] = src[j][i] for an 8 x 8 block given by its rows (8 floats each, any alignment).
void transpose8x8_rows(const float* const src[8], float* const dst[8]);

// dst[n][c][r] = src[n][r][c] for N planes of (rows, cols) floats; parallel over tiles.
void transpose_planes(const float* src, float* dst, int64_t N, int64_t rows, int64_t cols);

// dst[c] = src[c] over an N-d index c (extent dims), with element strides for both sides
// (sst, dstr); parallel over rows of the last dim.
void strided_copy_f32(const std::vector<int64_t>& dims, const float* src, const std::vector<int64_t>& sst, float* dst,
                      const std::vector<int64_t>& dstr);

}  // namespace wxe::cpu
