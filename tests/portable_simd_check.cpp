// Prints, as hex bits, what each intrinsic of kernels/cpu/simd.h and transpose.h's 8 x 8
// transpose give on fixed pseudo-random inputs (tests/portable_simd_test.sh builds it with the
// x86 intrinsics and with the portable ones, WXE_PORTABLE_SIMD, and compares the two).
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "kernels/cpu/transpose.h"

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void print(const char* what, const float* v, int n) {
  std::printf("%s", what);
  for (int i = 0; i < n; ++i) std::printf(" %08x", bits(v[i]));
  std::printf("\n");
}

void print8(const char* what, __m256 a) {
  float v[8];
  _mm256_storeu_ps(v, a);
  print(what, v, 8);
}

void print4(const char* what, __m128 a) {
  float v[4];
  _mm_storeu_ps(v, a);
  print(what, v, 4);
}

}  // namespace

int main() {
  alignas(32) float in[64];
  uint32_t s = 12345;
  for (float& f : in) {
    s = s * 1664525u + 1013904223u;
    f = (float)(s >> 8) / (float)(1u << 24) * 4.f - 2.f;
  }
  const __m256 a = _mm256_loadu_ps(in), b = _mm256_load_ps(in + 8), c = _mm256_loadu_ps(in + 17);
  print8("setzero", _mm256_setzero_ps());
  print8("set1", _mm256_set1_ps(in[3]));
  print8("broadcast", _mm256_broadcast_ss(in + 5));
  print8("add", _mm256_add_ps(a, b));
  print8("fmadd", _mm256_fmadd_ps(a, b, c));
  print4("cast", _mm256_castps256_ps128(a));
  print4("extract1", _mm256_extractf128_ps(a, 1));
  print4("shuffle 0x88", _mm_shuffle_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(b, 1), 0x88));
  print4("shuffle 0xDD", _mm_shuffle_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(b, 1), 0xDD));
  print8("shuffle256 0x44", _mm256_shuffle_ps(a, b, 0x44));
  print8("shuffle256 0xEE", _mm256_shuffle_ps(a, b, 0xEE));
  print8("unpacklo", _mm256_unpacklo_ps(a, b));
  print8("unpackhi", _mm256_unpackhi_ps(a, b));
  print8("permute2f128 0x20", _mm256_permute2f128_ps(a, b, 0x20));
  print8("permute2f128 0x31", _mm256_permute2f128_ps(a, b, 0x31));
  float out[64];
  const float* src[8];
  float* dst[8];
  for (int i = 0; i < 8; ++i) {
    src[i] = in + 8 * i;
    dst[i] = out + 8 * i;
  }
  wxe::cpu::transpose8x8_rows(src, dst);
  print("transpose8x8", out, 64);
  return 0;
}
