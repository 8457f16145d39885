// Layer: data/ (CREDIT data formats), over engine/ only.
// bridgescaler's quantile scaler, DQuantileScalerTensor (bridgescaler 0.8.6,
// distributed_tensor.py), as CREDIT uses it: a bridgescaler_transform preblock / postblock with
// `scaler_type: "quantile"` (credit/preblock/scaler.py, credit/postblock/scaler.py), fitted by
// `credit preprocess` and saved with save_scaler_dict as
//   {data_type: {source: {var_key: "<the scaler's own JSON text>"}}}.
// One scaler per variable; one t-digest per channel (CREDIT's tensors are (B, level, T, lat, lon)
// with scaler_params.channels_last: False, so a 3D variable has a digest per level).
//
// What bridgescaler computes, per channel, on a tensor of dtype T (float32 in CREDIT; everything
// below, centroids included, is cast to T first, as _gather_scales does):
//   transform:          z = ppf(clamp(cdf(x), min_val, max_val))
//   inverse_transform:  x = quantile(dist_cdf(z))
// ppf / dist_cdf: identity (uniform, the default), ndtri / ndtr (normal), logit / sigmoid
// (logistic). cdf and quantile are tdigest_cdf_tensor and tdigest_quantile_tensor: piecewise
// linear through (centroid mean, merged weight = cumulative weight - weight / 2), to (min, 0) and
// (max, total) at the ends; outside [min, max] the cdf is 0 / 1 and q <= 0 / q >= 1 give min /
// max. With fast_transform both directions are instead a monotone cubic (PCHIP) through n_knots
// knots (build_pchip_knots: uniform in z between ppf(min_val) and ppf(max_val), x from the
// float64 digest), saturating outside the end knots.
// NaN in gives NaN out. See quantile_scaler.cpp for the places where bridgescaler's math is
// not what a t-digest textbook says (they are reproduced, not fixed).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/io/json.h"

namespace wxe {

// The scalers of bridgescaler a CREDIT scaler file can hold.
enum class ScalerKind { None, Standard, Quantile, MinMax };

// What one JSON object of a scaler file is. A scaler (a variable's own JSON, parsed from the
// string the file holds) by its "type": DStandardScaler[Tensor] -> Standard,
// DQuantileScaler[Tensor] -> Quantile, DMinMaxScaler[Tensor] -> MinMax; without "type", by its
// fields (mean_x_ -> Standard, centroids_ / centroids_mean_stacked -> Quantile, min_x_ ->
// MinMax). None: not a scaler (a {data_type: ...} or {source: ...} group, to descend into).
// Another "type" string is an Error naming `where`. (The numpy DQuantileScaler is Quantile here,
// but QuantileScaler::from_json takes only DQuantileScalerTensor, the one CREDIT writes.)
ScalerKind scaler_kind(const Json& j, const std::string& where);
const char* scaler_kind_name(ScalerKind k);  // "standard", "quantile", "minmax", "none"

class QuantileScaler {
 public:
  enum class Distribution { Uniform, Normal, Logistic };

  // From the scaler's own JSON object (type DQuantileScalerTensor). Centroids come from
  // centroids_mean_stacked / centroids_weight_stacked / centroids_count (what bridgescaler's
  // transforms use), else the per-channel lists centroids_mean_tensor / centroids_weight_tensor,
  // else centroids_ ((k, 2) mean, weight); min / max from min_tensor / max_tensor, else min_ /
  // max_. Errors (wxe::Error, naming `where` and the field): malformed or missing fields, an
  // unknown distribution, a scaler that is not fit, mean and weight arrays of different lengths,
  // counts that disagree, non-finite values, centroid means not ascending, weights not positive,
  // padding of the stacked arrays that is not +inf / 0, min_val / max_val outside [0, 1].
  static QuantileScaler from_json(const Json& j, const std::string& where);
  // The same from the scaler's JSON text (the string value a scaler file holds per variable).
  static QuantileScaler from_text(const std::string& text, const std::string& where);

