// Small helpers the CPU backward kernels share (kernels/cpu/backward_*.cpp).
#pragma once
#include <algorithm>
#include <cmath>

#include "engine/ir/ops.h"
#include "kernels/cpu/op_args.h"  // opt_t

namespace wxe::cpu {

// Optional outputs' gradients and inputs' gradients: null when absent.
inline const Tensor* opt_g(const Ins& gout, size_t k) { return k < gout.size() ? gout[k] : nullptr; }
inline Tensor* opt_gin(const Outs& gin, size_t i) { return i < gin.size() ? gin[i] : nullptr; }

// A float32 gradient set to zero (nothing for a null one).
inline void fill_zero(Tensor* t) {
  if (t) std::fill(t->data<float>(), t->data<float>() + t->numel(), 0.f);
}

// Product of s[a..b) (1 when empty).
inline int64_t prod(const Shape& s, size_t a, size_t b) {
  int64_t p = 1;
  for (size_t d = a; d < b && d < s.size(); ++d) p *= s[d];
  return p;
}

// d/dv GELU(v): the erf form, or the tanh approximation.
inline double gelu_grad(double v, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
    const double t = std::tanh(k * (v + c * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * c * v * v);
  }
  return 0.5 * (1 + std::erf(v * M_SQRT1_2)) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
}

}  // namespace wxe::cpu
