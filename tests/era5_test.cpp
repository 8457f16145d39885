// CREDIT data: the gen2 config, channel order and normalisation of the ERA5-like fixture
// (tests/data/era5_tiny, models/make_era5_fixture.py: netCDF for 2020, zarr for 2021), the
// rollout against the model run step by step, the forecast netCDF read back, and the errors.
// Expected values come from the fixture's closed formula, recomputed here.
#include <gtest/gtest.h>
#include <netcdf.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "data/credit_config.h"
#include "data/era5.h"
#include "data/netcdf.h"
#include "engine/exec/executor.h"
#include "train/loss.h"
#include "engine/io/npy.h"
#include "data/geopotential.h"
#include "engine/io/samples.h"
#include "importers/onnx/onnx_import.h"
#include "tests/host_backend.h"
#include "test_util.h"
#include "tests/tiny_forecast.h"
#include "forecast/forecast.h"
#include "train/finetune.h"
#include "train/from_config.h"
#include "load/model.h"

namespace fs = std::filesystem;
using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/era5_tiny");

// the fixture's formula: A + B sin(0.1 i + 0.07 j + 0.05 h) + C lev / 1000, h hours since 2020-12-31T00
struct Coef {
  double a, b, c;
};
Coef coef(const std::string& v) {
  if (v == "T") return {250, 10, 30};
  if (v == "U") return {5, 8, 10};
  if (v == "SP") return {100000, 500, 0};
  if (v == "tp") return {0.001, 0.001, 0};
  if (v == "tsi") return {1e6, 3e5, 0};
  return {0.5, 0.5, 0};  // LSM
}
double field(const std::string& v, double h, double lev, int i, int j) {
  Coef k = coef(v);
  return k.a + k.b * std::sin(0.1 * i + 0.07 * j + 0.05 * h) + k.c * lev / 1000.0;
}
// The scaler's statistics as the fixture writes them (both the JSON and mean/std netCDF).
std::pair<double, double> stats(const std::string& v, double lev) {
  Coef k = coef(v);
  if (v == "LSM") return {0, 1};  // not in the scaler: passed through
  return {k.a + k.c * lev / 1000.0, k.b * (v == "T" || v == "U" ? 1 + lev / 1000.0 : 1.0)};
}
const int64_t kT0 = 1609372800;  // 2020-12-31T00:00:00Z

struct Ch {
  std::string var;
  double lev;
};
const std::vector<Ch> kInputs = {{"T", 500}, {"T", 850}, {"U", 500}, {"U", 850}, {"SP", 0}, {"LSM", 0}, {"tsi", 0}};
const std::vector<Ch> kTargets = {{"T", 500}, {"T", 850}, {"U", 500}, {"U", 850}, {"SP", 0}, {"tp", 0}};

// normalised (1, C, 1, 32, 64) from the formula at hours h
Tensor expected(const std::vector<Ch>& chans, double h) {
  Tensor x = Tensor::zeros(DType::F32, {1, (int64_t)chans.size(), 1, 32, 64});
  float* p = x.data<float>();
  for (size_t c = 0; c < chans.size(); ++c) {
    auto [m, s] = stats(chans[c].var, chans[c].lev);
    const double hh = chans[c].var == "LSM" ? 0 : h;
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 64; ++j) p[(c * 32 + i) * 64 + j] = (float)((field(chans[c].var, hh, chans[c].lev, i, j) - m) / s);
  }
  return x;
}

// A config in a temp folder with absolute paths into the fixture (test_util.h).
std::string write_config(const std::string& name, const std::vector<std::pair<std::string, std::string>>& repl = {},
                         const std::string& extra = "") {
  return era5_tiny_config(name, repl, extra);
}

// (1, C, 1, H, W) steps stacked on dim 2, oldest first
Tensor window(const std::vector<Tensor>& steps) {
  const int64_t n = (int64_t)steps.size(), C = steps[0].shape[1], hw = 32 * 64;
  Tensor x(DType::F32, {1, C, n, 32, 64});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < n; ++k)
      std::memcpy(x.data<float>() + (c * n + k) * hw, steps[k].data<float>() + c * hw, hw * sizeof(float));
  return x;
}

// The forecast file holds ys[k] (normalised model outputs) denormalised at time index k.
void expect_forecast(NcFile& f, const std::vector<Tensor>& ys) {
  for (size_t k = 0; k < ys.size(); ++k) {
    for (size_t c = 0; c < kTargets.size(); ++c) {
      const bool is3d = kTargets[c].var == "T" || kTargets[c].var == "U";
      std::vector<size_t> start = {k}, count = {1};
      if (is3d) {
        start.push_back(kTargets[c].lev == 500 ? 0 : 1);
        count.push_back(1);
      }
      start.insert(start.end(), {0, 0});
      count.insert(count.end(), {32, 64});
      std::vector<float> got = f.read_f32(kTargets[c].var, start, count);
      auto [m, s] = stats(kTargets[c].var, kTargets[c].lev);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = ys[k].data<float>()[c * 2048 + i] * s + m;
        worst = std::max(worst, std::fabs(got[i] - want) / (std::fabs(want) + s));
      }
      EXPECT_LT(worst, 1e-5) << "step " << k << " channel " << c;
    }
  }
}

}  // namespace

