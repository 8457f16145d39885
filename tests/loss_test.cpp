// engine/loss: the latitude/channel-weighted MSE against a direct computation, its gradient
// against central finite differences of the loss itself, latitude weights.
#include "train/loss.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace wxe {
namespace {

using namespace wxe::test;

// (B, C, T, H, W) indexing written out: an oracle independent of the row decomposition.
double direct_loss(const Tensor& p, const Tensor& t, const std::vector<double>& wl, const std::vector<double>& wc) {
  const int64_t B = p.dim(0), C = p.dim(1), T = p.rank() == 5 ? p.dim(2) : 1, H = p.dim(-2), W = p.dim(-1);
  double s = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < T; ++k)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w) {
            int64_t i = (((b * C + c) * T + k) * H + h) * W + w;
            double d = (double)p.data<float>()[i] - t.data<float>()[i];
            s += d * d * (wl.empty() ? 1 : wl[h]) * (wc.empty() ? 1 : wc[c]);
          }
  return s / (double)p.numel();
}

LossWeights example_weights() {
  LossWeights w;
  w.lat_weights = latitude_weights({60, 20, -20, -60});
  w.channel_weights = {0.5, 1.0, 2.0};
  return w;
}

TEST(Loss, WeightedMseValueMatchesDirectComputation) {
  LossWeights w = example_weights();
  for (Shape s : {Shape{2, 3, 2, 4, 5}, Shape{2, 3, 4, 5}}) {
    Tensor p = randn(s, 1), t = randn(s, 2);
    EXPECT_NEAR(weighted_mse(p, t, w), direct_loss(p, t, w.lat_weights, w.channel_weights), 1e-12) << shape_str(s);
    LossWeights lat_only{w.lat_weights, {}}, chan_only{{}, w.channel_weights};
    EXPECT_NEAR(weighted_mse(p, t, lat_only), direct_loss(p, t, w.lat_weights, {}), 1e-12);
    EXPECT_NEAR(weighted_mse(p, t, chan_only), direct_loss(p, t, {}, w.channel_weights), 1e-12);
  }
}

TEST(Loss, PlainMseOnAnyShape) {
  Tensor p = Tensor::from_f32({3}, {1.f, 2.f, 3.f}), t = Tensor::from_f32({3}, {1.f, 0.f, 6.f});
  EXPECT_DOUBLE_EQ(weighted_mse(p, t, {}), (0.0 + 4.0 + 9.0) / 3);
  // Larger than one reduction block: blocks summed in order equal one running double sum.
  Tensor a = randn({1, 2, 1, 200, 300}, 3), b = randn({1, 2, 1, 200, 300}, 4);
  EXPECT_NEAR(weighted_mse(a, b, {}), direct_loss(a, b, {}, {}), 1e-12);
}

TEST(Loss, GradientMatchesFiniteDifferences) {
  LossWeights w = example_weights();
  const double scale = 0.5;  // like 1 / accumulation steps
  Tensor p = randn({2, 3, 2, 4, 5}, 5), t = randn({2, 3, 2, 4, 5}, 6);
  Tensor g;
  const double loss = weighted_mse(p, t, w, &g, scale);
  ASSERT_EQ(shape_str(g.shape), shape_str(p.shape));
  EXPECT_NEAR(loss, direct_loss(p, t, w.lat_weights, w.channel_weights), 1e-12);  // grad_scale leaves the value
  double worst = 0;
  for (int64_t i = 0; i < p.numel(); ++i) {
    float& x = p.data<float>()[i];
    const float x0 = x;
    // The loss is quadratic in each element: central differences are exact up to rounding;
    // use the steps float32 actually took.
    x = x0 + 0.01f;
    const double up = weighted_mse(p, t, w), hu = (double)x - x0;
    x = x0 - 0.01f;
    const double down = weighted_mse(p, t, w), hd = (double)x0 - x;
    x = x0;
    const double fd = scale * (up - down) / (hu + hd);
    worst = std::max(worst, std::fabs(fd - g.data<float>()[i]) / (1e-3 + std::fabs(fd)));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(Loss, GradientOverwritesAndReallocates) {
  Tensor p = randn({1, 3, 4, 5}, 7), t = randn({1, 3, 4, 5}, 8);
  Tensor g(DType::F32, {1, 3, 4, 5});
  for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = 1e9f;  // garbage must be overwritten
  weighted_mse(p, t, example_weights(), &g);
  Tensor h(DType::F32, {7});  // wrong shape: replaced
  weighted_mse(p, t, example_weights(), &h);
  expect_close(h, g, 0, 0);
  for (int64_t i = 0; i < g.numel(); ++i) ASSERT_LT(std::fabs(g.data<float>()[i]), 1.f);
}

TEST(Loss, ErrorsNameTensorsAndShapes) {
  Tensor p = randn({1, 3, 4, 5}, 1), t = randn({1, 3, 4, 6}, 2);
  EXPECT_NE(error_of([&] { weighted_mse(p, t, {}); }).find("pred (1, 3, 4, 5) and target (1, 3, 4, 6)"),
            std::string::npos);
  LossWeights bad_lat{{1, 1, 1}, {}};
  EXPECT_NE(error_of([&] { weighted_mse(p, p, bad_lat); }).find("3 latitude weights for pred (1, 3, 4, 5) with H = 4"),
            std::string::npos);
  LossWeights bad_chan{{}, {1, 1}};
  EXPECT_NE(error_of([&] { weighted_mse(p, p, bad_chan); }).find("2 channel weights for pred (1, 3, 4, 5) with C = 3"),
            std::string::npos);
  Tensor flat = randn({4, 5}, 3);
  EXPECT_NE(error_of([&] { weighted_mse(flat, flat, LossWeights{{1, 1, 1, 1}, {}}); }).find("(B, C, [T,] H, W)"),
            std::string::npos);
}

TEST(Loss, LatitudeWeightsHaveMeanOneAndFollowCosine) {
  std::vector<double> lat = regular_latitudes(7);
  std::vector<double> w = latitude_weights(lat);
  double mean = 0;
  for (double x : w) mean += x / (double)w.size();
  EXPECT_NEAR(mean, 1.0, 1e-14);
  EXPECT_NEAR(w[0], 0.0, 1e-15);                                           // the pole
  EXPECT_NEAR(w[1] / w[3], std::cos(60 * M_PI / 180), 1e-14);              // 60 degrees vs the equator
  EXPECT_NEAR(w[1], w[5], 1e-15);                                          // symmetric
  EXPECT_NE(error_of([] { latitude_weights({95}); }).find("outside [-90, 90]"), std::string::npos);
}

TEST(Loss, RegularLatitudesIncludeBothPoles) {
  std::vector<double> lat = regular_latitudes(721);  // ERA5 0.25 degrees
  ASSERT_EQ(lat.size(), 721u);
  EXPECT_EQ(lat.front(), 90.0);
  EXPECT_EQ(lat.back(), -90.0);
  EXPECT_NEAR(lat[360], 0.0, 1e-12);
  EXPECT_NEAR(lat[1], 89.75, 1e-12);
  EXPECT_NE(error_of([] { regular_latitudes(1); }).find("at least 2"), std::string::npos);
}

}  // namespace
}  // namespace wxe
