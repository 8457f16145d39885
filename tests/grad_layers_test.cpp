// Gradient cases (tests/grad_check.h) for the layer ops of kernels/cpu/backward_layers.cpp:
// Softmax, the normalizations (ChannelLayerNorm: backward_fused.cpp), Reduce*, Gelu, MatMul, Gemm,
// Einsum, Linear, SpectralNorm.
// grad_test.cpp runs them against finite differences of the reference forward kernels.
#include <algorithm>
#include <numeric>
#include <random>

#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {

namespace {

Tensor i64(std::vector<int64_t> v) { return Tensor::from_i64(v); }

// Values spaced 0.15 apart in random order: no two within the finite-difference step, so
// Max/Min pick the same element at x +- h.
Tensor distinct(Shape s, unsigned seed) {
  Tensor t(DType::F32, std::move(s));
  std::vector<int64_t> order((size_t)t.numel());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.15f * (order[i] - t.numel() / 2.f);
  return t;
}

// randn moved at least `gap` away from zero (ReduceL1's kink, ReduceLogSum's domain).
Tensor away_from_zero(Shape s, unsigned seed, float gap, bool positive = false) {
  Tensor t = randn(std::move(s), seed);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& v = t.data<float>()[i];
    v = (v < 0 && !positive ? -1.f : 1.f) * (std::fabs(v) + gap);
  }
  return t;
}

// Fewer probed elements for ops whose reference forward opens an OpenMP region per call
// (MatMul-like ops): keeps the finite differences fast on a loaded machine.
GradCase probes(GradCase c, int max_probes) {
  c.max_probes = max_probes;
  return c;
}

GradCase with_outputs(GradCase c, int nout) {
  c.node = make_node(c.node.op, (int)c.inputs.size(), nout, c.node.attrs);
  return c;
}

}  // namespace

GRAD_CASES("Softmax") {
  return {grad_case("Softmax axis -1", "Softmax", {randn({2, 3, 5}, 1)}),
          grad_case("Softmax axis 1", "Softmax", {randn({2, 4, 3}, 2)}, {{"axis", attr_i(1)}}),
          grad_case("Softmax axis 0", "Softmax", {randn({3, 4}, 3)}, {{"axis", attr_i(0)}})};
}

GRAD_CASES("LayerNormalization") {
  GradCase last = grad_case("LayerNormalization axis -1", "LayerNormalization",
                            {randn({2, 3, 6}, 4), randn({6}, 5), randn({6}, 6)});
  // channel LayerNorm: normalized over (C, H, W), scale and bias (C, 1, 1) broadcast
  GradCase chan = grad_case("LayerNormalization axis 1, scale (C,1,1)", "LayerNormalization",
                            {randn({2, 4, 3, 3}, 7), randn({4, 1, 1}, 8), randn({4, 1, 1}, 9)},
                            {{"axis", attr_i(1)}, {"epsilon", attr_f(1e-3f)}});
  // Mean and InvStdDev outputs, no bias, scale (1, 5) broadcast over (3, 5)
  GradCase stats = with_outputs(
      grad_case("LayerNormalization axis -2 with Mean/InvStdDev, no bias", "LayerNormalization",
                {randn({2, 3, 5}, 10), randn({1, 5}, 11)}, {{"axis", attr_i(-2)}}),
      3);
  return {last, chan, stats};
}

GRAD_CASES("InstanceNormalization") {
  return {grad_case("InstanceNormalization", "InstanceNormalization",
                    {randn({2, 3, 4, 5}, 12), randn({3}, 13), randn({3}, 14)},
                    {{"epsilon", attr_f(1e-3f)}})};
}

GRAD_CASES("GroupNormalization") {
  return {grad_case("GroupNormalization 3 groups, per-channel scale", "GroupNormalization",
                    {randn({2, 6, 3, 2}, 15), randn({6}, 16), randn({6}, 17)},
                    {{"num_groups", attr_i(3)}}),
          grad_case("GroupNormalization 2 groups, per-group scale", "GroupNormalization",
                    {randn({2, 4, 5}, 18), randn({2}, 19), randn({2}, 20)},
                    {{"num_groups", attr_i(2)}, {"epsilon", attr_f(1e-3f)}}),
          grad_case("GroupNormalization 1 group", "GroupNormalization",
                    {randn({1, 3, 4, 2}, 21), randn({3}, 22), randn({3}, 23)},
                    {{"num_groups", attr_i(1)}})};
}

