#include "train/ensemble_loss.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel/comm.h"

namespace wxe {

namespace {

inline double sgn(double d) { return (double)((d > 0) - (d < 0)); }

// The weight of each row of W elements of a (B, C, mid..., H, W) tensor: wlat[h] * wvar[c].
struct RowWeights {
  int64_t W = 1, H = 1, C = 1, mid = 1;
  const LossWeights* w = nullptr;
  bool on = false;
  RowWeights(const Tensor& t, const LossWeights& lw, const char* what) : w(&lw) {
    on = !lw.lat_weights.empty() || !lw.channel_weights.empty();
    if (!on) {
      W = t.numel();
      return;
    }
    WXE_CHECK(t.rank() >= 4, what, ": latitude/channel weights need the target shaped (B, C, [T,] H, W), it is ",
              shape_str(t.shape));
    W = t.dim(-1);
    H = t.dim(-2);
    C = t.dim(1);
    mid = t.numel() / (t.dim(0) * C * H * W);
    WXE_CHECK(lw.lat_weights.empty() || (int64_t)lw.lat_weights.size() == H, what, ": ", lw.lat_weights.size(),
              " latitude weights for ", shape_str(t.shape));
    WXE_CHECK(lw.channel_weights.empty() || (int64_t)lw.channel_weights.size() == C, what, ": ",
              lw.channel_weights.size(), " channel weights for ", shape_str(t.shape));
  }
  int64_t rows(int64_t n) const { return W ? n / W : 0; }
  double operator()(int64_t r) const {
    if (!on) return 1.0;
    const double wl = w->lat_weights.empty() ? 1.0 : w->lat_weights[r % H];
    const double wc = w->channel_weights.empty() ? 1.0 : w->channel_weights[(r / (H * mid)) % C];
    return wl * wc;
  }
};

void check_f32(const Tensor& pred, const Tensor& target, const char* what) {
  WXE_CHECK(pred.dtype == DType::F32 && target.dtype == DType::F32, what, ": pred is ", dtype_name(pred.dtype),
            " and target ", dtype_name(target.dtype), ", expected float32");
  WXE_CHECK(target.numel() > 0 && target.rank() >= 1, what, ": the target ", shape_str(target.shape), " is empty");
}

}  // namespace

bool is_crps_loss(const std::string& name) {
  return name == "KCRPS" || name == "almost-fair-crps" || name == "ring-crps";
}

CrpsLoss crps_loss(const std::string& name, bool biased, double alpha) {
  WXE_CHECK(is_crps_loss(name), "loss '", name, "' is not a CRPS loss (KCRPS, almost-fair-crps, ring-crps)");
  CrpsLoss f;
  f.kind = name == "KCRPS" ? CrpsKind::KCRPS : name == "ring-crps" ? CrpsKind::Ring : CrpsKind::AlmostFair;
  f.biased = biased;
  f.alpha = alpha;
  return f;
}

const char* crps_name(CrpsKind k) {
  return k == CrpsKind::KCRPS ? "KCRPS" : k == CrpsKind::Ring ? "ring-crps" : "almost-fair-crps";
}

Tensor repeat_members(const Tensor& t, int64_t m) {
  WXE_CHECK(t.rank() >= 1 && m >= 1, "repeat_members: ", shape_str(t.shape), " x ", m);
  Shape s = t.shape;
  s[0] *= m;
  Tensor r(t.dtype, s);
  const size_t row = t.nbytes() / (size_t)std::max<int64_t>(1, t.dim(0));
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(r.raw());
  for (int64_t b = 0; b < t.dim(0); ++b)
    for (int64_t k = 0; k < m; ++k) std::memcpy(dst + (b * m + k) * row, src + b * row, row);
  return r;
}

Tensor ensemble_mean(const Tensor& t, int64_t m) {
  WXE_CHECK(t.dtype == DType::F32 && t.rank() >= 1 && m >= 1 && t.dim(0) % m == 0, "ensemble_mean: ",
            shape_str(t.shape), " is not members (B * ", m, ", ...)");
  Shape s = t.shape;
  s[0] /= m;
  Tensor r = Tensor::zeros(DType::F32, s);
  const int64_t n = r.numel() / std::max<int64_t>(1, s[0]);
  const float* x = t.data<float>();
  float* y = r.data<float>();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < m; ++k) acc += x[(b * m + k) * n + i];
      y[b * n + i] = (float)(acc / (double)m);
    }
  return r;
}

