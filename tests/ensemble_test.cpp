// Ensemble training (docs/finetune-from-a-credit-config.md, CREDIT's registries): CREDIT's CRPS
// losses against CREDIT's own modules (tests/data/crps, made by models/make_crps_fixture.py), the
// config rules, the random ops (RandomNormal, RandomNormalLike), and CREDIT's noise-injection
// CrossFormer (tests/data/crossformer_noise_tiny.onnx, models/make_noise_model_fixture.py)
// imported, trained with KCRPS over two members, and resumed bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "data/credit_config.h"
#include "engine/exec/autograd.h"
#include "engine/exec/executor.h"
#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "tests/test_util.h"
#include "tests/train_util.h"
#include "train/ensemble_loss.h"
#include "train/finetune.h"
#include "train/from_config.h"

using namespace wxe;
using namespace wxe::test;
namespace fs = std::filesystem;

namespace {

const std::string kCrps = data_path("tests/data/crps/");
const std::string kNoise = "tests/data/crossformer_noise_tiny.onnx";

double num(const Json& j) { return parse_double(j.s, "json"); }

std::string yaml_scalar(const Json& j) { return j.type == Json::Str ? "'" + j.s + "'" : j.s; }

// The era5_tiny config with this loss section and trainer.ensemble_size.
std::string ensemble_config(const std::string& name, const std::string& loss_section, int ensemble = 3) {
  return era5_tiny_config(name, {{"training_loss: \"mse\"\n  use_latitude_weights: true\n  use_variable_weights: false",
                                  loss_section},
                                 {"use_ema: false", "use_ema: false\n  ensemble_size: " + std::to_string(ensemble)}});
}

}  // namespace

// Each KCRPS / almost-fair-crps case of CREDIT's load_loss (flat and VariableTotalLoss2D, training
// and validation criteria) through wxe's config reader and choice of criterion: the value within
// 1e-5 relative and d loss / d pred within 1e-5 relative L2 of CREDIT's autograd.
TEST(Crps, KcrpsAndAlmostFairMatchCredit) {
  const Json ref = parse_json(slurp(kCrps + "crps.json"), "crps.json");
  std::vector<double> lat;
  for (const Json& v : ref.get("lat")->items) lat.push_back(num(v));
  const std::vector<double> channel_weights = {1.0, 2.0, 0.5, 0.25, 3.0};  // U: [1, 2], T: [0.5, 0.25], SP: 3
  const Json& cases = *ref.get("cases");
  ASSERT_EQ(cases.items.size(), 7u);
  for (const Json& k : cases.items) {
    const std::string name = k.get("name")->s;
    SCOPED_TRACE(name);
    const bool weighted = k.get("weighted")->s == "true", validation = k.get("validation")->s == "true";
    std::string section = "training_loss: \"" + k.get("training_loss")->s + "\"";
    if (k.get("validation_loss")->type == Json::Str) section += "\n  validation_loss: \"" + k.get("validation_loss")->s + "\"";
    const Json& params = *k.get("parameters");
    if (!params.keys.empty()) {
      section += "\n  training_loss_parameters:";
      for (size_t i = 0; i < params.keys.size(); ++i) section += "\n    " + params.keys[i] + ": " + yaml_scalar(params.items[i]);
    }
    section += weighted ? "\n  use_latitude_weights: true\n  use_variable_weights: true"
                        : "\n  use_latitude_weights: false\n  use_variable_weights: false";
    const CreditConfig c = read_credit_config(ensemble_config("crps_golden", section));
    const LossSpec spec = validation ? credit_validation_spec(c) : c.training_loss;
    LossWeights w;
    if (weighted) {
      w.lat_weights = latitude_weights(lat);
      w.channel_weights = channel_weights;
    }
    const Tensor pred = read_npy(kCrps + k.get("pred")->s), target = read_npy(kCrps + k.get("target")->s);
    const int64_t m = pred.dim(0) / target.dim(0);
    Tensor g;
    const double got = is_crps_loss(spec.name)
                           ? ensemble_crps(pred, target, w, crps_loss(spec.name, spec.biased, spec.alpha), &g)
                           : weighted_loss(pred, repeat_members(target, m), w, loss_function(spec.name, spec.delta), &g);
    const double want = num(*k.get("value"));
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << spec.name;
    const Tensor ref_g = read_npy(kCrps + k.get("grad")->s);
    ASSERT_EQ(ref_g.shape, g.shape);
    EXPECT_LE(rel_l2(g, ref_g), 1e-5) << spec.name;
  }
}

