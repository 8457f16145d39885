// bridgescaler's quantile scaler (data/quantile_scaler.h) against bridgescaler itself:
// tests/data/quantile/ (models/make_quantile_fixture.py) holds scaler files fitted the way
// `credit preprocess` fits them and CREDIT's blocks run over probe values (inside and outside
// the fitted range, exact centroid means, +-inf, NaN). Uniform (CREDIT's default), normal and
// logistic outputs, the fast_transform (PCHIP) path with knots built here and read from a file,
// float32 (what CREDIT computes in) and float64; then the round trip, a single-centroid digest
// and the errors.
//
// Tolerance reached: bit for bit (tolerance 0) for the float32 and float64 transforms and
// inverses of the uniform and normal scalers and for the fast path's outputs (checked at 2.5e-7);
// torch's ndtr / sigmoid (MKL erf, SLEEF exp) round 1 ulp apart from libm's on a few probes
// (normal 1 of 192, logistic 38): each such inverse is checked against the digest's quantile of
// torch's own probability, and came out identical here; logistic's transform (logit's log) is
// within 1 ulp (1.1e-7 relative; tolerance 2.5e-7). fast_transform knots built here are within
// 2e-14 relative of bridgescaler's (torch.linspace rounds its SIMD chunks differently).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data/quantile_scaler.h"
#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/quantile/");

// a fixture array of shape (rows, cols), or (cols) with rows 0
template <class T>
std::vector<T> npy(const std::string& name, int64_t rows, int64_t cols) {
  Tensor t = read_npy(kDir + name);
  const DType want = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  if (t.dtype != want || t.shape != (rows ? Shape{rows, cols} : Shape{cols}))
    throw Error(name + ": not the fixture's dtype and shape");
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

Json manifest() { return parse_json(slurp(kDir + "manifest.json"), kDir + "manifest.json"); }

// The scaler of one variable from a scaler file ({side: {"era5": {key: "<JSON text>"}}}).
QuantileScaler scaler_of(const std::string& file, const std::string& side, const std::string& key) {
  Json j = parse_json(slurp(kDir + file), file);
  const Json* s = j.get(side);
  const Json* src = s ? s->get("era5") : nullptr;
  const Json* text = src ? src->get(key) : nullptr;
  if (!text || text->type != Json::Str) throw Error(file + ": no scaler " + side + "/" + key);
  Json one = parse_json(text->s, file);
  EXPECT_EQ(scaler_kind(one, file), ScalerKind::Quantile);
  return QuantileScaler::from_json(one, file + ": scaler '" + key + "'");
}

struct Var {
  std::string key;
  int channels;
};
std::vector<Var> vars_of(const Json& entry, const std::string& side) {
  std::vector<Var> v;
  for (const Json& e : entry.get("sides")->get(side)->items)
    v.push_back({e.get("key")->s, (int)parse_int64(e.get("channels")->s, "channels")});
  return v;
}

// a equals b: same bits class (NaN, +-inf) and |a - b| <= rel * |b|; the worst relative error
template <class T>
double compare(const T* a, const T* b, int64_t n, double rel, const std::string& what) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(b[i]) || std::isinf(b[i])) {
      EXPECT_TRUE(std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i])
          << what << " [" << i << "]: " << a[i] << " vs " << b[i];
      continue;
    }
    const double d = std::fabs((double)a[i] - (double)b[i]);
    const double r = d == 0 ? 0 : d / std::max(std::fabs((double)b[i]), 1e-30);
    worst = std::max(worst, r);
    EXPECT_LE(d, rel * std::fabs((double)b[i])) << what << " [" << i << "]: " << a[i] << " vs " << b[i];
  }
  return worst;
}

