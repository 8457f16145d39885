// CREDIT 2026's physics postblocks (data/physics_blocks.h). Oracle: CREDIT's own classes
// (TracerFixer, GlobalMassFixer, GlobalWaterFixer, GlobalEnergyFixerUpDown, WindArtifactFilter,
// physics_hybrid_sigma_level's area) on an 8x16 grid, tests/data/physics (made by
// models/make_physics_fixture.py); then the blocks in a config: what a forecast writes, what the
// next step takes, finetune's rollouts, and the configs wxe refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "data/credit_config.h"
#include "data/era5.h"
#include "data/netcdf.h"
#include "data/physics_blocks.h"
#include "engine/io/samples.h"
#include "forecast/forecast.h"
#include "test_util.h"
#include "tests/tiny_forecast.h"
#include "train/finetune.h"
#include "train/from_config.h"

using namespace wxe;
using namespace wxe::test;
namespace fs = std::filesystem;

namespace {

const std::string kPhys = data_path("tests/data/physics");
constexpr int64_t H = 8, W = 16, N = H * W;

std::vector<float> get(const NcFile& f, const std::string& v) {
  const std::vector<double> d = f.read(v);
  return std::vector<float>(d.begin(), d.end());
}

// max |got - want| / max |want|
double rel(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, (double)std::fabs(got[i] - want[i]));
    m = std::max(m, (double)std::fabs(want[i]));
  }
  return d / m;
}

PhysicsBlockSpec fixer(bool midpoint, const char* phis = "") {
  PhysicsBlockSpec s;
  s.block = "postblocks.per_step.test";
  s.statics = kPhys + "/statics.nc";
  s.midpoint = midpoint;
  s.phis_name = phis;
  s.seconds = 6 * 3600;
  return s;
}

TEST(PhysicsBlocks, GridAreaIsCreditsIncludingTheWrap) {
  NcFile f(kPhys + "/cases.nc");
  const SigmaGrid g = read_sigma_grid(fixer(true), "test");
  ASSERT_EQ(g.h, H);
  ASSERT_EQ(g.w, W);
  const std::vector<float> want = get(f, "area");
  const std::vector<float> got(g.area.begin(), g.area.end());
  EXPECT_LT(rel(got, want), 2e-6);
  // the columns beside the 360 -> 0 jump: torch.gradient's difference wrapped, as CREDIT's
  EXPECT_GT(want[7], 5 * want[0]);
}

TEST(PhysicsBlocks, TracerFixerClampsAsCredit) {
  NcFile f(kPhys + "/cases.nc");
  std::vector<float> q = get(f, "Q_mid");
  tracer_fix(q.data(), (int64_t)q.size(), 4e-3, NAN);
  EXPECT_EQ(q, get(f, "tracer_Q"));
  q = get(f, "Q_mid");
  tracer_fix(q.data(), (int64_t)q.size(), 2e-3, 8e-3);
  EXPECT_EQ(q, get(f, "tracer_hi_Q"));
}

// The three global fixers, midpoint (5 levels) and trapezoid (6 levels), against CREDIT's.
TEST(PhysicsBlocks, FixersMatchCredit) {
  NcFile f(kPhys + "/cases.nc");
  for (const char* tag : {"mid", "trapz"}) {
    const bool mid = std::string(tag) == "mid";
    const std::string t = std::string("_") + tag;
    const SigmaGrid g = read_sigma_grid(fixer(mid, "PHIS"), "test");
    const std::vector<float> q = get(f, "Q" + t), q0 = get(f, "Q_in" + t), sp0 = get(f, "PS_in" + t);
    std::vector<float> sp = get(f, "PS" + t);
    mass_fix(g, q.data(), sp.data(), q0.data(), sp0.data());
    const double em = rel(sp, get(f, "mass" + t + "_PS"));
    EXPECT_LT(em, 1e-6) << tag;
    std::vector<float> precip = get(f, "PRECT");
    const std::vector<float> sp1 = get(f, "PS" + t), evap = get(f, "QFLX");
    water_fix(g, 6 * 3600, q.data(), sp1.data(), precip.data(), evap.data(), q0.data(), sp0.data());
    const double ew = rel(precip, get(f, "water" + t + "_PRECT"));
    EXPECT_LT(ew, 1e-5) << tag;
    std::vector<float> T = get(f, "T" + t);
    const std::vector<float> u = get(f, "U" + t), v = get(f, "V" + t), T0 = get(f, "T_in" + t), u0 = get(f, "U_in" + t),
                             v0 = get(f, "V_in" + t), solin = get(f, "SOLIN_in");
    std::map<std::string, std::vector<float>> fl;
    for (const char* k : {"FSUTOA", "FLUT", "FSDS", "FSUS", "FLDS", "FLUS", "SHFLX", "LHFLX"}) fl[k] = get(f, k);
    EnergyFields e;
    e.T = T.data(), e.q = q.data(), e.u = u.data(), e.v = v.data(), e.sp = sp1.data();
    e.T0 = T0.data(), e.q0 = q0.data(), e.u0 = u0.data(), e.v0 = v0.data(), e.sp0 = sp0.data(), e.solin0 = solin.data();
    e.toa_up_solar = fl["FSUTOA"].data(), e.olr = fl["FLUT"].data(), e.sfc_down_solar = fl["FSDS"].data();
    e.sfc_up_solar = fl["FSUS"].data(), e.sfc_down_lw = fl["FLDS"].data(), e.sfc_up_lw = fl["FLUS"].data();
    e.sh = fl["SHFLX"].data(), e.lh = fl["LHFLX"].data();
    energy_fix(g, 6 * 3600, e);
    const std::vector<float> want = get(f, "energy" + t + "_T"), before = get(f, "T" + t);
    const double ee = rel(T, want);
    EXPECT_LT(ee, 1e-6) << tag;
    // the correction itself (want - before, about 1 K) to 1e-3 of its size
    std::vector<float> dg(T.size()), dw(T.size());
    for (size_t i = 0; i < T.size(); ++i) dg[i] = T[i] - before[i], dw[i] = want[i] - before[i];
    EXPECT_LT(rel(dg, dw), 1e-3) << tag;
    std::printf("physics %s: mass %.2e, water %.2e, energy %.2e (its correction %.2e) relative to CREDIT\n", tag, em, ew,
                ee, rel(dg, dw));
  }
}

