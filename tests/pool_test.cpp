// AveragePool: the reference kernel against hand-computed values and against an oracle written
// here over an explicitly padded grid (PyTorch's avg_pool rule: the divisor with
// count_include_pad is the window clipped to the padded input), and its gradient cases for the
// finite-difference harness (tests/grad_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>

#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {
namespace {

using Attrs = std::map<std::string, Attr>;

Tensor pool(const Tensor& x, Attrs a) { return run_node(make_node("AveragePool", 1, 1, std::move(a)), {&x})[0]; }

// 2-D oracle, dilation 1: every output position's window over the padded grid
Tensor oracle2d(const Tensor& x, int64_t k, int64_t s, int64_t p, bool ceil_mode, bool include_pad) {
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  auto out_size = [&](int64_t n) {
    int64_t o = ceil_mode ? (n + 2 * p - k + s - 1) / s + 1 : (n + 2 * p - k) / s + 1;
    if (ceil_mode && (o - 1) * s >= n + p) --o;
    return o;
  };
  const int64_t OH = out_size(H), OW = out_size(W);
  Tensor y(DType::F32, {N, C, OH, OW});
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t h0 = oh * s - p, w0 = ow * s - p;
        const int64_t h1 = std::min(h0 + k, H + p), w1 = std::min(w0 + k, W + p);
        double sum = 0;
        int64_t valid = 0;
        for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h1, H); ++h)
          for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w1, W); ++w, ++valid)
            sum += x.data<float>()[(nc * H + h) * W + w];
        const int64_t div = include_pad ? (h1 - h0) * (w1 - w0) : valid;
        y.data<float>()[(nc * OH + oh) * OW + ow] = (float)(sum / div);
      }
  return y;
}

TEST(AveragePool, HandComputed1D) {
  Tensor x = Tensor::from_f32({1, 1, 5}, {1, 2, 3, 4, 5});
  // k 2 s 2: (1+2)/2, (3+4)/2; pads 1 1 with and without counting the pad
  expect_close(pool(x, {{"kernel_shape", attr_ints({2})}, {"strides", attr_ints({2})}}),
               Tensor::from_f32({1, 1, 2}, {1.5f, 3.5f}), 0);
  expect_close(pool(x, {{"kernel_shape", attr_ints({2})}, {"strides", attr_ints({2})}, {"pads", attr_ints({1, 1})}}),
               Tensor::from_f32({1, 1, 3}, {1.f, 2.5f, 4.5f}), 1e-7);
  expect_close(pool(x, {{"kernel_shape", attr_ints({2})}, {"strides", attr_ints({2})}, {"pads", attr_ints({1, 1})},
                        {"count_include_pad", attr_i(1)}}),
               Tensor::from_f32({1, 1, 3}, {0.5f, 2.5f, 4.5f}), 1e-7);
  // dilation 2, k 2: (1+3), (2+4), (3+5)
  expect_close(pool(x, {{"kernel_shape", attr_ints({2})}, {"dilations", attr_ints({2})}}),
               Tensor::from_f32({1, 1, 3}, {2.f, 3.f, 4.f}), 1e-7);
}

TEST(AveragePool, MatchesPaddedGridOracle2D) {
  struct Cfg {
    int64_t H, W, k, s, p;
    bool ceil_mode, include_pad;
  };
  for (Cfg c : {Cfg{8, 8, 2, 2, 0, false, false}, Cfg{6, 7, 3, 2, 1, false, true}, Cfg{6, 7, 3, 2, 1, true, true},
                Cfg{6, 7, 3, 2, 1, true, false}, Cfg{9, 5, 4, 3, 1, true, true}, Cfg{5, 5, 1, 2, 0, true, false}}) {
    SCOPED_TRACE(testing::Message() << c.H << "x" << c.W << " k" << c.k << " s" << c.s << " p" << c.p << " ceil "
                                    << c.ceil_mode << " include_pad " << c.include_pad);
    Tensor x = randn({2, 3, c.H, c.W}, 11);
    Tensor y = pool(x, {{"kernel_shape", attr_ints({c.k, c.k})},
                        {"strides", attr_ints({c.s, c.s})},
                        {"pads", attr_ints({c.p, c.p, c.p, c.p})},
                        {"ceil_mode", attr_i(c.ceil_mode)},
                        {"count_include_pad", attr_i(c.include_pad)}});
    expect_close(y, oracle2d(x, c.k, c.s, c.p, c.ceil_mode, c.include_pad), 1e-6);
  }
}

TEST(AveragePool, BadAttributesNameTheNode) {
  Tensor x = randn({1, 2, 4, 4}, 3);
  EXPECT_NE(error_of([&] { pool(x, {{"kernel_shape", attr_ints({2})}}); }).find("test_AveragePool"), std::string::npos);
  EXPECT_NE(error_of([&] { pool(x, {{"kernel_shape", attr_ints({5, 5})}}); }).find("larger than the padded input"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pool(x, {{"kernel_shape", attr_ints({2, 2})}, {"pads", attr_ints({2, 0, 0, 0})}}); })
                .find("pads must be smaller"),
            std::string::npos);
}