double ensemble_crps(const Tensor& pred, const Tensor& target, const LossWeights& w, const CrpsLoss& f, Tensor* grad,
                     double grad_scale) {
  const char* what = crps_name(f.kind);
  check_f32(pred, target, what);
  WXE_CHECK(f.kind != CrpsKind::Ring, "ring-crps holds one member per rank: ring_crps, not ensemble_crps");
  const int64_t B = target.dim(0), n = target.numel() / B;  // n: elements of one sample
  const int64_t m = B ? pred.dim(0) / B : 0;
  Shape member = pred.shape;
  member[0] = B;
  WXE_CHECK(m >= 2 && pred.dim(0) == B * m && member == target.shape, what, ": pred ", shape_str(pred.shape),
            " is not ensemble members (B * m, ...) of the target ", shape_str(target.shape), " with m >= 2");
  // spread weight per pair: KCRPS 1 / (m (m - 1)) (biased 1 / m^2); almost-fair (1 - eps) / (m (m - 1))
  double pair = f.kind == CrpsKind::KCRPS && f.biased ? 1.0 / (double)(m * m) : 1.0 / (double)(m * (m - 1));
  if (f.kind == CrpsKind::AlmostFair) pair *= 1.0 - (1.0 - f.alpha) / (double)m;
  const RowWeights rw(target, w, what);
  const int64_t rows = rw.rows(target.numel());
  if (grad && !(grad->defined() && grad->dtype == DType::F32 && grad->shape == pred.shape))
    *grad = Tensor(DType::F32, pred.shape);
  const float* p = pred.data<float>();
  const float* t = target.data<float>();
  float* g = grad ? grad->data<float>() : nullptr;
  const double gscale = grad_scale / (double)target.numel();
  std::vector<double> part(rows);
#pragma omp parallel for schedule(static) if (target.numel() >= (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const double wr = rw(r);
    std::vector<double> x(m);
    double s = 0;
    for (int64_t e = r * rw.W; e < (r + 1) * rw.W; ++e) {
      const int64_t b = e / n, i = e % n;
      const double y = t[e];
      for (int64_t k = 0; k < m; ++k) x[k] = p[(b * m + k) * n + i];  // read all before writing (g may be p)
      double skill = 0, spread = 0;
      for (int64_t k = 0; k < m; ++k) {
        skill += std::fabs(x[k] - y);
        for (int64_t j = k + 1; j < m; ++j) spread += std::fabs(x[k] - x[j]);
      }
      s += skill / (double)m - pair * spread;
      if (g)
        for (int64_t k = 0; k < m; ++k) {
          double ds = 0;
          for (int64_t j = 0; j < m; ++j) ds += sgn(x[k] - x[j]);
          g[(b * m + k) * n + i] = (float)(gscale * wr * (sgn(x[k] - y) / (double)m - pair * ds));
        }
    }
    part[r] = s * wr;
  }
  double loss = 0;
  for (double v : part) loss += v;
  return loss / (double)target.numel();
}

double ring_crps(const Tensor& pred, const Tensor& target, const LossWeights& w, Communicator* dp, Tensor* grad,
                 double grad_scale) {
  check_f32(pred, target, "ring-crps");
  WXE_CHECK(pred.shape == target.shape, "ring-crps: pred ", shape_str(pred.shape), " and target ",
            shape_str(target.shape), " differ in shape (one member per rank)");
  const int K = dp ? dp->size() : 1, r = dp ? dp->rank() : 0;
  const int64_t n = pred.numel();
  // spread[e] = sum over the other members of |x_r - x_j| and its derivative, one ring shift at a
  // time: each rank passes the member it holds to rank + 1 and takes rank - 1's (even ranks send
  // first, so the blocking sends of a ring cannot all wait on each other)
  std::vector<double> spread(n, 0.0), dspread(n, 0.0);
  const float* p = pred.data<float>();
  Tensor buf = pred.clone(), next(DType::F32, pred.shape);
  for (int shift = 1; shift < K; ++shift) {
    const int to = (r + 1) % K, from = (r - 1 + K) % K;
    if (r % 2 == 0) {
      dp->send(buf, to);
      dp->recv(next, from);
    } else {
      dp->recv(next, from);
      dp->send(buf, to);
    }
    std::swap(buf, next);
    const float* o = buf.data<float>();
    for (int64_t e = 0; e < n; ++e) {
      spread[e] += std::fabs((double)p[e] - o[e]);
      dspread[e] += sgn((double)p[e] - o[e]);
    }
  }
  const RowWeights rw(target, w, "ring-crps");
  const int64_t rows = rw.rows(n);
  if (grad && !(grad->defined() && grad->dtype == DType::F32 && grad->shape == pred.shape))
    *grad = Tensor(DType::F32, pred.shape);
  const float* t = target.data<float>();
  float* g = grad ? grad->data<float>() : nullptr;
  const double inv = K > 1 ? 1.0 / (K - 1) : 0.0, gscale = grad_scale / (double)n / K;
  std::vector<double> part(rows);
#pragma omp parallel for schedule(static) if (n >= (1 << 14))
  for (int64_t row = 0; row < rows; ++row) {
    const double wr = rw(row);
    double s = 0;
    for (int64_t e = row * rw.W; e < (row + 1) * rw.W; ++e) {
      const double d = (double)p[e] - t[e];
      s += (std::fabs(d) - spread[e] * inv) / K;
      if (g) g[e] = (float)(gscale * wr * (sgn(d) - dspread[e] * inv));
    }
    part[row] = s * wr;
  }
  double loss = 0;
  for (double v : part) loss += v;
  return loss / (double)n;
}

}  // namespace wxe