TEST(PhysicsBlocks, WindFilterMatchesCredit) {
  NcFile f(kPhys + "/cases.nc");
  struct Case {
    const char* name;
    int64_t mask;
    std::vector<int64_t> levels;
    double thr, sigma, zonal, merid, falloff;
    int64_t dz, dm;
    bool preserve;
  };
  for (const Case& c : {Case{"wind_amp", 2, {1, 2, 3}, 2.8, 1.2, 2.0, 0.5, 4.0, 15, 5, true},
                        Case{"wind_iso", 1, {0, 4}, 3.5, 1.0, NAN, NAN, 1.5, 5, 3, false}}) {
    PhysicsBlockSpec s;
    s.mask_level = c.mask, s.speed_threshold = c.thr, s.smooth_sigma = c.sigma, s.sigma_zonal = c.zonal;
    s.sigma_meridional = c.merid, s.falloff_sigma = c.falloff, s.dilation_zonal = c.dz, s.dilation_meridional = c.dm;
    std::map<std::string, std::vector<float>> v;
    for (const char* k : {"U", "V", "T"}) v[k] = get(f, std::string(k) + "_norm");
    const WindMask m = wind_mask(s, v["U"].data() + c.mask * N, v["V"].data() + c.mask * N, H, W);
    double worst = 0, changed = 0;
    for (const char* k : {"U", "V", "T"}) {
      const std::vector<float> before = v[k];
      for (int64_t l : c.levels) wind_blend(m, c.preserve, v[k].data() + l * N);
      const std::vector<float> want = get(f, std::string(c.name) + "_" + k);
      worst = std::max(worst, rel(v[k], want));
      changed = std::max(changed, rel(before, want));
    }
    EXPECT_LT(worst, 1e-6) << c.name;
    EXPECT_GT(changed, 1e-2) << c.name;  // the filter changes the fields: the comparison can fail
    std::printf("physics %s: %.2e relative to CREDIT\n", c.name, worst);
  }
}

// era5_tiny's config with postblocks: the inverse scaler, then `blocks`
std::string physics_config(const std::string& name, const std::string& blocks, const std::string& before = "",
                           const std::vector<std::pair<std::string, std::string>>& repl = {}) {
  const std::string dir = data_path("tests/data/era5_tiny");
  std::string text = "postblocks:\n  per_step:\n    reconstruct:\n      type: reconstruct\n" + before +
                     "    inverse:\n      type: bridgescaler_transform\n      args:\n        method: inverse_transform\n"
                     "        scaler_path: \"" + dir + "/scaler.json\"\n" + blocks;
  std::string c = era5_tiny_config(name, repl);
  std::string y = slurp(c);
  y.insert(y.find("trainer:"), text);
  spit(c, y);
  return c;
}

const char* kTracer = R"(    tracer:
      type: tracer_fixer
      args:
        tracer_vars: [era5/prognostic/3d/T, era5/diagnostic/2d/tp]
        tracer_thres: [265.0, 0.001]
)";

