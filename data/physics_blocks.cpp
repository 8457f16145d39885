#include "data/physics_blocks.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "data/data_file.h"
#include "engine/ir/error.h"

namespace wxe {

namespace {
// credit/physics_constants.py
constexpr double kRadEarth = 6371000, kGravity = 9.80665, kRhoWater = 1000.0, kLhWater = 2.501e6,
                 kCpDry = 1004.64, kCpVapor = 1810.0;
constexpr double kPi = 3.14159265358979323846;

// torch.gradient(f, edge_order=2) with unit spacing at index i of n values f(0..n-1)
template <class F>
double gradient(const F& f, int64_t i, int64_t n) {
  if (i == 0) return (-3 * f(0) + 4 * f(1) - f(2)) / 2;
  if (i == n - 1) return (3 * f(n - 1) - 4 * f(n - 2) + f(n - 3)) / 2;
  return (f(i + 1) - f(i - 1)) / 2;
}

// The pressure integral of a column's values e(l) (physics_core's integral: midpoint, or the
// trapezoid between levels) at surface pressure sp.
template <class E>
double column_integral(const SigmaGrid& g, const E& e, double sp) {
  double s = 0;
  for (size_t l = 0; l + 1 < g.a.size(); ++l) {
    const double dp = (g.a[l + 1] + g.b[l + 1] * sp) - (g.a[l] + g.b[l] * sp);
    s += (g.midpoint ? e(l) : 0.5 * (e(l) + e(l + 1))) * dp;
  }
  return s;
}

// Zero-padded correlation of x (h, w) with a 1-D kernel (odd size, centred) along rows (dim 0)
// or columns (dim 1), as F.conv2d with padding size // 2.
std::vector<double> smooth1d(const std::vector<double>& x, int64_t h, int64_t w, const std::vector<double>& k, int dim) {
  std::vector<double> y((size_t)(h * w), 0.0);
  const int64_t K = (int64_t)k.size(), c = K / 2;
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) {
      double s = 0;
      for (int64_t t = 0; t < K; ++t) {
        const int64_t ii = dim == 0 ? i + t - c : i, jj = dim == 1 ? j + t - c : j;
        if (ii >= 0 && ii < h && jj >= 0 && jj < w) s += k[t] * x[ii * w + jj];
      }
      y[i * w + j] = s;
    }
  return y;
}

// A normalised Gaussian of `size` points (centred) with standard deviation sigma.
std::vector<double> gaussian(int64_t size, double sigma) {
  std::vector<double> g((size_t)size);
  double sum = 0;
  for (int64_t i = 0; i < size; ++i) {
    const double x = (double)(i - size / 2) / sigma;
    sum += g[i] = std::exp(-0.5 * x * x);
  }
  for (double& v : g) v /= sum;
  return g;
}
}  // namespace

std::vector<double> grid_area(const std::vector<double>& lon2d, const std::vector<double>& lat2d, int64_t h, int64_t w) {
  WXE_CHECK(h >= 3 && w >= 3, "grid area: the grid is ", h, "x", w, " (torch.gradient's second-order edges need 3 points)");
  std::vector<double> area((size_t)(h * w));
  const double rad = kPi / 180;
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) {
      const double dphi = gradient([&](int64_t r) { return std::sin(lat2d[r * w + j] * rad); }, i, h);
      double dl = gradient([&](int64_t col) { return lon2d[i * w + col] * rad; }, j, w);
      const double x = dl + kPi;  // Python's floor modulo
      dl = x - 2 * kPi * std::floor(x / (2 * kPi)) - kPi;
      area[i * w + j] = std::fabs(kRadEarth * kRadEarth * dphi * dl);
    }
  return area;
}

