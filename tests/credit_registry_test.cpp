// CREDIT's registries (credit/losses, credit/scheduler.py, credit/preblock, credit/postblock) as
// wxe reads them from a config: each loss's gradient against central differences of its value,
// the config keys of every scheduler and block and their errors, the elementwise transforms on
// the era5_tiny data against their formulas and round trips. The golden files CREDIT itself made
// (tests/data/credit_registry, models/make_credit_registry_fixture.py) are checked in
// credit_golden_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include "data/credit_config.h"
#include "data/era5.h"
#include "data/tisr.h"
#include "engine/io/glob.h"
#include "engine/io/npy.h"
#include "engine/io/samples.h"
#include "test_util.h"
#include "train/finetune.h"
#include "train/from_config.h"
#include "train/loss.h"
#include "train/optim.h"

namespace fs = std::filesystem;
using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/era5_tiny");


bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

bool any_has(const std::vector<std::string>& w, const std::string& sub) {
  for (const std::string& x : w)
    if (has(x, sub)) return true;
  return false;
}

}  // namespace

// Every elementwise loss: its gradient against central differences of its own value (double),
// weighted by latitude and channel, at points away from the kinks (|p - t| not near 0 or delta).
TEST(CreditLosses, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.5f);
  const Shape shape = {2, 3, 1, 4, 5};
  Tensor p(DType::F32, shape), t(DType::F32, shape);
  for (int64_t i = 0; i < p.numel(); ++i) {
    t.data<float>()[i] = nd(rng);
    float d = nd(rng);
    if (std::fabs(d) < 0.05f) d = 0.3f;                       // away from mae's kink at 0
    if (std::fabs(std::fabs(d) - 0.5f) < 0.05f) d *= 1.3f;   // and huber's at delta 0.5
    p.data<float>()[i] = t.data<float>()[i] + d;
    if (std::fabs(p.data<float>()[i]) < 0.05f) p.data<float>()[i] += 0.2f;  // msle's kink at 0
  }
  LossWeights w;
  w.lat_weights = latitude_weights({60, 20, -20, -60});
  w.channel_weights = {0.5, 1.0, 2.0};
  for (const char* name : {"mse", "mae", "msle", "huber", "logcosh", "xtanh", "xsigmoid"}) {
    const LossFunction f = loss_function(name, 0.5);
    Tensor g;
    const double l0 = weighted_loss(p, t, w, f, &g, 3.0);
    EXPECT_GT(l0, 0) << name;
    for (int64_t i = 0; i < p.numel(); i += 7) {
      Tensor q = p.clone();
      const float x = q.data<float>()[i], h = 1e-2f;
      q.data<float>()[i] = x + h;
      const double lp = weighted_loss(q, t, w, f);
      q.data<float>()[i] = x - h;
      const double lm = weighted_loss(q, t, w, f);
      const double fd = 3.0 * (lp - lm) / (double)((x + h) - (x - h));
      EXPECT_NEAR(g.data<float>()[i], fd, 2e-3 * std::fabs(fd) + 1e-7) << name << " element " << i;
    }
  }
  // mse through weighted_loss equals the weighted MSE
  EXPECT_DOUBLE_EQ(weighted_loss(p, t, w, loss_function("mse")), weighted_mse(p, t, w));
  EXPECT_TRUE(has(error_of([] { loss_function("KCRPS"); }), "loss 'KCRPS' is not implemented (mse, mae"));
}

// CREDIT's formulas at a few points (the registry's definitions, credit/losses/gen_1).
TEST(CreditLosses, ValuesFollowCreditsDefinitions) {
  Tensor p(DType::F32, {1, 1, 1, 1, 2}), t(DType::F32, {1, 1, 1, 1, 2});
  p.data<float>()[0] = 2.0f, p.data<float>()[1] = -1.0f;
  t.data<float>()[0] = 0.5f, t.data<float>()[1] = 0.0f;
  auto L = [&](const char* n, double delta = 1.0) { return weighted_loss(p, t, LossWeights{}, loss_function(n, delta)); };
  const double e0 = 0.5 - 2.0, e1 = 1.0;  // target - pred
  EXPECT_NEAR(L("mse"), (e0 * e0 + e1 * e1) / 2, 1e-12);
  EXPECT_NEAR(L("mae"), (1.5 + 1.0) / 2, 1e-12);
  EXPECT_NEAR(L("huber"), ((1.5 - 0.5) + 0.5) / 2, 1e-12);  // 1.5 >= delta 1: delta (|d| - delta/2); 1.0 too
  EXPECT_NEAR(L("huber", 2.0), (0.5 * 2.25 + 0.5) / 2, 1e-12);
  EXPECT_NEAR(L("msle"), (std::pow(std::log(3.0) - std::log(1.5), 2) + std::pow(std::log(2.0), 2)) / 2, 1e-9);
  EXPECT_NEAR(L("logcosh"), (std::log(std::cosh(e0)) + std::log(std::cosh(e1))) / 2, 1e-9);
  EXPECT_NEAR(L("xtanh"), (e0 * std::tanh(e0) + e1 * std::tanh(e1)) / 2, 1e-9);
  auto xs = [](double e) { return 2 * e / (1 + std::exp(-e)) - e; };
  EXPECT_NEAR(L("xsigmoid"), (xs(e0) + xs(e1)) / 2, 1e-9);
}