// The written state is the fixed one, and the next step's input is that state re-normalised.
TEST(PhysicsBlocks, ForecastWritesAndFeedsBackTheFixedState) {
  Era5Data d(read_credit_config(physics_config("phys_rollout", kTracer), false));
  ASSERT_TRUE(d.has_physics());
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  Tensor x0 = d.input(t);
  Tensor y = d.target(t);  // a prediction: the truth at t (T below 265 K in places)
  std::vector<Tensor> written;
  Tensor second;
  int calls = 0;
  rollout(d, x0, t, 2, [&](const Tensor& x) {
    if (calls++) second = x.clone();
    return y;
  }, [&](int, const Tensor& p) { written.push_back(p.clone()); });
  ASSERT_EQ(written.size(), 2u);
  const int64_t n = 32 * 64;
  Tensor plain = y.clone();
  d.denormalise_target(plain);
  int64_t floored = 0;
  for (int64_t i = 0; i < 2 * n; ++i) {  // T, both levels
    const float w = written[0].data<float>()[i], p = plain.data<float>()[i];
    EXPECT_EQ(w, std::max(p, 265.0f)) << i;
    floored += p < 265.0f;
  }
  EXPECT_GT(floored, 100);
  for (int64_t i = 0; i < n; ++i) EXPECT_GE(written[0].data<float>()[5 * n + i], 0.001f);  // tp
  // the second step's input: the written state through the input side's scaler
  const Tensor fed = d.physical_to_input(written[0]);
  for (int64_t k = 0; k < 5; ++k)  // the prognostic channels (T, U, SP) feed back k -> k
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(second.data<float>()[k * n + i], fed.data<float>()[k * n + i]) << k << " " << i;
  ASSERT_NE(max_abs_diff(fed, d.prediction_to_input(y)), 0.0);
}

// A tracer_fixer before the inverse scaler clamps the normalised values, as CREDIT's does (a warning says so).
TEST(PhysicsBlocks, TracerBeforeTheScalerClampsNormalisedValues) {
  const CreditConfig c = read_credit_config(physics_config("phys_tracer_norm", "", kTracer), false);
  bool warned = false;
  for (const std::string& w : c.warnings) warned |= w.find("postblocks.per_step.tracer: clamps normalised values") != std::string::npos;
  EXPECT_TRUE(warned);
  Era5Data d(c);
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  Tensor x = d.input(t), y = d.target(t);
  const Tensor got = d.postprocess(y, x);
  Tensor want = y.clone();
  for (int64_t i = 0; i < 2 * 32 * 64; ++i) want.data<float>()[i] = std::max(want.data<float>()[i], 265.0f);
  for (int64_t i = 5 * 32 * 64; i < 6 * 32 * 64; ++i) want.data<float>()[i] = std::max(want.data<float>()[i], 0.001f);
  d.denormalise_target(want);
  EXPECT_EQ(max_abs_diff(got, want), 0.0);
}

// wxe forecast writes the fixed values (the ONNX model's prediction floored)
TEST(PhysicsBlocks, ForecastFileHoldsTheFloor) {
  const ForecastArgs a = tiny_forecast(physics_config("phys_forecast", kTracer), tmp_path("phys_forecast.nc"));
  ASSERT_EQ(run_forecast(a), 0);
  NcFile f(a.output);
  const std::vector<double> T = f.read("T"), tp = f.read("tp");
  int64_t at = 0;
  for (double v : T) {
    EXPECT_GE(v, 265.0f);
    at += v == 265.0f;
  }
  EXPECT_GT(at, 0);
  for (double v : tp) EXPECT_GE(v, 0.001f);
  fs::remove(a.output);
}

// finetune with forecast_len 2: the training rollout's and the validation rollout's next input
// is the fixed state re-normalised; then a run of two steps.
TEST(PhysicsBlocks, FinetuneRolloutsFeedBackTheFixedState) {
  const std::string cfg = physics_config("phys_finetune", kTracer, "", {{"forecast_len: 1", "forecast_len: 2"}});
  auto given = [](const std::string& f) { return f == "--save" || f == "--steps"; };
  FinetuneConfig fc;
  fc.model = data_path("models/wxformer_tiny/model.onnx");
  fc.save = tmp_path("phys_finetune_save");
  fc.steps = 2;
  fc.progress = false;
  finetune_from_config(cfg, fc, given, true);
  EXPECT_EQ(fc.forecast_len, 2);
  Era5Data d(read_credit_config(cfg));
  const int64_t t = parse_datetime("2021-01-01T00", "t");
  Tensor x = d.input(t), y = d.target(t);
  const Tensor want = d.physical_to_input(d.postprocess(y, x));
  EXPECT_EQ(max_abs_diff(fc.to_input(y, x), want), 0.0);
  // validation: the second step's input
  Tensor second;
  int calls = 0;
  fc.validate([&](const Tensor& xi) {
    if (calls++ == 1) second = xi.clone();
    return y;
  });
  ASSERT_TRUE(second.defined());
  const int64_t n = 32 * 64;
  for (int64_t k = 0; k < 5; ++k)
    for (int64_t i = 0; i < n; ++i) {
      const float v = second.data<float>()[k * n + i];
      if (k < 2) {  // T: de-normalised on the input side, at the floor or above
        const ChannelInfo& c = d.input_channels()[k];
        EXPECT_GE(v * (float)c.std + (float)c.mean, 265.0f - 1e-3f) << k << " " << i;
      }
    }
  EXPECT_EQ(run_finetune(fc), 0);
  fs::remove_all(fc.save);
}