SigmaGrid read_sigma_grid(const PhysicsBlockSpec& s, const std::string& config_file) {
  const std::string where = config_file + ": " + s.block + ".args.save_loc_physics: " + s.statics;
  std::unique_ptr<DataFile> f = open_data_file(s.statics);
  auto var = [&](const std::string& name) {
    if (!f->has(name)) fail(where, ": no variable '", name, "'");
    return f->read(name);
  };
  SigmaGrid g;
  g.midpoint = s.midpoint;
  const std::vector<int64_t> shape = f->has(s.lat_name) ? f->shape(s.lat_name) : std::vector<int64_t>{};
  if (shape.size() != 2) fail(where, ": '", s.lat_name, "' is not a 2-D latitude (", shape.size(), " dimensions)");
  g.h = shape[0], g.w = shape[1];
  const std::vector<double> lon = var(s.lon_name), lat = var(s.lat_name);
  if ((int64_t)lon.size() != g.h * g.w) fail(where, ": '", s.lon_name, "' has ", lon.size(), " values, '", s.lat_name, "' ", g.h * g.w);
  if (g.h < 3 || g.w < 3) fail(where, ": the grid is ", g.h, "x", g.w, " (CREDIT's area needs 3 points or more each way)");
  g.area = grid_area(lon, lat, g.h, g.w);
  g.a = var(s.a_name);
  g.b = var(s.b_name);
  if (g.a.size() != g.b.size() || g.a.size() < 2)
    fail(where, ": '", s.a_name, "' has ", g.a.size(), " values, '", s.b_name, "' ", g.b.size(), " (two or more each, as many)");
  if (!s.phis_name.empty()) {
    g.phis = var(s.phis_name);
    if ((int64_t)g.phis.size() != g.h * g.w) fail(where, ": '", s.phis_name, "' has ", g.phis.size(), " values for the ", g.h, "x", g.w, " grid");
  }
  const SigmaGrid& cg = g;
  for (const std::vector<double>* v : {&lon, &lat, &cg.a, &cg.b, &cg.phis})
    for (double x : *v)
      if (!std::isfinite(x)) fail(where, ": holds a missing (NaN) value");
  return g;
}

void tracer_fix(float* p, int64_t n, double lo, double hi) {
  const float l = (float)lo, u = (float)hi;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] < l) p[i] = l;
    if (!std::isnan(hi) && p[i] > u) p[i] = u;
  }
}

void mass_fix(const SigmaGrid& g, const float* q, float* sp, const float* q0, const float* sp0) {
  const int64_t n = g.h * g.w;
  double m0 = 0, ma = 0, mb = 0;  // the input's dry-air mass; the prediction's a and b parts
  for (int64_t i = 0; i < n; ++i) {
    m0 += g.area[i] * column_integral(g, [&](size_t l) { return 1.0 - q0[l * n + i]; }, sp0[i]) / kGravity;
    double pa = 0, pb = 0;
    for (size_t l = 0; l + 1 < g.a.size(); ++l) {
      const double dry = g.midpoint ? 1.0 - q[l * n + i] : 1.0 - 0.5 * ((double)q[l * n + i] + q[(l + 1) * n + i]);
      pa += (g.a[l + 1] - g.a[l]) * dry;
      pb += (g.b[l + 1] - g.b[l]) * dry;
    }
    ma += pa * g.area[i] / kGravity;
    mb += pb * sp[i] * g.area[i] / kGravity;
  }
  const double ratio = (m0 - ma) / mb;
  for (int64_t i = 0; i < n; ++i) sp[i] = (float)(sp[i] * ratio);
}

void water_fix(const SigmaGrid& g, double seconds, const float* q, const float* sp, float* precip, const float* evap,
               const float* q0, const float* sp0) {
  const int64_t n = g.h * g.w;
  double twc = 0, e = 0, p = 0;  // global sums of d(column water)/dt, evaporation and precipitation fluxes
  for (int64_t i = 0; i < n; ++i) {
    const double w1 = column_integral(g, [&](size_t l) { return (double)q[l * n + i]; }, sp[i]) / kGravity;
    const double w0 = column_integral(g, [&](size_t l) { return (double)q0[l * n + i]; }, sp0[i]) / kGravity;
    twc += (w1 - w0) / seconds * g.area[i];
    e += evap[i] * kRhoWater / seconds * g.area[i];
    p += precip[i] * kRhoWater / seconds * g.area[i];
  }
  const double residual = -twc - e - p, ratio = (p + residual) / p;
  for (int64_t i = 0; i < n; ++i) precip[i] = (float)(precip[i] * ratio);
}