// The loss section: every registry name, its parameters, validation_loss, per-level variable
// weights; what stays unimplemented is an error naming the key and saying what to do.
TEST(CreditConfigRegistry, LossSection) {
  CreditConfig c = read_credit_config(era5_tiny_config(
      "loss_huber", {{"training_loss: \"mse\"", "training_loss: \"huber\"\n  training_loss_parameters: {delta: 0.25}\n"
                                                "  validation_loss: \"logcosh\""},
                     {"use_variable_weights: false", "use_variable_weights: true\n  variable_weights: {T: [1, 2], SP: 3}"}}));
  EXPECT_EQ(c.training_loss.name, "huber");
  EXPECT_EQ(c.training_loss.delta, 0.25);
  EXPECT_TRUE(c.has_validation_loss);
  EXPECT_EQ(c.validation_loss.name, "logcosh");
  EXPECT_EQ(c.variable_weights["T"], (std::vector<double>{1, 2}));
  EXPECT_EQ(c.variable_weights["SP"], (std::vector<double>{3}));
  for (const char* n : {"mse", "mae", "msle", "huber", "logcosh", "xtanh", "xsigmoid"})
    EXPECT_EQ(read_credit_config(era5_tiny_config("loss_n", {{"\"mse\"", std::string("\"") + n + "\""}})).training_loss.name, n);
  struct Case {
    std::string from, to, want;
  };
  const std::vector<Case> cases = {
      {"training_loss: \"mse\"", "training_loss: \"KCRPS\"", "loss.training_loss: 'KCRPS' is an ensemble CRPS loss"},
      {"training_loss: \"mse\"", "training_loss: \"spectral\"",
       "loss.training_loss: 'spectral' returns one number and CREDIT's weighted loss"},
      {"training_loss: \"mse\"", "training_loss: \"power\"", "loss.training_loss: 'power': CREDIT 2026.2 cannot build it"},
      {"training_loss: \"mse\"", "training_loss: \"mse\"\n  use_spectral_loss: true", "loss.spectral_lambda_reg: missing"},
      {"training_loss: \"mse\"", "type: covmse\n  args: {wavenum_init: 3}", "only spectral and power take wavenum_init"},
      {"training_loss: \"mse\"", "training_loss: \"mse\"\n  training_loss_parameters: {delta: 2}",
       "only huber takes delta"},
      {"training_loss: \"mse\"", "type: base", "loss.args: missing"},
      {"training_loss: \"mse\"", "type: gradient", "loss.type: 'gradient' is not implemented"},
      {"training_loss: \"mse\"", "type: base\n  args: {var_weighting: learnable}", "'learnable'"},
  };
  for (const Case& k : cases) {
    const std::string e = error_of([&] { read_credit_config(era5_tiny_config("loss_bad", {{k.from, k.to}})); });
    EXPECT_TRUE(has(e, k.want)) << k.to << " -> " << e;
  }
  // the whole-tensor losses (train/spectral_loss.h): unweighted, their parameters; the terms
  c = read_credit_config(era5_tiny_config(
      "loss_covmse", {{"training_loss: \"mse\"", "training_loss: covmse\n  training_loss_parameters: "
                                                  "{batch_normalize: true, off_diagonal_scale: 0.5}"},
                      {"use_latitude_weights: true", "use_latitude_weights: false"}}));
  EXPECT_EQ(c.training_loss.name, "covmse");
  EXPECT_TRUE(c.training_loss.batch_normalize);
  EXPECT_EQ(c.training_loss.off_diagonal_scale, 0.5);
  c = read_credit_config(era5_tiny_config("loss_power", {{"training_loss: \"mse\"", "type: power\n  args: {wavenum_init: 4}"},
                                                         {"  use_latitude_weights: true\n  use_variable_weights: false\n", ""}}));
  EXPECT_EQ(c.training_loss.name, "power");
  EXPECT_EQ(c.training_loss.wavenum_init, 4);
  EXPECT_EQ(c.validation_loss.name, "power");  // load_loss(validation=True) builds the same type
  c = read_credit_config(era5_tiny_config("loss_terms", {{"training_loss: \"mse\"",
      "training_loss: mse\n  use_spectral_loss: true\n  use_power_loss: true\n  spectral_lambda_reg: 0.1\n"
      "  spectral_wavenum_init: 5"}}));
  EXPECT_TRUE(c.spectral_term && c.power_term);
  EXPECT_EQ(c.spectral_lambda, 0.1);
  EXPECT_EQ(c.spectral_wavenum, 5);
  c = read_credit_config(era5_tiny_config("loss_terms_off", {{"training_loss: \"mse\"", "training_loss: mse\n  use_spectral_loss: true"},
                                                             {"use_latitude_weights: true", "use_latitude_weights: false"}}));
  EXPECT_FALSE(c.spectral_term);  // CREDIT adds it only to its weighted loss: a warning says so
  ASSERT_FALSE(c.warnings.empty());
  EXPECT_TRUE(has(c.warnings.back(), "loss.use_spectral_loss: ignored")) << c.warnings.back();
}

// trainer.grad_max_norm: dynamic and each scheduler's section, with CREDIT's defaults.
TEST(CreditConfigRegistry, TrainerSection) {
  CreditConfig c = read_credit_config(era5_tiny_config("dyn", {{"grad_max_norm: 1.0", "grad_max_norm: 'dynamic'"}}));
  EXPECT_TRUE(c.grad_clip_dynamic);
  const std::string restarts =
      "use_scheduler: true\n  scheduler:\n    scheduler_type: cosine-annealing-restarts\n    first_cycle_steps: 250\n"
      "    cycle_mult: 6.0\n    max_lr: 5.0e-04\n    min_lr: 5.0e-07\n    warmup_steps: 249\n    gamma: 0.7\n  use_ema";
  c = read_credit_config(era5_tiny_config("restarts", {{"use_ema", restarts}}));
  EXPECT_EQ(c.scheduler_type, "cosine-annealing-restarts");
  EXPECT_EQ(c.first_cycle_steps, 250);
  EXPECT_EQ(c.cycle_mult, 6.0);
  EXPECT_EQ(c.max_lr, 5e-4);
  EXPECT_EQ(c.min_lr, 5e-7);
  EXPECT_EQ(c.warmup_steps, 249);
  EXPECT_EQ(c.gamma, 0.7);
  c = read_credit_config(era5_tiny_config(
      "cosine", {{"use_ema", "use_scheduler: true\n  scheduler:\n    scheduler_type: cosine-annealing\n    T_max: 7\n"
                             "    eta_min: 1.0e-6\n  use_ema"}}));
  EXPECT_EQ(c.t_max, 7);
  EXPECT_EQ(c.eta_min, 1e-6);
  c = read_credit_config(era5_tiny_config(
      "plateau", {{"use_ema", "use_scheduler: true\n  scheduler:\n    scheduler_type: plateau\n    mode: max\n"
                              "    factor: 0.5\n    patience: 2\n    threshold_mode: abs\n  use_ema"}}));
  EXPECT_EQ(c.plateau_mode, "max");
  EXPECT_EQ(c.plateau_factor, 0.5);
  EXPECT_EQ(c.plateau_patience, 2);
  EXPECT_EQ(c.plateau_threshold_mode, "abs");
  EXPECT_EQ(c.min_lr, 0);  // ReduceLROnPlateau's default, not linear-warmup-cosine's
  c = read_credit_config(era5_tiny_config(
      "lambda", {{"use_ema", "use_scheduler: true\n  scheduler:\n    scheduler_type: lambda\n    T_max: 3\n  use_ema"}}));
  EXPECT_TRUE(any_has(c.warnings, "trainer.scheduler.T_max: ignored"));
  // FSDP (trainer.mode, or the parallelism block's data) is wxe's --shard-weights; ddp is not
  EXPECT_FALSE(c.shard_weights);
  c = read_credit_config(era5_tiny_config("fsdp", {{"grad_max_norm: 1.0", "grad_max_norm: 1.0\n  mode: fsdp"}}));
  EXPECT_TRUE(c.shard_weights);
  c = read_credit_config(era5_tiny_config("ddp", {{"grad_max_norm: 1.0", "grad_max_norm: 1.0\n  mode: ddp"}}));
  EXPECT_FALSE(c.shard_weights);
  c = read_credit_config(era5_tiny_config(
      "fsdp2", {{"grad_max_norm: 1.0", "grad_max_norm: 1.0\n  parallelism:\n    data: fsdp2\n    tensor: 1"}}));
  EXPECT_TRUE(c.shard_weights);
  EXPECT_TRUE(any_has(c.warnings, "data: fsdp is --shard-weights"));
  struct Case {
    std::string to, want;
  };
  const std::vector<Case> cases = {
      {"use_scheduler: true\n  scheduler:\n    scheduler_type: cosine\n  use_ema", "'cosine' is not one of CREDIT's"},
      {"use_scheduler: true\n  scheduler:\n    scheduler_type: cosine-annealing\n  use_ema", "T_max: missing"},
      {"use_scheduler: true\n  scheduler:\n    scheduler_type: cosine-annealing-restarts\n    first_cycle_steps: 5\n"
       "    warmup_steps: 5\n  use_ema",
       "warmup_steps: 5 is not below first_cycle_steps 5"},
      {"use_scheduler: true\n  scheduler:\n    scheduler_type: plateau\n    factor: 1.0\n  use_ema", "factor: must be below 1"},
      {"use_scheduler: true\n  scheduler:\n    scheduler_type: plateau\n    mode: up\n  use_ema", "'up' is not min or max"},
  };
  for (const Case& k : cases) {
    const std::string e = error_of([&] { read_credit_config(era5_tiny_config("sched_bad", {{"use_ema", k.to}})); });
    EXPECT_TRUE(has(e, k.want)) << k.to << " -> " << e;
  }
}

