// Broadcast expand and sum over merged dims (broadcast.h).
#include "kernels/cpu/broadcast.h"

#include <algorithm>
#include <cstring>

namespace wxe::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements of full; below this OpenMP costs more than it saves

// Calls f(offset) for every index of the dims `dims` (outermost first) with element strides
// `st`, in row-major order, by an odometer (no division per index).
template <class F>
void for_each_offset(const std::vector<int64_t>& dims, const std::vector<int64_t>& st, int64_t base, F f) {
  const size_t r = dims.size();
  std::vector<int64_t> c(r, 0);
  int64_t off = base;
  while (true) {
    f(off);
    size_t d = r;
    while (d > 0) {
      --d;
      if (++c[d] < dims[d]) {
        off += st[d];
        break;
      }
      off -= (dims[d] - 1) * st[d];
      c[d] = 0;
      if (d == 0) return;
    }
    if (r == 0) return;
  }
}

// Strides of the merged dims in full (row-major) and in small (0 along broadcast dims).
void plan_strides(const BroadcastPlan& p, std::vector<int64_t>& fst, std::vector<int64_t>& sst) {
  const size_t m = p.size.size();
  fst.assign(m, 0);
  sst.assign(m, 0);
  int64_t f = 1, s = 1;
  for (size_t d = m; d-- > 0;) {
    fst[d] = f;
    f *= p.size[d];
    if (!p.bcast[d]) {
      sst[d] = s;
      s *= p.size[d];
    }
  }
}

double sum_run(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

BroadcastPlan broadcast_plan(const Shape& small, const Shape& full) {
  WXE_ASSERT(small.size() <= full.size());
  BroadcastPlan p;
  const size_t off = full.size() - small.size();
  for (size_t d = 0; d < full.size(); ++d) {
    const int64_t f = full[d], s = d >= off ? small[d - off] : 1;
    WXE_ASSERT(s == f || s == 1);
    if (f == 1) continue;
    const char b = s == 1 ? 1 : 0;
    if (!p.size.empty() && p.bcast.back() == b) {
      p.size.back() *= f;
    } else {
      p.size.push_back(f);
      p.bcast.push_back(b);
    }
  }
  if (p.size.empty()) {
    p.size.push_back(1);
    p.bcast.push_back(0);
  }
  p.full = numel(full);
  p.small = numel(small);
  return p;
}

void broadcast_expand(const BroadcastPlan& p, const float* src, float* dst, double scale) {
  if (p.full == 0) return;
  std::vector<int64_t> fst, sst;
  plan_strides(p, fst, sst);
  const int m = (int)p.size.size();
  const int64_t L = p.size[m - 1], rows = p.full / L;
  const bool fill = p.bcast[m - 1];
#pragma omp parallel for schedule(static) if (p.full > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, so = 0;
    for (int d = m - 2; d >= 0; --d) {
      so += rem % p.size[d] * sst[d];
      rem /= p.size[d];
    }
    float* o = dst + r * L;
    if (fill) {
      std::fill(o, o + L, (float)(src[so] * scale));
    } else if (scale == 1.0) {
      std::memcpy(o, src + so, (size_t)L * sizeof(float));
    } else {
      const float* s = src + so;
      for (int64_t j = 0; j < L; ++j) o[j] = (float)(s[j] * scale);
    }
  }
}

void broadcast_sum(const BroadcastPlan& p, const float* src, float* dst, double scale) {
  if (p.full == 0) {
    std::fill(dst, dst + p.small, 0.f);
    return;
  }
  if (p.small == p.full) {  // nothing broadcast
    for (int64_t i = 0; i < p.full; ++i) dst[i] = (float)(src[i] * scale);
    return;
  }
  if (p.small == 1) {  // a scalar: fixed chunks summed in parallel, combined in order
    const int64_t chunks = p.full > kParallelMin ? 16 : 1;
    std::vector<double> part((size_t)chunks);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t a = p.full * c / chunks, b = p.full * (c + 1) / chunks;
      part[c] = sum_run(src + a, b - a);
    }
    double s = 0;
    for (double v : part) s += v;
    dst[0] = (float)(s * scale);
    return;
  }
  std::vector<int64_t> fst, sst;
  plan_strides(p, fst, sst);
  const int m = (int)p.size.size();
  const int64_t L = p.size[m - 1];
  const bool inner_kept = !p.bcast[m - 1];
  // the kept dims (small's layout) and the reduced dims, leaving out the innermost run
  std::vector<int64_t> kdim, kst, rdim, rst;
  for (int d = 0; d < m - 1; ++d) {
    (p.bcast[d] ? rdim : kdim).push_back(p.size[d]);
    (p.bcast[d] ? rst : kst).push_back(fst[d]);
  }
  auto base_of = [&](int64_t k) {  // full offset of kept index k (row-major over kdim)
    int64_t off = 0;
    for (size_t d = kdim.size(); d-- > 0;) {
      off += k % kdim[d] * kst[d];
      k /= kdim[d];
    }
    return off;
  };
  if (inner_kept) {
    // dst rows of L contiguous elements, each the sum of the full rows over the reduced dims;
    // split into column chunks so that few rows still spread over the threads
    constexpr int64_t kChunk = 512;
    const int64_t srows = p.small / L, nch = (L + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (p.full > kParallelMin)
    for (int64_t t = 0; t < srows * nch; ++t) {
      const int64_t r = t / nch, j0 = t % nch * kChunk, n = std::min(kChunk, L - j0);
      double acc[kChunk];
      std::fill(acc, acc + n, 0.0);
      for_each_offset(rdim, rst, base_of(r) + j0, [&](int64_t off) {
        const float* s = src + off;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) acc[j] += s[j];
      });
      float* o = dst + r * L + j0;
      for (int64_t j = 0; j < n; ++j) o[j] = (float)(acc[j] * scale);
    }
    return;
  }
  // innermost run reduced: each dst element sums runs of L contiguous elements
#pragma omp parallel for schedule(static) if (p.full > kParallelMin)
  for (int64_t k = 0; k < p.small; ++k) {
    double acc = 0;
    for_each_offset(rdim, rst, base_of(k), [&](int64_t off) { acc += sum_run(src + off, L); });
    dst[k] = (float)(acc * scale);
  }
}

}  // namespace wxe::cpu