namespace {

// The axes variants every Reduce* is checked with: attribute and input axes, keepdims 0/1,
// several axes, all axes, noop_with_empty_axes.
std::vector<GradCase> reduce_cases(const std::string& op, const std::function<Tensor(Shape, unsigned)>& make) {
  const Shape s{2, 3, 4, 2};
  return {grad_case(op + " axes attr {1,3} keepdims 1", op, {make(s, 31)}, {{"axes", attr_ints({1, 3})}}),
          grad_case(op + " axes input {0,-1} keepdims 0", op, {make(s, 32), i64({0, -1})},
                    {{"keepdims", attr_i(0)}}),
          grad_case(op + " axes attr {-1} keepdims 1", op, {make({3, 5}, 33)}, {{"axes", attr_ints({-1})}}),
          grad_case(op + " all axes keepdims 0", op, {make({2, 3, 2}, 34)}, {{"keepdims", attr_i(0)}}),
          grad_case(op + " empty axes input, noop", op, {make({2, 3}, 35), i64({})},
                    {{"noop_with_empty_axes", attr_i(1)}})};
}

Tensor plain(Shape s, unsigned seed) { return randn(std::move(s), seed); }

}  // namespace

GRAD_CASES("ReduceSum") { return reduce_cases("ReduceSum", plain); }
GRAD_CASES("ReduceMean") { return reduce_cases("ReduceMean", plain); }
GRAD_CASES("ReduceMax") { return reduce_cases("ReduceMax", distinct); }
GRAD_CASES("ReduceMin") { return reduce_cases("ReduceMin", distinct); }
GRAD_CASES("ReduceSumSquare") { return reduce_cases("ReduceSumSquare", plain); }
GRAD_CASES("ReduceL2") { return reduce_cases("ReduceL2", plain); }
GRAD_CASES("ReduceLogSumExp") { return reduce_cases("ReduceLogSumExp", plain); }
GRAD_CASES("ReduceL1") {
  return reduce_cases("ReduceL1", [](Shape s, unsigned seed) { return away_from_zero(s, seed, 0.2f); });
}
GRAD_CASES("ReduceLogSum") {
  return reduce_cases("ReduceLogSum", [](Shape s, unsigned seed) { return away_from_zero(s, seed, 0.2f, true); });
}
GRAD_CASES("ReduceProd") {
  auto make = [](Shape s, unsigned seed) { return away_from_zero(s, seed, 0.5f); };
  std::vector<GradCase> c = reduce_cases("ReduceProd", make);
  // one exact zero in a reduced row: the other factors' product flows to it, 0 elsewhere
  Tensor z = make({3, 4}, 36);
  z.data<float>()[5] = 0.f;
  c.push_back(grad_case("ReduceProd with a zero", "ReduceProd", {z}, {{"axes", attr_ints({1})}}));
  return c;
}

GRAD_CASES("Gelu") {
  return {grad_case("Gelu erf", "Gelu", {randn({3, 4, 5}, 40, 2.f)}),
          grad_case("Gelu tanh", "Gelu", {randn({3, 4, 5}, 41, 2.f)}, {{"approximate", attr_s("tanh")}})};
}

GRAD_CASES("ChannelLayerNorm") {
  // g and b as CREDIT's (1, C, 1, 1), or C elements; S = 1; S = 70 spans two position tiles
  auto cln = [](const std::string& label, Shape x, Shape p, unsigned seed) {
    return grad_case(label, "ChannelLayerNorm", {randn(x, seed), randn(p, seed + 1), randn(p, seed + 2)},
                     {{"epsilon", attr_f(1e-5f)}});
  };
  return {cln("ChannelLayerNorm (2, 5, 3, 4)", {2, 5, 3, 4}, {1, 5, 1, 1}, 45),
          cln("ChannelLayerNorm (3, 4), no spatial dims", {3, 4}, {4}, 48),
          cln("ChannelLayerNorm (1, 6, 70)", {1, 6, 70}, {6, 1}, 51)};
}