// Schedules against CREDIT's definitions at points worked by hand.
TEST(CreditSchedules, HandWorkedPoints) {
  Schedule s;
  s.kind = ScheduleKind::CosineRestarts;
  s.first_cycle_steps = 10;
  s.warmup_steps = 2;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.gamma = 0.5;
  s.cycle_mult = 2.0;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);                 // construction sets min_lr
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.9 * 1 / 2 + 0.1);   // warm-up
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0);                 // the cycle's top
  EXPECT_NEAR(s.lr_at(6), 0.1 + 0.9 * (1 + std::cos(M_PI * 4 / 8)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1);                // cycle 1 (length (10-2)*2+2 = 18), max 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(12), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(28), 0.1);                // cycle 2 starts at 10 + 18
  EXPECT_DOUBLE_EQ(s.lr_at(30), 0.25);
  s.cycle_mult = 1.0;                                // equal cycles: the jump over them
  EXPECT_NEAR(s.lr_at(5 * 10 + 2), std::pow(0.5, 5), 1e-15);
  EXPECT_NEAR(s.lr_at(1000 * 10 + 6), 0.1 + (std::pow(0.5, 1000) - 0.1) * (1 + std::cos(M_PI / 2)) / 2, 1e-15);
  Schedule c;
  c.kind = ScheduleKind::CosineAnnealing;
  c.lr = 1.0;
  c.t_max = 4;
  c.epoch_batches = 3;
  EXPECT_DOUBLE_EQ(c.lr_at(2), 1.0);                                  // epoch 0
  EXPECT_NEAR(c.lr_at(3), (1 + std::cos(M_PI / 4)) / 2, 1e-15);       // epoch 1
  EXPECT_NEAR(c.lr_at(4 * 3), 0.0, 1e-15);                            // epoch T_max
  EXPECT_NEAR(c.lr_at(8 * 3), 1.0, 1e-12);                            // and back up at 2 T_max
  Schedule l;
  l.kind = ScheduleKind::Lambda;
  l.lr = 2.0;
  l.epoch_batches = 5;
  EXPECT_DOUBLE_EQ(l.lr_at(0), 2.0 * 0.1);  // epoch 0 runs at lambda(1)
  EXPECT_DOUBLE_EQ(l.lr_at(5), 2.0 * 0.3);  // epoch 1 at lambda(3)
  Schedule p;
  p.kind = ScheduleKind::Plateau;
  p.lr = 1.0;
  p.factor = 0.5;
  p.patience = 1;
  p.epoch_batches = 2;
  p.epoch_metrics = {1.0, 1.0, 1.0, 0.5, 0.5, 0.5};
  EXPECT_DOUBLE_EQ(p.lr_at(2 * 2), 1.0);   // one bad epoch: within patience
  EXPECT_DOUBLE_EQ(p.lr_at(3 * 2), 0.5);   // two: reduced
  EXPECT_DOUBLE_EQ(p.lr_at(5 * 2), 0.5);   // 0.5 improved, then one bad epoch
  EXPECT_DOUBLE_EQ(p.lr_at(6 * 2), 0.25);  // two
  p.epoch_metrics.push_back(0.5);
  EXPECT_DOUBLE_EQ(p.lr_at(7 * 2), 0.25);
  EXPECT_TRUE(has(error_of([&] { p.lr_at(9 * 2); }), "the metric of epoch 8 is missing"));
  // metadata round trip, exact
  Schedule r = schedule_from_metadata(schedule_metadata(p), "test");
  EXPECT_EQ(r.epoch_metrics, p.epoch_metrics);
  EXPECT_EQ(r.lr_at(7 * 2), p.lr_at(7 * 2));
  r = schedule_from_metadata(schedule_metadata(s), "test");
  for (int64_t k : {0, 1, 7, 99, 12345}) EXPECT_EQ(r.lr_at(k), s.lr_at(k)) << k;
}

// Pre- and postblocks: parsed in the config's order, the rules and options CREDIT takes, and
// what wxe refuses (a transform after the scaler) with the block named.
TEST(CreditConfigRegistry, TransformBlocks) {
  const std::string blocks =
      "preblocks:\n"
      "  fill:\n    type: fill_values\n    args:\n      variables: ['era5/prognostic/2d/SP']\n"
      "      rules:\n        - {search: nan, fill: 0.0}\n        - {search: 0.0, op: \"<\", fill: 1.0}\n"
      "  log:\n    type: log_transform\n    args:\n      variables: ['era5/prognostic/3d/T']\n      base: 10\n"
      "      eps: 1.0e-3\n      data_types: ['input']\n"
      "  sq:\n    type: sqrt_transform\n    args:\n      variables: 'era5/diagnostic/2d/tp'\n"
      "  norm:\n";
  CreditConfig c = read_credit_config(era5_tiny_config("blocks", {{"preblocks:\n  norm:\n", blocks}}));
  ASSERT_EQ(c.pre_transforms.size(), 3u);
  EXPECT_EQ(c.pre_transforms[0].kind, PointTransform::Fill);
  ASSERT_EQ(c.pre_transforms[0].rules.size(), 2u);
  EXPECT_TRUE(c.pre_transforms[0].rules[0].nan);
  EXPECT_EQ(c.pre_transforms[0].rules[1].op, "<");
  EXPECT_EQ(c.pre_transforms[1].base, 10);
  EXPECT_EQ(c.pre_transforms[1].eps, 1e-3);
  EXPECT_EQ(c.pre_transforms[1].data_types, (std::vector<std::string>{"input"}));
  // a plain string selects nothing in CREDIT (it iterates its characters): the same, said
  EXPECT_TRUE(any_has(c.warnings, "preblocks.sq.args.variables: 'era5/diagnostic/2d/tp' is a string, not a list"));
  Era5Data d(c);
  for (const ChannelInfo& ch : d.target_channels()) EXPECT_TRUE(ch.var != "tp" || ch.pre.empty());
  for (const ChannelInfo& ch : d.input_channels()) EXPECT_EQ(ch.pre.size(), ch.var == "T" || ch.var == "SP" ? 1u : 0u) << ch.var;
  for (const ChannelInfo& ch : d.target_channels()) EXPECT_EQ(ch.pre.size(), ch.var == "SP" ? 1u : 0u) << ch.var;
  const std::string after = "preblocks:\n  norm:\n    type: \"bridgescaler_transform\"\n    args:\n      scaler_path: \"" +
                            kDir + "/scaler.json\"\n  log:\n    type: log_transform\n    args:\n      variables: []\n";
  std::string e = error_of([&] {
    read_credit_config(era5_tiny_config("after", {{"preblocks:\n  norm:\n    type: \"bridgescaler_transform\"\n    args:\n"
                                              "      scaler_path: \"" + kDir + "/scaler.json\"\n", after}}));
  });
  EXPECT_TRUE(has(e, "preblocks.log: log_transform after the scaler is not implemented")) << e;
  e = error_of([&] {
    read_credit_config(era5_tiny_config("badrule", {{"preblocks:\n  norm:\n", "preblocks:\n  f:\n    type: fill_values\n    args:\n"
                                                                        "      rules:\n        - {search: 1, op: \"=~\", fill: 0}\n  norm:\n"}}));
  });
  EXPECT_TRUE(has(e, "preblocks.f.args.rules[0].op: '=~' is not one of")) << e;
  e = error_of([&] {
    read_credit_config(era5_tiny_config("twin", {{"preblocks:", "postblocks:\n  per_step:\n    rt:\n      type: reconstruct\n"
                                                           "      args:\n        in_key: y\n        out_key: y_target_processed\n"
                                                           "preblocks:"}}));
  });
  EXPECT_TRUE(has(e, "postblocks.per_step.rt: the target twin y_target_processed is read only by CREDIT's loss.type base"))
      << e;
  // forecast reads the same config: the loss's target twin and the training keys are no error
  const std::string fc = era5_tiny_config(
      "forecast_only", {{"preblocks:", "postblocks:\n  per_step:\n    rt:\n      type: reconstruct\n      args:\n"
                                       "        in_key: y\n        out_key: y_target_processed\npreblocks:"},
                        {"grad_max_norm: 1.0", "grad_max_norm: 'whatever'"},
                        {"training_loss: \"mse\"", "type: base"}});
  EXPECT_TRUE(has(error_of([&] { read_credit_config(fc); }), "trainer.grad_max_norm"));
  EXPECT_EQ(error_of([&] { read_credit_config(fc, /*training=*/false); }), "<no error>");
}

