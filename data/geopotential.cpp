#include "data/geopotential.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "data/data_file.h"
#include "engine/ir/error.h"

namespace wxe {
namespace fs = std::filesystem;

namespace {
// ECMWF's L137 model level definitions (https://confluence.ecmwf.int/display/UDOC/L137+model+level+definitions,
// columns 2 and 3: a in Pa and b at the 138 half levels, top first), as float32: the a_half and
// b_half of CREDIT's metadata file ERA5_Lev_Info.nc, which CREDIT's postblock reads into
// float32 tensors.
constexpr float kA[138] = {
    0.0f, 2.000365f, 3.102241f, 4.666084f, 6.827977f, 9.746966f, 13.605424f, 18.60893f, 24.985718f,
    32.98571f, 42.879242f, 54.955463f, 69.52058f, 86.89588f, 107.41574f, 131.4255f, 159.2794f,
    191.33856f, 227.96895f, 269.53958f, 316.42075f, 368.98236f, 427.5925f, 492.61603f, 564.41345f,
    643.3399f, 729.74414f, 823.96783f, 926.3449f, 1037.2012f, 1156.8536f, 1285.6104f, 1423.7701f,
    1571.6229f, 1729.449f, 1897.5193f, 2076.096f, 2265.4316f, 2465.7705f, 2677.3481f, 2900.3914f,
    3135.1194f, 3381.7437f, 3640.4683f, 3911.4905f, 4194.9307f, 4490.8174f, 4799.1494f, 5119.895f,
    5452.9907f, 5798.3447f, 6156.074f, 6526.947f, 6911.8706f, 7311.869f, 7727.412f, 8159.354f,
    8608.525f, 9076.4f, 9562.683f, 10065.979f, 10584.632f, 11116.662f, 11660.067f, 12211.548f,
    12766.873f, 13324.669f, 13881.331f, 14432.14f, 14975.615f, 15508.257f, 16026.115f, 16527.322f,
    17008.79f, 17467.613f, 17901.621f, 18308.434f, 18685.719f, 19031.29f, 19343.512f, 19620.043f,
    19859.39f, 20059.932f, 20219.664f, 20337.863f, 20412.309f, 20442.078f, 20425.719f, 20361.816f,
    20249.512f, 20087.086f, 19874.025f, 19608.572f, 19290.227f, 18917.46f, 18489.707f, 18006.926f,
    17471.84f, 16888.688f, 16262.047f, 15596.695f, 14898.453f, 14173.324f, 13427.77f, 12668.258f,
    11901.34f, 11133.305f, 10370.176f, 9617.516f, 8880.453f, 8163.375f, 7470.3438f, 6804.422f,
    6168.5312f, 5564.383f, 4993.797f, 4457.375f, 3955.961f, 3489.2344f, 3057.2656f, 2659.1406f,
    2294.2422f, 1961.5f, 1659.4766f, 1387.5469f, 1143.25f, 926.5078f, 734.9922f, 568.0625f,
    424.41406f, 302.47656f, 202.48438f, 122.10156f, 62.78125f, 22.835938f, 3.757813f, 0.0f, 0.0f,
};
constexpr float kB[138] = {
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.000007f, 0.000024f, 0.000059f, 0.000112f, 0.000199f,
    0.00034f, 0.000562f, 0.00089f, 0.001353f, 0.001992f, 0.002857f, 0.003971f, 0.005378f, 0.007133f,
    0.009261f, 0.011806f, 0.014816f, 0.018318f, 0.022355f, 0.026964f, 0.032176f, 0.038026f,
    0.044548f, 0.051773f, 0.059728f, 0.068448f, 0.077958f, 0.088286f, 0.099462f, 0.111505f,
    0.124448f, 0.138313f, 0.153125f, 0.16891f, 0.185689f, 0.203491f, 0.222333f, 0.242244f,
    0.263242f, 0.285354f, 0.308598f, 0.332939f, 0.358254f, 0.384363f, 0.411125f, 0.438391f,
    0.466003f, 0.4938f, 0.521619f, 0.549301f, 0.576692f, 0.603648f, 0.630036f, 0.655736f, 0.680643f,
    0.704669f, 0.727739f, 0.749797f, 0.770798f, 0.790717f, 0.809536f, 0.827256f, 0.843881f,
    0.859432f, 0.873929f, 0.887408f, 0.8999f, 0.911448f, 0.922096f, 0.931881f, 0.94086f, 0.949064f,
    0.95655f, 0.963352f, 0.969513f, 0.975078f, 0.980072f, 0.984542f, 0.9885f, 0.991984f, 0.995003f,
    0.99763f, 1.0f,
};

constexpr double kRd = 287.06, kRv = 461.51, kGamma = kRv / kRd - 1.0;  // CREDIT's constants
constexpr double kTopPressure = 0.57;  // Pa: where a + b sp is not positive (the model top)
}  // namespace

HybridLevels hybrid_levels(const GeopotentialSpec& g, const std::string& config_dir) {
  std::vector<double> a, b;
  std::string file = g.level_info_file;
  const bool bare = fs::path(file).parent_path().empty();
  if (bare && fs::exists(fs::path(config_dir) / file)) file = (fs::path(config_dir) / file).string();
  if (bare && file == g.level_info_file && file == "ERA5_Lev_Info.nc" && g.a_var == "a_half" && g.b_var == "b_half") {
    a.assign(kA, kA + 138);  // CREDIT's own file (credit/metadata): the table above
    b.assign(kB, kB + 138);
  } else {
    if (bare && file == g.level_info_file)
      fail(g.block, ".args.level_info_file: '", file, "' is not beside the config (wxe has only CREDIT's ERA5_Lev_Info.nc "
           "built in: give the file's path)");
    std::unique_ptr<DataFile> f = open_data_file(file);
    for (auto [name, out] : {std::pair<const std::string&, std::vector<double>*>{g.a_var, &a}, {g.b_var, &b}}) {
      if (!f->has(name)) fail(file, ": no variable '", name, "' (", g.block, ".args)");
      for (double v : f->read(name)) out->push_back((double)(float)v);  // float32, as CREDIT's tensors
    }
    if (a.size() != b.size() || a.size() < 2)
      fail(file, ": '", g.a_var, "' has ", a.size(), " values and '", g.b_var, "' ", b.size(), " (one per half level)");
  }
  HybridLevels h;
  if (g.levels.empty()) {  // every half level
    h.a = a;
    h.b = b;
  } else {  // CREDIT: the half levels lv - 1 of each level lv, then the last level's lower one
    std::vector<int64_t> idx;
    for (int64_t lv : g.levels) idx.push_back(lv - 1);
    idx.push_back(g.levels.back());
    for (int64_t i : idx) {
      if (i < 0 || i >= (int64_t)a.size())
        fail(g.block, ".args.levels: level ", i + 1, " is outside the ", a.size() - 1, " levels of ", file);
      h.a.push_back(a[i]);
      h.b.push_back(b[i]);
    }
  }
  return h;
}

namespace {
// The pressures at a column's interfaces (top first), their derivative by sp (0 where clamped).
void interfaces(const HybridLevels& h, double sp, std::vector<double>& p, std::vector<double>& dp) {
  const size_t n = h.a.size();
  p.resize(n);
  dp.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const double v = h.a[k] + h.b[k] * sp;
    p[k] = v > 0 ? v : kTopPressure;
    dp[k] = v > 0 ? h.b[k] : 0;
  }
}
}  // namespace