// One case of the manifest, one side, in float32: transform of x against fwd; inverse of z against
// inv where this dist_cdf(z) equals torch's (q.npy), else against quantile(torch's q).
void golden_case(const std::string& name, const std::string& side, double rel, int* cdf_ulps = nullptr) {
  Json man = manifest();
  const Json& e = *man.get(name);
  const int64_t M = parse_int64(man.get("M")->s, "M");
  const std::vector<Var> vars = vars_of(e, side);
  int64_t C = 0;
  for (const Var& v : vars) C += v.channels;
  const std::string p = name + "_" + side + "_";
  std::vector<float> x = npy<float>(p + "x.npy", C, M), fwd = npy<float>(p + "fwd.npy", C, M);
  std::vector<float> z = npy<float>(p + "z.npy", C, M), q = npy<float>(p + "q.npy", C, M);
  std::vector<float> inv = npy<float>(p + "inv.npy", C, M);
  int64_t row = 0, q_mismatch = 0;
  double worst = 0, apart = 0;  // apart: where the probabilities differ, the inverses' difference
  for (const Var& v : vars) {
    QuantileScaler s = scaler_of(e.get("file")->s, side, v.key);
    ASSERT_EQ(s.channels(), v.channels) << v.key;
    EXPECT_EQ(s.fast_transform(), e.get("fast_transform")->s == "true");
    EXPECT_FALSE(s.channels_last());  // CREDIT's configs: channels_last: False
    for (int c = 0; c < v.channels; ++c, ++row) {
      const std::string what = str(name, " ", side, " ", v.key, " channel ", c);
      std::vector<float> y(x.begin() + row * M, x.begin() + (row + 1) * M);
      s.transform(y.data(), M, c);
      worst = std::max(worst, compare(y.data(), fwd.data() + row * M, M, rel, what + " transform"));
      std::vector<float> w(z.begin() + row * M, z.begin() + (row + 1) * M);
      s.inverse_transform(w.data(), M, c);
      if (s.fast_transform()) {
        worst = std::max(worst, compare(w.data(), inv.data() + row * M, M, rel, what + " inverse_transform"));
        continue;
      }
      for (int64_t i = 0; i < M; ++i) {
        const float zi = z[row * M + i], tq = q[row * M + i];
        float mine = zi;
        if (s.distribution() == QuantileScaler::Distribution::Normal) mine = torch_cpu::ndtr(zi);
        if (s.distribution() == QuantileScaler::Distribution::Logistic) mine = torch_cpu::sigmoid(zi);
        float want = inv[row * M + i];
        if (!(mine == tq || (std::isnan(mine) && std::isnan(tq)))) {
          // torch's erf / exp rounded differently: for ndtr an ulp of erf (~1, so 2^-24 absolute
          // after (1 + erf) / 2), for sigmoid one of exp (2 ulps of the probability)
          ++q_mismatch;
          const float ulp = std::nextafter(std::fabs(tq), 2.0f) - std::fabs(tq);
          const bool normal = s.distribution() == QuantileScaler::Distribution::Normal;
          EXPECT_LE(std::fabs(mine - tq), 2 * ulp + (normal ? 0x1p-24f : 0.0f)) << what << " dist cdf of " << zi;
          const float from_torch_q = s.quantile(tq, c);
          worst = std::max(worst, compare(&from_torch_q, &want, 1, rel, what + " inverse from torch's probability"));
          want = s.quantile(mine, c);
          const float ref = inv[row * M + i];
          apart = std::max(apart, std::fabs((double)want - ref) / std::max(std::fabs((double)ref), 1e-30));
        }
        worst = std::max(worst, compare(&w[i], &want, 1, rel, str(what, " inverse_transform [", i, "] z ", zi)));
      }
    }
  }
  std::printf("%s %s: worst relative difference from bridgescaler %.3g; %lld probabilities 1 ulp apart, their "
              "inverses %.3g apart\n", name.c_str(), side.c_str(), worst, (long long)q_mismatch, apart);
  if (cdf_ulps) *cdf_ulps = (int)q_mismatch;
}

}  // namespace

TEST(QuantileGolden, UniformInputAndTargetBitForBit) {
  golden_case("uniform", "input", 0);
  golden_case("uniform", "target", 0);
}

TEST(QuantileGolden, NormalBitForBitButTorchsErfUlps) {
  int ulps = -1;
  golden_case("normal", "target", 0, &ulps);
  EXPECT_LE(ulps, 8);  // of 192 probes
}

TEST(QuantileGolden, LogisticBitForBitButTorchsExpUlps) {
  // logit's log (SLEEF in torch) may round apart by an ulp as well
  int ulps = -1;
  golden_case("logistic", "target", 2.5e-7, &ulps);
  EXPECT_LE(ulps, 48);  // of 192 probes (25 of them logit(min_val) fed back)
}

