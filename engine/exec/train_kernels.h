// The optimizer's element math and the training steps on flat float32 buffers that a backend
// runs in its own memory (Backend::train_kernels): the CPU's here, a device's beside its
// kernels. train/optim.h builds AdamW, clipping and the EMA on them.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/math/host_device.h"
#include "engine/ir/tensor.h"

namespace wxe {

// The float32 scalars of one AdamW step (AdamW::next_step) and its element update, shared by
// the CPU loop and the device kernels.
struct AdamWScalars {
  float decay = 1, w1 = 0, b2 = 0, w2 = 0, bc2_sqrt = 1, eps = 0, neg_step = 0;
};

WXE_HD void adamw_element(const AdamWScalars& s, float& p, float g, float& m, float& v) {
  const float pj = p * s.decay;
  // exp_avg.lerp_(grad, 1 - beta1): PyTorch's vectorized CPU lerp is fmadd(w, end - start, start).
  const float mj = fmaf(s.w1, g - m, m);
  const float vj = v * s.b2 + s.w2 * g * g;
  const float denom = sqrtf(vj) / s.bc2_sqrt + s.eps;
  m = mj;
  v = vj;
  p = pj + s.neg_step * mj / denom;  // addcdiv_: self + value * t1 / t2
}

// The training steps on flat float32 buffers of n elements in one backend's memory: the CPU
// ones below (cpu_train_kernels) and a device's (engine/exec/backend.h Backend::train_kernels), so
// that parameters, gradients and optimizer state can stay on the device.
struct TrainKernels {
  void (*adamw)(const AdamWScalars& s, float* p, const float* g, float* m, float* v, int64_t n) = nullptr;
  // out[i] = sum of x^2 over [bounds[i], bounds[i+1]), in double, in an order that depends on
  // the bounds only (deterministic); one result per segment, all returned at once (on a
  // device: one wait, not one per segment)
  void (*segment_sum_squares)(const float* x, const std::vector<int64_t>& bounds, double* out) = nullptr;
  void (*scale)(float* x, int64_t n, float factor) = nullptr;
  void (*fill)(float* x, int64_t n, float value) = nullptr;
  // shadow = decay * shadow + (1 - decay) * p, both coefficients float32
  void (*ema)(float* shadow, const float* p, int64_t n, float decay, float one_minus_decay) = nullptr;
};
const TrainKernels& cpu_train_kernels();

}  // namespace wxe
