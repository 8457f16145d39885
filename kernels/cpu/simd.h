// The AVX intrinsics wxe's own loops use (transpose.h, conv_small_oc.cpp, conv_fft.cpp), on
// every CPU: on x86 (built with -mavx -mfma) <immintrin.h>; elsewhere (aarch64: Grace, Neoverse)
// or with WXE_PORTABLE_SIMD the same few as plain functions on GCC/Clang vector types, with the
// same results (fmadd rounds once, as std::fma). tests/portable_simd_test.sh checks that both
// give the same bits on x86, and that the files build for aarch64.
#pragma once
#if defined(__AVX__) && !defined(WXE_PORTABLE_SIMD)
#include <immintrin.h>
#else
#include <cmath>
#include <cstring>

typedef float __m256 __attribute__((vector_size(32)));
typedef float __m128 __attribute__((vector_size(16)));

inline __m256 _mm256_setzero_ps() { return __m256{}; }
inline __m256 _mm256_set1_ps(float a) { return __m256{a, a, a, a, a, a, a, a}; }
inline __m256 _mm256_broadcast_ss(const float* p) { return _mm256_set1_ps(*p); }
inline __m256 _mm256_loadu_ps(const float* p) {
  __m256 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline __m256 _mm256_load_ps(const float* p) { return _mm256_loadu_ps(p); }
inline void _mm256_storeu_ps(float* p, __m256 a) { std::memcpy(p, &a, sizeof a); }
inline void _mm_storeu_ps(float* p, __m128 a) { std::memcpy(p, &a, sizeof a); }
inline __m256 _mm256_add_ps(__m256 a, __m256 b) { return a + b; }
inline __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c) {
  __m256 r;
  for (int i = 0; i < 8; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
}
inline __m128 _mm256_castps256_ps128(__m256 a) { return __m128{a[0], a[1], a[2], a[3]}; }
inline __m128 _mm256_extractf128_ps(__m256 a, int hi) {
  return hi ? __m128{a[4], a[5], a[6], a[7]} : _mm256_castps256_ps128(a);
}
// r = a[imm bits 0-1], a[bits 2-3], b[bits 4-5], b[bits 6-7] (within each 128-bit lane for 256)
inline __m128 _mm_shuffle_ps(__m128 a, __m128 b, int imm) {
  return __m128{a[imm & 3], a[(imm >> 2) & 3], b[(imm >> 4) & 3], b[(imm >> 6) & 3]};
}
inline __m256 _mm256_shuffle_ps(__m256 a, __m256 b, int imm) {
  __m256 r;
  for (int l = 0; l < 8; l += 4) {
    r[l] = a[l + (imm & 3)];
    r[l + 1] = a[l + ((imm >> 2) & 3)];
    r[l + 2] = b[l + ((imm >> 4) & 3)];
    r[l + 3] = b[l + ((imm >> 6) & 3)];
  }
  return r;
}
inline __m256 _mm256_unpacklo_ps(__m256 a, __m256 b) {
  return __m256{a[0], b[0], a[1], b[1], a[4], b[4], a[5], b[5]};
}
inline __m256 _mm256_unpackhi_ps(__m256 a, __m256 b) {
  return __m256{a[2], b[2], a[3], b[3], a[6], b[6], a[7], b[7]};
}
// each 128-bit half of r: a's low or high half, b's, or zeros (bit 3), by imm's 4-bit fields
inline __m256 _mm256_permute2f128_ps(__m256 a, __m256 b, int imm) {
  __m256 r;
  for (int h = 0; h < 2; ++h) {
    const int s = (imm >> (4 * h)) & 0xF;
    for (int i = 0; i < 4; ++i) r[4 * h + i] = (s & 8) ? 0.f : (s & 2 ? b : a)[4 * (s & 1) + i];
  }
  return r;
}
#endif