  int channels() const { return (int)ch_.size(); }
  Distribution distribution() const { return dist_; }
  bool fast_transform() const { return fast_; }
  bool channels_last() const { return channels_last_; }  // the layout the scaler was fitted on
  double min_val() const { return min_val_; }
  double max_val() const { return max_val_; }
  int centroids(int channel) const;     // real (unpadded) centroids of a channel's digest
  double fitted_min(int channel) const;  // the digest's min / max (min_tensor, max_tensor)
  double fitted_max(int channel) const;

  // In place on n values of one channel, as bridgescaler's transform / inverse_transform on a
  // float32 tensor (torch's CPU arithmetic in float32) or a float64 tensor.
  void transform(float* x, int64_t n, int channel) const;
  void inverse_transform(float* x, int64_t n, int channel) const;
  void transform(double* x, int64_t n, int channel) const;
  void inverse_transform(double* x, int64_t n, int channel) const;

  // The digest's CDF and quantile function in the tensor's precision (the exact path's core:
  // transform = ppf(clamp(cdf)), inverse_transform = quantile(dist_cdf)).
  float cdf(float x, int channel) const;
  double cdf(double x, int channel) const;
  float quantile(float q, int channel) const;
  double quantile(double q, int channel) const;

  // fast_transform's knots (as read from the file, else built as build_pchip_knots builds
  // them): z (n_knots), shared; per channel x, the slopes dz/dx (m) and dx/dz (minv). Empty
  // without fast_transform.
  const std::vector<double>& knots_z() const { return knots_z_; }
  const std::vector<double>& knots_x(int channel) const;
  const std::vector<double>& knots_m(int channel) const;
  const std::vector<double>& knots_minv(int channel) const;

 private:
  template <class T>
  struct Digest {  // one channel's centroids in one precision, padded to the stacked width K
    std::vector<T> mean, weight, merged;  // (K): merged = cumsum(weight) - weight / 2
    T total = 0, min = 0, max = 0;
  };
  template <class T>
  struct Knots {
    std::vector<T> x, z, m, minv;  // (n_knots)
  };
  struct Channel {
    int n = 0;  // real centroids; entries n..K-1 are padding (mean +inf, weight 0)
    Digest<float> f;
    Digest<double> d;
    std::vector<double> kx, km, kminv;  // fast_transform knots (float64, as bridgescaler keeps them)
    Knots<float> kf;
    Knots<double> kd;
  };
  template <class T>
  const Digest<T>& digest(int c) const;
  template <class T>
  const Knots<T>& knots(int c) const;
  template <class T>
  T cdf_t(T x, int c) const;
  template <class T>
  T quantile_t(T q, int c) const;
  template <class T>
  void transform_t(T* x, int64_t n, int c) const;
  template <class T>
  void inverse_t(T* x, int64_t n, int c) const;
  const Channel& at(int c) const;
  void build_knots();
  void finish_knots();

  std::vector<Channel> ch_;
  int K_ = 0;  // stacked width (max centroids over the channels)
  Distribution dist_ = Distribution::Uniform;
  bool fast_ = false, channels_last_ = true;
  double min_val_ = 1e-7, max_val_ = 0.9999999;
  int n_knots_ = 256;
  std::vector<double> knots_z_;
  std::string where_;
};

// torch's CPU elementwise functions as bridgescaler calls them (float32 and float64 tensors),
// for the transforms and their tests: special.ndtri (Cephes, its polynomials in T with fused
// multiply-adds as torch's AVX2/AVX-512 kernels compile them, the logs in double),
// special.ndtr ((1 + erf(x * sqrt(1/2))) * 0.5 in T), logit (log(x / (1 - x))), sigmoid
// (1 / (1 + exp(-x))).
namespace torch_cpu {
float ndtri(float y);
double ndtri(double y);
float ndtr(float x);
double ndtr(double x);
float logit(float x);
double logit(double x);
float sigmoid(float x);
double sigmoid(double x);
}  // namespace torch_cpu

}  // namespace wxe
