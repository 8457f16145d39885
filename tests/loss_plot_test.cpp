#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"
#include "tools/loss_plot.h"

namespace wxe::test {
namespace {

uint32_t be32(const std::string& b, size_t at) {
  return (uint32_t)(uint8_t)b[at] << 24 | (uint32_t)(uint8_t)b[at + 1] << 16 | (uint32_t)(uint8_t)b[at + 2] << 8 |
         (uint8_t)b[at + 3];
}

TEST(LossPlot, WritesAPng) {
  std::vector<double> steps, loss, vs, vl;
  for (int i = 1; i <= 200; ++i) {
    steps.push_back(i);
    loss.push_back(2.0 * std::exp(-i / 30.0) + 0.01);  // spans > 20x: log axis
    if (i % 20 == 0) {
      vs.push_back(i);
      vl.push_back(loss.back() * 1.2);
    }
  }
  const std::string png = tmp_path("curve.png");
  plot_loss_curve(png, "test", steps, loss, vs, vl);
  std::string b = slurp(png);
  ASSERT_GT(b.size(), 24u);
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(b.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(b, 16), 900u);
  EXPECT_EQ(be32(b, 20), 560u);
  // a curve, axes and text compress to far more than a blank page of that size (~2 KB)
  EXPECT_GT(b.size(), 10000u);
  // a second call works (PLplot's global state is reset per plot)
  plot_loss_curve(png, "again", steps, loss);
  EXPECT_EQ(slurp(png).substr(1, 3), "PNG");
}

TEST(LossPlot, NothingFiniteIsAnError) {
  EXPECT_NE(error_of([] { plot_loss_curve(tmp_path("nan.png"), "t", {1, 2}, {NAN, INFINITY}); }).find("no finite loss"),
            std::string::npos);
}

}  // namespace
}  // namespace wxe::test
