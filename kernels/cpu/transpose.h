// Fast 2-D transposes of float32 planes and strided float32 copies (fast.cpp), shared by the
// Transpose fast kernel, the oneDNN convolution and einsum paths and the Slice backward.
#pragma once
#include "kernels/cpu/simd.h"

#include <cstdint>
#include <vector>

namespace wxe::cpu {

// dst[i][j] = src[j][i] for an 8 x 8 block given by its rows (8 floats each, any alignment):
// the usual AVX unpack/shuffle/permute transpose (inline: the FFT conv's transforms call it in
// their inner loops).
inline void transpose8x8_rows(const float* const src[8], float* const dst[8]) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src[i]);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst[i], _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst[i + 4], _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

// dst[n][c][r] = src[n][r][c] for N planes of (rows, cols) floats; parallel over tiles.
void transpose_planes(const float* src, float* dst, int64_t N, int64_t rows, int64_t cols);

// dst[c] = src[c] over an N-d index c (extent dims), with element strides for both sides
// (sst, dstr); parallel over rows of the last dim.
void strided_copy_f32(const std::vector<int64_t>& dims, const float* src, const std::vector<int64_t>& sst, float* dst,
                      const std::vector<int64_t>& dstr);

}  // namespace wxe::cpu
