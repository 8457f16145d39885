// CREDIT's ensemble CRPS losses (credit/losses: gen_1/kcrps.py KCRPS, gen_1/almost_fair_crps.py
// almost-fair-crps, crps.py ring-crps) with their gradients, weighted as VariableTotalLoss2D
// weighs an elementwise loss (train/loss.h LossWeights: the mean over the target's elements of
// crps * wlat[h] * wvar[c]).
#pragma once
#include <string>

#include "train/loss.h"

namespace wxe {

class Communicator;

enum class CrpsKind { KCRPS, AlmostFair, Ring };
struct CrpsLoss {
  CrpsKind kind = CrpsKind::KCRPS;
  bool biased = false;  // KCRPS: denominator m^2 (else m (m - 1), the fair estimator)
  double alpha = 1.0;   // almost-fair-crps: the spread weighs 1 - (1 - alpha) / m
};
// "KCRPS", "almost-fair-crps", "ring-crps" (the registry's names); false for any other name.
bool is_crps_loss(const std::string& name);
CrpsLoss crps_loss(const std::string& name, bool biased = false, double alpha = 1.0);
const char* crps_name(CrpsKind k);

// KCRPS / almost-fair-crps over an ensemble in the batch: pred (B * m, C, [T,] H, W) holds sample
// b's m members in rows b * m .. b * m + m - 1 (CREDIT's repeat_interleave of the input), target
// (B, C, [T,] H, W). Per target element, with x the members and y the target:
//   KCRPS:       mean_i |x_i - y| - sum_{i<j} |x_i - x_j| / (m (m - 1))   (biased: m^2)
//   almost-fair: mean_i |x_i - y| - (1 - (1 - alpha) / m) sum_{i<j} |x_i - x_j| / (m (m - 1))
// Returns the weighted mean over the target's elements (double). With grad, writes d loss / d
// pred (float32, pred's shape; allocated unless *grad already is) times grad_scale; *grad may be
// pred itself. |.|'s derivative at 0 is 0, as torch's.
double ensemble_crps(const Tensor& pred, const Tensor& target, const LossWeights& w, const CrpsLoss& f,
                     Tensor* grad = nullptr, double grad_scale = 1.0);

// ring-crps: this rank holds one member (pred, target's shape) of the same sample as every other
// rank of `dp` (K ranks, K - 1 ring shifts of the members over it); elementwise, CREDIT's local
// contribution (|x_r - y| - sum_{j != r} |x_r - x_j| / (K - 1)) / K, whose gradient (the other
// members held fixed) summed over the ranks is the fair CRPS's. Weighted mean as above; K = 1
// (or no communicator): |x - y|. Collective over dp.
double ring_crps(const Tensor& pred, const Tensor& target, const LossWeights& w, Communicator* dp,
                 Tensor* grad = nullptr, double grad_scale = 1.0);

// torch.repeat_interleave(t, m, 0): each of t's rows (dim 0) m times in a row, as CREDIT's
// trainer makes an ensemble's input (and its target, for the members' elementwise scores).
Tensor repeat_members(const Tensor& t, int64_t m);
// The members' mean per sample: (B * m, ...) -> (B, ...).
Tensor ensemble_mean(const Tensor& t, int64_t m);

}  // namespace wxe
