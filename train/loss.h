// Training losses with their gradients.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

// CREDIT's default training loss (VariableTotalLoss2D with latitude and variable weights, MSE):
// loss = mean over all elements of (pred - target)^2 * wlat[h] * wvar[c], with pred/target
// shaped (B, C, [T,] H, W) (H is dim -2, C is dim 1). Plain MSE (any shape) when both are empty.
struct LossWeights {
  std::vector<double> lat_weights;      // (H), already normalized (latitude_weights)
  std::vector<double> channel_weights;  // (C); empty: all 1
};

// Latitude weights from latitudes in degrees: cos(lat) / mean(cos(lat)), so their mean is 1.
std::vector<double> latitude_weights(const std::vector<double>& lat_degrees);
// A regular grid from +90 to -90 including both poles (ERA5's convention), h rows.
std::vector<double> regular_latitudes(int64_t h);

// CREDIT's elementwise losses (credit/losses: the registry's torch and gen_1 entries), each
// called as CREDIT's trainer calls it, loss_fn(target, pred), with e = target - pred:
//   mse (p-t)^2, mae |p-t|, msle (log(|p|+1) - log(|t|+1))^2, huber(delta) 0.5 d^2 for |d| < delta
//   else delta (|d| - delta/2), logcosh log(cosh(e + 1e-12)), xtanh e' tanh(e') and xsigmoid
//   2 e' / (1 + exp(-e')) - e' with e' = e + 1e-12.
enum class LossKind { MSE, MAE, MSLE, Huber, LogCosh, XTanh, XSigmoid };
struct LossFunction {
  LossKind kind = LossKind::MSE;
  double delta = 1.0;  // huber
};
// "mse", "mae", ... (the registry's names); an unknown name is an error listing the known ones.
LossFunction loss_function(const std::string& name, double delta = 1.0);
const char* loss_name(LossKind k);

// The mean over all elements of loss(pred, target) * wlat[h] * wvar[c] (CREDIT's
// VariableTotalLoss2D: the mean over channels of each channel's weighted mean). Returns the loss
// (double accumulation, the same for any thread count). If grad is non-null,
// writes dloss/dpred (float32, pred's shape; allocated when *grad is not already that) scaled
// by `grad_scale`; *grad may be pred itself (each element is read before its gradient is
// written). pred and target are float32.
// per_channel: channel c's loss (CREDIT's BaseLoss base_loss_overrides); empty: f for all.
double weighted_loss(const Tensor& pred, const Tensor& target, const LossWeights& w, const LossFunction& f,
                     Tensor* grad = nullptr, double grad_scale = 1.0,
                     const std::vector<LossFunction>& per_channel = {});
inline double weighted_mse(const Tensor& pred, const Tensor& target, const LossWeights& w, Tensor* grad = nullptr,
                           double grad_scale = 1.0) {
  return weighted_loss(pred, target, w, LossFunction{}, grad, grad_scale);
}

}  // namespace wxe