// The transforms on real reads: input channels through log and fill before the scaler, the
// targets' postblocks undo them, and a rollout's feedback takes the prediction through the
// postblocks and back through the input preblocks.
TEST(CreditTransforms, EraTinyRoundTrips) {
  const std::string blocks =
      "postblocks:\n  per_step:\n    rec:\n      type: reconstruct\n"
      "    ex:\n      type: exp_transform\n      args:\n        variables: ['era5/prognostic/3d/T']\n        eps: 1.0e-3\n"
      "    sq:\n      type: square_transform\n      args:\n        variables: ['era5/prognostic/2d/SP']\n"
      "preblocks:\n"
      "  log:\n    type: log_transform\n    args:\n      variables: ['era5/prognostic/3d/T']\n      eps: 1.0e-3\n"
      "  sq:\n    type: sqrt_transform\n    args:\n      variables: ['era5/prognostic/2d/SP']\n"
      "  norm:\n";
  Era5Data plain(read_credit_config(kDir + "/config.yml"));
  Era5Data d(read_credit_config(era5_tiny_config("roundtrip", {{"preblocks:\n  norm:\n", blocks}})));
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  Tensor x0 = plain.input(t), x = d.input(t), y = d.target(t), y0 = plain.target(t);
  const int64_t hw = x.numel() / x.shape[1];
  for (size_t k = 0; k < d.input_channels().size(); ++k) {
    const ChannelInfo& c = d.input_channels()[k];
    for (int64_t i = 0; i < hw; i += 17) {
      // the physical value from the untransformed read, transformed by the formula, normalised
      const float phys = x0.data<float>()[k * hw + i] * (float)c.std + (float)c.mean;
      float want = phys;
      if (c.var == "T") want = std::log(phys + 1e-3f) - (float)std::log(1e-3);
      if (c.var == "SP") want = std::sqrt(phys);
      want = (want - (float)c.mean) / (float)c.std;
      EXPECT_NEAR(x.data<float>()[k * hw + i], want, 1e-5 * std::fabs(want) + 1e-5) << c.var << " " << i;
    }
  }
  // targets: de-normalised through the postblocks back to the physical values
  Tensor back = y.clone(), phys = y0.clone();
  d.denormalise_target(back);
  plain.denormalise_target(phys);
  for (int64_t i = 0; i < back.numel(); ++i)
    // (log T normalised by raw T's statistics is far from 0: float32 keeps ~1e-5 of it)
    ASSERT_NEAR(back.data<float>()[i], phys.data<float>()[i], 1e-4 * std::fabs(phys.data<float>()[i]) + 1e-4) << i;
  // rollout: the target as a prediction, fed back, equals the input the data reads at that time
  Tensor fed = d.prediction_to_input(y);
  Tensor want = d.input(t);
  for (int k = 0; k < d.prognostic_channels(); ++k)
    for (int64_t i = 0; i < hw; ++i)
      ASSERT_NEAR(fed.data<float>()[k * hw + i], want.data<float>()[k * hw + i], 1e-4) << "channel " << k << " " << i;
}

// fill_values: every rule matched on the original value, the last match wins, numeric rules never
// match NaN; NaN left after the blocks is an error naming the variable and the block.
TEST(CreditTransforms, FillValuesRules) {
  PointTransform f;
  f.kind = PointTransform::Fill;
  f.rules = {{true, "==", 0, -1.0}, {false, "<", 0.0, 0.0}, {false, "<=", -5.0, 7.0}, {false, "==", 2.0, 9.0}};
  float v[] = {NAN, -1.f, -6.f, 2.f, 3.f};
  f.apply(v, 5);
  EXPECT_EQ(v[0], -1.f);  // NaN rule; the numeric ones never match NaN
  EXPECT_EQ(v[1], 0.f);
  EXPECT_EQ(v[2], 7.f);   // < 0 and <= -5: the last wins
  EXPECT_EQ(v[3], 9.f);
  EXPECT_EQ(v[4], 3.f);
  PointTransform l;
  l.kind = PointTransform::Log;
  l.base = 2;
  l.eps = 0.5;
  float w[] = {0.f, 1.5f};
  l.apply(w, 2);
  EXPECT_FLOAT_EQ(w[0], 0.f);  // log(0 + eps) - log(eps)
  EXPECT_FLOAT_EQ(w[1], 2.f);
  PointTransform e = l;
  e.kind = PointTransform::Exp;
  e.apply(w, 2);
  EXPECT_FLOAT_EQ(w[1], 1.5f);
  // a log of negative values: NaN after the block, an error naming it
  const std::string blocks =
      "preblocks:\n  lg:\n    type: log_transform\n    args:\n      variables: ['era5/static/2d/LSM']\n      eps: 1.0e-30\n"
      "  sh:\n    type: fill_values\n    args:\n      variables: ['era5/static/2d/LSM']\n"
      "      rules:\n        - {search: -1.0e30, op: \">\", fill: -7.0}\n"
      "  lg2:\n    type: log_transform\n    args:\n      variables: ['era5/static/2d/LSM']\n"
      "  norm:\n";
  Era5Data d(read_credit_config(era5_tiny_config("nanlog", {{"preblocks:\n  norm:\n", blocks}})));
  const std::string err = error_of([&] { d.input(parse_datetime("2020-12-31T18", "t")); });
  EXPECT_TRUE(has(err, "variable 'LSM'") && has(err, "NaN or inf after preblocks.lg2")) << err;
}

