// Reference kernels of the normalizations and reductions against explicit formulas.
#include <cmath>

#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

Tensor f32(Shape s, std::vector<float> v) { return Tensor::from_f32(std::move(s), v); }
Tensor i64(std::vector<int64_t> v) { return Tensor::from_i64(v); }
Tensor run1(const Node& n, const std::vector<const Tensor*>& in) { return run_node(n, in)[0]; }

// ------------------------------------------------------------------ Softmax

TEST(NormSoftmax, HandValuesAndStability) {
  Tensor x = f32({3, 3}, {1, 2, 3, 1, 1, 1, 1000, 1001, -1e30f});
  Tensor y = run1(make_node("Softmax", 1), {&x});
  expect_close(y, f32({3, 3}, {0.09003057f, 0.24472847f, 0.66524096f,  //
                               1.f / 3, 1.f / 3, 1.f / 3,              //
                               0.26894142f, 0.73105858f, 0.f}),
               1e-6);
}

TEST(NormSoftmax, RowsSumToOneAndAxisZero) {
  Tensor x = randn({4, 5, 6}, 1, 3.f);
  Tensor y = run1(make_node("Softmax", 1, 1, {{"axis", attr_i(1)}}), {&x});
  for (int a = 0; a < 4; ++a)
    for (int c = 0; c < 6; ++c) {
      double s = 0, m = -1e30;
      for (int b = 0; b < 5; ++b) m = std::max(m, (double)x.data<float>()[(a * 5 + b) * 6 + c]);
      for (int b = 0; b < 5; ++b) s += std::exp(x.data<float>()[(a * 5 + b) * 6 + c] - m);
      double sum = 0;
      for (int b = 0; b < 5; ++b) {
        float got = y.data<float>()[(a * 5 + b) * 6 + c];
        EXPECT_NEAR(got, std::exp(x.data<float>()[(a * 5 + b) * 6 + c] - m) / s, 1e-6);
        sum += got;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  EXPECT_THROW(run_node(make_node("Softmax", 1, 1, {{"axis", attr_i(3)}}), {&x}), Error);
}

// ------------------------------------------------------------------ LayerNormalization

TEST(NormLayerNorm, HandValue) {
  Tensor x = f32({1, 4}, {1, 2, 3, 4});
  Tensor g = f32({4}, {1, 1, 1, 1}), b = f32({4}, {0, 0, 0, 0});
  Tensor y = run1(make_node("LayerNormalization", 3, 1, {{"epsilon", attr_f(0.f)}}), {&x, &g, &b});
  expect_close(y, f32({1, 4}, {-1.34164079f, -0.4472136f, 0.4472136f, 1.34164079f}));
}

void layernorm_ref(const Tensor& x, const Tensor& g, const Tensor* b, int64_t D, float eps,
                   Tensor& y, Tensor& mean, Tensor& inv) {
  const int64_t rows = x.numel() / D;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t k = 0; k < D; ++k) m += x.data<float>()[r * D + k];
    m /= D;
    for (int64_t k = 0; k < D; ++k) v += std::pow(x.data<float>()[r * D + k] - m, 2);
    v /= D;
    for (int64_t k = 0; k < D; ++k)
      y.data<float>()[r * D + k] = (float)((x.data<float>()[r * D + k] - m) / std::sqrt(v + eps) *
                                               g.data<float>()[k] +
                                           (b ? b->data<float>()[k] : 0.f));
    mean.data<float>()[r] = (float)m;
    inv.data<float>()[r] = (float)(1 / std::sqrt(v + eps));
  }
}

