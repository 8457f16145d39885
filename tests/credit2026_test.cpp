// CREDIT 2026's own files (tests/data/era5_tiny/credit2026_*, models/make_credit2026_fixture.py):
// the config `credit convert` writes (preblocks.per_step, postblocks.per_step, validation_data),
// the scaler `credit preprocess` fits (separate input and target statistics) against CREDIT's
// own normalised sample, linear-warmup-cosine against CREDIT's scheduler
// (tests/data/credit_lr_schedule.json, models/make_credit_lr_reference.py), and hostile config
// values, scaler numbers and FIFOs in data folders: each an error naming file, key and value.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>

#include "data/credit_config.h"
#include "data/era5.h"
#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "engine/io/samples.h"
#include "test_util.h"
#include "forecast/forecast.h"
#include "train/from_config.h"

namespace fs = std::filesystem;
using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/era5_tiny");


bool has_warning(const std::vector<std::string>& w, const std::string& s) {
  for (const std::string& x : w)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

}  // namespace

// `credit convert`'s output, unchanged: the per_step layout, the variable lists, validation_data;
// the other keys CREDIT writes are warnings. It normalises as the flat form of the same scaler.
TEST(Credit2026, ConvertConfigReadsUnchanged) {
  CreditConfig c = read_credit_config(kDir + "/credit2026_convert.yml");
  EXPECT_EQ(c.sources.at(0).name, "ERA5");
  EXPECT_EQ(c.scaler_json, kDir + "/credit2026_convert_pre_scaler.json");
  EXPECT_EQ(c.scaler_vars.size(), 5u);
  EXPECT_EQ(c.post_scaler_json, kDir + "/credit2026_convert_post_scaler.json");
  EXPECT_EQ(c.post_scaler_vars,
            (std::vector<std::string>{"ERA5/prognostic/3d/T", "ERA5/prognostic/3d/U", "ERA5/prognostic/2d/SP"}));
  EXPECT_EQ(c.valid_start, parse_datetime("2021-01-01", "x"));
  EXPECT_EQ(c.grad_accum_every, 2);
  for (const char* w : {"preblocks.per_step.concat", "model", "loss.latitude_weights", "trainer.parallelism"})
    EXPECT_TRUE(has_warning(c.warnings, w)) << w;
  Era5Data d(c), flat(read_credit_config(kDir + "/config.yml"));
  const int64_t t = parse_datetime("2021-01-01T06", "t");
  EXPECT_EQ(max_abs_diff(d.input(t), flat.input(t)), 0.0);
  EXPECT_EQ(max_abs_diff(d.target(t), flat.target(t)), 0.0);
  // the postblock selects the prognostic variables only: tp is de-normalised with the preblock's
  // target side (physical units in every forecast variable)
  const ChannelInfo& tp = d.target_channels().back();
  ASSERT_EQ(tp.var, "tp");
  EXPECT_EQ(tp.post_mean, tp.mean);
  EXPECT_EQ(tp.post_std, tp.std);
  // the flat form and the per_step form side by side are an error
  const std::string e = error_of([&] {
    read_credit_config(era5_tiny_config("mixed", {{"preblocks:\n", "preblocks:\n  per_step:\n    c:\n      type: \"concat\"\n"}}));
  });
  EXPECT_NE(e.find("preblocks.norm"), std::string::npos) << e;
}