void geopotential_column(const HybridLevels& h, bool flip, double zs, double sp, const float* T, const float* q,
                         int64_t stride, float* phi, const float* gphi, float* gT, float* gq, double* gsp) {
  const int64_t L = (int64_t)h.a.size() - 1;
  std::vector<double> p, dp;
  interfaces(h, sp, p, dp);
  // level j (file order) lies between interfaces j (upper) and j + 1 (lower); the integral runs
  // from the surface: flipped, j = L-1 first (pressure grows with the index), else j = 0 first
  auto level = [&](int64_t i) { return flip ? L - 1 - i : i; };
  double sum = zs;
  std::vector<double> dlogp(L), alpha(L), tv(L);
  for (int64_t i = 0; i < L; ++i) {
    const int64_t j = level(i);
    const double pu = p[j], pl = p[j + 1];
    dlogp[j] = std::log(pl / pu);
    alpha[j] = 1.0 - pu / (pl - pu) * dlogp[j];
    tv[j] = (double)T[j * stride] * (1.0 + kGamma * (double)q[j * stride]);
    sum += kRd * tv[j] * dlogp[j];  // the interface below the next level up
    if (phi) phi[j * stride] = (float)(sum - kRd * tv[j] * alpha[j]);
  }
  if (!gphi) return;
  // back: phi_j = zs + sum_{i' <= i} Rd tv dlogp - Rd tv_j alpha_j (i: integration order)
  double acc = 0, gs = 0;  // acc: sum of g over the levels whose sum includes level j
  for (int64_t i = L - 1; i >= 0; --i) {
    const int64_t j = level(i);
    const double g = gphi[j * stride];
    acc += g;
    const double pu = p[j], pl = p[j + 1], d = pl - pu;
    const double gtv = kRd * (acc * dlogp[j] - g * alpha[j]);
    const double gdlogp = kRd * tv[j] * acc + g * kRd * tv[j] * pu / d;  // through sum and through -alpha
    const double galpha = -g * kRd * tv[j];
    // alpha = 1 - pu / (pl - pu) * dlogp: by pu and pl (dlogp's own share in gdlogp's second term)
    const double gpu = gdlogp * (-1.0 / pu) + galpha * (-(dlogp[j] / d) - pu * dlogp[j] / (d * d));
    const double gpl = gdlogp * (1.0 / pl) + galpha * (pu * dlogp[j] / (d * d));
    gs += gpu * dp[j] + gpl * dp[j + 1];
    gT[j * stride] += (float)(gtv * (1.0 + kGamma * (double)q[j * stride]));
    gq[j * stride] += (float)(gtv * kGamma * (double)T[j * stride]);
  }
  *gsp += gs;
}