TEST(NormLayerNorm, LastAxisWithStatsOutputs) {
  Tensor x = randn({2, 3, 8}, 2, 2.f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 5.f;  // non-zero mean
  Tensor g = randn({8}, 3), b = randn({8}, 4);
  auto out = run_node(make_node("LayerNormalization", 3, 3, {{"epsilon", attr_f(1e-5f)}}),
                      {&x, &g, &b});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(shape_str(out[1].shape), "(2, 3, 1)");
  EXPECT_EQ(shape_str(out[2].shape), "(2, 3, 1)");
  Tensor y(DType::F32, x.shape), m(DType::F32, {2, 3, 1}), inv(DType::F32, {2, 3, 1});
  layernorm_ref(x, g, &b, 8, 1e-5f, y, m, inv);
  expect_close(out[0], y, 1e-5, 1e-5);
  expect_close(out[1], m, 1e-5, 1e-5);
  expect_close(out[2], inv, 1e-5, 1e-5);
}

TEST(NormLayerNorm, AxisOneNoBias) {
  Tensor x = randn({2, 3, 4}, 5);
  Tensor g = randn({3, 4}, 6);
  Tensor y = run1(make_node("LayerNormalization", 2, 1, {{"axis", attr_i(1)}}), {&x, &g});
  Tensor want(DType::F32, x.shape), m(DType::F32, {2}), inv(DType::F32, {2});
  layernorm_ref(x, g, nullptr, 12, 1e-5f, want, m, inv);
  expect_close(y, want, 1e-5, 1e-5);
}

TEST(NormLayerNorm, RejectsBadInput) {
  Tensor x = randn({2, 8}, 1);
  Tensor g = randn({7}, 2);
  EXPECT_THROW(run_node(make_node("LayerNormalization", 2), {&x, &g}), Error);
  Tensor g8 = randn({8}, 2);
  EXPECT_THROW(run_node(make_node("LayerNormalization", 2, 1, {{"axis", attr_i(2)}}), {&x, &g8}),
               Error);
}

// ------------------------------------------------------------------ Instance / Group norm

// Normalizes over groups of channels: y = (x - mean) / sqrt(var + eps) * g[c or grp] + b[.]
Tensor groupnorm_ref(const Tensor& x, int64_t G, const std::vector<float>& g,
                     const std::vector<float>& b, float eps) {
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel() / (N * C), cpg = C / G;
  Tensor y(DType::F32, x.shape);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t grp = 0; grp < G; ++grp) {
      double m = 0, v = 0;
      for (int64_t c = grp * cpg; c < (grp + 1) * cpg; ++c)
        for (int64_t s = 0; s < S; ++s) m += x.data<float>()[(n * C + c) * S + s];
      m /= cpg * S;
      for (int64_t c = grp * cpg; c < (grp + 1) * cpg; ++c)
        for (int64_t s = 0; s < S; ++s) v += std::pow(x.data<float>()[(n * C + c) * S + s] - m, 2);
      v /= cpg * S;
      for (int64_t c = grp * cpg; c < (grp + 1) * cpg; ++c) {
        const size_t pi = (int64_t)g.size() == C ? c : grp;
        for (int64_t s = 0; s < S; ++s) {
          const int64_t i = (n * C + c) * S + s;
          y.data<float>()[i] =
              (float)((x.data<float>()[i] - m) / std::sqrt(v + eps) * g[pi] + b[pi]);
        }
      }
    }
  return y;
}

TEST(NormInstanceNorm, HandValueAndFormula) {
  Tensor x = f32({1, 1, 4}, {1, 2, 3, 4});
  Tensor g = f32({1}, {2}), b = f32({1}, {1});
  expect_close(run1(make_node("InstanceNormalization", 3, 1, {{"epsilon", attr_f(0.f)}}),
                    {&x, &g, &b}),
               f32({1, 1, 4}, {1 - 2 * 1.34164079f, 1 - 2 * 0.4472136f, 1 + 2 * 0.4472136f,
                               1 + 2 * 1.34164079f}));
  Tensor x4 = randn({2, 3, 4, 5}, 11);
  std::vector<float> gv{0.5f, -1.f, 2.f}, bv{0.1f, 0.2f, -0.3f};
  Tensor g3 = f32({3}, gv), b3 = f32({3}, bv);
  expect_close(run1(make_node("InstanceNormalization", 3, 1, {{"epsilon", attr_f(1e-5f)}}),
                    {&x4, &g3, &b3}),
               groupnorm_ref(x4, 3, gv, bv, 1e-5f), 1e-5, 1e-5);
  Tensor g2 = f32({2}, {1, 1});
  EXPECT_THROW(run_node(make_node("InstanceNormalization", 3), {&x4, &g2, &b3}), Error);
}

