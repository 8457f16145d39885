// Kernels of the CPU fast path added for speed: each fused op's reference kernel against the
// ops it replaces, and each fast kernel against the reference kernel (the oracle).
#include <cmath>
#include <cstring>

#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

Tensor run1(const Node& n, const std::vector<const Tensor*>& in, KernelKind k = KernelKind::Reference) {
  return run_node(n, in, k)[0];
}

// ------------------------------------------------------------------ ChannelLayerNorm

// The unfused formula with the reference kernels of the ops the exporter writes.
Tensor channel_layernorm_unfused(const Tensor& x, const Tensor& g, const Tensor& b, float eps) {
  Node mean = make_node("ReduceMean", 1, 1, {{"axes", attr_ints({1})}});
  Tensor m = run1(mean, {&x});
  Tensor d = run1(make_node("Sub", 2), {&x, &m});
  Tensor sq = run1(make_node("Mul", 2), {&d, &d});
  Tensor v = run1(mean, {&sq});
  Tensor e = Tensor::scalar_f32(eps);
  Tensor ve = run1(make_node("Add", 2), {&v, &e});
  Tensor sd = run1(make_node("Sqrt", 1), {&ve});
  Tensor n = run1(make_node("Div", 2), {&d, &sd});
  Tensor ng = run1(make_node("Mul", 2), {&n, &g});
  return run1(make_node("Add", 2), {&ng, &b});
}

TEST(ChannelLayerNorm, ReferenceEqualsTheExportedSubgraph) {
  for (Shape s : {Shape{2, 5, 3, 4}, Shape{1, 32, 7}, Shape{3, 1, 2, 2}}) {
    Tensor x = randn(s, 1, 2.f);
    for (int64_t i = 0; i < x.numel(); i += 3) x.data<float>()[i] += 5.f;  // an offset mean
    Tensor g = randn({1, s[1], 1, 1}, 2), b = randn({1, s[1], 1, 1}, 3);
    if (s.size() == 3) g = g.reshaped({1, s[1], 1}), b = b.reshaped({1, s[1], 1});
    Node n = make_node("ChannelLayerNorm", 3, 1, {{"epsilon", attr_f(1e-5f)}});
    expect_close(run1(n, {&x, &g, &b}), channel_layernorm_unfused(x, g, b, 1e-5f), 2e-6, 2e-6);
  }
}

TEST(ChannelLayerNorm, FastEqualsReference) {
  // positions not a multiple of the fast kernel's tile, and more than one tile
  for (Shape s : {Shape{2, 32, 9, 15}, Shape{1, 256, 130}, Shape{1, 3, 1, 1}}) {
    Tensor x = randn(s, 4, 3.f);
    Tensor g = randn({s[1]}, 5), b = randn({s[1]}, 6);
    Node n = make_node("ChannelLayerNorm", 3, 1, {{"epsilon", attr_f(1e-5f)}});
    expect_close(run1(n, {&x, &g, &b}, KernelKind::Fast), run1(n, {&x, &g, &b}), 2e-6, 2e-6);
  }
}

// With backward_accumulates(0) (the executor hands it the residual stream's gradient so far,
// engine/ir/ops.h gradient_accumulation) the backward adds its dx to what gin[0] holds: the
// same bits as the gradient alone plus that tensor; dg and db are as without.
TEST(ChannelLayerNorm, BackwardAddsIntoTheGradientItIsHanded) {
  register_cpu_kernels();
  ASSERT_EQ(gradient_accumulation("ChannelLayerNorm"), 1u);
  const BackwardFn bw = backward_kernel("ChannelLayerNorm");
  const Shape s{2, 24, 9, 15};
  Tensor x = randn(s, 7, 2.f), g = randn({1, 24, 1, 1}, 8), b = randn({1, 24, 1, 1}, 9), gy = randn(s, 10);
  const Tensor before = randn(s, 11);
  Node n = make_node("ChannelLayerNorm", 3, 1, {{"epsilon", attr_f(1e-5f)}});
  Tensor y = run1(n, {&x, &g, &b}, KernelKind::Fast);
  Tensor alone(DType::F32, s), gg(DType::F32, g.shape), gb(DType::F32, b.shape);
  bw(n, {&x, &g, &b}, {&y}, {&gy}, {&alone, &gg, &gb});
  Tensor summed = before.clone(), gg2(DType::F32, g.shape), gb2(DType::F32, b.shape);
  set_backward_accumulates(1u);
  bw(n, {&x, &g, &b}, {&y}, {&gy}, {&summed, &gg2, &gb2});
  set_backward_accumulates(0);
  for (int64_t i = 0; i < summed.numel(); ++i) {
    const float want = before.data<float>()[i] + alone.data<float>()[i];
    ASSERT_EQ(std::memcmp(&summed.data<float>()[i], &want, sizeof(float)), 0) << i;
  }
  EXPECT_EQ(std::memcmp(gg.raw(), gg2.raw(), gg.nbytes()), 0);
  EXPECT_EQ(std::memcmp(gb.raw(), gb2.raw(), gb.nbytes()), 0);
  EXPECT_FALSE(backward_accumulates(0));  // nothing left set for the next kernel
}