// `credit preprocess`'s scaler: input and target statistics differ. Inputs and targets as
// CREDIT's dataset and preblocks normalise them (credit2026_x/y.npy: input at 2021-01-01T00,
// target 6 h later), forecasts de-normalised with the target side, and a prediction fed back
// re-normalised with the input side as CREDIT's rollout does.
TEST(Credit2026, PreprocessScalerInputAndTargetSides) {
  Era5Data d(read_credit_config(kDir + "/credit2026_preprocess.yml"));
  const int64_t t = parse_datetime("2021-01-01T00", "t"), dt = 6 * 3600;
  Tensor x = d.input(t), y = d.target(t + dt);
  Tensor cx = read_npy(kDir + "/credit2026_x.npy"), cy = read_npy(kDir + "/credit2026_y.npy");
  ASSERT_EQ(x.shape, cx.shape);
  ASSERT_EQ(y.shape, cy.shape);
  EXPECT_LT(max_abs_diff(x, cx), 2e-6);
  EXPECT_LT(max_abs_diff(y, cy), 2e-6);
  EXPECT_NE(d.input_channels()[0].mean, d.target_channels()[0].mean);  // T at 500 hPa: two sides
  // the target at t + dt fed back equals the input read at t + dt (prognostic channels)
  Tensor fed = d.prediction_to_input(y), x1 = d.input(t + dt);
  for (int k = 0; k < d.prognostic_channels(); ++k)
    for (int64_t i = 0; i < 32 * 64; ++i)
      ASSERT_NEAR(fed.data<float>()[k * 2048 + i], x1.data<float>()[k * 2048 + i], 2e-5) << k << " " << i;
  // de-normalised: physical T at 500 hPa, h = 30 (the fixture's formula at row 0, column 0)
  Tensor phys = y.clone();
  d.denormalise_target(phys);
  EXPECT_NEAR(phys.data<float>()[0], 250 + 10 * std::sin(0.05 * 30) + 30 * 0.5, 1e-3);
}

// linear-warmup-cosine from a config: CREDIT steps it once per batch, so optimizer step j takes
// the lr of the batch that ends it; the number of optimizer steps is CREDIT's.
TEST(Credit2026, SchedulerLearningRatesAreCredits) {
  Json ref = parse_json(slurp(data_path("tests/data/credit_lr_schedule.json")), "credit_lr_schedule.json");
  const Json* cases = ref.get("cases");
  ASSERT_TRUE(cases && !cases->items.empty());
  for (const Json& k : cases->items) {
    auto num = [&](const char* key) { return k.get(key)->s; };
    SCOPED_TRACE(str("accum ", num("grad_accum_every"), " batches_per_epoch ", num("batches_per_epoch")));
    const std::string cfg = era5_tiny_config(
        "sched", {{"learning_rate: 1.0e-4", "learning_rate: " + num("learning_rate")},
                  {"grad_accum_every: 1", "grad_accum_every: " + num("grad_accum_every")},
                  {"batches_per_epoch: 2", "batches_per_epoch: " + num("batches_per_epoch")},
                  {"epochs: 1", "epochs: " + num("epochs") + "\n  use_scheduler: true\n  scheduler:\n"
                                "    scheduler_type: linear-warmup-cosine\n    warmup_steps: " + num("warmup_steps") +
                                "\n    total_steps: " + num("total_steps") + "\n    min_lr: " + num("min_lr")}});
    FinetuneConfig fc;
    finetune_from_config(cfg, fc, [](const std::string&) { return false; }, false);
    const Json& lrs = *k.get("lrs");
    ASSERT_EQ(fc.steps, (int64_t)lrs.items.size());
    for (size_t j = 0; j < lrs.items.size(); ++j) {
      const double want = parse_double(lrs.items[j].s, "lr");
      EXPECT_NEAR(fc.schedule.lr_at((int64_t)j), want, 1e-15 + 1e-12 * want) << "optimizer step " << j;
    }
    // on the command line the counts are optimizer steps (both flags), as before
    FinetuneConfig f2;
    f2.schedule.warmup_steps = 3;
    f2.schedule.total_steps = 10;
    finetune_from_config(cfg, f2, [](const std::string& f) { return f == "--warmup-steps" || f == "--total-steps"; },
                         false);
    EXPECT_EQ(f2.schedule.accum_batches, 1);
    EXPECT_DOUBLE_EQ(f2.schedule.lr_at(1), f2.schedule.lr * 1 / 3);
  }
}