// A plateau schedule in a fine-tuning run: each epoch's validation loss (training_log.csv) steps it
// at the epoch's end, as CREDIT's trainer; a run resumed mid-way keeps the metrics it had seen
// (the checkpoint holds them) and logs the same learning rates.
TEST(CreditSchedules, PlateauFollowsTheValidationLossAndResumes) {
  const std::string plateau =
      "use_scheduler: true\n  scheduler:\n    scheduler_type: plateau\n    factor: 0.5\n    patience: 0\n"
      "    threshold: 0.5\n  use_ema";  // patience 0, a 50 % threshold: every epoch that is not far better halves
  const std::string cfg = era5_tiny_config("plateau_run", {{"use_ema", plateau}, {"epochs: 1", "epochs: 3"}});
  auto run = [&](const std::string& save, int64_t steps, bool resume) {
    FinetuneConfig fc;
    fc.model = data_path("models/wxformer_tiny/model.onnx");
    fc.save = save;
    fc.steps = steps;
    fc.resume = resume;
    fc.progress = false;
    finetune_from_config(cfg, fc, [](const std::string& f) { return f == "--save" || f == "--steps" || f == "--resume"; },
                         true);
    EXPECT_EQ(fc.schedule.kind, ScheduleKind::Plateau);
    fc.validate_every = 2;  // an epoch is 2 steps (batches_per_epoch), also when --steps cuts the run short
    EXPECT_EQ(run_finetune(fc), 0);
    return fc;
  };
  auto column = [](const std::string& log, int col) {
    std::vector<std::string> out;
    std::istringstream in(slurp(log));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::string cell;
      std::istringstream ls(line);
      for (int i = 0; i <= col; ++i) std::getline(ls, cell, ',');
      out.push_back(cell);
    }
    return out;
  };
  const std::string a = tmp_path("plateau_a"), b = tmp_path("plateau_b");
  fs::remove_all(a);
  fs::remove_all(b);
  const FinetuneConfig fc = run(a, 6, false);
  // columns: step, loss, lr, grad_norm, samples_per_s, step_seconds, data_wait_s, valid_loss, ...
  const std::vector<std::string> lr = column(a + "/training_log.csv", 2), valid = column(a + "/training_log.csv", 7);
  ASSERT_EQ(lr.size(), 6u);
  // the schedule replayed on the logged validation losses of epochs 1 and 2
  Schedule s = fc.schedule;
  s.epoch_metrics = {std::stod(valid[1]), std::stod(valid[3])};
  for (int64_t k = 0; k < 6; ++k) EXPECT_DOUBLE_EQ(std::stod(lr[k]), s.lr_at(k)) << "step " << k + 1;
  EXPECT_EQ(std::stod(lr[0]), 1e-4);
  // resumed from step 3 (mid-epoch 2): the same learning rates
  run(b, 3, false);
  run(b, 6, true);
  EXPECT_EQ(column(b + "/training_log.csv", 2), lr);
  fs::remove_all(a);
  fs::remove_all(b);
}