// One-line errors naming the file and the key.
TEST(PhysicsBlocks, RefusalsNameTheKey) {
  auto err = [](const std::string& cfg, bool training = false) {
    return error_of([&] { Era5Data d(read_credit_config(cfg, training)); });
  };
  const std::string statics = kPhys + "/statics.nc";
  const std::string mass = "    mass:\n      type: global_mass_fixer\n      args:\n        save_loc_physics: " + statics +
                           "\n        lon_lat_level_name: [lon2d, lat2d, hyai, hybi]\n        midpoint: true\n"
                           "        q_var: era5/prognostic/3d/U\n        sp_var: era5/prognostic/2d/SP\n";
  struct Case {
    std::string name, cfg, want;
    bool training = false;
  };
  const std::vector<Case> cases = {
      {"before_scaler", physics_config("phys_before", "", mass),
       "postblocks.per_step.mass: global_mass_fixer before the inverse bridgescaler_transform sees normalised values"},
      {"levels", physics_config("phys_levels", mass),
       "postblocks.per_step.mass.args.q_var: 'era5/prognostic/3d/U' has 2 levels; the statics' hyai has 6 values, so 5 "
       "levels with midpoint true"},
      {"pressure", physics_config("phys_pressure", mass + "        grid_type: pressure\n"),
       "postblocks.per_step.mass.args.grid_type: 'pressure' is not implemented"},
      {"not_a_target", physics_config("phys_nokey", "    tracer:\n      type: tracer_fixer\n      args:\n"
                                                    "        tracer_vars: [era5/prognostic/3d/Q]\n        tracer_thres: 0\n"),
       "postblocks.per_step.tracer.args.tracer_vars: 'era5/prognostic/3d/Q' is not a predicted (target) variable"},
      {"even_kernel", physics_config("phys_even", "", "    wind:\n      type: wind_artifact_filter\n      args:\n"
                                     "        u_var: era5/prognostic/3d/U\n        v_var: era5/prognostic/3d/U\n"
                                     "        target_vars: [era5/prognostic/3d/T]\n        dilation_zonal: 14\n"),
       "postblocks.per_step.wind.args.dilation_zonal: 14 is even"},
      {"mask_level", physics_config("phys_mask", "", "    wind:\n      type: wind_artifact_filter\n      args:\n"
                                    "        u_var: era5/prognostic/3d/U\n        v_var: era5/prognostic/3d/U\n"
                                    "        target_vars: [era5/prognostic/3d/T]\n"),
       "postblocks.per_step.wind.args.mask_level: 14 is not a level index of u_var (2 levels)"},
      {"exp_after", physics_config("phys_exp", std::string(kTracer) + "    exp:\n      type: exp_transform\n      args:\n"
                                                                       "        variables: [era5/diagnostic/2d/tp]\n"),
       "postblocks.per_step.exp: exp_transform after postblocks.per_step.tracer is not implemented"},
      {"no_args", physics_config("phys_noargs", "    mass:\n      type: global_mass_fixer\n"),
       "postblocks.per_step.mass.args: missing (CREDIT's global_mass_fixer takes its variables there)"},
      {"base_loss", physics_config("phys_base", kTracer, "", {{"training_loss: \"mse\"", "type: base\n  args:\n    training_loss: mse\n    var_weighting: none"}}),
       "loss.type: base with the physics postblock postblocks.per_step.tracer is not implemented", true},
  };
  for (const Case& c : cases) {
    const std::string e = err(c.cfg, c.training);
    EXPECT_NE(e.find(c.cfg + ": " + c.want), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name;
  }
  // under post_rollout
  std::string y = slurp(physics_config("phys_post_rollout", ""));
  y.insert(y.find("trainer:"), "  post_rollout:\n" + std::string(kTracer).replace(0, 0, ""));
  spit(tmp_path("phys_post_rollout.yml"), y);
  const std::string e = err(tmp_path("phys_post_rollout.yml"));
  EXPECT_NE(e.find("postblocks.post_rollout.tracer: tracer_fixer under post_rollout is not implemented"), std::string::npos)
      << e;
}

}  // namespace
