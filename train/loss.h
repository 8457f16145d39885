// Training losses with their gradients.
#pragma once
#include <cstdint>
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

// Returns the loss (double accumulation, the same for any thread count). If grad is non-null,
// writes dloss/dpred (float32, pred's shape; allocated when *grad is not already that) scaled
// by `grad_scale`; *grad may be pred itself (each element is read before its gradient is
// written). pred and target are float32.
double weighted_mse(const Tensor& pred, const Tensor& target, const LossWeights& w, Tensor* grad = nullptr,
                    double grad_scale = 1.0);

}  // namespace wxe