TEST(CreditConfig, ReadsGen2Keys) {
  CreditConfig c = read_credit_config(kDir + "/config.yml");
  EXPECT_EQ(c.sources.at(0).name, "era5");
  EXPECT_EQ(c.sources.at(0).levels, (std::vector<double>{500, 850}));
  EXPECT_EQ(c.sources.at(0).prognostic.vars_3D, (std::vector<std::string>{"T", "U"}));
  EXPECT_EQ(c.sources.at(0).diagnostic.vars_2D, (std::vector<std::string>{"tp"}));
  EXPECT_EQ(c.timestep, 6 * 3600);
  EXPECT_EQ(c.start, kT0);
  EXPECT_EQ(c.end, kT0 + 36 * 3600);
  EXPECT_EQ(c.valid_start, kT0 + 24 * 3600);
  EXPECT_EQ(c.scaler_json, kDir + "/scaler.json");
  EXPECT_EQ(c.save_loc, kDir + "/save");
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
  EXPECT_EQ(c.batches_per_epoch, 2);
  EXPECT_TRUE(c.use_latitude_weights);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(parse_timestep("1d", "x"), 86400);
  EXPECT_EQ(format_datetime(parse_datetime("2021-01-01T06", "x")), "2021-01-01T06:00:00");
}

TEST(CreditConfig, UnknownKeyWarnsUnimplementedKeyFails) {
  CreditConfig c = read_credit_config(write_config("unknown", {}, "trainer_extra: 3\n"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("trainer_extra"), std::string::npos) << c.warnings[0];
  std::string e = error_of([&] { read_credit_config(write_config("hist", {{"history_len: 1", "history_len: 0"}})); });
  EXPECT_NE(e.find("data.history_len"), std::string::npos) << e;
  e = error_of([&] { read_credit_config(write_config("loss", {{"training_loss: \"mse\"", "training_loss: \"KCRPS\""}})); });
  EXPECT_NE(e.find("loss.training_loss"), std::string::npos) << e;
}

TEST(Era5Data, ChannelOrderAndNormalisation) {
  Era5Data d(read_credit_config(kDir + "/config.yml"));
  ASSERT_EQ(d.input_channels().size(), kInputs.size());
  for (size_t c = 0; c < kInputs.size(); ++c) EXPECT_EQ(d.input_channels()[c].var, kInputs[c].var) << c;
  ASSERT_EQ(d.target_channels().size(), kTargets.size());
  for (size_t c = 0; c < kTargets.size(); ++c) EXPECT_EQ(d.target_channels()[c].var, kTargets[c].var) << c;
  EXPECT_EQ(d.prognostic_channels(), 5);
  // 2020-12-31T18 from the netCDF file, 2021-01-01T06 from the zarr store
  for (double h : {18.0, 30.0}) {
    expect_close(d.input(kT0 + (int64_t)h * 3600), expected(kInputs, h), 2e-4, 0);
    expect_close(d.target(kT0 + (int64_t)h * 3600), expected(kTargets, h), 2e-4, 0);
  }
  EXPECT_EQ(d.units("T"), "K");
  EXPECT_EQ(d.lat().size(), 32u);
  EXPECT_DOUBLE_EQ(d.lat()[0], 90.0);
  ASSERT_EQ(d.warnings.size(), 1u);  // LSM has no scaler
  EXPECT_NE(d.warnings[0].find("LSM"), std::string::npos);
}

TEST(Era5Data, Gen1MeanStdNetcdfScaler) {
  CreditConfig c = read_credit_config(kDir + "/config.yml");
  c.scaler_json.clear();
  c.mean_nc = kDir + "/mean.nc";  // per level over the file's 3 levels: selected by value
  c.std_nc = kDir + "/std.nc";
  Era5Data d(c);
  expect_close(d.input(kT0 + 12 * 3600), expected(kInputs, 12), 2e-4, 0);
}

TEST(Era5Data, ChannelSchemaLikeCredit) {
  Era5Data d(read_credit_config(kDir + "/config.yml"));
  const std::string want =
      "schema_version: 1\ninput:\n"
      "- var_key: era5/prognostic/3d/T\n  n_levels: 2\n  n_time: 1\n"
      "- var_key: era5/prognostic/3d/U\n  n_levels: 2\n  n_time: 1\n"
      "- var_key: era5/prognostic/2d/SP\n  n_levels: 1\n  n_time: 1\n"
      "- var_key: era5/static/2d/LSM\n  n_levels: 1\n  n_time: 1\n"
      "- var_key: era5/dynamic_forcing/2d/tsi\n  n_levels: 1\n  n_time: 1\n"
      "target:\n"
      "- var_key: era5/prognostic/3d/T\n  n_levels: 2\n  n_time: 1\n"
      "- var_key: era5/prognostic/3d/U\n  n_levels: 2\n  n_time: 1\n"
      "- var_key: era5/prognostic/2d/SP\n  n_levels: 1\n  n_time: 1\n"
      "- var_key: era5/diagnostic/2d/tp\n  n_levels: 1\n  n_time: 1\n";
  EXPECT_EQ(d.channel_schema_yaml(), want);
}

TEST(Era5Data, SamplesForTraining) {
  auto d = std::make_shared<Era5Data>(read_credit_config(kDir + "/config.yml"));
  auto src = open_era5_samples(d, kT0, kT0 + 36 * 3600, 2);  // 7 times, 2 steps: 5 samples
  ASSERT_EQ(src->size(), 5);
  Sample s = src->get(1);
  expect_close(s.input, expected(kInputs, 6), 2e-4, 0);
  ASSERT_EQ(s.targets.size(), 2u);
  expect_close(s.targets[1], expected(kTargets, 18), 2e-4, 0);
  ASSERT_EQ(s.forcing.size(), 2u);
  expect_close(s.forcing[1], expected(kInputs, 12), 2e-4, 0);
}

// data.date_ranges (CREDIT's non-contiguous training blocks): each block's windows stay inside
// it (its history and forecast margins its own), the blocks' samples one after the other; the
// config's errors name the key.
TEST(Era5Data, DateRangesSampleEachBlock) {
  const std::string ranges = "date_ranges: [[\"2020-12-31T00\", \"2020-12-31T12\"], [\"2021-01-01T00\", \"2021-01-01T18\"]]";
  const std::string cfg = write_config("date_ranges", {{"start_datetime: \"2020-12-31T00\"", ranges},
                                                       {"end_datetime: \"2021-01-01T12\"", ""}});
  CreditConfig c = read_credit_config(cfg);
  ASSERT_EQ(c.date_ranges.size(), 2u);
  EXPECT_EQ(c.start, kT0);
  EXPECT_EQ(c.end, kT0 + 42 * 3600);
  auto d = std::make_shared<Era5Data>(c);
  auto src = open_era5_samples(d, training_blocks(c), 1);
  // 00 06 12 in the first block (2 samples: 12 h is the last target), 00 .. 18 in the second (3)
  ASSERT_EQ(src->size(), 5);
  const double hours[] = {0, 6, 24, 30, 36};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("sample " + std::to_string(i));
    Sample s = src->get(i);
    expect_close(s.input, expected(kInputs, hours[i]), 2e-4, 0);
    expect_close(s.targets[0], expected(kTargets, hours[i] + 6), 2e-4, 0);
  }
  // history_len 2: each block's first window starts at its start
  CreditConfig c2 = read_credit_config(write_config("date_ranges_hist2", {{"start_datetime: \"2020-12-31T00\"", ranges},
                                                                        {"end_datetime: \"2021-01-01T12\"", ""},
                                                                        {"history_len: 1", "history_len: 2"}}));
  auto d2 = std::make_shared<Era5Data>(c2);
  auto src2 = open_era5_samples(d2, training_blocks(c2), 1);
  ASSERT_EQ(src2->size(), 3);  // windows ending 06 | 06, 12 of the second day
  expect_close(last_step(src2->get(1).input), expected(kInputs, 30), 2e-4, 0);
  auto err = [&](const std::string& name, const std::string& from, const std::string& to) {
    return error_of([&] { read_credit_config(write_config(name, {{from, to}})); });
  };
  std::string e = err("dr_both", "start_datetime: \"2020-12-31T00\"", "start_datetime: \"2020-12-31T00\"\n  " + ranges);
  EXPECT_NE(e.find("data.date_ranges: not beside start_datetime"), std::string::npos) << e;
  e = err("dr_overlap", "start_datetime: \"2020-12-31T00\"",
          "date_ranges: [[\"2020-12-31T00\", \"2021-01-01T00\"], [\"2020-12-31T18\", \"2021-01-01T06\"]]");
  EXPECT_NE(e.find("end_datetime"), std::string::npos) << e;  // beside end_datetime still
  e = error_of([&] {
    read_credit_config(write_config("dr_overlap2", {{"start_datetime: \"2020-12-31T00\"",
                                                     "date_ranges: [[\"2020-12-31T00\", \"2021-01-01T00\"], [\"2020-12-31T18\", \"2021-01-01T06\"]]"},
                                                    {"end_datetime: \"2021-01-01T12\"", ""}}));
  });
  EXPECT_NE(e.find("data.date_ranges: the blocks overlap"), std::string::npos) << e;
  e = error_of([&] {
    read_credit_config(write_config("dr_backwards", {{"start_datetime: \"2020-12-31T00\"",
                                                      "date_ranges: [[\"2020-12-31T12\", \"2020-12-31T00\"]]"},
                                                     {"end_datetime: \"2021-01-01T12\"", ""}}));
  });
  EXPECT_NE(e.find("data.date_ranges[0]: its end"), std::string::npos) << e;
  CreditConfig c3 = read_credit_config(write_config("dr_short", {{"start_datetime: \"2020-12-31T00\"",
                                                                 "date_ranges: [[\"2020-12-31T00\", \"2020-12-31T06\"], [\"2021-01-01T00\", \"2021-01-01T18\"]]"},
                                                                {"end_datetime: \"2021-01-01T12\"", ""},
                                                                {"history_len: 1", "history_len: 2"}}));
  e = error_of([&] { open_era5_samples(std::make_shared<Era5Data>(c3), training_blocks(c3), 1); });
  EXPECT_NE(e.find("date_ranges block 2020-12-31T00"), std::string::npos) << e;
  EXPECT_NE(e.find("too short"), std::string::npos) << e;
}