TEST(QuantileGolden, FastTransformKnotsBuiltAsBridgescaler) {
  Json man = manifest();
  const std::vector<Var> vars = vars_of(*man.get("fast"), "target");
  const std::vector<double> kz = npy<double>("fast_knots_z.npy", 0, 64);
  const std::vector<double> kx = npy<double>("fast_knots_x.npy", 4, 64), km = npy<double>("fast_knots_m.npy", 4, 64),
                            ki = npy<double>("fast_knots_minv.npy", 4, 64);
  int64_t row = 0;
  double worst = 0;
  for (const Var& v : vars) {
    QuantileScaler built = scaler_of("scaler_quantile_fast.json", "target", v.key);
    QuantileScaler read = scaler_of("scaler_quantile_fast_saved.json", "target", v.key);
    ASSERT_EQ(built.knots_z().size(), 64u);
    // torch.linspace's vectorised loop (base + k * step per SIMD chunk) rounds apart from the
    // scalar formula here in the last bit
    for (int k = 0; k < 64; ++k) EXPECT_NEAR(built.knots_z()[k], kz[k], 1e-15 * std::fabs(kz[0])) << "knots_z " << k;
    compare(read.knots_z().data(), kz.data(), 64, 0, "knots_z read");
    for (int c = 0; c < v.channels; ++c, ++row) {
      const std::string w = str(v.key, " channel ", c);
      const int64_t o = row * 64;
      worst = std::max(worst, compare(built.knots_x(c).data(), kx.data() + o, 64, 1e-12, w + " knots_x built"));
      worst = std::max(worst, compare(built.knots_m(c).data(), km.data() + o, 64, 1e-9, w + " knots_m built"));
      worst = std::max(worst, compare(built.knots_minv(c).data(), ki.data() + o, 64, 1e-9, w + " knots_minv built"));
      compare(read.knots_x(c).data(), kx.data() + row * 64, 64, 0, w + " knots_x read");
      compare(read.knots_minv(c).data(), ki.data() + row * 64, 64, 0, w + " knots_minv read");
    }
  }
  std::printf("fast_transform knots built here: worst relative difference %.3g\n", worst);
}

TEST(QuantileGolden, FastTransformOutputs) {
  golden_case("fast", "target", 2.5e-7);
}

TEST(QuantileGolden, FastTransformFromSavedKnots) {
  // the file written after a transform holds the knots; the same outputs come from them
  Json man = manifest();
  const std::vector<Var> vars = vars_of(*man.get("fast"), "target");
  const std::vector<float> x = npy<float>("fast_target_x.npy", 4, 48), fwd = npy<float>("fast_target_fwd.npy", 4, 48);
  int64_t row = 0;
  for (const Var& v : vars) {
    QuantileScaler s = scaler_of("scaler_quantile_fast_saved.json", "target", v.key);
    for (int c = 0; c < v.channels; ++c, ++row) {
      std::vector<float> y(x.begin() + row * 48, x.begin() + (row + 1) * 48);
      s.transform(y.data(), 48, c);
      compare(y.data(), fwd.data() + row * 48, 48, 0, v.key + " fast transform, saved knots");
    }
  }
}

TEST(QuantileGolden, Float64) {
  const std::vector<double> x = npy<double>("uniform_target_x64.npy", 4, 48),
                            z = npy<double>("uniform_target_z64.npy", 4, 48);
  const std::vector<double> fwd = npy<double>("uniform_target_fwd64.npy", 4, 48),
                            inv = npy<double>("uniform_target_inv64.npy", 4, 48);
  int64_t row = 0;
  for (const Var& v : vars_of(*manifest().get("uniform"), "target")) {
    QuantileScaler s = scaler_of("scaler_quantile.json", "target", v.key);
    for (int c = 0; c < v.channels; ++c, ++row) {
      std::vector<double> y(x.begin() + row * 48, x.begin() + (row + 1) * 48);
      std::vector<double> w(z.begin() + row * 48, z.begin() + (row + 1) * 48);
      s.transform(y.data(), 48, c);
      s.inverse_transform(w.data(), 48, c);
      compare(y.data(), fwd.data() + row * 48, 48, 0, v.key + " transform float64");
      compare(w.data(), inv.data() + row * 48, 48, 0, v.key + " inverse_transform float64");
    }
  }
}