// The gradient can fail: KCRPS's against central differences of its own value (double), and a
// wrong criterion (the biased estimator for the fair one) is caught by the golden values.
TEST(Crps, GradientMatchesFiniteDifferences) {
  const Tensor target = randn({2, 3, 1, 4, 5}, 3);
  Tensor pred = randn({6, 3, 1, 4, 5}, 4);
  LossWeights w;
  w.lat_weights = latitude_weights({60, 20, -20, -60});
  w.channel_weights = {1.0, 0.5, 2.0};
  for (const CrpsLoss f : {crps_loss("KCRPS"), crps_loss("KCRPS", true), crps_loss("almost-fair-crps", false, 0.9)}) {
    Tensor g;
    ensemble_crps(pred, target, w, f, &g, 2.0);
    for (int64_t e : {0, 7, 33, 71, 119}) {
      const float x0 = pred.data<float>()[e];
      const double h = 1e-3;
      pred.data<float>()[e] = (float)(x0 + h);
      const double lp = ensemble_crps(pred, target, w, f);
      pred.data<float>()[e] = (float)(x0 - h);
      const double lm = ensemble_crps(pred, target, w, f);
      pred.data<float>()[e] = x0;
      EXPECT_NEAR(g.data<float>()[e], 2.0 * (lp - lm) / (2 * h), 1e-6) << crps_name(f.kind) << " element " << e;
    }
  }
  const Json ref = parse_json(slurp(kCrps + "crps.json"), "crps.json");
  const Tensor p = read_npy(kCrps + "pred.npy"), t = read_npy(kCrps + "target.npy");
  const double fair = num(*ref.get("cases")->items[0].get("value"));
  EXPECT_GT(std::fabs(ensemble_crps(p, t, {}, crps_loss("KCRPS", true)) - fair), 1e-3);
}

// ring-crps on one rank is |x - y| (CREDIT: K == 1 reduces to elementwise MAE); its K-rank values
// against CREDIT are tests/mpi/ring_crps_test.cpp's.
TEST(Crps, RingOnOneRankIsMae) {
  const Tensor p = randn({1, 2, 1, 3, 4}, 5), t = randn({1, 2, 1, 3, 4}, 6);
  Tensor g1, g2;
  EXPECT_DOUBLE_EQ(ring_crps(p, t, {}, nullptr, &g1), weighted_loss(p, t, {}, loss_function("mae"), &g2));
  EXPECT_EQ(max_abs_diff(g1, g2), 0);
}