TEST(NormGroupNorm, PerChannelAndPerGroupScale) {
  Tensor x = randn({2, 6, 4}, 12, 2.f);
  std::vector<float> gc{1, 2, 3, -1, 0.5f, 0.25f}, bc{0, 1, 2, 3, 4, 5};
  Tensor g6 = f32({6}, gc), b6 = f32({6}, bc);
  Node n = make_node("GroupNormalization", 3, 1, {{"num_groups", attr_i(3)}});
  expect_close(run1(n, {&x, &g6, &b6}), groupnorm_ref(x, 3, gc, bc, 1e-5f), 1e-5, 1e-5);
  std::vector<float> gg{2, -1, 0.5f}, bg{1, 0, -1};
  Tensor g3 = f32({3}, gg), b3 = f32({3}, bg);
  Tensor y = run1(n, {&x, &g3, &b3});
  expect_close(y, groupnorm_ref(x, 3, gg, bg, 1e-5f), 1e-5, 1e-5);
  // per-group scale equals per-channel scale repeated over each group's channels
  Tensor g3c = f32({6}, {2, 2, -1, -1, 0.5f, 0.5f}), b3c = f32({6}, {1, 1, 0, 0, -1, -1});
  expect_close(run1(n, {&x, &g3c, &b3c}), y, 1e-6, 1e-6);
  // groups of 2 channels differ from instance norm
  Tensor inst = run1(make_node("InstanceNormalization", 3), {&x, &g3c, &b3c});
  EXPECT_GT(max_abs_diff(inst, y), 1e-3);
}

TEST(NormGroupNorm, RejectsBadInput) {
  Tensor x = randn({1, 6, 4}, 1);
  Tensor g = f32({6}, {1, 1, 1, 1, 1, 1}), b = f32({6}, {0, 0, 0, 0, 0, 0});
  EXPECT_THROW(run_node(make_node("GroupNormalization", 3, 1, {{"num_groups", attr_i(4)}}),
                        {&x, &g, &b}),
               Error);
  Tensor g5 = f32({5}, {1, 1, 1, 1, 1});
  EXPECT_THROW(run_node(make_node("GroupNormalization", 3, 1, {{"num_groups", attr_i(3)}}),
                        {&x, &g5, &b}),
               Error);
  EXPECT_THROW(run_node(make_node("GroupNormalization", 3), {&x, &g, &b}), Error);
}

// ------------------------------------------------------------------ Reduce*

TEST(NormReduceMean, KeepdimsAndAxesAttrVsInput) {
  Tensor x = f32({2, 2}, {1, 2, 3, 5});
  Tensor k0 = run1(make_node("ReduceMean", 1, 1, {{"axes", attr_ints({0})}, {"keepdims", attr_i(0)}}),
                   {&x});
  expect_close(k0, f32({2}, {2, 3.5f}));
  Tensor k1 = run1(make_node("ReduceMean", 1, 1, {{"axes", attr_ints({1})}}), {&x});
  expect_close(k1, f32({2, 1}, {1.5f, 4}));
  Tensor axes = i64({-1});
  expect_close(run1(make_node("ReduceMean", 2), {&x, &axes}), k1);  // opset 18 input
  Tensor all = run1(make_node("ReduceMean", 1, 1, {{"keepdims", attr_i(0)}}), {&x});
  EXPECT_EQ(shape_str(all.shape), "()");
  EXPECT_FLOAT_EQ(all.data<float>()[0], 2.75f);
  Tensor empty = Tensor::from_i64({});
  Tensor noop = run1(make_node("ReduceMean", 2, 1, {{"noop_with_empty_axes", attr_i(1)}}),
                     {&x, &empty});
  expect_close(noop, x);
}

TEST(NormReduceMean, ChannelMeanLikeCreditLayerNorm) {
  // ReduceMean(axes=[1], keepdims=1) over (B, C, H, W)
  Tensor x = randn({2, 4, 3, 5}, 21);
  Tensor y = run1(make_node("ReduceMean", 1, 1, {{"axes", attr_ints({1})}, {"keepdims", attr_i(1)}}),
                  {&x});
  ASSERT_EQ(shape_str(y.shape), "(2, 1, 3, 5)");
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 15; ++s) {
      double m = 0;
      for (int c = 0; c < 4; ++c) m += x.data<float>()[(b * 4 + c) * 15 + s];
      EXPECT_NEAR(y.data<float>()[b * 15 + s], m / 4, 1e-6);
    }
}

