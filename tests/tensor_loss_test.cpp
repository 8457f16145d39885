// CREDIT's whole-tensor losses (train/spectral_loss.h) against CREDIT's own modules on the same
// tensors (tests/data/credit_registry/tensor_losses from models/make_tensor_loss_fixture.py):
// SpectralLoss2D, PSDLoss, CovarianceWeightedMSELoss, and VariableTotalLoss2D with its spectral
// and power terms; value and d loss / d pred.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"
#include "train/loss.h"
#include "train/from_config.h"
#include "train/spectral_loss.h"

namespace wxe {
namespace {
using namespace test;

const std::string kDir = data_path("tests/data/credit_registry/tensor_losses/");
const std::vector<double> kLat = {75.0, 45.0, 15.0, -15.0, -45.0, -75.0};

double num(const Json& j) { return parse_double(j.s, "json"); }

// relative L2 distance of two gradients
double rel_l2(const Tensor& a, const Tensor& b) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d += std::pow((double)a.data<float>()[i] - b.data<float>()[i], 2);
    r += std::pow((double)b.data<float>()[i], 2);
  }
  return std::sqrt(d / r);
}

TEST(TensorLoss, SpectralPowerCovmseMatchCredit) {
  const Json cases = parse_json(slurp(kDir + "cases.json"), "cases.json");
  const Tensor pred = read_npy(kDir + "pred.npy"), target = read_npy(kDir + "target.npy");
  const std::vector<double> lat = latitude_weights(kLat);
  struct Case {
    const char* name;
    TensorLoss f;
    bool lat;
  };
  auto loss = [](TensorLossKind k, int64_t w0 = 20, bool norm = false, double off = 1.0) {
    TensorLoss f;
    f.kind = k;
    f.wavenum_init = w0;
    f.batch_normalize = norm;
    f.off_diagonal_scale = off;
    return f;
  };
  for (const Case& c : {Case{"spectral", loss(TensorLossKind::Spectral, 5), false},
                        Case{"spectral_lat", loss(TensorLossKind::Spectral, 3), true},
                        Case{"power", loss(TensorLossKind::Power, 5), false},
                        Case{"power_lat", loss(TensorLossKind::Power, 0), true},
                        Case{"covmse", loss(TensorLossKind::CovMSE), false},
                        Case{"covmse_norm", loss(TensorLossKind::CovMSE, 20, true, 0.5), false}}) {
    const Json& ref = *cases.get(c.name);
    Tensor g;
    const double got = tensor_loss(c.f, pred, target, c.lat ? lat : std::vector<double>{}, &g, 1.0);
    const double want = num(*ref.get("value"));
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << c.name;
    EXPECT_LE(rel_l2(g, read_npy(kDir + ref.get("grad")->s)), 1e-4) << c.name;
    EXPECT_EQ(tensor_loss(c.f, pred, target, c.lat ? lat : std::vector<double>{}), got) << c.name;
  }
}

// VariableTotalLoss2D with use_spectral_loss and use_power_loss: the weighted elementwise loss
// plus spectral_lambda_reg times each term, both latitude-weighted (CREDIT's power term also takes
// spectral_lambda_reg)
TEST(TensorLoss, VariableTotalLoss2DWithSpectralAndPowerTerms) {
  const Json cases = parse_json(slurp(kDir + "cases.json"), "cases.json");
  const Tensor pred = read_npy(kDir + "pred.npy"), target = read_npy(kDir + "target.npy");
  LossWeights w;
  w.lat_weights = latitude_weights(kLat);
  w.channel_weights = {1.0, 2.0, 0.5};
  Tensor g;
  double got = weighted_loss(pred, target, w, loss_function("mse"), &g, 1.0);
  TensorLoss f;
  f.wavenum_init = 5;
  f.kind = TensorLossKind::Power;
  got += 0.1 * tensor_loss(f, pred, target, w.lat_weights, &g, 0.1);
  f.kind = TensorLossKind::Spectral;
  got += 0.1 * tensor_loss(f, pred, target, w.lat_weights, &g, 0.1);
  const Json& ref = *cases.get("vtl2d");
  EXPECT_NEAR(got, num(*ref.get("value")), 1e-5 * num(*ref.get("value")));
  EXPECT_LE(rel_l2(g, read_npy(kDir + ref.get("grad")->s)), 1e-5);
}

// A wavenumber_init that leaves no wavenumber (CREDIT: the mean of nothing, NaN) is an error.
TEST(TensorLoss, NoWavenumberLeftIsAnError) {
  const Tensor pred = read_npy(kDir + "pred.npy"), target = read_npy(kDir + "target.npy");
  TensorLoss f;
  f.wavenum_init = 21;  // W = 40: 21 wavenumbers
  const std::string e = error_of([&] { tensor_loss(f, pred, target, {}); });
  EXPECT_NE(e.find("wavenumber_init 21 leaves none of the 21 wavenumbers"), std::string::npos) << e;
}

// finetune CONFIG: use_spectral_loss / use_power_loss become the trainer's extra terms
// (lambda times each, latitude-weighted by the data's latitudes), an unweighted covmse its whole loss.
TEST(TensorLoss, ConfigSetsTheTrainersTerms) {
  auto none = [](const std::string&) { return false; };
  FinetuneConfig fc;
  finetune_from_config(era5_tiny_config("spectral_terms", {{"training_loss: \"mse\"",
      "training_loss: mse\n  use_spectral_loss: true\n  use_power_loss: true\n  spectral_lambda_reg: 0.5\n"
      "  spectral_wavenum_init: 2"}}), fc, none, false);
  ASSERT_TRUE((bool)fc.extra_loss);
  EXPECT_FALSE((bool)fc.whole_loss);
  Tensor p(DType::F32, {1, 6, 1, 32, 64}), t(DType::F32, {1, 6, 1, 32, 64});
  for (int64_t i = 0; i < p.numel(); ++i) {
    p.data<float>()[i] = (float)std::sin(0.37 * (double)i);
    t.data<float>()[i] = (float)std::cos(0.11 * (double)i);
  }
  const std::vector<double> lat = latitude_weights(regular_latitudes(32));
  TensorLoss s, pw;
  s.wavenum_init = pw.wavenum_init = 2;
  pw.kind = TensorLossKind::Power;
  const double want = 0.5 * tensor_loss(s, p, t, lat) + 0.5 * tensor_loss(pw, p, t, lat);
  EXPECT_NEAR(fc.extra_loss(p, t, nullptr, 1.0), want, 1e-12 * want);
  FinetuneConfig fw;
  finetune_from_config(era5_tiny_config("covmse_whole", {{"training_loss: \"mse\"", "training_loss: covmse"},
                                                         {"use_latitude_weights: true", "use_latitude_weights: false"}}),
                       fw, none, false);
  ASSERT_TRUE((bool)fw.whole_loss);
  TensorLoss cv;
  cv.kind = TensorLossKind::CovMSE;
  EXPECT_EQ(fw.whole_loss(p, t, nullptr, 1.0), tensor_loss(cv, p, t, {}));
}

}  // namespace
}  // namespace wxe