// A 2-step forecast of the tiny WXFormer from 2020-12-31T18 into `out`.
ForecastArgs two_step_forecast(const std::string& out) {
  return tiny_forecast(kDir + "/config.yml", out);
}

// The oracle of two_step_forecast: the model run step by step on inputs built here from the
// formula.
std::vector<Tensor> two_step_oracle() {
  const std::string model = data_path("models/wxformer_tiny/model.onnx");
  Graph g = import_onnx(model);
  const std::string in = g.values[g.inputs[0]].name;
  Tensor x0 = expected(kInputs, 18);
  prepare_model(g, {{in, {DType::F32, x0.shape}}}, {});
  ExecOptions opt;
  opt.threads = 1;
  Executor ex(g, opt);
  Tensor y0 = ex.run({{in, x0}}).at(0);
  Tensor x1 = expected(kInputs, 24);  // forcing (tsi) at the next time, LSM as always
  std::copy(y0.data<float>(), y0.data<float>() + 5 * 32 * 64, x1.data<float>());
  return {y0, ex.run({{in, x1}}).at(0)};
}

TEST(Forecast, TwoStepRolloutMatchesStepByStepAndNetcdfReadsBack) {
  const std::string out = tmp_path("forecast.nc");
  ASSERT_EQ(run_forecast(two_step_forecast(out)), 0);
  NcFile f(out);
  EXPECT_EQ(f.read("time"), (std::vector<double>{6, 12}));
  EXPECT_EQ(f.attr("time", "units"), "hours since 2020-12-31 18:00:00");
  EXPECT_EQ(f.read("level"), (std::vector<double>{500, 850}));
  EXPECT_EQ(f.read("latitude").size(), 32u);
  EXPECT_EQ(f.attr("T", "units"), "K");
  EXPECT_EQ(f.attr("tp", "long_name"), "Total precipitation");
  EXPECT_EQ(f.dims("T"), (std::vector<std::string>{"time", "level", "latitude", "longitude"}));
  EXPECT_EQ(f.dims("SP"), (std::vector<std::string>{"time", "latitude", "longitude"}));
  expect_forecast(f, two_step_oracle());
}