// torch.special.ndtri / ndtr values (torch 2.15 on CPU)
TEST(QuantileScaler, TorchNdtri) {
  EXPECT_EQ(torch_cpu::ndtri(0.5f), 0.0f);
  EXPECT_EQ(torch_cpu::ndtri(0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(torch_cpu::ndtri(1.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(torch_cpu::ndtri(1.5f)));
  EXPECT_NEAR(torch_cpu::ndtri(0.975), 1.959963984540054, 1e-15);
  EXPECT_EQ(torch_cpu::ndtri(1e-7), -5.1993375821928165);
  EXPECT_NEAR(torch_cpu::ndtr(1.959963984540054), 0.975, 1e-15);
}

// Round trip: inverse_transform(transform(x)) = x inside the fitted range, to the precision
// the probability carries (float32: the quantile function's spread over +-2 ulps of it).
TEST(QuantileScaler, RoundTrip) {
  for (const char* dist : {"uniform", "normal"}) {
    const std::string file = std::string(dist) == "uniform" ? "scaler_quantile.json" : "scaler_quantile_normal.json";
    for (const Var& v : vars_of(*manifest().get(dist), "target")) {
      QuantileScaler s = scaler_of(file, "target", v.key);
      for (int c = 0; c < v.channels; ++c) {
        const double lo = s.fitted_min(c), hi = s.fitted_max(c);
        int checked = 0, spikes = 0;
        for (int i = 1; i < 400; ++i) {
          const double x = lo + (hi - lo) * i / 400.0;
          const double q = s.cdf(x, c);
          if (q <= s.min_val() || q >= s.max_val()) continue;  // clamped tails do not come back
          // an exact centroid mean (a float32 data value of a single-value centroid) has the next
          // centroid's probability in bridgescaler: it comes back as that centroid's mean
          const float fx = (float)x, fq = s.cdf(fx, c);
          if (s.cdf(std::nextafter(fx, -INFINITY), c) < fq && s.cdf(std::nextafter(fx, INFINITY), c) < fq) {
            ++spikes;
            continue;
          }
          double y = x;
          s.transform(&y, 1, c);
          s.inverse_transform(&y, 1, c);
          EXPECT_NEAR(y, x, 1e-9 * (hi - lo)) << dist << " " << v.key << " " << c << " float64 at " << x;
          float f = (float)x;
          // the probability's rounding: a few ulps of it (cdf), and for normal also float32's
          // ndtr, whose 1 + erf cancels to an absolute ~6e-8
          const float qf = s.cdf(f, c);
          float lo_q = qf, hi_q = qf;
          for (int k = 0; k < 4; ++k) {
            lo_q = std::nextafter(lo_q, 0.0f);
            hi_q = std::nextafter(hi_q, 1.0f);
          }
          if (std::string(dist) == "normal") {
            lo_q -= 1.2e-7f;
            hi_q += 1.2e-7f;
          }
          const float a = s.quantile(lo_q, c), b = s.quantile(hi_q, c);
          s.transform(&f, 1, c);
          s.inverse_transform(&f, 1, c);
          EXPECT_NEAR(f, (float)x, (b - a) + 4e-7 * std::fabs(x))
              << dist << " " << v.key << " " << c << " float32 at " << x;
          ++checked;
        }
        EXPECT_GT(checked, 200) << v.key;
        EXPECT_LE(spikes, 3) << v.key;
      }
    }
  }
}

// bridgescaler's single-centroid digest: a ramp from min to max (0.5 when they are equal), and
// its mean for any interior probability.
TEST(QuantileScaler, SingleCentroid) {
  const std::string js = R"({"type": "DQuantileScalerTensor", "_fit": true, "distribution": "uniform",
    "min_val": 1e-07, "max_val": 0.9999999, "centroids_mean_tensor": [[5.0], [2.0]],
    "centroids_weight_tensor": [[1.0], [3.0]], "min_tensor": [5.0, 1.0], "max_tensor": [5.0, 3.0]})";
  QuantileScaler s = QuantileScaler::from_text(js, "single");
  EXPECT_EQ(s.channels(), 2);
  float v[] = {4.0f, 5.0f, 6.0f};
  s.transform(v, 3, 0);
  EXPECT_EQ(v[0], 1e-7f);
  EXPECT_EQ(v[1], 0.5f);
  EXPECT_EQ(v[2], 0.9999999f);
  EXPECT_FLOAT_EQ(s.cdf(1.5f, 1), 0.25f);
  float q[] = {0.3f, 0.0f, 1.0f};
  s.inverse_transform(q, 3, 1);
  EXPECT_EQ(q[0], 2.0f);
  EXPECT_EQ(q[1], 1.0f);
  EXPECT_EQ(q[2], 3.0f);
}

// The quirks bridgescaler has, kept: at an exact centroid mean the cdf takes the NEXT centroid's
// merged weight (a spike above both neighbours).
TEST(QuantileScaler, ExactCentroidMeanTakesTheNextMergedWeight) {
  const std::string js = R"({"type": "DQuantileScalerTensor", "centroids_mean_tensor": [[0.0, 1.0, 2.0, 3.0]],
    "centroids_weight_tensor": [[1.0, 2.0, 2.0, 1.0]], "min_tensor": [0.0], "max_tensor": [3.0]})";
  QuantileScaler s = QuantileScaler::from_text(js, "quirk");
  // merged weights 0.5, 2, 4, 5.5 of 6
  EXPECT_DOUBLE_EQ(s.cdf(1.0, 0), 4.0 / 6);
  EXPECT_NEAR(s.cdf(1.0 - 1e-9, 0), 2.0 / 6, 1e-9);
  EXPECT_NEAR(s.cdf(1.0 + 1e-9, 0), 2.0 / 6, 1e-9);
  EXPECT_DOUBLE_EQ(s.quantile(3.0 / 6, 0), 1.5);
}