TEST(ChannelLayerNorm, BadParameterIsAnError) {
  Tensor x = randn({1, 4, 2}, 1), g = randn({3}, 2), b = randn({4}, 3);
  EXPECT_NE(error_of([&] { run1(make_node("ChannelLayerNorm", 3), {&x, &g, &b}); }).find("must have 4 elements"),
            std::string::npos);
}

// ------------------------------------------------------------------ Linear + Gelu

TEST(LinearGelu, ReferenceEqualsLinearThenGelu) {
  Tensor x = randn({2, 6, 3, 4}, 1, 2.f), w = randn({8, 6}, 2), b = randn({8}, 3);
  for (int64_t axis : {1, -1}) {
    Tensor xin = axis == 1 ? x : x.reshaped({2, 3, 4, 6});
    Tensor y = run1(make_node("Linear", 3, 1, {{"axis", attr_i(axis)}}), {&xin, &w, &b});
    Tensor ref = run1(make_node("Gelu", 1), {&y});
    Tensor fused = run1(make_node("Linear", 3, 1, {{"axis", attr_i(axis)}, {"activation", attr_s("gelu")}}),
                        {&xin, &w, &b});
    EXPECT_EQ(max_abs_diff(fused, ref), 0.0) << "axis " << axis;
  }
}

// Features inner (axis 1) with a bias: K < N takes the bias as a K + 1st weight column against
// a row of ones, K >= N adds it by a sum post-op (dnnl.cpp); with and without GELU.
TEST(LinearGelu, FastEqualsReference) {
  for (int64_t N : {24, 12})
    for (bool gelu : {true, false}) {
      Tensor w = randn({N, 16}, 2), b = randn({N}, 3);
      for (int64_t axis : {1, -1})
        for (bool bias : {true, false}) {
          SCOPED_TRACE("N " + std::to_string(N) + " gelu " + std::to_string(gelu) + " axis " + std::to_string(axis) +
                       " bias " + std::to_string(bias));
          Tensor x = axis == 1 ? randn({2, 16, 5, 7}, 1, 2.f) : randn({3, 11, 16}, 1, 2.f);
          std::map<std::string, Attr> a{{"axis", attr_i(axis)}};
          if (gelu) a["activation"] = attr_s("gelu");
          Node n = make_node("Linear", bias ? 3 : 2, 1, a);
          std::vector<const Tensor*> in{&x, &w};
          if (bias) in.push_back(&b);
          expect_close(run1(n, in, KernelKind::Fast), run1(n, in), 2e-5, 2e-5);
        }
    }
}

TEST(LinearGelu, UnknownActivationIsAnError) {
  Tensor x = randn({2, 3}, 1), w = randn({4, 3}, 2);
  EXPECT_NE(error_of([&] { run1(make_node("Linear", 2, 1, {{"activation", attr_s("relu6")}}), {&x, &w}); })
                .find("unknown activation 'relu6'"),
            std::string::npos);
}

// ------------------------------------------------------------------ fast kernels of existing ops

TEST(FastKernels, GeluEqualsReference) {
  Tensor x = randn({3, 1000}, 1, 3.f);
  expect_close(run1(make_node("Gelu", 1), {&x}, KernelKind::Fast), run1(make_node("Gelu", 1), {&x}), 1e-6, 1e-5);
}

TEST(FastKernels, SoftmaxEqualsReference) {
  Tensor x = randn({4, 3, 16, 16}, 1, 4.f);
  for (int64_t axis : {-1, 1, 0, 2}) {
    Node n = make_node("Softmax", 1, 1, {{"axis", attr_i(axis)}});
    expect_close(run1(n, {&x}, KernelKind::Fast), run1(n, {&x}), 1e-7, 2e-6);
  }
}

TEST(FastKernels, DepthToSpaceEqualsReference) {
  Tensor x = randn({2, 12, 3, 5}, 1);
  for (const char* mode : {"CRD", "DCR"}) {
    Node n = make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}, {"mode", attr_s(mode)}});
    EXPECT_EQ(max_abs_diff(run1(n, {&x}, KernelKind::Fast), run1(n, {&x})), 0.0) << mode;
  }
  Tensor y = randn({1, 18, 2, 3}, 2);
  Node n3 = make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(3)}, {"mode", attr_s("CRD")}});
  EXPECT_EQ(max_abs_diff(run1(n3, {&y}, KernelKind::Fast), run1(n3, {&y})), 0.0);
}

}  // namespace

namespace {

// ------------------------------------------------------------------ ConvChannelsLast, Transpose

Tensor nhwc_of(const Tensor& x) {
  Node t = make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 2, 3, 1})}});
  return run1(t, {&x});
}