TEST(NormReduce, SumMaxL2AndInt64) {
  Tensor x = f32({2, 2}, {1, 2, 3, 5});
  Tensor axes = i64({1});
  expect_close(run1(make_node("ReduceSum", 2), {&x, &axes}), f32({2, 1}, {3, 8}));
  expect_close(run1(make_node("ReduceMax", 1, 1, {{"axes", attr_ints({0})}}), {&x}),
               f32({1, 2}, {3, 5}));
  expect_close(run1(make_node("ReduceL2", 1, 1, {{"axes", attr_ints({1})}, {"keepdims", attr_i(0)}}),
                    {&x}),
               f32({2}, {2.23606798f, 5.83095189f}));
  Tensor xi = Tensor::from_i64({1, 7, 64, 96});
  Tensor p = run1(make_node("ReduceProd", 1, 1, {{"keepdims", attr_i(0)}}), {&xi});
  EXPECT_EQ(p.dtype, DType::I64);
  EXPECT_EQ(p.to_i64()[0], 7 * 64 * 96);
  Tensor s = run1(make_node("ReduceSum", 1), {&xi});  // no axes: all, keepdims 1
  EXPECT_EQ(shape_str(s.shape), "(1)");
  EXPECT_EQ(s.to_i64()[0], 168);
}

TEST(NormReduce, AdjacentAndSplitAxesMatchLoops) {
  // axes {1, 2} are adjacent (blocked path, inner 300 > one block); {1, 3} are not
  Tensor x = randn({3, 4, 5, 300}, 31);
  for (auto axes : {std::vector<int64_t>{1, 2}, std::vector<int64_t>{1, 3}}) {
    for (const char* op : {"ReduceSum", "ReduceMean", "ReduceL2", "ReduceMax"}) {
      Tensor y = run1(make_node(op, 1, 1, {{"axes", attr_ints(axes)}, {"keepdims", attr_i(0)}}),
                      {&x});
      const std::string o = op;
      const int64_t d3 = axes[1] == 2 ? 300 : 5;  // the kept dim besides 0
      ASSERT_EQ(shape_str(y.shape), shape_str({3, d3})) << op;
      for (int64_t a = 0; a < 3; ++a)
        for (int64_t k = 0; k < d3; ++k) {
          double sum = 0, sq = 0, mx = -1e30;
          int cnt = 0;
          for (int64_t b = 0; b < 4; ++b)
            for (int64_t j = 0; j < (axes[1] == 2 ? 5 : 300); ++j) {
              const int64_t c = axes[1] == 2 ? j : k, w = axes[1] == 2 ? k : j;
              const double v = x.data<float>()[((a * 4 + b) * 5 + c) * 300 + w];
              sum += v;
              sq += v * v;
              mx = std::max(mx, v);
              ++cnt;
            }
          const double want = o == "ReduceSum" ? sum : o == "ReduceMean" ? sum / cnt
                              : o == "ReduceL2" ? std::sqrt(sq) : mx;
          ASSERT_NEAR(y.data<float>()[a * d3 + k], want, 1e-4) << op << " axes " << axes[1];
        }
    }
  }
}

TEST(NormReduce, RejectsBadAxes) {
  Tensor x = f32({2, 2}, {1, 2, 3, 5});
  EXPECT_THROW(run_node(make_node("ReduceMean", 1, 1, {{"axes", attr_ints({2})}}), {&x}), Error);
  Tensor rep = i64({1, -1});
  EXPECT_THROW(run_node(make_node("ReduceSum", 2), {&x, &rep}), Error);
}

// ------------------------------------------------------------------ Gelu

TEST(NormGelu, ErfAndTanh) {
  Tensor x = f32({5}, {-1, 0, 1, 2, -3});
  expect_close(run1(make_node("Gelu", 1), {&x}),
               f32({5}, {-0.15865525f, 0.f, 0.84134475f, 1.95449974f, -0.00404969f}), 1e-6);
  expect_close(run1(make_node("Gelu", 1, 1, {{"approximate", attr_s("tanh")}}), {&x}),
               f32({5}, {-0.15880801f, 0.f, 0.84119199f, 1.95459769f, -0.00363739f}), 1e-6);
  EXPECT_THROW(run_node(make_node("Gelu", 1, 1, {{"approximate", attr_s("fast")}}), {&x}), Error);
}

}  // namespace
