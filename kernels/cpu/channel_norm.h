// The per-position statistics of ChannelLayerNorm's fast kernels (forward fused.cpp, backward
// backward_fused.cpp), so both compute the same float32 mean and variance.
#pragma once
#include <cstdint>

namespace wxe::cpu {

// Positions [0, len) of a tile (len <= T) whose C channels lie S floats apart from xp: the mean
// over the channels, and the sum of squared deviations from it (the caller divides by C), float32,
// vectorized over the positions.
template <int64_t T>
inline void channel_tile_moments(const float* xp, int64_t C, int64_t S, int64_t len, float (&mean)[T],
                                 float (&var)[T]) {
  const float invC = 1.f / (float)C;
  for (int64_t i = 0; i < T; ++i) mean[i] = var[i] = 0.f;
  for (int64_t c = 0; c < C; ++c) {
    const float* xc = xp + c * S;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) mean[i] += xc[i];
  }
#pragma omp simd
  for (int64_t i = 0; i < T; ++i) mean[i] *= invC;
  for (int64_t c = 0; c < C; ++c) {
    const float* xc = xp + c * S;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) var[i] += (xc[i] - mean[i]) * (xc[i] - mean[i]);
  }
}

}  // namespace wxe::cpu