GRAD_CASES("MatMul") {
  return {grad_case("MatMul batched x 2-D", "MatMul", {randn({2, 3, 4}, 50), randn({4, 5}, 51)}),
          grad_case("MatMul broadcast batch (2,1) x (3)", "MatMul", {randn({2, 1, 3, 4}, 52), randn({3, 4, 2}, 53)}),
          grad_case("MatMul 1-D x batched", "MatMul", {randn({4}, 54), randn({2, 4, 3}, 55)}),
          grad_case("MatMul batched x 1-D", "MatMul", {randn({2, 3, 4}, 56), randn({4}, 57)}),
          grad_case("MatMul 1-D x 1-D", "MatMul", {randn({5}, 58), randn({5}, 59)})};
}

GRAD_CASES("Gemm") {
  // M, K, N = 3, 4, 5; c_shape nullptr: no C
  auto gemm = [](const std::string& label, bool ta, bool tb, const Shape* c_shape, float alpha, float beta) {
    const int64_t M = 3, K = 4, N = 5;
    std::vector<Tensor> in{randn(ta ? Shape{K, M} : Shape{M, K}, 60), randn(tb ? Shape{N, K} : Shape{K, N}, 61)};
    if (c_shape) in.push_back(randn(*c_shape, 62));
    return probes(grad_case(label, "Gemm", in,
                            {{"transA", attr_i(ta)}, {"transB", attr_i(tb)}, {"alpha", attr_f(alpha)}, {"beta", attr_f(beta)}}),
                  24);
  };
  const Shape n{5}, m1{3, 1}, mn{3, 5}, scalar{}, row{1, 5};
  return {gemm("Gemm plain, C (N)", false, false, &n, 1.f, 1.f),
          gemm("Gemm transA, C (M, 1)", true, false, &m1, 0.5f, 2.f),
          gemm("Gemm transB, C (M, N)", false, true, &mn, 1.5f, -0.5f),
          gemm("Gemm transA transB, C scalar", true, true, &scalar, 1.f, 1.f),
          gemm("Gemm no C", false, true, nullptr, 2.f, 1.f),
          gemm("Gemm beta 0", false, false, &row, 1.f, 0.f)};
}

GRAD_CASES("Einsum") {
  auto es = [](const std::string& eq, std::vector<Tensor> in) {
    return probes(grad_case("Einsum " + eq, "Einsum", std::move(in), {{"equation", attr_s(eq)}}), 24);
  };
  return {es("bhid,bhjd->bhij", {randn({2, 2, 3, 4}, 70), randn({2, 2, 5, 4}, 71)}),
          es("bhij,bhjd->bhid", {randn({2, 2, 3, 5}, 72), randn({2, 2, 5, 4}, 73)}),
          es("abc,cd->ad", {randn({2, 3, 4}, 74), randn({4, 3}, 75)}),  // b only in operand 0
          es("ij,jk", {randn({3, 4}, 76), randn({4, 2}, 77)}),          // implicit output
          es("ab,bc,cd->da", {randn({2, 3}, 78), randn({3, 4}, 79), randn({4, 2}, 80)}),
          es("ii,ij->j", {randn({3, 3}, 81), randn({3, 4}, 82)})};       // diagonal
}

GRAD_CASES("Linear") {
  return {probes(grad_case("Linear axis -1 with bias", "Linear", {randn({2, 3, 4}, 90), randn({5, 4}, 91), randn({5}, 92)}), 24),
          probes(grad_case("Linear axis 1 (1x1 conv), no bias", "Linear", {randn({2, 4, 3, 2}, 93), randn({5, 4}, 94)},
                    {{"axis", attr_i(1)}}), 24),
          probes(grad_case("Linear gelu", "Linear", {randn({3, 4}, 95), randn({5, 4}, 96), randn({5}, 97)},
                           {{"activation", attr_s("gelu")}}), 24)};
}