TEST(ConvChannelsLast, EqualsConvOnTheTransposedInput) {
  Tensor x = randn({2, 5, 11, 13}, 1), w = randn({7, 5, 3, 4}, 2), b = randn({7}, 3);
  std::map<std::string, Attr> attrs{{"strides", attr_ints({2, 1})}, {"pads", attr_ints({1, 2, 0, 1})}};
  Tensor ref = run1(make_node("Conv", 3, 1, attrs), {&x, &w, &b});
  Tensor xl = nhwc_of(x);
  for (KernelKind k : {KernelKind::Reference, KernelKind::Fast}) {
    EXPECT_LE(max_abs_diff(run1(make_node("ConvChannelsLast", 3, 1, attrs), {&xl, &w, &b}, k), ref), 2e-5);
    auto last = attrs;
    last["channels_last_output"] = attr_i(1);
    EXPECT_LE(max_abs_diff(run1(make_node("ConvChannelsLast", 3, 1, last), {&xl, &w, &b}, k), nhwc_of(ref)), 2e-5);
  }
}

TEST(ConvChannelsLast, ConstantWeightsCacheFollowsTheWeights) {
  // the fast kernel keeps reordered weights per weight storage: two weight tensors of one
  // shape must not share an entry, and a call after the first gives the same answer
  Tensor x = nhwc_of(randn({1, 4, 9, 9}, 1));
  Tensor w1 = randn({6, 4, 3, 3}, 2), w2 = randn({6, 4, 3, 3}, 3);
  std::map<std::string, Attr> attrs{{"pads", attr_ints({1, 1, 1, 1})}, {"constant_weights", attr_i(1)}};
  Node n = make_node("ConvChannelsLast", 2, 1, attrs);
  for (int rep = 0; rep < 2; ++rep)
    for (const Tensor* w : {&w1, &w2})
      EXPECT_LE(max_abs_diff(run1(n, {&x, w}, KernelKind::Fast), run1(n, {&x, w})), 2e-5);
}

TEST(FastKernels, TransposeEqualsReference) {
  Tensor x = randn({3, 5, 17, 19}, 1);
  for (std::vector<int64_t> perm : {std::vector<int64_t>{0, 2, 3, 1}, {0, 3, 1, 2}, {2, 3, 0, 1}, {1, 0, 2, 3},
                                    {0, 1, 3, 2}, {0, 2, 1, 3}, {3, 2, 1, 0}}) {
    Node n = make_node("Transpose", 1, 1, {{"perm", attr_ints(perm)}});
    EXPECT_EQ(max_abs_diff(run1(n, {&x}, KernelKind::Fast), run1(n, {&x})), 0.0) << shape_str(perm);
  }
  Tensor big = randn({1, 84, 40, 72}, 2);  // whole 8 x 8 blocks, tiles and edges
  Node n = make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 2, 3, 1})}});
  EXPECT_EQ(max_abs_diff(run1(n, {&big}, KernelKind::Fast), run1(n, {&big})), 0.0);
}

}  // namespace

namespace {

TEST(ConvChannelsLast, Bf16IsCloseToFloat32) {
  // bfloat16 products (8 significant bits) with float32 sums: relative error ~ 2^-9
  Tensor x = nhwc_of(randn({1, 16, 20, 24}, 1)), w = randn({32, 16, 3, 3}, 2), b = randn({32}, 3);
  std::map<std::string, Attr> attrs{{"pads", attr_ints({1, 1, 1, 1})}, {"precision", attr_s("bf16")}};
  Node n = make_node("ConvChannelsLast", 3, 1, attrs);
  Tensor ref = run1(n, {&x, &w, &b});  // the reference kernel computes in float32 (double sums)
  Tensor fast = run1(n, {&x, &w, &b}, KernelKind::Fast);
  EXPECT_LT(rel_l2(fast, ref), 1e-2);  // (a CPU oneDNN has no bf16 kernel for runs float32: 0)
}

}  // namespace

namespace {

TEST(FastKernels, SameShapeArithmeticEqualsReference) {
  Tensor a = randn({3, 70000}, 1), b = randn({3, 70000}, 2), s = Tensor::scalar_f32(1.7f), row = randn({70000}, 3);
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    Node n = make_node(op, 2);
    for (const Tensor* y : {&b, &s, &row})  // same shape, scalar, broadcast row (reference path)
      EXPECT_EQ(max_abs_diff(run1(n, {&a, y}, KernelKind::Fast), run1(n, {&a, y})), 0.0) << op;
  }
}

}  // namespace

namespace {

TEST(LinearGelu, Bf16IsCloseToFloat32) {
  Tensor w = randn({24, 16}, 2), b = randn({24}, 3);
  for (int64_t axis : {1, -1})
    for (int cached : {0, 1}) {
      Tensor x = axis == 1 ? randn({2, 16, 5, 7}, 1) : randn({3, 11, 16}, 1);
      Node n = make_node("Linear", 3, 1,
                         {{"axis", attr_i(axis)}, {"precision", attr_s("bf16")}, {"constant_weights", attr_i(cached)}});
      Tensor ref = run1(n, {&x, &w, &b});  // the reference kernel is float32
      EXPECT_LT(rel_l2(run1(n, {&x, &w, &b}, KernelKind::Fast), ref), 1e-2) << "axis " << axis;
    }
}

}  // namespace