// mslp_diagnostic (CREDIT's credit/postblock/mslp.py) in a config: the forecast writes its 2D
// variable, computed from the written surface pressure and temperature (here SP in both roles:
// the tiny data have no 2 m temperature) and the static's raw value (LSM standing for the surface
// geopotential) by the formula data/geopotential.h's test holds to CREDIT's.
TEST(Forecast, WritesTheMslpDiagnostic) {
  const std::string cfg = write_config("mslp", {}, "postblocks:\n  per_step:\n    mslp:\n      type: mslp_diagnostic\n"
                                                   "      args:\n        output_name: era5/derived_diagnostic/2d/mslp\n"
                                                   "        surface_pressure_var: era5/prognostic/2d/SP\n"
                                                   "        temperature_var: era5/prognostic/2d/SP\n"
                                                   "        surface_geopotential_var: era5/static/2d/LSM\n");
  const std::string out = tmp_path("forecast_mslp.nc");
  ForecastArgs a = two_step_forecast(out);
  a.config = cfg;
  ASSERT_EQ(run_forecast(a), 0);
  NcFile f(out);
  EXPECT_EQ(f.dims("mslp"), (std::vector<std::string>{"time", "latitude", "longitude"}));
  const std::vector<double> sp = f.read("SP"), m = f.read("mslp");
  ASSERT_EQ(m.size(), sp.size());
  double worst = 0;
  for (size_t k = 0; k < m.size(); ++k) {
    const int i = (int)(k / 64 % 32), j = (int)(k % 64);
    const double lsm = (float)field("LSM", 0, 0, i, j);
    worst = std::max(worst, std::fabs(m[k] - (float)mslp_trenberth((float)sp[k], (float)sp[k], lsm)) / m[k]);
  }
  EXPECT_LE(worst, 1e-6);
  // its gradient reaches the prediction's sp and t channels (here both SP): BaseLoss's chain rule
  Era5Data d(read_credit_config(cfg));
  d.input(kT0);  // the grid
  Tensor y = expected(kTargets, 6);
  d.denormalise_target(y);
  const Tensor g = randn({1, 1, 1, 32, 64}, 5);
  Tensor gy = Tensor::zeros(DType::F32, y.shape);
  d.compute_diagnostics(y, kT0, &g, &gy);
  const int64_t sp_ch = 4, n = 32 * 64;
  for (int64_t i : {0, 100, 777, 2047}) {
    Tensor yp = y.clone(), ym = y.clone();
    const float h = 64.0f;  // Pa, on ~1e5 (float32 steps of 0.008 there)
    yp.data<float>()[sp_ch * n + i] += h;
    ym.data<float>()[sp_ch * n + i] -= h;
    const double fd = ((double)d.compute_diagnostics(yp, kT0).data<float>()[i] -
                       (double)d.compute_diagnostics(ym, kT0).data<float>()[i]) / (2 * h) * g.data<float>()[i];
    EXPECT_NEAR(gy.data<float>()[sp_ch * n + i], fd, 1e-3 * std::fabs(fd) + 1e-6) << i;
  }
  const std::string e = error_of([&] {
    read_credit_config(write_config("mslp_3d", {}, "postblocks:\n  per_step:\n    mslp:\n      type: mslp_diagnostic\n"
                                                   "      args:\n        output_name: era5/derived_diagnostic/3d/mslp\n"));
  });
  EXPECT_NE(e.find("postblocks.per_step.mslp.args.output_name: 'era5/derived_diagnostic/3d/mslp' is not a 2D variable key"),
            std::string::npos) << e;
}