// CREDIT's rules for the ensemble losses, one line each naming the key.
TEST(Crps, ConfigRules) {
  const CreditConfig c = read_credit_config(ensemble_config("crps_ok", "training_loss: \"KCRPS\"\n  "
                                                            "training_loss_parameters: {biased: true}", 2));
  EXPECT_EQ(c.ensemble_size, 2);
  EXPECT_EQ(c.training_loss.name, "KCRPS");
  EXPECT_TRUE(c.training_loss.biased);
  EXPECT_EQ(read_credit_config(ensemble_config("crps_af", "training_loss: \"almost-fair-crps\"\n  "
                                               "training_loss_parameters: {alpha: 0.95}"))
                .training_loss.alpha,
            0.95);
  struct Bad {
    std::string section;
    int ensemble;
    std::string error;
  };
  const std::vector<Bad> bad = {
      {"training_loss: \"KCRPS\"", 1, "loss.training_loss: 'KCRPS' is an ensemble CRPS loss and requires trainer.ensemble_size > 1"},
      {"training_loss: \"ring-crps\"\n  use_latitude_weights: true", 2, "ring-crps cannot be combined with use_latitude_weights"},
      {"training_loss: \"mse\"\n  training_loss_parameters: {biased: true}", 2, "only KCRPS takes biased"},
      {"training_loss: \"KCRPS\"\n  training_loss_parameters: {alpha: 0.5}", 2, "only almost-fair-crps takes alpha"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.section);
    const std::string e = error_of([&] { read_credit_config(ensemble_config("crps_bad", b.section, b.ensemble)); });
    EXPECT_NE(e.find(b.error), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // ensembles roll out one step only
  std::string e = error_of([&] {
    read_credit_config(era5_tiny_config("crps_rollout", {{"use_ema: false", "use_ema: false\n  ensemble_size: 2"},
                                                         {"forecast_len: 1", "forecast_len: 2"}}));
  });
  EXPECT_NE(e.find("trainer.ensemble_size: 2 with data.forecast_len 2: ensemble rollouts are not implemented"),
            std::string::npos)
      << e;
}

// RandomNormal / RandomNormalLike: the asked distribution; the numbers a function of the node's
// stream (and seed) alone: the same stream gives the same numbers, another stream or node others.
TEST(RandomOps, StreamsAreReproducibleAndDistinct) {
  register_cpu_kernels();
  Node rn = make_node("RandomNormal", 0, 1, {{"shape", attr_ints({300, 700})}, {"mean", attr_f(-1.f)}, {"scale", attr_f(2.f)}});
  rn.name = "noise";
  Tensor a = run_node(rn, {})[0];
  ASSERT_EQ(a.shape, (Shape{300, 700}));
  double sum = 0, sq = 0;
  for (int64_t e = 0; e < a.numel(); ++e) {
    sum += a.data<float>()[e];
    sq += (double)a.data<float>()[e] * a.data<float>()[e];
  }
  const double mean = sum / a.numel(), sd = std::sqrt(sq / a.numel() - mean * mean);
  EXPECT_NEAR(mean, -1.0, 0.015);  // 4 standard errors (2 / sqrt(210k) = 0.0044)
  EXPECT_NEAR(sd, 2.0, 0.015);
  EXPECT_EQ(max_abs_diff(a, run_node(rn, {})[0]), 0);
  Node other = rn;
  other.name = "noise2";
  EXPECT_GT(max_abs_diff(a, run_node(other, {})[0]), 1);
  rn.attrs["stream"] = attr_i(7);
  Tensor s7 = run_node(rn, {})[0];
  other.attrs["stream"] = attr_i(7);  // the stream, not the name, once set
  EXPECT_EQ(max_abs_diff(s7, run_node(other, {})[0]), 0);
  rn.attrs["stream"] = attr_i(8);
  EXPECT_GT(max_abs_diff(s7, run_node(rn, {})[0]), 1);
  Tensor x(DType::F32, {300, 700});
  Node like = make_node("RandomNormalLike", 1, 1, {{"mean", attr_f(-1.f)}, {"scale", attr_f(2.f)}, {"stream", attr_i(7)}});
  EXPECT_EQ(max_abs_diff(s7, run_node(like, {&x})[0]), 0);  // RandomNormal's numbers for the same key
}

// A random node is not folded into a constant (RandomNormal has no input at all) and no gradient
// flows through it: a graph y = p * RandomNormalLike(p) + RandomNormal trains p by the noise only.
TEST(RandomOps, NotFoldedAndNoGradientThrough) {
  register_cpu_kernels();
  Graph g;
  auto val = [&](const std::string& n) {
    Value v;
    v.name = n;
    return g.add_value(v);
  };
  const int x = val("x"), p = val("p"), r = val("r"), q = val("q"), pr = val("pr"), y = val("y"), xy = val("xy");
  g.values[p].is_param = true;
  g.values[p].constant = std::make_shared<Tensor>(randn({2, 3}, 9));
  g.values[p].dtype = DType::F32;
  g.values[p].shape = {2, 3};
  g.values[p].shape_known = true;
  g.values[x].dtype = DType::F32;
  g.values[x].shape = {2, 3};
  g.inputs = {x};
  auto node = [&](const std::string& op, std::vector<int> in, int out, std::map<std::string, Attr> attrs = {}) {
    Node n;
    n.op = op;
    n.name = op + std::to_string(out);
    n.inputs = in;
    n.outputs = {out};
    n.attrs = attrs;
    g.nodes.push_back(n);
  };
  node("RandomNormalLike", {p}, r);
  node("RandomNormal", {}, q, {{"shape", attr_ints({2, 3})}});
  node("Mul", {p, r}, pr);
  node("Add", {pr, q}, y);
  node("Add", {y, x}, xy);
  g.outputs = {xy};
  prepare_training_graph(g, {{"x", {DType::F32, {2, 3}}}});
  int random = 0;
  for (const Node& n : g.nodes) random += op_is_random(n.op);
  EXPECT_EQ(random, 2);
  GradExecutor ex(g, trainable_parameters(g));
  const Tensor xin = randn({2, 3}, 10);
  std::vector<Tensor> outs = ex.forward({{"x", xin}});
  Tensor ones = Tensor::zeros(DType::F32, {2, 3});
  for (int64_t e = 0; e < 6; ++e) ones.data<float>()[e] = 1.f;
  ex.backward({ones});
  // d sum(y) / d p = the noise r (drawn from p's shape, not its values)
  Node rn = make_node("RandomNormalLike", 1, 1, {});
  rn.name = "RandomNormalLike" + std::to_string(r);
  const Tensor noise = run_node(rn, {g.values[p].constant.get()})[0];
  EXPECT_EQ(max_abs_diff(ex.grads()[0], noise), 0);
}

// CREDIT's CrossFormerWithNoise as its TorchScript export writes it (12 RandomNormalLike): with
// every noise_factor 0 wxe's output is PyTorch's (the deterministic model); with the noise, two
// members of one input differ.
TEST(NoiseModel, ImportsAndMatchesPyTorchWithoutNoise) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path(kNoise));
  const Tensor x = read_npy(data_path("tests/data/crossformer_noise_tiny_x.npy"));
  simplify(g, {{"x", {x.dtype, repeat_members(x, 2).shape}}});
  int random = 0, factors = 0;
  for (const Node& n : g.nodes) random += n.op == "RandomNormalLike";
  EXPECT_EQ(random, 12);
  Tensor noisy = Executor(g, {0, KernelKind::Fast}).run({{"x", repeat_members(x, 2)}})[0];
  const int64_t half = noisy.numel() / 2;
  double spread = 0;
  for (int64_t e = 0; e < half; ++e) spread = std::max(spread, (double)std::fabs(noisy.data<float>()[e] - noisy.data<float>()[half + e]));
  EXPECT_GT(spread, 1e-3);
  for (Value& v : g.values)
    if (v.is_const() && v.name.size() > 13 && v.name.substr(v.name.size() - 13) == ".noise_factor") {
      std::memset(v.constant->raw(), 0, v.constant->nbytes());
      ++factors;
    }
  EXPECT_EQ(factors, 6);
  const Tensor y = Executor(g, {0, KernelKind::Fast}).run({{"x", repeat_members(x, 2)}})[0];
  const Tensor want = read_npy(data_path("tests/data/crossformer_noise_tiny_y_quiet.npy"));
  Tensor first(DType::F32, want.shape);
  std::memcpy(first.raw(), y.raw(), first.nbytes());
  EXPECT_LE(rel_l2(first, want), 1e-5);
}