double mslp_trenberth(double sp, double t, double zs, double* dsp, double* dt) {
  constexpr double kG = 9.80665, kRd = 287.05, kLapse = 0.0065, kAlphaStd = kLapse * kRd / kG, kWarm = 290.5,
                   kCold = 255.0;
  const double height = zs / kG;
  if (std::fabs(height) < 1e-4) {  // at sea level
    if (dsp) *dsp = 1;
    if (dt) *dt = 0;
    return sp;
  }
  const bool warm_sea = t <= kWarm && t + kLapse * height > kWarm, warm = t > kWarm;
  const bool cold = t < kCold && !warm_sea && !warm;
  const double zc = std::max(zs, 1e-6);
  const double alpha = warm_sea ? kRd * (kWarm - t) / zc : warm ? 0.0 : kAlphaStd;
  const double dalpha = warm_sea ? -kRd / zc : 0.0;
  const double teff = warm ? 0.5 * (kWarm + t) : cold ? 0.5 * (kCold + t) : t;
  const double dteff = warm || cold ? 0.5 : 1.0;
  const double te = std::max(teff, 1.0), dte = teff > 1.0 ? dteff : 0.0;
  const double x = zs / (kRd * te), dx = -zs / (kRd * te * te) * dte;
  const double ax = alpha * x, f = x * (1.0 - 0.5 * ax + ax * ax / 3.0), e = std::exp(f);
  if (dsp) *dsp = e;
  // df/dx = 1 - alpha x + (alpha x)^2, df/dalpha = -x^2 / 2 + 2 alpha x^3 / 3
  if (dt) *dt = sp * e * ((1.0 - ax + ax * ax) * dx + (-0.5 * x * x + 2.0 * alpha * x * x * x / 3.0) * dalpha);
  return sp * e;
}

}  // namespace wxe