// --device: the rollout's model runs on that backend (here one on host memory with every CPU
// kernel, unfused) and the forecast equals the step-by-step oracle.
TEST(Forecast, RunsOnTheGivenDevice) {
  static HostMemoryBackend* dev = [] {
    register_cpu_kernels();
    auto b = std::make_unique<HostMemoryBackend>("hostall");
    for (const std::string& op : known_ops()) b->register_kernel(op, kernel_for(op, KernelKind::Fast), ~0u);
    HostMemoryBackend* raw = b.get();
    register_backend(std::move(b));
    return raw;
  }();
  const std::string out = tmp_path("forecast_device.nc");
  ForecastArgs a = two_step_forecast(out);
  a.device = "hostall";
  const int uploads = dev->uploads;
  ASSERT_EQ(run_forecast(a), 0);
  EXPECT_GT(dev->uploads, uploads) << "the model did not run on the device";
  NcFile f(out);
  expect_forecast(f, two_step_oracle());
}

// history_len 2: the input is the window of the two latest steps (oldest first, on dim 2);
// training samples start one step later.
TEST(Era5Data, HistoryWindowAndSamples) {
  auto d = std::make_shared<Era5Data>(read_credit_config(write_config("hist2", {{"history_len: 1", "history_len: 2"}})));
  expect_close(d->input_window(kT0 + 12 * 3600), window({expected(kInputs, 6), expected(kInputs, 12)}), 2e-4, 0);
  auto src = open_era5_samples(d, kT0, kT0 + 36 * 3600, 2);  // windows end at 6 h .. 36 h, 2 steps: 4 samples
  ASSERT_EQ(src->size(), 4);
  Sample s = src->get(1);
  expect_close(s.input, window({expected(kInputs, 6), expected(kInputs, 12)}), 2e-4, 0);
  ASSERT_EQ(s.targets.size(), 2u);
  expect_close(s.targets[1], expected(kTargets, 24), 2e-4, 0);
  ASSERT_EQ(s.forcing.size(), 2u);
  expect_close(s.forcing[1], expected(kInputs, 18), 2e-4, 0);
  std::string e = error_of([&] {
    read_credit_config(write_config("hist_bad", {{"history_len: 1", "history_len: 2\n  valid_history_len: 1"}}));
  });
  EXPECT_NE(e.find("data.valid_history_len"), std::string::npos) << e;
}

// A CREDIT WXFormer with two input frames (models/make_history_model.py): its export matches
// PyTorch, and a 3-step forecast with history_len 2 equals the model run step by step on
// windows built here: each new step the previous prediction's prognostic channels, the
// forcing of its time and the static field, slid in after the previous newest step.
TEST(Forecast, HistoryTwoRolloutMatchesStepByStep) {
  const std::string model = kDir + "/model_history2.onnx";
  Graph g = import_onnx(model);
  const std::string in = g.values[g.inputs[0]].name;
  Tensor x = read_npy(kDir + "/model_history2_x.npy");
  prepare_model(g, {{in, {DType::F32, x.shape}}}, {});
  ExecOptions opt;
  opt.threads = 1;
  Executor ex(g, opt);
  EXPECT_LT(max_abs_diff(ex.run({{in, x}}).at(0), read_npy(kDir + "/model_history2_y.npy")), 1e-4);

  ForecastArgs a =
      tiny_forecast(write_config("hist2_forecast", {{"history_len: 1", "history_len: 2"}}), tmp_path("forecast_hist2.nc"), 3, model);
  ASSERT_EQ(run_forecast(a), 0);
  // the steps' inputs as the data reader gives them (checked against the formula above), so
  // that the comparison is as tight as the one-step forecast's
  Era5Data d(read_credit_config(a.config));
  auto at = [&](double h) { return d.input(kT0 + (int64_t)h * 3600); };
  auto step_after = [&](const Tensor& y, double h) {  // the input of time h with y's prognostic channels
    Tensor n = at(h);
    std::copy(y.data<float>(), y.data<float>() + 5 * 32 * 64, n.data<float>());
    return n;
  };
  Tensor y0 = ex.run({{in, window({at(12), at(18)})}}).at(0);
  Tensor n1 = step_after(y0, 24);
  Tensor y1 = ex.run({{in, window({at(18), n1})}}).at(0);
  Tensor y2 = ex.run({{in, window({n1, step_after(y1, 30)})}}).at(0);
  NcFile f(a.output);
  EXPECT_EQ(f.read("time"), (std::vector<double>{6, 12, 18}));
  expect_forecast(f, {y0, y1, y2});
  // a one-frame model with this config: the error names the model and the key
  a.model = data_path("models/wxformer_tiny/model.onnx");
  std::string e = error_of([&] { run_forecast(a); });
  EXPECT_NE(e.find("model.onnx"), std::string::npos) << e;
  EXPECT_NE(e.find("data.history_len 2"), std::string::npos) << e;
}

