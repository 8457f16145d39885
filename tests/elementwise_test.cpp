// Elementwise and shape ops against hand-computed ONNX semantics.
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

TEST(Elementwise, BroadcastAddMatchesNumpyRules) {
  Tensor a = Tensor::from_f32({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from_f32({4, 1}, {10, 20, 30, 40});
  auto out = run_node(make_node("Add", 2), {&a, &b});
  ASSERT_EQ(out[0].shape, (Shape{2, 4, 3}));
  // out[i][j][k] = a[i][0][k] + b[j][0]
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(out[0].data<float>()[(i * 4 + j) * 3 + k], a.data<float>()[i * 3 + k] + b.data<float>()[j]);
}

TEST(Elementwise, ChannelBroadcastLikeLayerNormGain) {
  Tensor x = randn({1, 3, 2, 2}, 1);
  Tensor g = Tensor::from_f32({1, 3, 1, 1}, {2, 3, 4});
  auto out = run_node(make_node("Mul", 2), {&x, &g});
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 4; ++p)
      EXPECT_FLOAT_EQ(out[0].data<float>()[c * 4 + p], x.data<float>()[c * 4 + p] * (c + 2));
}

TEST(Elementwise, Int64DivTruncatesAndSubWorks) {
  Tensor a = Tensor::from_i64({7, -7, 9});
  Tensor b = Tensor::from_i64({2, 2, 3});
  auto q = run_node(make_node("Div", 2), {&a, &b});
  EXPECT_EQ(q[0].to_i64(), (std::vector<int64_t>{3, -3, 3}));
  auto d = run_node(make_node("Sub", 2), {&a, &b});
  EXPECT_EQ(d[0].to_i64(), (std::vector<int64_t>{5, -9, 6}));
}

TEST(Elementwise, MixedDtypesAreAnError) {
  Tensor a = Tensor::from_i64({1});
  Tensor b = Tensor::from_f32({1}, {1});
  EXPECT_THROW(run_node(make_node("Add", 2), {&a, &b}), Error);
}

TEST(Elementwise, IncompatibleShapesAreAnError) {
  Tensor a = randn({2, 3}, 1), b = randn({4}, 2);
  EXPECT_THROW(run_node(make_node("Mul", 2), {&a, &b}), Error);
}

TEST(Elementwise, UnaryValues) {
  Tensor x = Tensor::from_f32({4}, {-1.f, 0.f, 0.5f, 4.f});
  EXPECT_FLOAT_EQ(run_node(make_node("Relu", 1), {&x})[0].data<float>()[0], 0.f);
  EXPECT_FLOAT_EQ(run_node(make_node("Sqrt", 1), {&x})[0].data<float>()[3], 2.f);
  EXPECT_NEAR(run_node(make_node("Erf", 1), {&x})[0].data<float>()[2], 0.5204998778, 1e-7);
  EXPECT_NEAR(run_node(make_node("Sigmoid", 1), {&x})[0].data<float>()[0], 0.2689414214, 1e-7);
}

TEST(Elementwise, CastFloatToInt64TruncatesTowardZero) {
  Tensor x = Tensor::from_f32({3}, {2.7f, -2.7f, 3.0f});
  auto out = run_node(make_node("Cast", 1, 1, {{"to", attr_i(7)}}), {&x});
  EXPECT_EQ(out[0].dtype, DType::I64);
  EXPECT_EQ(out[0].to_i64(), (std::vector<int64_t>{2, -2, 3}));
}

TEST(Elementwise, WhereBroadcastsCondition) {
  Tensor c(DType::Bool, {2, 1});
  c.data<uint8_t>()[0] = 1;
  c.data<uint8_t>()[1] = 0;
  Tensor x = Tensor::from_f32({1, 3}, {1, 2, 3});
  Tensor y = Tensor::scalar_f32(-1);
  auto out = run_node(make_node("Where", 3), {&c, &x, &y});
  EXPECT_EQ(out[0].shape, (Shape{2, 3}));
  std::vector<float> want = {1, 2, 3, -1, -1, -1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[0].data<float>()[i], want[i]);
}

TEST(ShapeOps, ReshapeZeroAndMinusOne) {
  Tensor x = randn({2, 3, 4}, 3);
  Tensor s = Tensor::from_i64({0, -1});
  auto out = run_node(make_node("Reshape", 2), {&x, &s});
  EXPECT_EQ(out[0].shape, (Shape{2, 12}));
  Tensor bad = Tensor::from_i64({5, -1});
  EXPECT_THROW(run_node(make_node("Reshape", 2), {&x, &bad}), Error);
}

TEST(ShapeOps, SqueezeUnsqueezeAxesFromInput) {
  Tensor x = randn({1, 3, 1}, 4);
  Tensor ax = Tensor::from_i64({-1});
  EXPECT_EQ(run_node(make_node("Squeeze", 2), {&x, &ax})[0].shape, (Shape{1, 3}));
  EXPECT_EQ(run_node(make_node("Squeeze", 1), {&x})[0].shape, (Shape{3}));
  Tensor ax2 = Tensor::from_i64({0, 4});
  EXPECT_EQ(run_node(make_node("Unsqueeze", 2), {&x, &ax2})[0].shape, (Shape{1, 1, 3, 1, 1}));
  Tensor ax3 = Tensor::from_i64({1});
  EXPECT_THROW(run_node(make_node("Squeeze", 2), {&x, &ax3}), Error);  // dim 1 is 3
}

TEST(ShapeOps, ConcatMiddleAxis) {
  Tensor a = Tensor::from_f32({2, 1}, {1, 2});
  Tensor b = Tensor::from_f32({2, 2}, {3, 4, 5, 6});
  auto out = run_node(make_node("Concat", 2, 1, {{"axis", attr_i(-1)}}), {&a, &b});
  std::vector<float> want = {1, 3, 4, 2, 5, 6};
  ASSERT_EQ(out[0].shape, (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[0].data<float>()[i], want[i]);
}

TEST(ShapeOps, ShapeWithStartEnd) {
  Tensor x = randn({2, 3, 4, 5}, 5);
  auto out = run_node(make_node("Shape", 1, 1, {{"start", attr_i(1)}, {"end", attr_i(-1)}}), {&x});
  EXPECT_EQ(out[0].to_i64(), (std::vector<int64_t>{3, 4}));
}

TEST(ShapeOps, ExpandAndConstantOfShape) {
  Tensor x = Tensor::from_f32({3, 1}, {1, 2, 3});
  Tensor s = Tensor::from_i64({2, 3, 2});
  auto out = run_node(make_node("Expand", 2), {&x, &s});
  ASSERT_EQ(out[0].shape, (Shape{2, 3, 2}));
  EXPECT_EQ(out[0].data<float>()[11], 3.f);
  EXPECT_EQ(out[0].data<float>()[2], 2.f);
  Node n = make_node("ConstantOfShape", 1);
  Attr v;
  v.kind = Attr::Tensor_;
  v.t = std::make_shared<Tensor>(Tensor::from_i64({7}));
  n.attrs["value"] = v;
  Tensor shp = Tensor::from_i64({2, 2});
  auto c = run_node(n, {&shp});
  EXPECT_EQ(c[0].to_i64(), (std::vector<int64_t>{7, 7, 7, 7}));
}

TEST(ShapeOps, RangeInt64) {
  Tensor a = Tensor::from_i64({2}).reshaped({}), b = Tensor::from_i64({9}).reshaped({}),
         d = Tensor::from_i64({3}).reshaped({});
  auto out = run_node(make_node("Range", 3), {&a, &b, &d});
  EXPECT_EQ(out[0].to_i64(), (std::vector<int64_t>{2, 5, 8}));
}