GRAD_CASES("SpectralNorm") {
  // u and v are buffers without gradient: fixed. power_iterations 0 (the harness runs the
  // forward many times; an iteration would move u and v between runs).
  auto sn = [](const std::string& label, Shape w, int64_t dim, unsigned seed) {
    const int64_t rows = w[dim], cols = numel(w) / rows;
    GradCase c = grad_case(label, "SpectralNorm", {randn(w, seed), randn({rows}, seed + 1), randn({cols}, seed + 2)},
                           {{"dim", attr_i(dim)}});
    c.fixed = {1, 2};
    return c;
  };
  return {sn("SpectralNorm conv weight dim 0", {4, 3, 2, 2}, 0, 100),
          sn("SpectralNorm ConvTranspose weight dim 1", {3, 4, 2, 2}, 1, 110),
          sn("SpectralNorm 2-D weight", {5, 3}, 0, 120)};
}

namespace {

// Mean and InvStdDev gradients given as nullptr equal zeros (the harness always passes them).
TEST(GradLayers, LayerNormNullStatGradientsAreZero) {
  register_cpu_kernels();
  Node n = make_node("LayerNormalization", 3, 3);
  Tensor x = randn({3, 4}, 1), s = randn({4}, 2), b = randn({4}, 3);
  std::vector<Tensor> outs = run_node(n, {&x, &s, &b});
  Tensor gy = randn({3, 4}, 4), z = Tensor::zeros(DType::F32, {3, 1});
  std::vector<Tensor> g1, g2;
  for (auto* g : {&g1, &g2})
    for (const Tensor* t : {&x, &s, &b}) g->emplace_back(DType::F32, t->shape);
  BackwardFn bw = backward_kernel("LayerNormalization");
  ASSERT_NE(bw, nullptr);
  bw(n, {&x, &s, &b}, {&outs[0], &outs[1], &outs[2]}, {&gy, nullptr, nullptr}, {&g1[0], &g1[1], &g1[2]});
  bw(n, {&x, &s, &b}, {&outs[0], &outs[1], &outs[2]}, {&gy, &z, &z}, {&g2[0], &g2[1], &g2[2]});
  for (int i = 0; i < 3; ++i) expect_close(g1[i], g2[i], 0, 0);
  // and the input gradient of a LayerNorm sums to zero over each row (shift invariance)
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int k = 0; k < 4; ++k) sum += g1[0].data<float>()[r * 4 + k];
    EXPECT_NEAR(sum, 0.0, 1e-5);
  }
}

// Gradients only for the inputs asked: nullptr entries are skipped, the rest match.
TEST(GradLayers, MatMulPartialGradients) {
  register_cpu_kernels();
  Node n = make_node("MatMul", 2);
  Tensor a = randn({2, 3, 4}, 5), b = randn({4, 2}, 6);
  std::vector<Tensor> outs = run_node(n, {&a, &b});
  Tensor gy = randn(outs[0].shape, 7);
  Tensor ga(DType::F32, a.shape), gb(DType::F32, b.shape), gb2(DType::F32, b.shape);
  BackwardFn bw = backward_kernel("MatMul");
  bw(n, {&a, &b}, {&outs[0]}, {&gy}, {&ga, &gb});
  bw(n, {&a, &b}, {&outs[0]}, {&gy}, {nullptr, &gb2});
  expect_close(gb2, gb, 0, 0);
  // gB = sum over the batch of A^T gY, by hand
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 2; ++j) {
      double s = 0;
      for (int bt = 0; bt < 2; ++bt)
        for (int i = 0; i < 3; ++i) s += (double)a.data<float>()[(bt * 3 + i) * 4 + k] * gy.data<float>()[(bt * 3 + i) * 2 + j];
      EXPECT_NEAR(gb.data<float>()[k * 2 + j], s, 1e-5);
    }
}

}  // namespace
}  // namespace wxe::test