// Fine-tuning with history_len 2 and forecast_len 2: the first step's loss is the mean of the
// two steps' latitude-weighted MSEs of the model run on the windows built here.
TEST(FinetuneConfig, HistoryTwoRolloutLoss) {
  FinetuneConfig fc;
  fc.model = kDir + "/model_history2.onnx";
  fc.steps = 1;
  fc.threads = 1;
  fc.progress = false;
  fc.shuffle = false;
  fc.save = tmp_path("ft_hist2");
  auto given = [](const std::string& f) { return f == "--save" || f == "--steps" || f == "--shuffle"; };
  finetune_from_config(write_config("hist2_train", {{"history_len: 1", "history_len: 2"}, {"forecast_len: 1", "forecast_len: 2"}}),
                       fc, given, false);
  ASSERT_EQ(fc.forecast_len, 2);
  fc.accum = 1;
  Trainer t(fc, fc.open_data());
  const double loss = t.step().loss;

  Graph g = import_onnx(fc.model);
  const std::string in = g.values[g.inputs[0]].name;
  Tensor x0 = window({expected(kInputs, 0), expected(kInputs, 6)});
  prepare_model(g, {{in, {DType::F32, x0.shape}}}, {});
  ExecOptions opt;
  opt.threads = 1;
  Executor ex(g, opt);
  Tensor y0 = ex.run({{in, x0}}).at(0);
  Tensor n1 = expected(kInputs, 12);
  std::copy(y0.data<float>(), y0.data<float>() + 5 * 32 * 64, n1.data<float>());
  Tensor y1 = ex.run({{in, window({expected(kInputs, 6), n1})}}).at(0);
  LossWeights w;
  w.lat_weights = latitude_weights(fc.lat);
  const double want = 0.5 * (weighted_mse(y0, expected(kTargets, 12), w) + weighted_mse(y1, expected(kTargets, 18), w));
  EXPECT_NEAR(loss, want, 1e-4 * want);
}

