#include "train/loss.h"

#include <algorithm>
#include <cmath>

namespace wxe {

std::vector<double> latitude_weights(const std::vector<double>& lat_degrees) {
  WXE_CHECK(!lat_degrees.empty(), "latitude weights: no latitudes");
  std::vector<double> w(lat_degrees.size());
  double mean = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    WXE_CHECK(std::fabs(lat_degrees[i]) <= 90, "latitude weights: latitude ", i, " is ", lat_degrees[i],
              " degrees, outside [-90, 90]");
    w[i] = std::cos(lat_degrees[i] * M_PI / 180);
    mean += w[i];
  }
  mean /= (double)w.size();
  WXE_CHECK(mean > 0, "latitude weights: the mean of cos(lat) over ", w.size(), " latitudes is ", mean);
  for (double& x : w) x /= mean;
  return w;
}

std::vector<double> regular_latitudes(int64_t h) {
  WXE_CHECK(h >= 2, "regular latitudes: ", h, " rows, need at least 2 (both poles)");
  std::vector<double> lat(h);
  for (int64_t i = 0; i < h; ++i) lat[i] = 90.0 - 180.0 * (double)i / (double)(h - 1);
  return lat;
}

namespace {
const std::pair<const char*, LossKind> kLosses[] = {
    {"mse", LossKind::MSE},         {"mae", LossKind::MAE},     {"msle", LossKind::MSLE},
    {"huber", LossKind::Huber},     {"logcosh", LossKind::LogCosh}, {"xtanh", LossKind::XTanh},
    {"xsigmoid", LossKind::XSigmoid}};

// The loss of one element and its derivative by p (double).
inline double element_loss(const LossFunction& f, double p, double t, double& dp) {
  switch (f.kind) {
    case LossKind::MSE: {
      const double d = p - t;
      dp = 2 * d;
      return d * d;
    }
    case LossKind::MAE: {
      const double d = p - t;
      dp = (double)((d > 0) - (d < 0));
      return std::fabs(d);
    }
    case LossKind::MSLE: {
      const double lp = std::log(std::fabs(p) + 1), lt = std::log(std::fabs(t) + 1);
      dp = 2 * (lp - lt) * (double)((p > 0) - (p < 0)) / (std::fabs(p) + 1);
      return (lp - lt) * (lp - lt);
    }
    case LossKind::Huber: {
      const double d = p - t, a = std::fabs(d);
      if (a < f.delta) {
        dp = d;
        return 0.5 * d * d;
      }
      dp = f.delta * (double)((d > 0) - (d < 0));
      return f.delta * (a - 0.5 * f.delta);
    }
    case LossKind::LogCosh: {
      const double e = t - p + 1e-12, a = std::fabs(e);
      dp = -std::tanh(e);
      return a + std::log1p(std::exp(-2 * a)) - M_LN2;  // log(cosh(e)) without overflow
    }
    case LossKind::XTanh: {
      const double e = t - p + 1e-12, th = std::tanh(e);
      dp = -(th + e * (1 - th * th));
      return e * th;
    }
    case LossKind::XSigmoid: {
      const double e = t - p + 1e-12, s = 1 / (1 + std::exp(-e));
      dp = -(2 * s + 2 * e * s * (1 - s) - 1);
      return 2 * e * s - e;
    }
  }
  return 0;
}
}  // namespace

LossFunction loss_function(const std::string& name, double delta) {
  std::string known;
  for (const auto& [n, k] : kLosses) {
    if (name == n) {
      WXE_CHECK(k != LossKind::Huber || (delta > 0 && std::isfinite(delta)), "loss huber: delta ", delta,
                " must be positive");
      return {k, delta};
    }
    known += std::string(known.empty() ? "" : ", ") + n;
  }
  fail("loss '", name, "' is not implemented (", known, ")");
}

const char* loss_name(LossKind k) {
  for (const auto& [n, kind] : kLosses)
    if (kind == k) return n;
  return "?";
}

