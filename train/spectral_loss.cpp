#include "train/spectral_loss.h"

#include <cmath>
#include <complex>

#include "engine/ir/error.h"

namespace wxe {

namespace {

using cd = std::complex<double>;

// out[k] = sum_j x[j * stride] exp(-2 pi i j k / n), k < n, by mixed-radix decimation in time
// (a prime length directly); tw[j] = exp(-2 pi i j / N) with n dividing N.
void fft(const cd* x, int64_t stride, int64_t n, cd* out, const std::vector<cd>& tw) {
  const int64_t N = (int64_t)tw.size(), step = N / n;
  int64_t p = 2;
  while (p * p <= n && n % p) ++p;
  if (p * p > n) p = n;
  if (p == n) {
    for (int64_t k = 0; k < n; ++k) {
      cd s = 0;
      for (int64_t j = 0; j < n; ++j) s += x[j * stride] * tw[(j * k % n) * step];
      out[k] = s;
    }
    return;
  }
  const int64_t m = n / p;
  std::vector<cd> sub(n);
  for (int64_t r = 0; r < p; ++r) fft(x + r * stride, stride * p, m, sub.data() + r * m, tw);
  for (int64_t q = 0; q < p; ++q)
    for (int64_t k = 0; k < m; ++k) {
      const int64_t f = k + q * m;
      cd s = 0;
      for (int64_t r = 0; r < p; ++r) s += sub[r * m + k] * tw[(r * f % n) * step];
      out[f] = s;
    }
}

struct Rfft {
  int64_t W, K;  // K = W / 2 + 1 wavenumbers
  std::vector<cd> tw;
  explicit Rfft(int64_t w) : W(w), K(w / 2 + 1), tw(w) {
    for (int64_t j = 0; j < w; ++j) tw[j] = std::polar(1.0, -2 * M_PI * (double)j / (double)w);
  }
  // the K wavenumbers of a real row
  void forward(const float* x, cd* F) const {
    std::vector<cd> in(x, x + W), out(W);
    fft(in.data(), 1, W, out.data(), tw);
    std::copy(out.begin(), out.begin() + K, F);
  }
  // Adds s * sum_k (a_k cos t - b_k sin t), t = 2 pi k w / W, z_k = a_k + i b_k, into g[w]: with
  // z_k = c_k F_k, the gradient of a function of the |F_k| (or |F_k|^2) whose derivative by Re F_k
  // is c_k Re F_k and by Im F_k is c_k Im F_k (Re F = sum x cos t, Im F = -sum x sin t)
  void backward(const cd* z, double s, float* g) const {
    std::vector<cd> in(W, cd(0)), out(W);
    for (int64_t k = 0; k < K; ++k) in[k] = std::conj(z[k]);
    fft(in.data(), 1, W, out.data(), tw);
    for (int64_t w = 0; w < W; ++w) g[w] += (float)(s * out[w].real());
  }
};

struct Blocks {
  int64_t n, H, W;  // n blocks of H x W
};
Blocks blocks_of(const Tensor& pred, const Tensor& target, const char* what) {
  WXE_CHECK(pred.dtype == DType::F32 && target.dtype == DType::F32 && pred.shape == target.shape, what, ": pred ",
            shape_str(pred.shape), " and target ", shape_str(target.shape), " must be float32 of one shape");
  WXE_CHECK(pred.rank() >= 4, what, ": pred is ", shape_str(pred.shape), ", expected (B, C, [T,] H, W)");
  const int64_t H = pred.dim(-2), W = pred.dim(-1);
  return {pred.numel() / (H * W), H, W};
}

double spectral_or_power(const TensorLoss& f, const Tensor& pred, const Tensor& target, const std::vector<double>& lat,
                         Tensor* grad, double scale) {
  const bool power = f.kind == TensorLossKind::Power;
  const char* what = power ? "power loss" : "spectral loss";
  const Blocks b = blocks_of(pred, target, what);
  const Rfft r(b.W);
  WXE_CHECK(f.wavenum_init >= 0 && f.wavenum_init < r.K, what, ": wavenumber_init ", f.wavenum_init,
            " leaves none of the ", r.K, " wavenumbers of rows of ", b.W, " (spectral_wavenum_init)");
  WXE_CHECK(lat.empty() || (int64_t)lat.size() == b.H, what, ": ", lat.size(), " latitude weights for ", b.H, " rows");
  // per latitude: the spectral loss's weight (w / H) or the power loss's (w / sum w)
  std::vector<double> wl(b.H, 1.0 / (double)b.H);
  if (!lat.empty()) {
    double sum = 0;
    for (double v : lat) sum += v;
    for (int64_t h = 0; h < b.H; ++h) wl[h] = power ? lat[h] / sum : lat[h] / (double)b.H;
  }
  const int64_t K = r.K, k0 = f.wavenum_init, nk = K - k0;
  const double N = (double)(b.n * nk), W2 = (double)b.W * (double)b.W;
  if (grad && !(grad->defined() && grad->shape == pred.shape)) *grad = Tensor::zeros(DType::F32, pred.shape);
  double loss = 0;
  std::vector<cd> Fp(b.H * K), Ft(b.H * K), z(K);
  std::vector<double> A(K), At(K);
  for (int64_t i = 0; i < b.n; ++i) {
    const float* p = pred.data<float>() + i * b.H * b.W;
    const float* t = target.data<float>() + i * b.H * b.W;
    for (int64_t h = 0; h < b.H; ++h) {
      r.forward(p + h * b.W, Fp.data() + h * K);
      r.forward(t + h * b.W, Ft.data() + h * K);
    }
    auto P = [&](const cd& F, int64_t k) { return (k ? 2.0 : 1.0) * std::norm(F) / W2; };
    if (!power) {  // A_k = sum_h wl_h |F_hk|
      std::fill(A.begin(), A.end(), 0.0);
      std::fill(At.begin(), At.end(), 0.0);
      for (int64_t h = 0; h < b.H; ++h)
        for (int64_t k = 0; k < K; ++k) {
          A[k] += wl[h] * std::abs(Fp[h * K + k]);
          At[k] += wl[h] * std::abs(Ft[h * K + k]);
        }
      for (int64_t k = k0; k < K; ++k) loss += (At[k] - A[k]) * (At[k] - A[k]);
    } else {
      for (int64_t h = 0; h < b.H; ++h)
        for (int64_t k = k0; k < K; ++k) {
          const double d = std::log(P(Ft[h * K + k], k) + 1e-8) - std::log(P(Fp[h * K + k], k) + 1e-8);
          loss += wl[h] * d * d;
        }
    }
    if (!grad) continue;
    float* g = grad->data<float>() + i * b.H * b.W;
    for (int64_t h = 0; h < b.H; ++h) {
      std::fill(z.begin(), z.end(), cd(0));
      for (int64_t k = k0; k < K; ++k) {
        const cd F = Fp[h * K + k];
        if (!power) {  // d/dA_k = -2 (At - A) / N; dA/d|F| = wl_h; d|F|: F / |F| (0 at 0, as torch)
          const double a = std::abs(F);
          if (a > 0) z[k] = (-2 * (At[k] - A[k]) / N * wl[h] / a) * F;
        } else {  // d/dP = wl_h 2 (lp - lt) / (P + 1e-8) / N; dP/dF: (k ? 2 : 1) 2 F / W^2
          const double pp = P(F, k), d = std::log(pp + 1e-8) - std::log(P(Ft[h * K + k], k) + 1e-8);
          z[k] = (wl[h] * 2 * d / (pp + 1e-8) / N * (k ? 2.0 : 1.0) * 2 / W2) * F;
        }
      }
      r.backward(z.data(), scale, g + h * b.W);
    }
  }
  return loss / N;
}

// In place: a <- inverse of the D x D matrix a (Gauss-Jordan, partial pivoting).
bool invert(std::vector<double>& a, int64_t D) {
  std::vector<double> inv(D * D, 0.0);
  for (int64_t i = 0; i < D; ++i) inv[i * D + i] = 1;
  for (int64_t c = 0; c < D; ++c) {
    int64_t piv = c;
    for (int64_t r = c + 1; r < D; ++r)
      if (std::fabs(a[r * D + c]) > std::fabs(a[piv * D + c])) piv = r;
    if (!(std::fabs(a[piv * D + c]) > 1e-300)) return false;
    for (int64_t k = 0; k < D; ++k) {
      std::swap(a[c * D + k], a[piv * D + k]);
      std::swap(inv[c * D + k], inv[piv * D + k]);
    }
    const double d = a[c * D + c];
    for (int64_t k = 0; k < D; ++k) {
      a[c * D + k] /= d;
      inv[c * D + k] /= d;
    }
    for (int64_t r = 0; r < D; ++r)
      if (r != c && a[r * D + c] != 0) {
        const double m = a[r * D + c];
        for (int64_t k = 0; k < D; ++k) {
          a[r * D + k] -= m * a[c * D + k];
          inv[r * D + k] -= m * inv[c * D + k];
        }
      }
  }
  a.swap(inv);
  return true;
}

double covmse(const TensorLoss& f, const Tensor& pred, const Tensor& target, Tensor* grad, double scale) {
  const Blocks b = blocks_of(pred, target, "covmse loss");
  const int64_t B = pred.dim(0), D = b.n / B, HW = b.H * b.W, N = B * HW;  // rows (C x T), points (B x H x W)
  WXE_CHECK(N > 1 && D >= 1, "covmse loss: ", N, " points: the covariance needs two");
  // residual rows r[d][n] = target - pred (each row over the batch's points), optionally normalised
  auto at = [&](int64_t d, int64_t n) { return (n / HW) * D * HW + d * HW + n % HW; };
  std::vector<double> R(D * N), inv_s(D, 1.0);
  for (int64_t d = 0; d < D; ++d) {
    if (f.batch_normalize) {
      double m = 0, v = 0;
      for (int64_t n = 0; n < N; ++n) m += target.data<float>()[at(d, n)];
      m /= (double)N;
      for (int64_t n = 0; n < N; ++n) v += std::pow(target.data<float>()[at(d, n)] - m, 2);
      inv_s[d] = 1.0 / std::sqrt(v / (double)(N - 1));  // torch.std: unbiased
    }
    for (int64_t n = 0; n < N; ++n)
      R[d * N + n] = ((double)target.data<float>()[at(d, n)] - (double)pred.data<float>()[at(d, n)]) * inv_s[d];
  }
  std::vector<double> mean(D, 0.0), S(D * D, 0.0), G(D * D, 0.0);
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t n = 0; n < N; ++n) mean[d] += R[d * N + n];
    mean[d] /= (double)N;
  }
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = i; j < D; ++j) {
      double s = 0, g = 0;
      for (int64_t n = 0; n < N; ++n) {
        s += (R[i * N + n] - mean[i]) * (R[j * N + n] - mean[j]);
        g += R[i * N + n] * R[j * N + n];
      }
      S[i * D + j] = S[j * D + i] = s / (double)(N - 1);
      G[i * D + j] = G[j * D + i] = g / (double)N;
    }
  std::vector<double> P = S;
  WXE_CHECK(invert(P, D), "covmse loss: the residuals' covariance over the ", D, " channels is singular");
  // P' = P with its off-diagonal entries scaled; loss = mean_n r_n^T P' r_n = sum_ij P'_ij G_ij
  std::vector<double> Ps = P;
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j)
      if (i != j) Ps[i * D + j] *= f.off_diagonal_scale;
  double loss = 0;
  for (int64_t k = 0; k < D * D; ++k) loss += Ps[k] * G[k];
  if (!grad) return loss;
  if (!(grad->defined() && grad->shape == pred.shape)) *grad = Tensor::zeros(DType::F32, pred.shape);
  // dL/dP = G o scale; dL/dS = -P^T (dL/dP) P^T; S = Rc Rc^T / (N - 1)
  std::vector<double> GP(D * D), Hm(D * D, 0.0), T1(D * D, 0.0);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) GP[i * D + j] = G[i * D + j] * (i == j ? 1.0 : f.off_diagonal_scale);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t k = 0; k < D; ++k)
      for (int64_t j = 0; j < D; ++j) T1[i * D + j] += P[k * D + i] * GP[k * D + j];  // P^T GP
  for (int64_t i = 0; i < D; ++i)
    for (int64_t k = 0; k < D; ++k)
      for (int64_t j = 0; j < D; ++j) Hm[i * D + j] -= T1[i * D + k] * P[j * D + k];  // (P^T GP) P^T
  // dL/dR = (P' + P'^T) R / N + (H + H^T) Rc / (N - 1); the centring passes it through (its rows sum to 0)
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t e = 0; e < D; ++e)
        s += (Ps[d * D + e] + Ps[e * D + d]) * R[e * N + n] / (double)N +
             (Hm[d * D + e] + Hm[e * D + d]) * (R[e * N + n] - mean[e]) / (double)(N - 1);
      grad->data<float>()[at(d, n)] += (float)(-s * inv_s[d] * scale);  // r = (t - p) / s
    }
  return loss;
}

}  // namespace

bool is_tensor_loss(const std::string& name) { return name == "spectral" || name == "power" || name == "covmse"; }

double tensor_loss(const TensorLoss& f, const Tensor& pred, const Tensor& target, const std::vector<double>& lat,
                   Tensor* grad, double grad_scale) {
  WXE_CHECK(!grad || grad != &pred, "tensor loss: the gradient cannot overwrite the prediction");
  if (f.kind == TensorLossKind::CovMSE) return covmse(f, pred, target, grad, grad_scale);
  return spectral_or_power(f, pred, target, lat, grad, grad_scale);
}

}  // namespace wxe