// Below a first centroid that is not at min (weight > 1, as merged fits of large data have):
// bridgescaler's ramp reaches only half the first merged weight, so cdf and quantile disagree
// by a factor 2 there; past the last centroid they agree. Values from bridgescaler's
// tdigest_cdf_tensor / tdigest_quantile_tensor on these centroids (float64); channel 0 is
// padded to the 4 centroids of channel 1.
TEST(QuantileScaler, BelowTheFirstCentroid) {
  const std::string js = R"({"type": "DQuantileScalerTensor", "centroids_mean_tensor": [[1, 2, 3], [0, 1, 2, 3]],
    "centroids_weight_tensor": [[2, 2, 2], [1, 1, 1, 1]], "min_tensor": [0, 0], "max_tensor": [4, 3]})";
  QuantileScaler s = QuantileScaler::from_text(js, "first");
  const double x[] = {0.5, 1.0, 1.5, 3.0, 3.5, 4.0, 0.0};
  const double cdf[] = {0.041666666666666664, 0.5, 0.3333333333333333, 0.8333333333333334, 0.9166666666666666, 1.0, 0.0};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(s.cdf(x[i], 0), cdf[i]) << x[i];
  const double q[] = {0.05, 1.0 / 6, 0.5, 0.95};
  const double quant[] = {0.30000000000000004, 1.0, 2.0, 3.6999999999999993};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.quantile(q[i], 0), quant[i]) << q[i];
}