double weighted_loss(const Tensor& pred, const Tensor& target, const LossWeights& w, const LossFunction& f,
                     Tensor* grad, double grad_scale, const std::vector<LossFunction>& per_channel) {
  WXE_CHECK(pred.dtype == DType::F32 && target.dtype == DType::F32, "loss: pred is ", dtype_name(pred.dtype),
            " and target ", dtype_name(target.dtype), ", expected float32");
  WXE_CHECK(pred.shape == target.shape, "loss: pred ", shape_str(pred.shape), " and target ", shape_str(target.shape),
            " differ in shape");
  const int64_t n = pred.numel();
  WXE_CHECK(n > 0, "loss: pred ", shape_str(pred.shape), " is empty");
  const bool weighted = !w.lat_weights.empty() || !w.channel_weights.empty() || !per_channel.empty();
  // Weighted: rows of W elements (pred is (B, C, mid..., H, W)), each with one weight
  // lat[h] * chan[c]. Plain: fixed blocks of weight 1. Either way every row's sum is a
  // partial, summed in order: the same result for any thread count.
  int64_t row_len = 1 << 14, H = 1, C = 1, mid = 1;
  if (weighted) {
    WXE_CHECK(pred.rank() >= 4, "loss: latitude/channel weights need pred shaped (B, C, [T,] H, W), it is ",
              shape_str(pred.shape));
    row_len = pred.dim(-1);
    H = pred.dim(-2);
    C = pred.dim(1);
    mid = n / (pred.dim(0) * C * H * row_len);
    WXE_CHECK(w.lat_weights.empty() || (int64_t)w.lat_weights.size() == H, "loss: ", w.lat_weights.size(),
              " latitude weights for pred ", shape_str(pred.shape), " with H = ", H);
    WXE_CHECK(w.channel_weights.empty() || (int64_t)w.channel_weights.size() == C, "loss: ", w.channel_weights.size(),
              " channel weights for pred ", shape_str(pred.shape), " with C = ", C);
    WXE_CHECK(per_channel.empty() || (int64_t)per_channel.size() == C, "loss: ", per_channel.size(),
              " channel losses for pred ", shape_str(pred.shape), " with C = ", C);
  }
  const int64_t rows = (n + row_len - 1) / row_len;
  auto row_weight = [&](int64_t r) {
    if (!weighted) return 1.0;
    double wl = w.lat_weights.empty() ? 1.0 : w.lat_weights[r % H];
    double wc = w.channel_weights.empty() ? 1.0 : w.channel_weights[(r / (H * mid)) % C];
    return wl * wc;
  };
  if (grad && !(grad->defined() && grad->dtype == DType::F32 && grad->shape == pred.shape))
    *grad = Tensor(DType::F32, pred.shape);
  const float* p = pred.data<float>();
  const float* t = target.data<float>();
  float* g = grad ? grad->data<float>() : nullptr;
  const double gscale = grad_scale / (double)n;  // d/dpred of mean(w l) = w l' / n
  std::vector<double> part(rows);
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const double wr = row_weight(r);
    double s = 0;
    const LossFunction& fr = per_channel.empty() ? f : per_channel[(r / (H * mid)) % C];
    if (fr.kind == LossKind::MSE) {  // the common case, kept a plain loop
      for (int64_t j = r * row_len, e = std::min(n, j + row_len); j < e; ++j) {
        const double d = (double)p[j] - (double)t[j];
        s += d * d;
        if (g) g[j] = (float)(2 * gscale * wr * d);
      }
    } else {
      for (int64_t j = r * row_len, e = std::min(n, j + row_len); j < e; ++j) {
        double dp = 0;
        s += element_loss(fr, (double)p[j], (double)t[j], dp);
        if (g) g[j] = (float)(gscale * wr * dp);
      }
    }
    part[r] = s * wr;
  }
  double loss = 0;
  for (double x : part) loss += x;
  return loss / (double)n;
}

}  // namespace wxe