// Several data sources: CREDIT's channel order (inputs source by source, each prognostic < static
// < dynamic_forcing; targets source by source, prognostic then diagnostic), each source with its
// own files, and rollouts feeding each prognostic target channel into its own input channel.
TEST(CreditSources, SeveralLocalSourcesInCreditsChannelOrder) {
  const std::string one = kDir + "/config.yml";
  auto two = [&](const std::string& name, const std::string& a, const std::string& b) {
    std::string text = slurp(one);
    const size_t s = text.find("  source:\n"), e = text.find("  start_datetime:");
    text.replace(s, e - s, "  source:\n" + a + b);
    text.replace(text.find("\"scaler.json\""), 13, "\"" + kDir + "/scaler.json\"");
    const std::string path = tmp_path(name + ".yml");
    spit(path, text);
    return path;
  };
  const std::string d = kDir + "/";
  const std::string prog = "      variables:\n        prognostic:\n          vars_3D: [\"T\", \"U\"]\n          vars_2D: [\"SP\"]\n"
                           "          path: \"" + d + "era5_%Y.*\"\n";
  const std::string lsm = "        static:\n          vars_2D: [\"LSM\"]\n          path: \"" + d + "static.nc\"\n";
  const std::string tp = "        diagnostic:\n          vars_2D: [\"tp\"]\n          path: \"" + d + "era5_%Y.*\"\n";
  const std::string tsi = "        dynamic_forcing:\n          vars_2D: [\"tsi\"]\n          path: \"" + d + "forcing_%Y.nc\"\n";
  const std::string head = "      dataset_type: \"local\"\n      level_coord: \"level\"\n      levels: [500, 850]\n";
  Era5Data ref(read_credit_config(one));
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  // A: prognostic + static, B: diagnostic + forcing: the single source's order and values
  Era5Data ab(read_credit_config(two("src_ab", "    A:\n" + head + prog + lsm, "    B:\n" + head + "      variables:\n" + tp + tsi)));
  EXPECT_EQ(ab.input(t).shape, ref.input(t).shape);
  EXPECT_EQ(rel_l2(ab.input(t), ref.input(t)), 0.0);
  EXPECT_EQ(rel_l2(ab.target(t), ref.target(t)), 0.0);
  EXPECT_EQ(var_key(ab.config(), ab.target_channels().back()), "B/diagnostic/2d/tp");
  // A: static + forcing only, B: prognostic + diagnostic: B's prognostic inputs come after A's
  Era5Data ba(read_credit_config(two("src_ba", "    A:\n" + head + "      variables:\n" + lsm + tsi,
                                     "    B:\n" + head + prog + tp)));
  std::vector<std::string> in;
  for (const ChannelInfo& c : ba.input_channels()) in.push_back(c.var);
  EXPECT_EQ(in, (std::vector<std::string>{"LSM", "tsi", "T", "T", "U", "U", "SP"}));
  EXPECT_EQ(ba.feedback_map(), (std::vector<int64_t>{2, 3, 4, 5, 6, -1}));
  EXPECT_EQ(ba.prognostic_channels(), 5);
  const Tensor x = ba.input(t), xr = ref.input(t), y = ba.target(t);
  const int64_t hw = x.numel() / x.shape[1];
  for (int64_t k = 0; k < 7; ++k) {  // the same channels, permuted: LSM, tsi first
    const int64_t from = k < 2 ? 5 + k : k - 2;
    for (int64_t i = 0; i < hw; ++i) ASSERT_EQ(x.data<float>()[k * hw + i], xr.data<float>()[from * hw + i]) << k;
  }
  // a rollout step: the target as the prediction lands on B's prognostic inputs, LSM and tsi stay
  Tensor step = Tensor::zeros(DType::F32, x.shape);
  feed_back(step, ba.prediction_to_input(y), ba.feedback_map());
  for (int64_t k = 0; k < 7; ++k)
    for (int64_t i = 0; i < hw; i += 31)
      ASSERT_EQ(step.data<float>()[k * hw + i], k < 2 ? 0.f : y.data<float>()[(k - 2) * hw + i]) << k;
  // a variable name in two sources (CREDIT's upper/lower-air split): channels of their own, each
  // source's scaler by its full key or, as here, the file's one scaler of the name
  Era5Data dup(read_credit_config(two("src_dup", "    A:\n" + head + prog, "    B:\n" + head + prog)));
  ASSERT_EQ(dup.input_channels().size(), 10u);
  EXPECT_EQ(dup.feedback_map(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const Tensor xd = dup.input(t);
  for (int64_t k = 0; k < 5; ++k)
    for (int64_t i = 0; i < hw; i += 53) {
      ASSERT_EQ(xd.data<float>()[k * hw + i], xr.data<float>()[k * hw + i]) << k;
      ASSERT_EQ(xd.data<float>()[(k + 5) * hw + i], xr.data<float>()[k * hw + i]) << k;
    }
  // a tisr source with more than its one variable: an error naming it
  std::string e = error_of([&] {
    read_credit_config(two("src_tisr", "    A:\n" + head + prog,
                           "    S:\n      dataset_type: tisr\n      lat_spec: [90, -90, 32]\n      lon_spec: [0, 354.375, 64]\n"
                           "      variables:\n" + lsm));
  });
  EXPECT_TRUE(has(e, "data.source.S.variables: a tisr source has one 2D dynamic_forcing variable")) << e;
  // a tisr source (CREDIT's computed solar radiation) after the data: its channel last, the values
  // data/tisr.h computes (checked against CREDIT in tisr_test.cpp) at the input's time
  const std::string solar = "    SOLAR:\n      dataset_type: tisr\n      num_integration_steps: 36\n"
                            "      lat_spec: [90, -90, 32]\n      lon_spec: [0, 354.375, 64]\n      variables:\n"
                            "        dynamic_forcing:\n          vars_2D: ['tisr']\n";
  Era5Data st(read_credit_config(two("src_solar", "    A:\n" + head + prog + lsm + tp + tsi, solar)));
  ASSERT_EQ(st.input_channels().size(), 8u);
  EXPECT_EQ(var_key(st.config(), st.input_channels().back()), "SOLAR/dynamic_forcing/2d/tisr");
  const Tensor xs = st.input(t);
  TisrOptions o;
  o.integration_period_s = 6 * 3600;
  o.num_integration_steps = 36;
  const std::vector<float> want = credit_tisr(t, tisr_grid_from_spec({90, -90, 32}, {0, 354.375, 64}), o);
  const ChannelInfo& ts = st.input_channels().back();
  double peak = 0;
  for (int64_t i = 0; i < hw; ++i) {
    const float v = want[i];
    peak = std::max(peak, (double)v);
    ASSERT_FLOAT_EQ(xs.data<float>()[7 * hw + i], (float)((v - ts.mean) / ts.std)) << i;
  }
  EXPECT_GT(peak, 1e6);  // daylight somewhere: J m-2 over 6 h
  for (int64_t k = 0; k < 7; ++k)  // the data's channels as before
    for (int64_t i = 0; i < hw; i += 97) ASSERT_EQ(xs.data<float>()[k * hw + i], xr.data<float>()[k * hw + i]) << k;
  e = error_of([&] {
    read_credit_config(two("src_nogrid", "    A:\n" + head + prog, "    S:\n      dataset_type: tisr\n      variables:\n"
                                                                     "        dynamic_forcing:\n          vars_2D: ['tisr']\n"));
  });
  EXPECT_TRUE(has(e, "data.source.S: a tisr source needs its grid")) << e;
  e = error_of([&] { read_credit_config(two("src_hrrr", "    A:\n" + head + prog, "    H:\n      dataset_type: hrrr\n")); });
  EXPECT_TRUE(has(e, "data.source.H.dataset_type: 'hrrr' is not implemented")) << e;
}

// CREDIT's gen1 flat schema: the v1 config models/make_credit2026_fixture.py gave `credit convert`
// reads as the config `credit convert` wrote from it (tests/data/era5_tiny/credit2026_convert.yml):
// the same source, variables, paths, levels, dates, forecast lengths and validation dates; the
// mean/std netCDF files become the scaler.
TEST(CreditConfigRegistry, Gen1SchemaReadsAsCreditConvertWritesIt) {
  const std::string v1 =
      "save_loc: \"save\"\nseed: 1000\ndata:\n  variables: [\"T\", \"U\"]\n  surface_variables: [\"SP\"]\n"
      "  dynamic_forcing_variables: [\"tsi\"]\n  static_variables: [\"LSM\"]\n  diagnostic_variables: [\"tp\"]\n"
      "  save_loc: \"era5_*\"\n  save_loc_dynamic_forcing: \"forcing_*\"\n  save_loc_diagnostic: \"era5_*\"\n"
      "  save_loc_static: \"static.nc\"\n  mean_path: \"mean.nc\"\n  std_path: \"std.nc\"\n"
      "  train_years: [2020, 2021]\n  valid_years: [2021, 2021]\n  lead_time_periods: 6\n  level_ids: [500, 850]\n"
      "  history_len: 1\n  valid_history_len: 1\n  forecast_len: 0\n  valid_forecast_len: 0\n"
      "model:\n  type: \"crossformer\"\n  levels: 2\ntrainer:\n  type: era5\n  learning_rate: 1.0e-4\n"
      "loss:\n  training_loss: \"mse\"\n  use_latitude_weights: true\n";
  const std::string path = kDir + "/gen1_tmp.yml";  // beside the data: its paths are relative
  spit(path, v1);
  const CreditConfig a = read_credit_config(path);
  std::remove(path.c_str());
  const CreditConfig b = read_credit_config(kDir + "/credit2026_convert.yml");
  EXPECT_TRUE(any_has(a.warnings, "CREDIT's gen1 flat schema"));
  ASSERT_EQ(a.sources.size(), 1u);
  const SourceConfig &x = a.sources[0], &y = b.sources[0];
  EXPECT_EQ(x.name, y.name);
  EXPECT_EQ(x.levels, y.levels);
  EXPECT_EQ(x.level_coord, y.level_coord);
  for (auto [g, h] : {std::pair{&x.prognostic, &y.prognostic}, {&x.diagnostic, &y.diagnostic},
                      {&x.dynamic_forcing, &y.dynamic_forcing}, {&x.statics, &y.statics}}) {
    EXPECT_EQ(g->vars_3D, h->vars_3D);
    EXPECT_EQ(g->vars_2D, h->vars_2D);
    EXPECT_EQ(g->path, h->path);
  }
  EXPECT_EQ(a.start, b.start);
  EXPECT_EQ(a.end, b.end);
  EXPECT_EQ(a.timestep, b.timestep);
  EXPECT_EQ(a.forecast_len, 1);
  EXPECT_EQ(a.valid_forecast_len, 1);
  EXPECT_EQ(a.valid_start, parse_datetime("2021-01-01", "t"));
  EXPECT_EQ(a.valid_end, parse_datetime("2021-12-31", "t"));
  EXPECT_EQ(a.mean_nc, kDir + "/mean.nc");
  // and it reads the data: the same channels as the converted config
  Era5Data da(a), db(b);
  ASSERT_EQ(da.input_channels().size(), db.input_channels().size());
  for (size_t k = 0; k < da.input_channels().size(); ++k) EXPECT_EQ(da.input_channels()[k].var, db.input_channels()[k].var);
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  EXPECT_EQ(da.input(t).shape, db.input(t).shape);
}

// bridgescaler's quantile scaler (scaler_type: quantile; data/quantile_scaler.h, checked against
// bridgescaler in quantile_scaler_test.cpp) as the config's preblock: each channel its variable's
// digest for its level, statics too; variables the file lacks pass through; predictions go back
// through the target side's inverse.
TEST(CreditTransforms, QuantileScalerNormalisesEachChannel) {
  const std::string file = data_path("tests/data/quantile/scaler_quantile.json");
  CreditConfig c = read_credit_config(era5_tiny_config(
      "quantile", {{"scaler_path: \"" + kDir + "/scaler.json\"", "scaler_path: \"" + file + "\"\n      scaler_type: quantile"}}));
  ASSERT_EQ(c.scaler_json, file);
  CreditConfig raw_cfg = c;
  raw_cfg.scaler_json.clear();
  Era5Data q(c), raw(raw_cfg);
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  const Tensor x = q.input(t), x0 = raw.input(t), y = q.target(t), y0 = raw.target(t);
  const Json j = parse_json(slurp(file), file);
  auto scaler = [&](const char* side, const std::string& key) {
    return QuantileScaler::from_text(j.get(side)->get("era5")->get(key)->s, key);
  };
  const int64_t hw = x.numel() / x.shape[1];
  int transformed = 0;
  for (size_t k = 0; k < q.input_channels().size(); ++k) {
    const ChannelInfo& ch = q.input_channels()[k];
    const Json* e = j.get("input")->get("era5")->get(var_key(c, ch));
    std::vector<float> want(x0.data<float>() + k * hw, x0.data<float>() + (k + 1) * hw);
    if (e) {
      scaler("input", var_key(c, ch)).transform(want.data(), hw, ch.is3d ? ch.level_index : 0);
      ++transformed;
    }
    for (int64_t i = 0; i < hw; ++i) ASSERT_EQ(x.data<float>()[k * hw + i], want[i]) << ch.var << " " << i;
  }
  EXPECT_EQ(transformed, 4);  // T at two levels, SP, LSM; U and tsi pass through
  // the target side de-normalises: back near the data (a digest's round trip is piecewise linear)
  Tensor back = y.clone();
  q.denormalise_target(back);
  for (size_t k = 0; k < q.target_channels().size(); ++k) {
    const ChannelInfo& ch = q.target_channels()[k];
    if (!ch.post_quant) continue;
    std::vector<float> want(y.data<float>() + k * hw, y.data<float>() + (k + 1) * hw);
    scaler("target", var_key(c, ch)).inverse_transform(want.data(), hw, ch.is3d ? ch.level_index : 0);
    double spread = 0, worst = 0;
    for (int64_t i = 0; i < hw; ++i) {
      ASSERT_EQ(back.data<float>()[k * hw + i], want[i]) << ch.var;
      spread = std::max(spread, (double)std::fabs(y0.data<float>()[k * hw + i]));
      worst = std::max(worst, (double)std::fabs(back.data<float>()[k * hw + i] - y0.data<float>()[k * hw + i]));
    }
    EXPECT_LE(worst, 0.05 * spread) << ch.var;
  }
  // BaseLoss needs the postblocks' derivative, which the quantile inverse does not give: an error
  Tensor d;
  EXPECT_TRUE(has(error_of([&] { Tensor b = y.clone(); q.denormalise_target(b, &d); }), "quantile scaler's inverse"));
}

// CREDIT's weatherbench2_era5 dataset type from a local copy of the store (`path`, wxe's key;
// tests/data/wb2_tiny from models/make_wb2_fixture.py): one zarr store for every field type,
// (longitude, latitude) transposed to (latitude, longitude) as CREDIT does, time from the
// store's coordinate, statics without time; without `path` an error saying what to copy.
TEST(CreditSources, WeatherBench2StoreReadsTransposed) {
  const std::string dir = data_path("tests/data/wb2_tiny/");
  Era5Data d(read_credit_config(dir + "wb2_tiny.yml"));
  const Tensor x = d.input(parse_datetime("2020-01-01T06", "t"));
  ASSERT_EQ(x.shape, (Shape{1, 4, 1, 32, 64}));
  const std::vector<std::pair<std::string, int>> want = {{"T500", 0}, {"T850", 1}, {"t2m", 2}, {"lsm", 3}};
  for (auto& [name, k] : want) {
    const Tensor e = read_npy(dir + "expected_" + name + ".npy");
    ASSERT_EQ(e.numel(), 32 * 64) << name;
    for (int64_t i = 0; i < e.numel(); ++i) ASSERT_EQ(x.data<float>()[k * 2048 + i], e.data<float>()[i]) << name << " " << i;
  }
  EXPECT_NEAR(d.lat().front(), -87.1875, 1e-9);  // ascending, as the store holds them
  std::string text = slurp(dir + "wb2_tiny.yml");
  text.erase(text.find("      path:"), text.find('\n', text.find("      path:")) - text.find("      path:") + 1);
  const std::string bad = tmp_path("wb2_nopath.yml");
  spit(bad, text);
  const std::string e = error_of([&] { read_credit_config(bad); });
  EXPECT_TRUE(has(e, "data.source.WBERA5.path: missing: wxe reads no network; copy gs://weatherbench2/datasets/era5/"
                     "1959-2023_01_10-6h-64x32_equiangular_conservative.zarr")) << e;
}

// CREDIT's arco_era5 dataset type from local copies of Google's two ARCO-ERA5 stores (`path`,
// `model_level_path`: wxe's keys; tests/data/arco_tiny from models/make_arco_fixture.py, whose
// expected_*.npy are what CREDIT's own ARCOERA5Dataset reads from the same stores): 3D variables
// from the model-level store (level_coord hybrid) or the pressure-level one (level), every 2D
// variable from the pressure-level store, statics at the sample's time (ARCO keeps a time axis
// on them: sea ice changes); without the stores' paths an error saying what to copy.
TEST(CreditSources, ArcoEra5StoresReadAsCredit) {
  const std::string dir = data_path("tests/data/arco_tiny/");
  for (const std::string lc : {"hybrid", "level"}) {
    Era5Data d(read_credit_config(dir + "arco_" + lc + ".yml"));
    const int64_t t = parse_datetime("2020-01-01T06", "t");
    const Tensor x = d.input(t), y = d.target(t);
    const int64_t hw = 6 * 8;
    auto expect = [&](const Tensor& got, const std::vector<ChannelInfo>& chans) {
      for (size_t k = 0; k < chans.size(); ++k) {
        const Tensor e = read_npy(dir + "expected_" + lc + "_ARCO__" + chans[k].field_type + "__" +
                                  (chans[k].is3d ? "3d__" : "2d__") + chans[k].var + ".npy");
        const int64_t off = chans[k].is3d ? chans[k].level_index * hw : 0;
        ASSERT_GE(e.numel(), off + hw) << lc << " " << chans[k].var;
        for (int64_t i = 0; i < hw; ++i)
          ASSERT_EQ(got.data<float>()[(int64_t)k * hw + i], e.data<float>()[off + i]) << lc << " " << chans[k].var << " " << i;
      }
    };
    ASSERT_EQ(x.shape, (Shape{1, 5, 1, 6, 8})) << lc;
    expect(x, d.input_channels());
    ASSERT_EQ(y.shape, (Shape{1, 4, 1, 6, 8})) << lc;
    expect(y, d.target_channels());
  }
  std::string text = slurp(dir + "arco_hybrid.yml");
  const size_t at = text.find("      model_level_path:");
  text.erase(at, text.find('\n', at) - at + 1);
  const std::string bad = tmp_path("arco_nomodel.yml");
  spit(bad, text);
  const std::string e = error_of([&] { read_credit_config(bad); });
  EXPECT_TRUE(has(e, "data.source.ARCO.model_level_path: missing: level_coord hybrid reads the 3D variables from "
                     "gs://gcp-public-data-arco-era5/ar/model-level-1h-0p25deg.zarr-v1")) << e;
}

// A grid-wise scaler (a bridgescaler_transform's spatial_variables): the variable normalised point
// by point, (x - mean[i]) / sqrt(var[i]), and its predictions de-normalised point by point (also
// through the postblocks' derivative, which BaseLoss takes); a 3D variable is an error.
TEST(CreditTransforms, GridWiseScalerPerPoint) {
  // era5_tiny's scaler with SP's statistics one per grid point (32 x 64)
  std::string json = slurp(kDir + "/scaler.json");
  std::vector<double> mean(2048), var(2048);
  std::string m = "[", v = "[";
  for (int i = 0; i < 2048; ++i) {
    mean[i] = 100000 + 10 * (i % 64) - 5 * (i / 64);
    var[i] = 2500 + 3 * i;
    m += str(i ? "," : "", mean[i]);
    v += str(i ? "," : "", var[i]);
  }
  const std::string sp = "{\"_fit\": true, \"type\": \"DStandardScalerTensor\", \"mean_x_\": " + m + "], \"var_x_\": " + v + "]}";
  const Json j = parse_json(json, "scaler.json");
  std::string out = "{";
  for (size_t side = 0; side < j.keys.size(); ++side) {
    out += str(side ? "," : "", "\"", j.keys[side], "\": {\"era5\": {");
    const Json& src = *j.items[side].get("era5");
    for (size_t k = 0; k < src.keys.size(); ++k) {
      std::string text = src.keys[k] == "era5/prognostic/2d/SP" ? sp : src.items[k].s;
      std::string quoted;
      json_string(quoted, text);
      out += str(k ? "," : "", "\"", src.keys[k], "\": ", quoted);
    }
    out += "}}";
  }
  const std::string file = tmp_path("grid_scaler.json");
  spit(file, out + "}");
  const std::string cfg = era5_tiny_config(
      "grid", {{"scaler_path: \"" + kDir + "/scaler.json\"",
                "scaler_path: \"" + file + "\"\n      spatial_variables: ['era5/prognostic/2d/SP']"}});
  Era5Data g(read_credit_config(cfg)), ref(read_credit_config(kDir + "/config.yml"));
  const int64_t t = parse_datetime("2020-12-31T18", "t");
  const Tensor x = g.input(t), x0 = ref.input(t);
  const int sp_channel = 4;
  const ChannelInfo& c0 = ref.input_channels()[sp_channel];
  ASSERT_EQ(g.input_channels()[sp_channel].var, "SP");
  for (int64_t i = 0; i < 2048; ++i) {
    const float phys = x0.data<float>()[sp_channel * 2048 + i] * (float)c0.std + (float)c0.mean;
    const float want = (phys - (float)mean[i]) / (float)std::sqrt(var[i]);
    ASSERT_NEAR(x.data<float>()[sp_channel * 2048 + i], want, 1e-3) << i;
  }
  for (int64_t k = 0; k < 7; ++k) {  // the other channels as before
    if (k == sp_channel) continue;
    for (int64_t i = 0; i < 2048; i += 101) ASSERT_EQ(x.data<float>()[k * 2048 + i], x0.data<float>()[k * 2048 + i]) << k;
  }
  Tensor y = g.target(t), d;
  Tensor back = y.clone();
  g.denormalise_target(back, &d);
  for (int64_t i = 0; i < 2048; i += 7) {
    EXPECT_NEAR(back.data<float>()[sp_channel * 2048 + i], y.data<float>()[sp_channel * 2048 + i] * std::sqrt(var[i]) + mean[i], 0.05);
    EXPECT_FLOAT_EQ(d.data<float>()[sp_channel * 2048 + i], (float)std::sqrt(var[i]));
  }
  const std::string bad = era5_tiny_config(
      "grid3d", {{"scaler_path: \"" + kDir + "/scaler.json\"",
                  "scaler_path: \"" + file + "\"\n      spatial_variables: ['era5/prognostic/3d/T']"}});
  const std::string e = error_of([&] { Era5Data bd(read_credit_config(bad)); });
  EXPECT_TRUE(has(e, "a grid-wise scaler (spatial_variables) of a 3D variable")) << e;
}

// Config details CREDIT's shipped configs met: a tisr grid spec written as a YAML block list, and
// filename_time_format finding the time anywhere in a '*' (ERA5_6h_2020.nc from ERA5_6h*).
TEST(CreditConfigRegistry, SpecsAndTimeFormats) {
  const std::string block = "save_loc: s\ndata:\n  source:\n    A:\n      variables:\n        prognostic:\n"
                            "          vars_2D: ['SP']\n          path: 'ERA5_6h*'\n          filename_time_format: '%Y'\n"
                            "    S:\n      dataset_type: tisr\n      lat_spec:\n      - 90\n      - -90\n      - 32\n"
                            "      lon_spec: [0, 354.375, 64]\n      variables:\n        dynamic_forcing:\n"
                            "          vars_2D: ['tisr']\n  start_datetime: '2020-01-01'\n  end_datetime: '2020-01-02'\n";
  const std::string path = tmp_path("specs.yml");
  spit(path, block);
  const CreditConfig c = read_credit_config(path);
  EXPECT_EQ(c.sources.at(0).prognostic.path, (fs::path(path).parent_path() / "ERA5_6h*%Y*").string());
  EXPECT_TRUE(glob_match("ERA5_6h*2020*", "ERA5_6h_2020.nc"));
  CreditConfig d = c;
  d.sources.erase(d.sources.begin());  // the tisr source alone: its grid from the block list
  d.sources[0].dynamic_forcing.vars_2D = {"tisr"};
  Era5Data e(d);
  const Tensor x = e.input(parse_datetime("2020-01-01T06", "t"));
  EXPECT_EQ(x.shape, (Shape{1, 1, 1, 32, 64}));
}