TEST(QuantileScaler, ScalerKind) {
  EXPECT_EQ(scaler_kind(parse_json(R"({"type": "DStandardScalerTensor", "mean_x_": [1]})", "k"), "k"),
            ScalerKind::Standard);
  EXPECT_EQ(scaler_kind(parse_json(R"({"mean_x_": [1], "var_x_": [1]})", "k"), "k"), ScalerKind::Standard);
  EXPECT_EQ(scaler_kind(parse_json(R"({"type": "DQuantileScalerTensor"})", "k"), "k"), ScalerKind::Quantile);
  EXPECT_EQ(scaler_kind(parse_json(R"({"centroids_": []})", "k"), "k"), ScalerKind::Quantile);
  EXPECT_EQ(scaler_kind(parse_json(R"({"type": "DMinMaxScalerTensor"})", "k"), "k"), ScalerKind::MinMax);
  EXPECT_EQ(scaler_kind(parse_json(R"({"era5/prognostic/3d/T": "{}"})", "k"), "k"), ScalerKind::None);
  EXPECT_NE(error_of([] { scaler_kind(parse_json(R"({"type": "RobustScaler"})", "k"), "f.json: scaler 'T'"); })
                .find("f.json: scaler 'T': scaler type 'RobustScaler'"),
            std::string::npos);
  // a standard scaler of a real CREDIT file
  Json j = parse_json(slurp(kDir + "scaler_quantile.json"), "f");
  EXPECT_EQ(scaler_kind(j, "f"), ScalerKind::None);
  EXPECT_EQ(scaler_kind(*j.get("target"), "f"), ScalerKind::None);
}

namespace {

std::string b64(const std::string& bytes) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = (uint8_t)bytes[i] << 16;
    if (i + 1 < bytes.size()) n |= (uint8_t)bytes[i + 1] << 8;
    if (i + 2 < bytes.size()) n |= (uint8_t)bytes[i + 2];
    o += t[(n >> 18) & 63];
    o += t[(n >> 12) & 63];
    o += i + 1 < bytes.size() ? t[(n >> 6) & 63] : '=';
    o += i + 2 < bytes.size() ? t[n & 63] : '=';
  }
  return o;
}

// a numpy array of float64 as NumpyEncoder writes it
std::string np(const std::vector<double>& v, const std::string& shape) {
  return R"({"__numpy__": ")" + b64(std::string((const char*)v.data(), v.size() * 8)) + R"(", "dtype": "<f8", "shape": )" +
         shape + "}";
}

const double kInf = std::numeric_limits<double>::infinity();

// A valid stacked scaler of 2 channels (3 and 2 centroids), with one field replaced.
std::string stacked(const std::string& field = "", const std::string& value = "") {
  std::vector<std::pair<std::string, std::string>> f = {
      {"type", R"("DQuantileScalerTensor")"},
      {"_fit", "true"},
      {"distribution", R"("uniform")"},
      {"min_val", "1e-07"},
      {"max_val", "0.9999999"},
      {"fast_transform", "false"},
      {"n_knots", "256"},
      {"centroids_mean_stacked", np({0, 1, 2, 5, 6, kInf}, "[2, 3]")},
      {"centroids_weight_stacked", np({1, 2, 1, 1, 1, 0}, "[2, 3]")},
      {"centroids_count", R"({"__numpy__": ")" + b64(std::string("\3\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0", 16)) +
                              R"(", "dtype": "<i8", "shape": [2]})"},
      {"min_tensor", np({0, 5}, "[2]")},
      {"max_tensor", np({2, 6}, "[2]")},
      {"x_columns_", "[0, 1]"}};
  std::string s = "{";
  for (auto& [k, v] : f) {
    if (k == field && value == "<drop>") continue;
    s += (s.size() > 1 ? ", \"" : "\"") + k + "\": " + (k == field ? value : v);
  }
  if (!field.empty() && value != "<drop>" && s.find("\"" + field + "\"") == std::string::npos)
    s += ", \"" + field + "\": " + value;
  return s + "}";
}

