#include "data/tisr.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "data/data_file.h"
#include "engine/ir/error.h"

// Every float32 operation below is one of CREDIT's torch ops, each rounded on its own:
// CMakeLists.txt compiles this file without FMA contraction (-ffp-contract=off).

namespace wxe {

namespace {

constexpr int64_t kUsPerSecond = 1000000;
constexpr int64_t kUsPerDay = 86400 * kUsPerSecond;

// Python float constants as torch holds them in float32 tensors (double, then rounded).
inline float F(double v) { return static_cast<float>(v); }

// torch's float32 sin and cos are within 1 ulp (SLEEF); these are correctly rounded.
inline float sin_f(float x) { return static_cast<float>(std::sin(static_cast<double>(x))); }
inline float cos_f(float x) { return static_cast<float>(std::cos(static_cast<double>(x))); }

// ---------------------------------------------------------------------------------------------
// The CMIP6 annual-mean total solar irradiance at 1 AU (W m-2), the float32 "tsi" variable of
// credit/metadata/total_solar_irradiance_CMIP6_49r1.nc in miles-credit 2026.2 (sha256
// 755018a7fd629e1c36f898256367a0ed942139736bedb3602f8d7a0f476d5802; ECMWF's IFS cycle 49r1 table,
// from CMIP6's solarforcing input4MIPs: observations to 2014, the reference scenario after),
// at the mid-years 1850.5, 1851.5, ..., 2299.5 (its float32 "time", years since 0000-01-01).
// The values are the shortest decimals that read back to the file's float32 numbers.
constexpr int kTsiFirstYear = 1850, kTsiYears = 450;
constexpr float kTsi[] = {
    1360.869f, 1360.826f, 1360.82f, 1360.74f, 1360.632f, 1360.565f, 1360.546f, 1360.593f,  // 1850
    1360.725f, 1360.837f, 1360.92f, 1360.903f, 1360.807f, 1360.751f, 1360.695f, 1360.651f,  // 1858
    1360.629f, 1360.594f, 1360.671f, 1360.81f, 1360.821f, 1360.906f, 1360.862f, 1360.785f,  // 1866
    1360.72f, 1360.598f, 1360.541f, 1360.506f, 1360.46f, 1360.47f, 1360.58f, 1360.731f,  // 1874
    1360.699f, 1360.676f, 1360.857f, 1360.744f, 1360.615f, 1360.536f, 1360.505f, 1360.494f,  // 1882
    1360.521f, 1360.72f, 1360.885f, 1361.013f, 1361.168f, 1361.021f, 1360.82f, 1360.692f,  // 1890
    1360.631f, 1360.559f, 1360.518f, 1360.447f, 1360.463f, 1360.608f, 1360.868f, 1360.753f,  // 1898
    1360.941f, 1360.839f, 1360.902f, 1360.771f, 1360.674f, 1360.533f, 1360.479f, 1360.491f,  // 1906
    1360.598f, 1360.909f, 1361.16f, 1361.325f, 1361.355f, 1361.099f, 1360.856f, 1360.707f,  // 1914
    1360.57f, 1360.538f, 1360.599f, 1360.764f, 1360.986f, 1361.172f, 1361.05f, 1360.988f,  // 1922
    1360.989f, 1360.816f, 1360.686f, 1360.632f, 1360.692f, 1360.9f, 1361.352f, 1361.377f,  // 1930
    1361.295f, 1361.273f, 1361.121f, 1360.997f, 1360.853f, 1360.707f, 1360.748f, 1361.025f,  // 1938
    1361.158f, 1361.514f, 1361.635f, 1361.518f, 1361.255f, 1360.907f, 1360.891f, 1360.789f,  // 1946
    1360.791f, 1361.004f, 1361.476f, 1361.911f, 1361.969f, 1361.721f, 1361.552f, 1361.176f,  // 1954
    1360.915f, 1360.824f, 1360.782f, 1360.806f, 1361.006f, 1361.254f, 1361.385f, 1361.408f,  // 1962
    1361.424f, 1361.2f, 1361.186f, 1360.96f, 1360.85f, 1360.852f, 1360.816f, 1361.051f,  // 1970
    1361.412f, 1361.715f, 1361.656f, 1361.675f, 1361.337f, 1361.323f, 1360.924f, 1360.789f,  // 1978
    1360.806f, 1360.891f, 1361.243f, 1361.726f, 1361.637f, 1361.623f, 1361.461f, 1361.079f,  // 1986
    1360.848f, 1360.804f, 1360.709f, 1360.837f, 1361.204f, 1361.474f, 1361.67f, 1361.587f,  // 1994
    1361.628f, 1361.149f, 1360.939f, 1360.732f, 1360.685f, 1360.595f, 1360.576f, 1360.575f,  // 2002
    1360.749f, 1361.017f, 1361.13f, 1361.195f, 1361.272f, 1361.038f, 1360.75f, 1360.673f,  // 2010
    1360.641f, 1360.636f, 1360.677f, 1360.963f, 1361.274f, 1361.451f, 1361.52f, 1361.348f,  // 2018
    1361.152f, 1360.953f, 1360.873f, 1360.74f, 1360.669f, 1360.6f, 1360.615f, 1360.786f,  // 2026
    1361.085f, 1361.121f, 1361.254f, 1361.121f, 1361.115f, 1360.923f, 1360.742f, 1360.584f,  // 2034
    1360.54f, 1360.561f, 1360.659f, 1360.941f, 1361.133f, 1361.348f, 1361.368f, 1361.194f,  // 2042
    1360.924f, 1360.791f, 1360.668f, 1360.58f, 1360.614f, 1360.778f, 1360.981f, 1360.986f,  // 2050
    1361.02f, 1361.045f, 1360.877f, 1360.734f, 1360.617f, 1360.575f, 1360.56f, 1360.61f,  // 2058
    1360.834f, 1361.034f, 1361.144f, 1361.099f, 1360.976f, 1360.8f, 1360.714f, 1360.651f,  // 2066
    1360.558f, 1360.521f, 1360.483f, 1360.533f, 1360.673f, 1360.824f, 1360.931f, 1360.944f,  // 2074
    1360.936f, 1360.823f, 1360.771f, 1360.602f, 1360.508f, 1360.5f, 1360.514f, 1360.644f,  // 2082
    1360.861f, 1361.021f, 1361.229f, 1361.143f, 1360.969f, 1360.83f, 1360.669f, 1360.613f,  // 2090
    1360.562f, 1360.636f, 1360.808f, 1361.01f, 1360.999f, 1360.991f, 1360.903f, 1360.737f,  // 2098
    1360.643f, 1360.565f, 1360.557f, 1360.607f, 1360.769f, 1361.107f, 1361.123f, 1361.142f,  // 2106
    1360.948f, 1360.89f, 1360.724f, 1360.638f, 1360.582f, 1360.584f, 1360.738f, 1360.979f,  // 2114
    1361.235f, 1361.088f, 1361.121f, 1360.913f, 1360.729f, 1360.636f, 1360.56f, 1360.58f,  // 2122
    1360.735f, 1361.138f, 1361.202f, 1361.278f, 1361.146f, 1360.946f, 1360.707f, 1360.634f,  // 2130
    1360.562f, 1360.527f, 1360.553f, 1360.714f, 1360.881f, 1360.904f, 1360.941f, 1360.913f,  // 2138
    1360.769f, 1360.753f, 1360.655f, 1360.603f, 1360.578f, 1360.582f, 1360.724f, 1360.998f,  // 2146
    1361.206f, 1361.198f, 1361.159f, 1361.03f, 1360.844f, 1360.69f, 1360.607f, 1360.616f,  // 2154
    1360.757f, 1361.039f, 1361.313f, 1361.227f, 1361.269f, 1361.004f, 1360.815f, 1360.681f,  // 2162
    1360.605f, 1360.584f, 1360.665f, 1360.908f, 1361.051f, 1361.177f, 1361.183f, 1361.056f,  // 2170
    1360.873f, 1360.763f, 1360.641f, 1360.568f, 1360.504f, 1360.478f, 1360.508f, 1360.618f,  // 2178
    1360.876f, 1360.918f, 1360.992f, 1361.046f, 1360.869f, 1360.714f, 1360.612f, 1360.578f,  // 2186
    1360.563f, 1360.629f, 1360.861f, 1361.104f, 1361.242f, 1361.183f, 1361.069f, 1360.87f,  // 2194
    1360.789f, 1360.723f, 1360.615f, 1360.575f, 1360.528f, 1360.576f, 1360.719f, 1360.879f,  // 2202
    1360.999f, 1361.f, 1360.984f, 1360.863f, 1360.796f, 1360.616f, 1360.513f, 1360.504f,  // 2210
    1360.523f, 1360.662f, 1360.878f, 1361.04f, 1361.274f, 1361.174f, 1360.999f, 1360.847f,  // 2218
    1360.662f, 1360.615f, 1360.538f, 1360.62f, 1360.817f, 1360.947f, 1360.978f, 1361.053f,  // 2226
    1360.96f, 1360.877f, 1360.693f, 1360.62f, 1360.574f, 1360.585f, 1360.684f, 1360.924f,  // 2234
    1361.139f, 1361.168f, 1361.138f, 1360.978f, 1360.813f, 1360.743f, 1360.631f, 1360.563f,  // 2242
    1360.512f, 1360.505f, 1360.583f, 1360.745f, 1360.93f, 1360.96f, 1361.006f, 1360.973f,  // 2250
    1360.851f, 1360.766f, 1360.6f, 1360.519f, 1360.525f, 1360.557f, 1360.723f, 1360.956f,  // 2258
    1361.133f, 1361.3f, 1361.119f, 1360.981f, 1360.795f, 1360.683f, 1360.577f, 1360.576f,  // 2266
    1360.703f, 1360.887f, 1361.02f, 1361.017f, 1360.989f, 1360.889f, 1360.708f, 1360.614f,  // 2274
    1360.578f, 1360.559f, 1360.65f, 1360.871f, 1361.105f, 1361.183f, 1361.175f, 1360.911f,  // 2282
    1360.849f, 1360.707f, 1360.587f, 1360.52f, 1360.571f, 1360.776f, 1360.959f, 1361.154f,  // 2290
    1361.16f, 1361.01f,  // 2298
};
static_assert(sizeof(kTsi) / sizeof(kTsi[0]) == kTsiYears, "one TSI value a year, 1850 to 2299");
inline float tsi_time(int i) { return static_cast<float>(kTsiFirstYear + i) + 0.5f; }  // exact

// ---------------------------------------------------------------------------------------------
// Calendar (proleptic Gregorian, UTC), as pandas' DatetimeIndex fields give it.

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

struct Civil {
  int64_t year = 0;
  int month = 0, day = 0, hour = 0, minute = 0, second = 0, microsecond = 0;
  int day_of_year = 0;  // 1-based
  bool leap = false;
  int64_t us_of_day = 0;
};

bool is_leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

Civil civil(int64_t t_us) {
  Civil c;
  const int64_t days = floor_div(t_us, kUsPerDay);
  c.us_of_day = t_us - days * kUsPerDay;
  // days since 1970-01-01 -> y/m/d (H. Hinnant's civil_from_days)
  const int64_t z = days + 719468;
  const int64_t era = floor_div(z, 146097);
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  c.day = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
  c.month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
  c.year = yoe + era * 400 + (c.month <= 2);
  c.leap = is_leap(c.year);
  static const int kCum[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
  c.day_of_year = kCum[c.month - 1] + c.day + (c.leap && c.month > 2);
  int64_t s = c.us_of_day / kUsPerSecond;
  c.microsecond = static_cast<int>(c.us_of_day % kUsPerSecond);
  c.hour = static_cast<int>(s / 3600);
  c.minute = static_cast<int>(s / 60 % 60);
  c.second = static_cast<int>(s % 60);
  return c;
}

std::string iso(int64_t t_us) {
  const Civil c = civil(t_us);
  char b[64];
  std::snprintf(b, sizeof b, "%04lld-%02d-%02dT%02d:%02d:%02d", static_cast<long long>(c.year), c.month, c.day,
                c.hour, c.minute, c.second);
  std::string s = b;
  if (c.microsecond) {
    std::snprintf(b, sizeof b, ".%06d", c.microsecond);
    s += b;
  }
  return s;
}

// pandas' DatetimeIndex.to_julian_date(), in float64 and in its order of operations.
double julian_date(const Civil& c) {
  int64_t y = c.year, m = c.month;
  if (m < 3) {
    y -= 1;
    m += 12;
  }
  const double yd = static_cast<double>(y);
  double jd = static_cast<double>(c.day) + std::trunc(static_cast<double>(153 * m - 457) / 5.0);
  jd = jd + static_cast<double>(365 * y);
  jd = jd + std::floor(yd / 4.0);
  jd = jd - std::floor(yd / 100.0);
  jd = jd + std::floor(yd / 400.0);
  jd = jd + 1721118.5;
  double frac = static_cast<double>(c.hour) + static_cast<double>(c.minute) / 60.0;
  frac = frac + static_cast<double>(c.second) / 3600.0;
  frac = frac + static_cast<double>(c.microsecond) / 3600.0 / 1e6;
  // + nanosecond / 3600 / 1e9: always 0 here
  return jd + frac / 24.0;
}

// CREDIT's _get_tsi for one time: the fractional year (float64, then float32) against the table.
float tsi_at(const Civil& c, int64_t t_us) {
  WXE_CHECK(c.year >= kTsiFirstYear && c.year <= kTsiFirstYear + kTsiYears - 1, "tisr: time ", iso(t_us),
            " is outside the CMIP6 TSI table's years [", kTsiFirstYear, ", ", kTsiFirstYear + kTsiYears - 1,
            "] (credit/metadata/total_solar_irradiance_CMIP6_49r1.nc)");
  const double day_frac = static_cast<double>(c.us_of_day) / static_cast<double>(kUsPerDay);
  const double year_frac = (static_cast<double>(c.day_of_year - 1) + day_frac) / static_cast<double>(365 + c.leap);
  const float fy = static_cast<float>(static_cast<double>(c.year) + year_frac);
  // torch.searchsorted (left): the first table time >= fy, clamped to [1, n-1]
  int idx = 0;
  while (idx < kTsiYears && tsi_time(idx) < fy) ++idx;
  idx = std::min(std::max(idx, 1), kTsiYears - 1);
  const int lo = idx - 1, hi = idx;
  const float w = (fy - tsi_time(lo)) / (tsi_time(hi) - tsi_time(lo));
  return kTsi[lo] + w * (kTsi[hi] - kTsi[lo]);
}

// ---------------------------------------------------------------------------------------------
// The orbital terms' dot products: torch.stack(...) @ coefficients on (T, k) float32, which is
// MKL's sgemv: float32 products, summed in an order that depends on the row. Rows in the whole
// blocks of four (T >= 4) take one order, the rest another (measured on this torch build).

float dot6(const float* a, const float* c, bool block) {
  float p[6];
  for (int k = 0; k < 6; ++k) p[k] = a[k] * c[k];
  if (block) return (((p[0] + p[1]) + p[2]) + p[4]) + (p[3] + p[5]);
  return ((((p[0] + p[1]) + p[2]) + p[3]) + p[4]) + p[5];
}

float dot5(const float* a, const float* c, bool block) {
  float p[5];
  for (int k = 0; k < 5; ++k) p[k] = a[k] * c[k];
  if (block) return ((p[0] + p[1]) + p[3]) + (p[2] + p[4]);
  return (((p[0] + p[1]) + p[2]) + p[4]) + p[3];
}

float dot3(const float* a, const float* c) { return ((a[0] * c[0]) + (a[1] * c[1])) + (a[2] * c[2]); }

// Per integration sample: what the zenith cosine and the instantaneous TISR need.
struct SampleTerms {
  float tsi_factor;  // tsi * (1 / distance^2)
  float cos_decl, sin_decl;
  float solar_angle;  // 360 * solar_time (degrees; plus longitude: the hour angle)
};

// _get_orbital_parameters and _get_solar_time (float32) for sample `row` of `rows`.
SampleTerms sample_terms(int64_t t_us, int64_t row, int64_t rows) {
  const Civil c = civil(t_us);
  const float tsi = tsi_at(c, t_us);
  const float j2000 = static_cast<float>(julian_date(c) - 2451545.0);
  const float theta = j2000 / F(365.25);
  float rot = std::fmod(j2000, 1.0f);  // torch.remainder(j2000, 1.0)
  if (rot != 0 && rot < 0) rot += 1.0f;
  const float rel = F(6.283076) * theta + F(1.7535);
  const float rem = F(6.283020) * theta + F(6.240041);
  const float rlls = F(6.283076) * theta + F(4.8951);
  const float sin_rel = sin_f(rel), cos_rel = cos_f(rel);
  const float sin_two_rel = sin_f(2.0f * rel), cos_two_rel = cos_f(2.0f * rel);
  const float sin_two_rlls = sin_f(2.0f * rlls), cos_two_rlls = cos_f(2.0f * rlls);
  const float sin_four_rlls = sin_f(4.0f * rlls);
  const float sin_rem = sin_f(rem), sin_two_rem = sin_f(2.0f * rem);
  const bool block = rows >= 4 && row < rows / 4 * 4;

  static const float c_rllls[6] = {F(4.8952), F(6.283320), F(-0.0075), F(-0.0326), F(-0.0003), F(0.0002)};
  const float a_rllls[6] = {1.0f, theta, sin_rel, cos_rel, sin_two_rel, cos_two_rel};
  const float rllls = dot6(a_rllls, c_rllls, block);
  const float sin_repsm = sin_f(F(0.409093));  // obliquity
  const float sin_decl = sin_repsm * sin_f(rllls);
  const float cos_decl = std::sqrt(1.0f - sin_decl * sin_decl);

  static const float c_eot[5] = {F(591.8), F(-459.4), F(39.5), F(-12.7), F(-4.8)};
  const float a_eot[5] = {sin_two_rlls, sin_rem, sin_rem * cos_two_rlls, sin_four_rlls, sin_two_rem};
  const float eot_s = dot5(a_eot, c_eot, block);

  static const float c_dist[3] = {F(1.0001), F(-0.0163), F(0.0037)};
  const float a_dist[3] = {1.0f, sin_rel, cos_rel};
  const float dist = dot3(a_dist, c_dist);

  const float solar_time = rot + eot_s / 86400.0f;
  const float solar_factor = (1.0f / (dist * dist)) * 1.0f;  // 1.0 / d**2: reciprocal, then * 1.0
  return {tsi * solar_factor, cos_decl, sin_decl, 360.0f * solar_time};
}

// ---------------------------------------------------------------------------------------------
// torch's float32 sum over the time dimension (aten/src/ATen/native/cpu/SumKernel.cpp
// cascade_sum, one thread): multi_row_sum's four-level cascade, row_sum's four interleaved
// cascades, and for a single point the 8-lane inner sum. Which one a point gets depends on
// its flat index among P points: with 8-float vectors (this build's sum kernel), points below
// 32 * (P / 32) (P >= 8) or 4 * (P / 4) (P < 8) take multi_row_sum, the rest row_sum.

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t b = 0;
  for (uint64_t v = static_cast<uint64_t>(x - 1); v; v >>= 1) ++b;
  return b;
}

// multi_row_sum over `size` rows of `lanes` values, fed one row at a time.
struct Cascade {
  int64_t lanes, power, step, mask, i = 0;
  std::vector<float> acc;  // (4 levels, lanes)
  Cascade(int64_t lanes_, int64_t size) : lanes(lanes_) {
    power = std::max<int64_t>(4, ceil_log2(size) / 4);
    step = int64_t(1) << power;
    mask = step - 1;
    acc.assign(4 * lanes, 0.0f);
  }
  void add(const float* row) {
    float* a0 = acc.data();
    for (int64_t k = 0; k < lanes; ++k) a0[k] += row[k];
    if (++i % step) return;
    for (int64_t j = 1; j < 4; ++j) {  // a whole block of `step` rows: carry up the levels
      float* aj = acc.data() + j * lanes;
      float* ap = aj - lanes;
      for (int64_t k = 0; k < lanes; ++k) {
        aj[k] += ap[k];
        ap[k] = 0.0f;
      }
      if (i & (mask << (j * power))) break;
    }
  }
  void finish(float* out) const {
    for (int64_t k = 0; k < lanes; ++k) {
      float s = acc[k];
      for (int64_t j = 1; j < 4; ++j) s += acc[j * lanes + k];
      out[k] = s;
    }
  }
};

// row_sum: n values (stride `lanes` between them, `lanes` sums at once) as (n/4, 4) interleaved
// cascades, the leftover values into the first, then the four summed.
void row_sum(const float* y, int64_t n, int64_t lanes, float* out) {
  const int64_t rows = n / 4;
  Cascade c(4 * lanes, rows);
  for (int64_t r = 0; r < rows; ++r) c.add(y + 4 * r * lanes);
  std::vector<float> ps(4 * lanes);
  c.finish(ps.data());  // ps[k * lanes + l]: partial k of lane l
  for (int64_t l = 0; l < lanes; ++l) {
    float s = ps[l];
    for (int64_t r = 4 * rows; r < n; ++r) s += y[r * lanes + l];
    for (int64_t k = 1; k < 4; ++k) s += ps[k * lanes + l];
    out[l] = s;
  }
}

// One point's n >= 8 values: vectorized_inner_sum with 8-float vectors.
float inner_sum(const float* y, int64_t n) {
  const int64_t vecs = n / 8;
  float lanes[8];
  row_sum(y, vecs, 8, lanes);
  float s = 0.0f;
  for (int64_t t = 8 * vecs; t < n; ++t) s += y[t];
  for (float l : lanes) s += l;
  return s;
}

// ---------------------------------------------------------------------------------------------

void check_options(const TisrOptions& o) {
  WXE_CHECK(o.integration_period_s > 0, "tisr: the integration period (the source's timestep) is ",
            o.integration_period_s, " s; it must be > 0");
  WXE_CHECK(o.num_integration_steps > 0, "tisr: num_integration_steps is ", o.num_integration_steps,
            "; it must be a positive integer");
  WXE_CHECK(o.integration_period_s <= int64_t(1) << 40, "tisr: the integration period ", o.integration_period_s,
            " s is out of range");
  WXE_CHECK(o.integration_period_s * kUsPerSecond / o.num_integration_steps > 0, "tisr: num_integration_steps ",
            o.num_integration_steps, " splits the ", o.integration_period_s, " s period into steps under 1 us");
}

float checked_lat(double v, size_t i) {
  WXE_CHECK(std::isfinite(v), "tisr: latitude ", v, " (index ", i, ") is not finite");
  WXE_CHECK(v >= -90.0 && v <= 90.0, "tisr: latitude ", v, " (index ", i, ") is not in [-90, 90]");
  return static_cast<float>(v);
}

float checked_lon(double v, size_t i) {
  WXE_CHECK(std::isfinite(v), "tisr: longitude ", v, " (index ", i, ") is not finite");
  return static_cast<float>(v);
}

const float kDeg2Rad = F(0.017453292519943295);  // torch.deg2rad: x * (float)(pi / 180)

// The integration over P points: fill(k, p0, p1, y) writes the instantaneous TISR of points
// [p0, p1) at sample k into y; blocks of `block` points keep the running sums in cache.
// The integration window's N + 1 samples ending at t: pandas' date_range(end=t, periods=N+1,
// freq=period/N), the step Timedelta(period) / N truncated to pandas' microsecond unit.
struct Window {
  std::vector<SampleTerms> terms;
  float dx;  // the step in seconds (float64, then float32 as torch.trapz's dx)
};

Window window(int64_t t, const TisrOptions& o) {
  check_options(o);
  // the TSI table's years, and no overflow in microseconds
  WXE_CHECK(t > -(int64_t(1) << 36) && t < (int64_t(1) << 36), "tisr: time ", t, " s since 1970 is out of range");
  const int64_t N = o.num_integration_steps, T = N + 1;
  const int64_t t_us = t * kUsPerSecond;
  const int64_t step_us = o.integration_period_s * kUsPerSecond / N;
  Window w;
  w.dx = static_cast<float>(static_cast<double>(step_us) / 1e6);
  w.terms.resize(T);
  for (int64_t k = 0; k < T; ++k) w.terms[k] = sample_terms(t_us - (N - k) * step_us, k, T);
  return w;
}

template <class Fill>
std::vector<float> integrate(const Window& w, int64_t P, int64_t block, Fill fill) {
  const int64_t T = w.terms.size();
  const float dx = w.dx;

  const int64_t n_cascade = P == 1 ? 0 : P < 8 ? P / 4 * 4 : P / 32 * 32;  // multi_row_sum points
  std::vector<float> out(P), y, first, last, series, sums;
  for (int64_t p0 = 0; p0 < P; p0 += block) {
    const int64_t p1 = std::min(P, p0 + block), nb = p1 - p0;
    const int64_t nc = std::clamp(n_cascade - p0, int64_t(0), nb);  // this block's cascade points
    const int64_t nt = nb - nc;                                      // and row_sum points (< 32)
    y.resize(nb);
    first.resize(nb);
    last.resize(nb);
    series.assign(nt * T, 0.0f);
    Cascade cascade(nc, T);
    for (int64_t k = 0; k < T; ++k) {
      fill(k, p0, p1, y.data());
      if (k == 0) std::copy(y.begin(), y.end(), first.begin());
      if (k == T - 1) std::copy(y.begin(), y.end(), last.begin());
      if (nc) cascade.add(y.data());
      for (int64_t q = 0; q < nt; ++q) series[q * T + k] = y[nc + q];
    }
    sums.resize(nb);
    cascade.finish(sums.data());
    for (int64_t q = 0; q < nt; ++q) {
      const float* s = series.data() + q * T;
      if (P == 1 && T >= 8)
        sums[nc + q] = inner_sum(s, T);
      else
        row_sum(s, T, 1, &sums[nc + q]);
    }
    // torch.trapz(y, dx=dx, dim=0): (sum - (y[0] + y[-1]) * 0.5) * dx
    for (int64_t q = 0; q < nb; ++q) out[p0 + q] = (sums[q] - (first[q] + last[q]) * 0.5f) * dx;
  }
  return out;
}

}  // namespace

std::vector<float> credit_linspace_f32(double start, double end, int64_t n) {
  WXE_CHECK(n >= 1, "tisr: a grid spec's num_points is ", n, "; it must be >= 1");
  WXE_CHECK(std::isfinite(start) && std::isfinite(end), "tisr: a grid spec's ends ", start, ", ", end,
            " are not finite");
  const float s = static_cast<float>(start), e = static_cast<float>(end);
  std::vector<float> v(n);
  if (n == 1) {
    v[0] = s;
    return v;
  }
  const float step = (e - s) / static_cast<float>(n - 1);
  const int64_t half = n / 2;
  for (int64_t i = 0; i < n; ++i)
    v[i] = i < half ? std::fma(step, static_cast<float>(i), s) : std::fma(-step, static_cast<float>(n - i - 1), e);
  return v;
}

TisrGrid tisr_grid_from_spec(const TisrAxisSpec& lat, const TisrAxisSpec& lon) {
  TisrGrid g;
  for (float v : credit_linspace_f32(lat.start, lat.end, lat.num_points)) g.lat.push_back(v);
  for (float v : credit_linspace_f32(lon.start, lon.end, lon.num_points)) g.lon.push_back(v);
  g.ny = lat.num_points;
  g.nx = lon.num_points;
  for (size_t i = 0; i < g.lat.size(); ++i) checked_lat(g.lat[i], i);
  return g;
}

TisrGrid tisr_grid_from_file(const std::string& path) {
  std::unique_ptr<DataFile> f = open_data_file(path);
  auto find = [&](const std::vector<std::string>& names, const char* what) {
    std::string tried;
    for (const std::string& n : names) {
      if (f->has(n)) return n;
      tried += (tried.empty() ? "" : ", ") + n;
    }
    fail(path, ": no ", what, " variable for the tisr grid (CREDIT's names: ", tried, ")");
  };
  const std::string ky = find({"latitude", "lat", "XLAT", "nav_lat"}, "latitude");
  const std::string kx = find({"longitude", "lon", "XLONG", "nav_lon"}, "longitude");
  auto squeezed = [&](const std::string& k) {
    std::vector<int64_t> s;
    for (int64_t d : f->shape(k))
      if (d != 1) s.push_back(d);
    return s;
  };
  const std::vector<int64_t> sy = squeezed(ky), sx = squeezed(kx);
  TisrGrid g;
  g.lat = f->read(ky);
  g.lon = f->read(kx);
  if (sy.size() <= 1 && sx.size() <= 1) {  // a size-1 axis squeezes to 0-D: CREDIT fails there
    WXE_CHECK(sy.size() == 1 && sx.size() == 1, path, ": '", ky, "' and '", kx,
              "' must be 1-D or 2-D after dropping size-1 dimensions (CREDIT's tisr grid)");
    g.ny = sy[0];
    g.nx = sx[0];
  } else {
    WXE_CHECK(sy.size() == 2 && sx.size() == 2, path, ": '", ky, "' (", sy.size(), "-D) and '", kx, "' (", sx.size(),
              "-D) must both be 1-D or both 2-D after dropping size-1 dimensions");
    WXE_CHECK(sy == sx, path, ": '", ky, "' is ", sy[0], " x ", sy[1], " but '", kx, "' is ", sx[0], " x ", sx[1]);
    g.curvilinear = true;
    g.ny = sy[0];
    g.nx = sy[1];
  }
  for (size_t i = 0; i < g.lat.size(); ++i) {
    WXE_CHECK(std::isfinite(g.lat[i]) && g.lat[i] >= -90 && g.lat[i] <= 90, path, ": ", ky, " value ", g.lat[i],
              " (index ", i, ") is not in [-90, 90]");
    g.lat[i] = static_cast<float>(g.lat[i]);
  }
  for (size_t i = 0; i < g.lon.size(); ++i) {
    WXE_CHECK(std::isfinite(g.lon[i]), path, ": ", kx, " value ", g.lon[i], " (index ", i, ") is not finite");
    g.lon[i] = static_cast<float>(g.lon[i]);
  }
  return g;
}

float credit_tsi(int64_t t_us) { return tsi_at(civil(t_us), t_us); }

std::vector<float> credit_tisr(int64_t t, const std::vector<double>& lat, const std::vector<double>& lon,
                               const TisrOptions& o) {
  check_options(o);
  WXE_CHECK(!lat.empty() && !lon.empty(), "tisr: the grid has ", lat.size(), " latitudes and ", lon.size(),
            " longitudes");
  const int64_t ny = lat.size(), nx = lon.size();
  std::vector<float> latf(ny), lonf(nx), cl(ny), sl(ny);
  for (int64_t i = 0; i < ny; ++i) {
    latf[i] = checked_lat(lat[i], i);
    cl[i] = cos_f(latf[i] * kDeg2Rad);
    sl[i] = sin_f(latf[i] * kDeg2Rad);
  }
  for (int64_t j = 0; j < nx; ++j) lonf[j] = checked_lon(lon[j], j);
  const Window w = window(t, o);
  const int64_t T = w.terms.size();
  std::vector<float> cos_ha(T * nx);  // (T, nx): cos(deg2rad(360 * solar_time + lon))
  for (int64_t s = 0; s < T; ++s)
    for (int64_t j = 0; j < nx; ++j) cos_ha[s * nx + j] = cos_f((w.terms[s].solar_angle + lonf[j]) * kDeg2Rad);
  const int64_t rows = std::max<int64_t>(1, 16384 / nx);
  return integrate(w, ny * nx, rows * nx, [&](int64_t k, int64_t p0, int64_t p1, float* y) {
    const SampleTerms& st = w.terms[k];
    const float* ch = cos_ha.data() + k * nx;
    for (int64_t i = p0 / nx; i < p1 / nx; ++i) {
      const float a = cl[i] * st.cos_decl, b = sl[i] * st.sin_decl;
      float* yr = y + (i * nx - p0);
      for (int64_t j = 0; j < nx; ++j) {
        const float cz = a * ch[j] + b;  // ((cos lat * cos decl) * cos ha) + (sin lat * sin decl)
        yr[j] = st.tsi_factor * (cz < 0.0f ? 0.0f : cz);
      }
    }
  });
}

std::vector<float> credit_tisr_points(int64_t t, const std::vector<double>& lat, const std::vector<double>& lon,
                                      const TisrOptions& o) {
  check_options(o);
  WXE_CHECK(lat.size() == lon.size() && !lat.empty(), "tisr: ", lat.size(), " latitudes and ", lon.size(),
            " longitudes for a grid of points");
  const int64_t P = lat.size();
  std::vector<float> lonf(P), cl(P), sl(P);
  for (int64_t p = 0; p < P; ++p) {
    const float la = checked_lat(lat[p], p);
    cl[p] = cos_f(la * kDeg2Rad);
    sl[p] = sin_f(la * kDeg2Rad);
    lonf[p] = checked_lon(lon[p], p);
  }
  const Window w = window(t, o);
  return integrate(w, P, 4096, [&](int64_t k, int64_t p0, int64_t p1, float* y) {
    const SampleTerms& st = w.terms[k];
    for (int64_t p = p0; p < p1; ++p) {
      const float ch = cos_f((st.solar_angle + lonf[p]) * kDeg2Rad);
      const float cz = cl[p] * st.cos_decl * ch + sl[p] * st.sin_decl;
      y[p - p0] = st.tsi_factor * (cz < 0.0f ? 0.0f : cz);
    }
  });
}

std::vector<float> credit_tisr(int64_t t, const TisrGrid& g, const TisrOptions& o) {
  if (!g.curvilinear) {
    WXE_CHECK(int64_t(g.lat.size()) == g.ny && int64_t(g.lon.size()) == g.nx, "tisr: a rectangular grid of ", g.ny,
              " x ", g.nx, " has ", g.lat.size(), " latitudes and ", g.lon.size(), " longitudes");
    return credit_tisr(t, g.lat, g.lon, o);
  }
  WXE_CHECK(int64_t(g.lat.size()) == g.ny * g.nx && int64_t(g.lon.size()) == g.ny * g.nx, "tisr: a curvilinear grid of ",
            g.ny, " x ", g.nx, " has ", g.lat.size(), " latitudes and ", g.lon.size(), " longitudes");
  return credit_tisr_points(t, g.lat, g.lon, o);
}

}  // namespace wxe