void energy_fix(const SigmaGrid& g, double seconds, const EnergyFields& f) {
  const int64_t n = g.h * g.w, L = g.levels();
  WXE_CHECK(g.phis.size() == (size_t)n, "energy fixer: no surface geopotential");
  // a level's energy other than the sensible heat (latent, surface geopotential, kinetic), and cp
  auto qgk = [&](const float* q, const float* u, const float* v, int64_t j, int64_t i) {
    return kLhWater * q[j] + g.phis[i] + 0.5 * ((double)u[j] * u[j] + (double)v[j] * v[j]);
  };
  auto cp = [](double q) { return (1 - q) * kCpDry + q * kCpVapor; };
  double rt = 0, fs = 0, te0 = 0, te1 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double N = seconds;
    rt += ((double)f.solin0[i] * N - (double)f.toa_up_solar[i] * N - (double)f.olr[i] * N) / N * g.area[i];
    fs += ((double)f.sfc_down_solar[i] - f.sfc_up_solar[i] + f.sfc_down_lw[i] - f.sfc_up_lw[i] + f.sh[i] + f.lh[i]) / N *
          g.area[i];
    auto e0 = [&](size_t l) {
      const int64_t j = (int64_t)l * n + i;
      return cp(f.q0[j]) * f.T0[j] + qgk(f.q0, f.u0, f.v0, j, i);
    };
    auto e1 = [&](size_t l) {
      const int64_t j = (int64_t)l * n + i;
      return cp(f.q[j]) * f.T[j] + qgk(f.q, f.u, f.v, j, i);
    };
    te0 += column_integral(g, e0, f.sp0[i]) / kGravity * g.area[i];
    te1 += column_integral(g, e1, f.sp[i]) / kGravity * g.area[i];
  }
  const double ratio = (seconds * (rt - fs) + te0) / te1;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = l * n + i;
      const double c = cp(f.q[j]), other = qgk(f.q, f.u, f.v, j, i);
      f.T[j] = (float)(((c * f.T[j] + other) * ratio - other) / c);
    }
}

WindMask wind_mask(const PhysicsBlockSpec& s, const float* u, const float* v, int64_t h, int64_t w) {
  WindMask m;
  m.h = h, m.w = w;
  const int64_t n = h * w;
  std::vector<double> high((size_t)n);
  for (int64_t i = 0; i < n; ++i) high[i] = std::sqrt((double)u[i] * u[i] + (double)v[i] * v[i]) > s.speed_threshold;
  // dilation: any flagged point in the (meridional x zonal) box around it
  const std::vector<double> box_lat((size_t)s.dilation_meridional, 1.0), box_lon((size_t)s.dilation_zonal, 1.0);
  std::vector<double> grown = smooth1d(smooth1d(high, h, w, box_lat, 0), h, w, box_lon, 1);
  for (double& x : grown) x = std::min(std::max(x, 0.0), 1.0);
  // the falloff: a Gaussian twice as wide zonally; sizes as CREDIT rounds them (up to odd)
  const double fsig = s.falloff_sigma;
  const int64_t f_lat = (int64_t)(2 * fsig * 2 + 1) | 1, f_lon = (int64_t)(2 * fsig * 4 + 1) | 1;
  m.blend = smooth1d(smooth1d(grown, h, w, gaussian(f_lat, fsig), 0), h, w, gaussian(f_lon, fsig * 2), 1);
  const double sig_lat = std::isnan(s.sigma_meridional) ? s.smooth_sigma : s.sigma_meridional;
  const double sig_lon = std::isnan(s.sigma_zonal) ? s.smooth_sigma : s.sigma_zonal;
  m.k_lat = gaussian((int64_t)(2 * sig_lat * 3 + 1) | 1, sig_lat);
  m.k_lon = gaussian((int64_t)(2 * sig_lon * 3 + 1) | 1, sig_lon);
  return m;
}

void wind_blend(const WindMask& m, bool preserve_amplitude, float* field) {
  const int64_t n = m.h * m.w;
  const std::vector<double> x(field, field + n);
  std::vector<double> sm = smooth1d(smooth1d(x, m.h, m.w, m.k_lat, 0), m.h, m.w, m.k_lon, 1);
  if (preserve_amplitude) {  // the smoothed field's mask-weighted RMS matched to the original's, at most 4x
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      num += m.blend[i] * x[i] * x[i];
      den += m.blend[i] * sm[i] * sm[i];
    }
    const double alpha = std::min(std::sqrt(num / (den + 1e-12)), 4.0);
    for (double& v : sm) v *= alpha;
  }
  for (int64_t i = 0; i < n; ++i) field[i] = (float)(m.blend[i] * sm[i] + (1 - m.blend[i]) * x[i]);
}

}  // namespace wxe