// MaxPool 2-D oracle, dilation 1: the largest tap of each window over the unpadded input
Tensor max_oracle2d(const Tensor& x, int64_t k, int64_t s, int64_t p) {
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
  Tensor y(DType::F32, {N, C, OH, OW});
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        float m = -1e30f;
        for (int64_t h = std::max<int64_t>(oh * s - p, 0); h < std::min(oh * s - p + k, H); ++h)
          for (int64_t w = std::max<int64_t>(ow * s - p, 0); w < std::min(ow * s - p + k, W); ++w)
            m = std::max(m, x.data<float>()[(nc * H + h) * W + w]);
        y.data<float>()[(nc * OH + oh) * OW + ow] = m;
      }
  return y;
}

TEST(MaxPool, HandComputedAndPaddedOracle) {
  Tensor x = Tensor::from_f32({1, 1, 5}, {1, 5, 3, 2, 4});
  expect_close(run_node(make_node("MaxPool", 1, 1, {{"kernel_shape", attr_ints({2})}, {"strides", attr_ints({2})}}),
                        {&x})[0],
               Tensor::from_f32({1, 1, 2}, {5, 3}), 0);
  Tensor x2 = randn({2, 3, 7, 9}, 31);
  for (auto [k, s, p] : {std::array<int64_t, 3>{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}) {
    Tensor y = run_node(make_node("MaxPool", 1, 1,
                                  {{"kernel_shape", attr_ints({k, k})},
                                   {"strides", attr_ints({s, s})},
                                   {"pads", attr_ints({p, p, p, p})}}),
                        {&x2})[0];
    expect_close(y, max_oracle2d(x2, k, s, p), 0);
  }
}

TEST(GlobalAveragePool, MeanOverSpatialAxes) {
  Tensor x = randn({2, 3, 4, 5}, 32);
  Tensor y = run_node(make_node("GlobalAveragePool", 1, 1), {&x})[0];
  ASSERT_EQ(y.shape, (Shape{2, 3, 1, 1}));
  for (int64_t p = 0; p < 6; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < 20; ++i) sum += x.data<float>()[p * 20 + i];
    EXPECT_NEAR(y.data<float>()[p], sum / 20, 1e-6);
  }
}

// Values 0.1 apart in a shuffled order: no two taps of a window within the finite-difference
// step (h = 0.01) of each other, so moving one by +-h never changes which tap is the largest.
// (randn values can be closer than h: the difference then averages two taps and disagrees
// with the exact gradient, though the gradient is right.)
Tensor spaced(Shape s, unsigned seed) {
  Tensor t(DType::F32, s);
  std::vector<float> v((size_t)t.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * (float)i - 0.05f * (float)v.size();
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

}  // namespace

GRAD_CASES("MaxPool") {
  return {
      grad_case("MaxPool 2x2 stride 2", "MaxPool", {spaced({1, 2, 4, 6}, 33)},
                {{"kernel_shape", attr_ints({2, 2})}, {"strides", attr_ints({2, 2})}}),
      grad_case("MaxPool 3x3 s2 p1 (overlapping windows)", "MaxPool", {spaced({1, 2, 5, 5}, 34)},
                {{"kernel_shape", attr_ints({3, 3})}, {"strides", attr_ints({2, 2})}, {"pads", attr_ints({1, 1, 1, 1})}}),
  };
}

GRAD_CASES("GlobalAveragePool") {
  return {grad_case("GlobalAveragePool 2-D", "GlobalAveragePool", {randn({2, 3, 4, 5}, 35)}, {})};
}

GRAD_CASES("AveragePool") {
  return {
      grad_case("AveragePool 2x2 stride 2", "AveragePool", {randn({1, 2, 4, 6}, 21)},
                {{"kernel_shape", attr_ints({2, 2})}, {"strides", attr_ints({2, 2})}}),
      grad_case("AveragePool 3x3 s2 p1 ceil count_include_pad", "AveragePool", {randn({2, 2, 6, 7}, 22)},
                {{"kernel_shape", attr_ints({3, 3})},
                 {"strides", attr_ints({2, 2})},
                 {"pads", attr_ints({1, 1, 1, 1})},
                 {"ceil_mode", attr_i(1)},
                 {"count_include_pad", attr_i(1)}}),
      grad_case("AveragePool 1-D dilation 2 pad", "AveragePool", {randn({1, 3, 9}, 23)},
                {{"kernel_shape", attr_ints({3})}, {"dilations", attr_ints({2})}, {"pads", attr_ints({1, 2})}}),
      grad_case("AveragePool 3-D", "AveragePool", {randn({1, 1, 3, 4, 4}, 24)},
                {{"kernel_shape", attr_ints({1, 2, 2})}, {"strides", attr_ints({1, 2, 2})}}),
  };
}

}  // namespace wxe::test
