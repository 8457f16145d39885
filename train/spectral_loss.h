// CREDIT's losses over a whole tensor, with their gradients: SpectralLoss2D and PSDLoss
// (credit/losses/gen_1/spectral.py, power.py: the spectra along longitude) and
// CovarianceWeightedMSELoss (gen_1/covariance.py, "covmse"). pred and target are float32
// (B, C, [T,] H, W); arithmetic in double.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

enum class TensorLossKind { Spectral, Power, CovMSE };
struct TensorLoss {
  TensorLossKind kind = TensorLossKind::Spectral;
  int64_t wavenum_init = 20;       // spectral, power: the first wavenumber compared
  bool batch_normalize = false;    // covmse: rows normalised by the target's mean and std
  double off_diagonal_scale = 1.0;  // covmse: the precision's off-diagonal entries scaled
};
// "spectral", "power", "covmse"; false for any other name.
bool is_tensor_loss(const std::string& name);

// The loss (CREDIT's value for loss(target, pred)). lat: CREDIT's latitude weights (H, mean 1:
// VariableTotalLoss2D's), empty for none (a plain mean over latitudes). With grad, ADDS
// d loss / d pred times grad_scale into *grad (float32, pred's shape; allocated as zeros unless
// it already is pred's shape); *grad must not be pred.
//   spectral: A = mean over latitudes (lat-weighted) of |rfft(x)| along W; the mean over all but
//     the first wavenumber_init wavenumbers of (A_target - A_pred)^2;
//   power: P = |rfft(x) / W|^2, doubled but at wavenumber 0; the mean over wavenumbers >=
//     wavenumber_init of the lat-weighted (weights / their sum) mean of (log(P_t + 1e-8) -
//     log(P_p + 1e-8))^2;
//   covmse: residuals r = target - pred as (C*T) x (B*H*W) rows; the mean over points of
//     r^T P r with P the inverse of the rows' covariance (off-diagonal scaled).
double tensor_loss(const TensorLoss& f, const Tensor& pred, const Tensor& target, const std::vector<double>& lat,
                   Tensor* grad = nullptr, double grad_scale = 1.0);

}  // namespace wxe