namespace {

FinetuneConfig noise_config(const std::string& data, const std::string& save) {
  FinetuneConfig c = tiny_config(data, save);
  c.model = data_path(kNoise);
  c.accum = 2;
  c.ensemble_size = 2;
  c.use_crps = true;
  c.crps = crps_loss("KCRPS");
  c.shuffle = true;
  c.seed = 5;
  return c;
}

}  // namespace

// KCRPS over two members of the noise model: the loss changes, the noise layers (noise_transform,
// modulation) get gradients and move; noise_factor (requires_grad False in CREDIT) does not; the
// members differ. A deterministic model with ensemble_size 2 is a one-line error.
TEST(NoiseModel, TrainsWithKcrps) {
  const std::string data = make_series("noise_series", 3, {1, 7, 1, 32, 64}, {1, 6, 1, 32, 64}, 41);
  FinetuneConfig c = noise_config(data, "");
  Trainer t(c, open_npy_dir(data, 1));
  std::map<std::string, Tensor> before;
  for (auto& [n, v] : t.parameters()) before[n] = v.clone();
  const std::vector<double> losses = run_steps(t, 3);
  EXPECT_NE(losses[0], losses[2]);
  int noise_moved = 0, factors = 0;
  for (auto& [n, v] : t.parameters()) {
    const bool same = std::memcmp(before[n].raw(), v.raw(), v.nbytes()) == 0;
    if (n.find(".noise_factor") != std::string::npos) {
      EXPECT_TRUE(same) << n;
      ++factors;
    } else if (n.find("noise_transform") != std::string::npos || n.find("modulation") != std::string::npos) {
      EXPECT_FALSE(same) << n;
      ++noise_moved;
    }
  }
  EXPECT_EQ(factors, 6);
  EXPECT_GE(noise_moved, 12);  // 6 layers: noise_transform weight and bias, modulation
  const Tensor x = read_npy(data_path("tests/data/crossformer_noise_tiny_x.npy"));
  const Tensor y = t.predict(x);  // both members
  ASSERT_EQ(y.dim(0), 2);
  EXPECT_GT(max_abs_diff(ensemble_mean(y, 2), y) , 1e-4);

  FinetuneConfig d = tiny_config(data, "");
  d.ensemble_size = 2;
  d.use_crps = true;
  const std::string e = error_of([&] { Trainer bad(d, open_npy_dir(data, 1)); });
  EXPECT_NE(e.find("has no random nodes (RandomNormal, RandomNormalLike), so its members would be identical"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

// A run interrupted after 2 of 4 steps and resumed from its checkpoint equals the uninterrupted
// run bit for bit (losses and parameters): the noise streams derive from the step, not from a
// generator's state.
TEST(NoiseModel, ResumeIsBitExact) {
  const std::string data = make_series("noise_resume_series", 3, {1, 7, 1, 32, 64}, {1, 6, 1, 32, 64}, 43);
  FinetuneConfig c = noise_config(data, tmp_path("noise_resume_a"));
  Trainer whole(c, open_npy_dir(data, 1));
  const std::vector<double> ref = run_steps(whole, 4);
  FinetuneConfig c2 = c;
  c2.save = tmp_path("noise_resume_b");
  fs::remove_all(c2.save);
  {
    Trainer first(c2, open_npy_dir(data, 1));
    run_steps(first, 2);
    first.save_checkpoint();
  }
  c2.resume = true;
  Trainer second(c2, open_npy_dir(data, 1));
  ASSERT_EQ(second.steps_done(), 2);
  const std::vector<double> rest = run_steps(second, 2);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(rest[i], ref[2 + i]) << "step " << 3 + i;
  std::map<std::string, Tensor> a;
  for (auto& [n, v] : whole.parameters()) a[n] = v;
  for (auto& [n, v] : second.parameters()) {
    ASSERT_TRUE(a.count(n));
    EXPECT_EQ(std::memcmp(a[n].raw(), v.raw(), v.nbytes()), 0) << n;
  }
  // and the noise is in the numbers: another seed trains otherwise
  FinetuneConfig c3 = c;
  c3.save = "";
  c3.seed = 6;
  Trainer other(c3, open_npy_dir(data, 1));
  EXPECT_NE(run_steps(other, 1)[0], ref[0]);
}

// `wxe finetune CONFIG.yml` with KCRPS over two members of the noise model, on era5_tiny: the
// config's ensemble reaches the trainer, validation scores the members with KCRPS (with
// latitude weights CREDIT validates KCRPS with KCRPS) and the ensemble mean's RMSE and bias;
// two identical members (a predictor of 0) score what the deterministic config's L1 validation
// of the same predictor scores, the ensemble mean is that predictor. Then the run itself.
TEST(NoiseModel, FinetunesFromACreditConfig) {
  const std::string cfg = ensemble_config("kcrps_run", "training_loss: \"KCRPS\"\n  use_latitude_weights: true\n  "
                                          "use_variable_weights: false", 2);
  auto given = [](const std::string& f) { return f == "--save" || f == "--steps"; };
  FinetuneConfig fc;
  fc.model = data_path(kNoise);
  fc.save = tmp_path("kcrps_run_save");
  fc.steps = 2;
  fc.progress = false;
  finetune_from_config(cfg, fc, given, true);
  EXPECT_EQ(fc.ensemble_size, 2);
  EXPECT_TRUE(fc.use_crps);
  EXPECT_EQ(fc.crps.kind, CrpsKind::KCRPS);
  FinetuneConfig base;
  base.model = fc.model;
  base.save = tmp_path("kcrps_base_save");
  base.steps = 2;
  finetune_from_config(era5_tiny_config("kcrps_base"), base, given, true);
  int rows = 0;
  const std::vector<double> v = fc.validate([&](const Tensor& x) {
    rows = (int)x.dim(0);
    return Tensor::zeros(DType::F32, {2, 6, 1, 32, 64});
  });
  EXPECT_EQ(rows, 1);  // the trainer's predict repeats the sample into its members
  const std::vector<double> b = base.validate([](const Tensor&) { return Tensor::zeros(DType::F32, {1, 6, 1, 32, 64}); });
  ASSERT_EQ(v.size(), b.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], b[i], 1e-9 * std::fabs(b[i])) << fc.validate_columns[i];
  EXPECT_EQ(run_finetune(fc), 0);
  const std::string log = slurp(fc.save + "/training_log.csv");
  EXPECT_NE(log.find("valid_loss"), std::string::npos);
  EXPECT_EQ(log.find("nan"), std::string::npos);
  fs::remove_all(fc.save);
  fs::remove_all(base.save);
}
