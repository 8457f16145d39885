#include "engine/exec/train_kernels.h"

#include <algorithm>

namespace wxe {

namespace {

// Loops shorter than this run on one thread (the parallel region costs more than it saves).
constexpr int64_t kParallelMin = 1 << 15;
// Reductions sum blocks of this many elements, then the block sums in order: the same result
// for any thread count.
constexpr int64_t kBlock = 1 << 14;

double sum_squares_cpu(const float* x, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> part(blocks);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    // eight interleaved sums (they vectorize), then added in order: fixed, whatever the threads
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t j0 = b * kBlock, e = std::min(n, j0 + kBlock);
    int64_t j = j0;
    for (; j + 8 <= e; j += 8)
      for (int l = 0; l < 8; ++l) lane[l] += (double)x[j + l] * x[j + l];
    for (; j < e; ++j) lane[j & 7] += (double)x[j] * x[j];
    double s = 0;
    for (double l : lane) s += l;
    part[b] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

void segment_sum_squares_cpu(const float* x, const std::vector<int64_t>& bounds, double* out) {
  for (size_t i = 0; i + 1 < bounds.size(); ++i) out[i] = sum_squares_cpu(x + bounds[i], bounds[i + 1] - bounds[i]);
}

void adamw_cpu(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t j = 0; j < n; ++j) adamw_element(s, p[j], g[j], m[j], v[j]);
}

void scale_cpu(float* x, int64_t n, float factor) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t j = 0; j < n; ++j) x[j] *= factor;
}

void fill_cpu(float* x, int64_t n, float value) { std::fill(x, x + n, value); }

void ema_cpu(float* s, const float* p, int64_t n, float d, float w) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t j = 0; j < n; ++j) s[j] = d * s[j] + w * p[j];
}

}  // namespace

const TrainKernels& cpu_train_kernels() {
  static const TrainKernels k{adamw_cpu, segment_sum_squares_cpu, scale_cpu, fill_cpu, ema_cpu};
  return k;
}

}  // namespace wxe