// Wrong-typed, out-of-range and unparsable config values: an error naming the key and value
// (before: ignored, wrapped around, or a bare "stoll").
TEST(Credit2026, HostileConfigValuesNameTheKey) {
  struct Case {
    std::string from, to, want;
  };
  const std::vector<Case> cases = {
      {"timestep: \"6h\"", "timestep: \"99999999999999999999h\"", "data.timestep: '99999999999999999999h'"},
      {"timestep: \"6h\"", "timestep: \"100000000d\"", "data.timestep: '100000000d' is not between"},
      {"timestep: \"6h\"", "timestep: \"7x\"", "data.timestep: '7x' is not a timestep"},
      {"start_datetime: \"2020-12-31T00\"", "start_datetime: \"2020-12-31T00junk\"", "data.start_datetime"},
      {"preblocks:\n  norm:", "preblocks: \"x\"\nunused:\n  norm:", "preblocks: expected a mapping"},
      {"use_variable_weights: false", "use_variable_weights: true\n  variable_weights: [1, 2]",
       "loss.variable_weights: expected a mapping"},
      {"use_variable_weights: false", "use_variable_weights: true\n  variable_weights: {T: -1}",
       "loss.variable_weights.T: -1 is not in"},
      {"batches_per_epoch: 2", "batches_per_epoch: -3", "trainer.batches_per_epoch: -3 is not in"},
      {"batches_per_epoch: 2\n  epochs: 1", "batches_per_epoch: 1000000\n  epochs: 1000000000000",
       "trainer.epochs: 1000000000000 x trainer.batches_per_epoch 1000000 steps is more than"},
      {"epochs: 1", "epochs: 0", "trainer.epochs: 0 is not in"},
      {"grad_accum_every: 1", "grad_accum_every: 4000000000", "trainer.grad_accum_every"},
      {"grad_accum_every: 1\n  train_batch_size: 1", "grad_accum_every: 100000\n  train_batch_size: 100000",
       "trainer.grad_accum_every: 100000 x trainer.train_batch_size 100000"},
      {"learning_rate: 1.0e-4", "learning_rate: .nan", "trainer.learning_rate"},
      {"use_ema: false", "use_ema: true\n  ema_decay: 2", "trainer.ema_decay: 2 is not in"},
      {"forecast_len: 1", "forecast_len: 1\n  valid_forecast_len: 0", "data.valid_forecast_len: 0 is not in"},
      {"training_loss: \"mse\"", "type: base\n  training_loss: \"mse\"", "loss.args: missing (loss.type base takes its settings there)"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { read_credit_config(era5_tiny_config("hostile", {{c.from, c.to}})); });
    EXPECT_NE(e.find(c.want), std::string::npos) << c.to << " -> " << e;
    EXPECT_NE(e.find("hostile.yml"), std::string::npos) << e;
  }
  EXPECT_EQ(parse_timestep("6h", "x"), 21600);
  for (const char* bad : {"7x", "", " 7", "1e999", "0x"}) EXPECT_NE(error_of([&] { parse_int64(bad, "k"); }), "<no error>") << bad;
  EXPECT_EQ(parse_double("1e-320", "k"), 1e-320);  // an underflow reads as the nearest double
  EXPECT_NE(error_of([&] { parse_double("1e999", "k"); }).find("k: '1e999' is out of range"), std::string::npos);
}