TEST(Era5Data, ErrorsNameFileAndVariable) {
  auto err = [](const std::string& cfg, int64_t t) {
    return error_of([&] { Era5Data(read_credit_config(cfg)).input(t); });
  };
  // a variable missing from the file
  std::string e = err(write_config("missing", {{"vars_2D: [\"SP\"]", "vars_2D: [\"SP\", \"Q\"]"}}), kT0);
  EXPECT_NE(e.find("era5_2020.nc"), std::string::npos) << e;
  EXPECT_NE(e.find("'Q'"), std::string::npos) << e;
  // a time that is not in the file
  e = err(kDir + "/config.yml", kT0 + 3 * 3600);
  EXPECT_NE(e.find("era5_2020.nc"), std::string::npos) << e;
  EXPECT_NE(e.find("no time 2020-12-31T03:00:00"), std::string::npos) << e;
  // no file for the template
  e = err(write_config("nofile", {{kDir + "/forcing_%Y.nc", kDir + "/solar_%Y.nc"}}), kT0);
  EXPECT_NE(e.find("solar_2020.nc"), std::string::npos) << e;
  EXPECT_NE(e.find("'tsi'"), std::string::npos) << e;
  // wrong dimension order: T(time, latitude, level, longitude)
  const std::string bad = tmp_path("bad_2020.nc");
  int id, d[4], v;
  ASSERT_EQ(nc_create(bad.c_str(), NC_NETCDF4 | NC_CLOBBER, &id), NC_NOERR);
  nc_def_dim(id, "time", 1, &d[0]);
  nc_def_dim(id, "latitude", 32, &d[1]);
  nc_def_dim(id, "level", 2, &d[2]);
  nc_def_dim(id, "longitude", 64, &d[3]);
  nc_def_var(id, "T", NC_FLOAT, 4, d, &v);
  nc_close(id);
  std::string tmpl = bad;
  tmpl.replace(tmpl.rfind("2020"), 4, "%Y");
  e = err(write_config("dims", {{kDir + "/era5_%Y.*", tmpl}}), kT0);
  EXPECT_NE(e.find("bad_2020.nc"), std::string::npos) << e;
  EXPECT_NE(e.find("variable 'T' has dimensions (time, latitude, level, longitude)"), std::string::npos) << e;
  // a scaler whose numpy array is not float, and one whose base64 is broken: file and key named
  const std::string good = slurp(kDir + "/scaler.json");
  const std::string key = "era5/prognostic/2d/SP";
  for (auto [what, from, to] : {std::tuple<const char*, const char*, const char*>{"dtype <i8", "<f4", "<i8"},
                                {"malformed base64", "==", "=*"}}) {
    std::string text = good;
    const size_t at = text.find(key), p = text.find(from, at);
    ASSERT_NE(p, std::string::npos);
    text.replace(p, std::strlen(from), to);
    const std::string path = tmp_path(std::string("scaler_") + (from[0] == '<' ? "dtype" : "b64") + ".json");
    spit(path, text);
    CreditConfig c = read_credit_config(kDir + "/config.yml");
    c.scaler_json = path;
    e = error_of([&] { Era5Data d(c); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find(key), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  }
}

// trainer.amp (CREDIT's mixed precision) is --precision bf16 unless the flag was given.
TEST(FinetuneConfig, AmpIsBf16) {
  const std::string cfg = write_config("amp", {{"use_ema: false", "use_ema: false\n  amp: true"}});
  FinetuneConfig fc;
  fc.model = data_path("models/wxformer_tiny/model.onnx");
  fc.save = tmp_path("ft_amp");
  finetune_from_config(cfg, fc, [](const std::string& f) { return f == "--save"; }, false);
  EXPECT_EQ(fc.precision, "bf16");
  FinetuneConfig f2;
  f2.model = fc.model;
  f2.save = fc.save;
  finetune_from_config(cfg, f2, [](const std::string& f) { return f == "--save" || f == "--precision"; }, false);
  EXPECT_EQ(f2.precision, "fp32");
  FinetuneConfig f3;
  f3.model = fc.model;
  f3.save = fc.save;
  finetune_from_config(write_config("no_amp"), f3, [](const std::string& f) { return f == "--save"; }, false);
  EXPECT_EQ(f3.precision, "fp32");
  fs::remove_all(fc.save);
}

TEST(FinetuneConfig, ValidationRmseAndBiasOfAKnownPredictor) {
  FinetuneConfig fc;
  fc.model = data_path("models/wxformer_tiny/model.onnx");
  fc.save = tmp_path("ft_valid");
  fc.steps = 2;
  auto given = [](const std::string& f) { return f == "--save" || f == "--steps"; };
  finetune_from_config(kDir + "/config.yml", fc, given, true);
  EXPECT_EQ(slurp(fc.save + "/channel_schema.yaml"), Era5Data(read_credit_config(kDir + "/config.yml")).channel_schema_yaml());
  fs::remove_all(fc.save);
  EXPECT_EQ(fc.prognostic, 5);
  EXPECT_EQ(fc.forecast_len, 1);
  EXPECT_DOUBLE_EQ(fc.schedule.lr, 1e-4);
  EXPECT_TRUE(fc.shuffle);
  EXPECT_FALSE(fc.plain_mse);
  ASSERT_EQ(fc.validate_columns.size(), 1u + 2 * 4);
  EXPECT_EQ(fc.validate_columns[0], "valid_loss");
  EXPECT_EQ(fc.validate_columns[1], "valid_rmse/era5/prognostic/3d/T");
  EXPECT_EQ(fc.validate_columns[8], "valid_bias/era5/diagnostic/2d/tp");
  // predicting 0 (normalised) is predicting the scaler's mean: RMSE and bias from the formula
  std::vector<double> v = fc.validate([](const Tensor& x) { return Tensor::zeros(DType::F32, {1, 6, 1, 32, 64}); });
  ASSERT_EQ(v.size(), 9u);
  // validation samples start at 2021-01-01T00, 06, 12 (targets at h = 30, 36, 42)
  std::vector<double> lat(32), wl;
  for (int i = 0; i < 32; ++i) lat[i] = 90.0 - 180.0 * i / 31;
  double wsum = 0;
  for (double l : lat) wsum += std::cos(l * M_PI / 180);
  for (double l : lat) wl.push_back(std::cos(l * M_PI / 180) / (wsum / 32));
  const std::vector<std::string> vars = {"T", "U", "SP", "tp"};
  std::vector<double> sq(4), sum(4), cnt(4);
  double loss = 0;
  for (double h : {30.0, 36.0, 42.0})
    for (const Ch& c : kTargets) {
      const int vi = (int)(std::find(vars.begin(), vars.end(), c.var) - vars.begin());
      auto [m, s] = stats(c.var, c.lev);
      for (int i = 0; i < 32; ++i)
        for (int j = 0; j < 64; ++j) {
          const double d = m - field(c.var, h, c.lev, i, j);
          sq[vi] += d * d;
          sum[vi] += d;
          cnt[vi] += 1;
          // the config weighs by latitude and names no validation_loss: CREDIT validates with L1
          // (VariableTotalLoss2D's default)
          loss += std::fabs(d / s) * wl[i] / (6 * 32 * 64);
        }
    }
  EXPECT_NEAR(v[0], loss / 3, 1e-4 * loss / 3);
  for (int k = 0; k < 4; ++k) {
    EXPECT_NEAR(v[1 + k], std::sqrt(sq[k] / cnt[k]), 1e-4 * std::sqrt(sq[k] / cnt[k])) << vars[k];
    EXPECT_NEAR(v[5 + k], sum[k] / cnt[k], 1e-4 * (std::fabs(sum[k] / cnt[k]) + std::sqrt(sq[k] / cnt[k]))) << vars[k];
  }
}

// validation_data.source naming other files than data.source (CREDIT builds the validation set
// from that section): the validation reads them. Copies of the data give data.source's scores;
// with the copies gone the error names their path; other variables are refused.
TEST(FinetuneConfig, ValidationSourceWithItsOwnFiles) {
  const std::string copy = tmp_path("valid_source_files");
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (const char* f : {"era5_2020.nc", "era5_2021.zarr", "forcing_2020.nc", "forcing_2021.nc", "static.nc"})
    fs::copy(kDir + "/" + f, copy + "/" + f, fs::copy_options::recursive);
  auto section = [&](const std::string& vars3d) {
    return "validation_data:\n  source:\n    era5:\n      dataset_type: \"local\"\n      level_coord: \"level\"\n"
           "      levels: [500, 850]\n      variables:\n        prognostic:\n          vars_3D: " + vars3d + "\n"
           "          vars_2D: [\"SP\"]\n          path: \"" + copy + "/era5_%Y.*\"\n        diagnostic:\n"
           "          vars_2D: [\"tp\"]\n          path: \"" + copy + "/era5_%Y.*\"\n        dynamic_forcing:\n"
           "          vars_2D: [\"tsi\"]\n          path: \"" + copy + "/forcing_%Y.nc\"\n        static:\n"
           "          vars_2D: [\"LSM\"]\n          path: \"" + copy + "/static.nc\"\n"
           "  start_datetime: \"2021-01-01T00\"\n  end_datetime: \"2021-01-01T18\"\n";
  };
  const std::string cfg = write_config("valid_source", {}, section("[\"T\", \"U\"]"));
  ASSERT_EQ(read_credit_config(cfg).valid_sources.size(), 1u);
  auto validate = [](const std::string& config) {
    FinetuneConfig fc;
    fc.model = data_path("models/wxformer_tiny/model.onnx");
    fc.save = tmp_path("ft_valid_source");
    fc.steps = 1;
    finetune_from_config(config, fc, [](const std::string& f) { return f == "--save" || f == "--steps"; }, true);
    fs::remove_all(fc.save);
    return fc.validate([](const Tensor&) { return Tensor::zeros(DType::F32, {1, 6, 1, 32, 64}); });
  };
  const std::vector<double> want = validate(kDir + "/config.yml"), got = validate(cfg);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_DOUBLE_EQ(got[k], want[k]) << k;
  fs::remove_all(copy + "/era5_2021.zarr");
  std::string e = error_of([&] { validate(cfg); });
  EXPECT_NE(e.find(copy), std::string::npos) << e;
  EXPECT_NE(e.find("validation_data.source.era5.variables."), std::string::npos) << e;
  e = error_of([&] { read_credit_config(write_config("valid_source_vars", {}, section("[\"T\"]"))); });
  EXPECT_NE(e.find("validation_data.source: its sources, variables or levels differ from data.source's"), std::string::npos)
      << e;
  fs::remove_all(copy);
}

TEST(FinetuneConfig, TrainsFromConfigAndValidationDoesNotChangeTraining) {
  auto run = [](bool validate) {
    FinetuneConfig fc;
    fc.model = data_path("models/wxformer_tiny/model.onnx");
    fc.save = tmp_path(validate ? "ft_run_v" : "ft_run");
    fs::remove_all(fc.save);
    fc.steps = 2;
    fc.threads = 1;
    fc.progress = false;
    auto given = [](const std::string& f) { return f == "--save" || f == "--steps"; };
    finetune_from_config(kDir + "/config.yml", fc, given, true);
    if (!validate) fc.validate = nullptr;
    fc.validate_every = 1;  // validation between the two steps must not change the second
    EXPECT_EQ(run_finetune(fc), 0);
    std::string log = slurp(fc.save + "/training_log.csv");
    fs::remove_all(fc.save);
    return log;
  };
  const std::string plain = run(false), with = run(true);
  std::istringstream a(plain), b(with);
  std::string la, lb;
  std::getline(a, la);
  std::getline(b, lb);
  EXPECT_EQ(lb, la + ",valid_loss,valid_rmse/era5/prognostic/3d/T,valid_rmse/era5/prognostic/3d/U,"
                     "valid_rmse/era5/prognostic/2d/SP,valid_rmse/era5/diagnostic/2d/tp,valid_bias/era5/prognostic/3d/T,"
                     "valid_bias/era5/prognostic/3d/U,valid_bias/era5/prognostic/2d/SP,valid_bias/era5/diagnostic/2d/tp");
  int rows = 0;
  while (std::getline(a, la) && std::getline(b, lb)) {
    ++rows;
    // step, loss, lr, grad_norm identical (not the timings); validation columns after the seven
    auto fields = [](const std::string& s) {
      std::vector<std::string> f;
      std::stringstream ss(s);
      std::string x;
      while (std::getline(ss, x, ',')) f.push_back(x);
      return f;
    };
    std::vector<std::string> fa = fields(la), fb = fields(lb);
    ASSERT_GE(fb.size(), 7u);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(fa[k], fb[k]) << "row " << rows << " field " << k;
    ASSERT_EQ(fb.size(), 16u) << lb;
    EXPECT_GE(std::stod(fb[6]), 0.0);  // data_wait_s
    EXPECT_GT(std::stod(fb[7]), 0.0);
  }
  EXPECT_EQ(rows, 2);
}

// loss.variable_weights that weigh every target 0 (a loss of 0, nothing trained) are an error
// naming the key (issue 41: accepted).
TEST(FinetuneConfig, AllZeroVariableWeightsAreRefused) {
  const std::string cfg = write_config("zero_weights", {{"use_variable_weights: false",
                                                         "use_variable_weights: true\n  variable_weights: {T: 0, U: 0, SP: 0, tp: 0}"}});
  FinetuneConfig fc;
  fc.model = data_path("models/wxformer_tiny/model.onnx");
  fc.save = tmp_path("ft_zero_weights");
  const std::string e = error_of([&] { finetune_from_config(cfg, fc, [](const std::string& f) { return f == "--save"; }, false); });
  EXPECT_NE(e.find(cfg + ": loss.variable_weights: every target's weight is 0"), std::string::npos) << e;
}

// A NUL byte in a config's path, and a validation_data.source without variables: errors naming
// the key (issue 41).
TEST(FinetuneConfig, NulPathsAndOtherValidationSourcesAreRefused) {
  std::string e = error_of([&] { read_credit_config(write_config("nul_path", {{"static.nc\"", "static\\0.nc\""}})); });
  EXPECT_NE(e.find("static.path: the path holds a NUL byte"), std::string::npos) << e;
  e = error_of([&] {
    read_credit_config(write_config("other_valid_source", {}, "validation_data:\n  source:\n    era5:\n      levels: [500]\n"));
  });
  EXPECT_NE(e.find("validation_data.source.era5.variables: missing"), std::string::npos) << e;
}