void expect_error(const std::string& text, const std::string& needle) {
  const std::string msg = error_of([&] { QuantileScaler::from_text(text, "s.json: scaler 'era5/prognostic/2d/SP'"); });
  EXPECT_NE(msg.find("s.json: scaler 'era5/prognostic/2d/SP'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "want '" << needle << "' in: " << msg;
}

}  // namespace

TEST(QuantileScalerErrors, ValidBaseline) {
  QuantileScaler s = QuantileScaler::from_text(stacked(), "ok");
  EXPECT_EQ(s.channels(), 2);
  EXPECT_EQ(s.centroids(0), 3);
  EXPECT_EQ(s.centroids(1), 2);
  EXPECT_FLOAT_EQ(s.cdf(1.0f, 0), 0.875f);  // exact mean 1: the next centroid's merged weight 3.5 of 4
  EXPECT_NE(error_of([&] { s.cdf(0.0f, 2); }).find("channel 2 out of range"), std::string::npos);
}

TEST(QuantileScalerErrors, Each) {
  expect_error("{\"type\": ", "malformed");
  expect_error("[1, 2]", "a JSON object");
  expect_error(stacked("distribution", R"("gamma")"), "distribution: unknown distribution 'gamma'");
  expect_error(stacked("distribution", "3"), "distribution is not a string");
  expect_error(stacked("type", R"("DStandardScalerTensor")"), "type is 'DStandardScalerTensor'");
  expect_error(stacked("_fit", "false"), "_fit is false");
  expect_error(stacked("centroids_weight_stacked", np({1, 2, 1, 1}, "[2, 2]")),
               "centroid arrays of different lengths");
  expect_error(stacked("centroids_weight_stacked", "<drop>"), "centroids_weight_stacked is missing");
  expect_error(stacked("centroids_mean_stacked", np({0, NAN, 2, 5, 6, kInf}, "[2, 3]")), "centroid means[0][1] is nan");
  expect_error(stacked("centroids_mean_stacked", np({0, 3, 2, 5, 6, kInf}, "[2, 3]")), "are not ascending");
  expect_error(stacked("centroids_mean_stacked", np({0, 1, 2, 5, 6, 7}, "[2, 3]")), "padding");
  expect_error(stacked("centroids_weight_stacked", np({1, 0, 1, 1, 1, 0}, "[2, 3]")), "centroid weights[0][1] is 0");
  expect_error(stacked("centroids_weight_stacked", np({1, 2, kInf, 1, 1, 0}, "[2, 3]")), "centroid weights[0][2] is inf");
  expect_error(stacked("centroids_mean_stacked", np({0, 1, 2, 5, 6, kInf}, "[6]")), "is not 2-D");
  expect_error(stacked("centroids_mean_stacked", R"({"__numpy__": "AAAA", "dtype": "<f8", "shape": [2, 3]})"),
               "centroids_mean_stacked holds 3 bytes");
  expect_error(stacked("centroids_mean_stacked", R"({"__numpy__": "AAAA", "dtype": "<c16", "shape": [1]})"),
               "has dtype <c16");
  expect_error(stacked("min_tensor", np({0, NAN}, "[2]")), "min_tensor[1] is nan");
  expect_error(stacked("max_tensor", np({2, 6, 7}, "[3]")), "max_tensor has 3 entries for 2 channels");
  expect_error(stacked("max_tensor", np({2, 4}, "[2]")), "channel 1: min 5 > max 4");
  expect_error(stacked("min_tensor", "<drop>"), "min_tensor (or min_) is missing");
  expect_error(stacked("x_columns_", "[0]"), "x_columns_ names 1 channels");
  expect_error(stacked("min_val", "-0.1"), "must satisfy 0 <= min_val <= max_val <= 1");
  expect_error(stacked("max_val", "1.5"), "must satisfy 0 <= min_val <= max_val <= 1");
  expect_error(stacked("min_val", R"("a")"), "min_val is not a numpy array");
  expect_error(stacked("fast_transform", "1"), "fast_transform is not true or false");
  std::string few_knots = stacked("fast_transform", "true");
  const std::string knots256 = "\"n_knots\": 256";
  few_knots.replace(few_knots.find(knots256), knots256.size(), "\"n_knots\": 3");
  expect_error(few_knots, "fast_transform needs at least 4");
  expect_error(stacked("centroids_mean_stacked", "<drop>"), "no centroids");
  // the per-channel lists
  const std::string lists = R"({"type": "DQuantileScalerTensor", "centroids_mean_tensor": [[1, 2, 3]],
    "centroids_weight_tensor": [[1, 1]], "min_tensor": [1], "max_tensor": [3]})";
  expect_error(lists,
               "centroids_mean_tensor[0] has 3 centroids, centroids_weight_tensor[0] 2 (centroid arrays of different "
               "lengths)");
  expect_error(R"({"centroids_": [[[1, 1], [2]]], "min_": [1], "max_": [2]})", "ragged");
  expect_error(R"({"centroids_": [[]], "min_": [1], "max_": [2]})", "centroids_[0]");
}