// Scaler statistics that cannot normalise: subnormal, out of range, inf or NaN.
TEST(Credit2026, UnusableScalerStatisticsNameTheFileAndVariable) {
  struct Case {
    const char* var_x;
    const char* want;
  };
  const Case cases[] = {{"[1e-320, 1]", "(not usable in float32)"},
                        {"[1e999, 1]", "'1e999' is out of range"},
                        {"{\"__numpy__\": \"AACAfwAAgD8=\", \"dtype\": \"<f4\", \"shape\": [2]}", "holds inf"},
                        {"{\"__numpy__\": \"AADAfwAAgD8=\", \"dtype\": \"<f4\", \"shape\": [2]}", "holds nan"}};
  for (const Case& c : cases) {
    const std::string path = tmp_path("bad_scaler.json");
    spit(path, std::string("{\"T\": {\"mean_x_\": [250, 260], \"var_x_\": ") + c.var_x + "}}");
    CreditConfig cfg = read_credit_config(kDir + "/config.yml");
    cfg.scaler_json = path;
    const std::string e = error_of([&] { Era5Data d(cfg); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find("'T'"), std::string::npos) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << c.var_x << " -> " << e;
  }
}

// FIFOs where data files go: an error at once, not a read that waits for a writer forever.
TEST(Credit2026, FifosInDataFoldersAreErrors) {
  const std::string dir = tmp_path("fifo_npy_dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  Tensor x = Tensor::zeros(DType::F32, {1, 2, 3});
  write_npy(dir + "/x_0000.npy", x);
  write_npy(dir + "/y_0000.npy", x);
  ASSERT_EQ(::mkfifo((dir + "/x_0001.npy").c_str(), 0600), 0);
  write_npy(dir + "/y_0001.npy", x);
  ASSERT_EQ(::mkfifo((dir + "/lat.npy").c_str(), 0600), 0);
  auto within = [](const std::string& fifo, const std::function<std::string()>& f) {
    auto fut = std::async(std::launch::async, f);
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "hung on the FIFO " << fifo;
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // let it return
      if (fd >= 0) ::close(fd);
    }
    return fut.get();
  };
  std::string e = within(dir + "/x_0001.npy", [&] { return error_of([&] { open_npy_dir(dir, 1); }); });
  EXPECT_NE(e.find("x_0001.npy: is not a regular file"), std::string::npos) << e;
  e = within(dir + "/lat.npy", [&] { return error_of([&] { read_npy_dir_info(dir); }); });
  EXPECT_NE(e.find("lat.npy: is not a regular file"), std::string::npos) << e;
  // an empty lat.npy and negative channel weights: errors, not the defaults
  fs::remove(dir + "/lat.npy");
  write_npy(dir + "/lat.npy", Tensor::zeros(DType::F32, {0}));
  e = error_of([&] { read_npy_dir_info(dir); });
  EXPECT_NE(e.find("lat.npy: empty"), std::string::npos) << e;
  fs::remove(dir + "/lat.npy");
  Tensor w = Tensor::zeros(DType::F32, {2});
  w.data<float>()[1] = -1;
  write_npy(dir + "/channel_weights.npy", w);
  e = error_of([&] { read_npy_dir_info(dir); });
  EXPECT_NE(e.find("channel_weights.npy: weight -1 is not a finite number >= 0"), std::string::npos) << e;
  // a netCDF data file that is a FIFO
  const std::string nc = tmp_path("fifo_2020.nc");
  fs::remove(nc);
  ASSERT_EQ(::mkfifo(nc.c_str(), 0600), 0);
  std::string tmpl = nc;
  tmpl.replace(tmpl.rfind("2020"), 4, "%Y");
  e = within(nc, [&] {
    return error_of([&] {
      Era5Data(read_credit_config(era5_tiny_config("fifo_cfg", {{kDir + "/forcing_%Y.nc", tmpl}}))).input(
          parse_datetime("2020-12-31T00", "t"));
    });
  });
  EXPECT_NE(e.find(nc + ": is not a regular file"), std::string::npos) << e;
  fs::remove(nc);
  fs::remove_all(dir);
}

// A forecast's second step takes the first prediction re-normalised from the target side
// (the postblock's inverse scaler) to the input side, as CREDIT's rollout does.
TEST(Credit2026, RolloutFeedsPredictionsBackOnTheInputScale) {
  Era5Data d(read_credit_config(kDir + "/credit2026_preprocess.yml"));
  const int64_t t = parse_datetime("2021-01-01T00", "t");
  Tensor x0 = d.input(t);
  Tensor y = d.target(t + 6 * 3600);  // any prediction: the truth
  Tensor second;
  int calls = 0;
  rollout(d, x0, t, 2, [&](const Tensor& x) {
    if (calls++) second = x.clone();
    return y;
  }, [](int, const Tensor&) {});
  ASSERT_EQ(calls, 2);
  const auto& in = d.input_channels();
  const auto& out = d.target_channels();
  for (int k = 0; k < d.prognostic_channels(); ++k) {
    const float pm = (float)out[k].post_mean, ps = (float)out[k].post_std, m = (float)in[k].mean, s = (float)in[k].std;
    ASSERT_NE(pm, m);
    for (int64_t i = 0; i < 2048; i += 97)
      EXPECT_EQ(second.data<float>()[k * 2048 + i], (y.data<float>()[k * 2048 + i] * ps + pm - m) / s) << k << " " << i;
  }
  // training rollouts get the same re-normalisation from the config
  FinetuneConfig fc;
  fc.save = tmp_path("rollout_save");
  finetune_from_config(kDir + "/credit2026_preprocess.yml", fc, [](const std::string& f) { return f == "--save"; }, false);
  ASSERT_TRUE(fc.to_input);
  Tensor a = fc.to_input(y, x0), b = d.prediction_to_input(y);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  EXPECT_GT(max_abs_diff(a, y), 1e-3);
}
