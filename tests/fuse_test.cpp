// CPU fusion passes (engine/passes/fuse.h), each alone: a small graph in, the expected graph out, the
// same numbers before and after (reference kernels).
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/exec/executor.h"
#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

struct Builder : GraphBuilder {
  // Shapes bound and inferred, as after simplify().
  Graph done(int output, const Shape& x_shape) {
    register_cpu_kernels();
    g.outputs = {output};
    bind_inputs(g, {{g.values[g.inputs[0]].name, {DType::F32, x_shape}}});
    infer_shapes(g);
    return g;
  }
};

Tensor run_ref(const Graph& g, const Tensor& x) {
  Executor ex(g, {0, KernelKind::Reference});
  return ex.run({{g.values[g.inputs[0]].name, x}})[0];
}

std::vector<std::string> ops_of(const Graph& g) {
  std::vector<std::string> r;
  for (auto& n : g.nodes) r.push_back(n.op);
  return r;
}

using Ops = std::vector<std::string>;

// x -> Pad(constant 0, spatial) -> Conv, plus Conv's own pads
Graph pad_conv_graph(float pad_value) {
  Builder b;
  int x = b.input("x", {1, 3, 10, 12});
  int pads = b.constant("pads", Tensor::from_i64({0, 0, 1, 2, 0, 0, 3, 1}));
  int p = b.node("Pad", {x, pads, b.scalar(pad_value)}, {{"mode", attr_s("constant")}});
  int w = b.constant("w", randn({4, 3, 3, 3}, 2));
  int y = b.node("Conv", {p, w}, {{"pads", attr_ints({1, 0, 0, 1})}, {"strides", attr_ints({2, 1})}});
  return b.done(y, {1, 3, 10, 12});
}

TEST(Fuse, PadFoldsIntoConv) {
  Graph g = pad_conv_graph(0.f);
  Tensor x = randn({1, 3, 10, 12}, 1);
  Tensor before = run_ref(g, x);
  fold_pad_into_conv(g);
  EXPECT_EQ(ops_of(g), (Ops{"Conv"}));
  EXPECT_EQ(g.nodes[0].ints("pads"), (std::vector<int64_t>{2, 2, 3, 2}));
  EXPECT_EQ(max_abs_diff(run_ref(g, x), before), 0.0);
}

TEST(Fuse, PadWithNonZeroValueStays) {
  Graph g = pad_conv_graph(1.f);
  fold_pad_into_conv(g);
  EXPECT_EQ(ops_of(g), (Ops{"Pad", "Conv"}));
}

TEST(Fuse, NarrowStride2ConvSplitsIntoOutputPhases) {
  for (int64_t k : {8, 9}) {
    Builder b;
    int x = b.input("x", {2, 3, 20, 24});
    int w = b.constant("w", randn({2, 3, k, k}, 3));
    int bias = b.constant("bias", randn({2}, 4));
    int y = b.node("Conv", {x, w, bias}, {{"strides", attr_ints({2, 2})}, {"pads", attr_ints({3, 4, 4, 3})}});
    Graph g = b.done(y, {2, 3, 20, 24});
    const Shape out = g.values[y].shape;
    Tensor xin = randn({2, 3, 20, 24}, 5);
    Tensor before = run_ref(g, xin);
    split_conv_output_phases(g, false);  // as for bfloat16 (float32 runs such narrow convs by FFT)
    ASSERT_EQ(ops_of(g), (Ops{"Conv", "DepthToSpace"})) << "kernel " << k;
    EXPECT_EQ(g.nodes[0].ints("strides"), (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(shape_str(g.values[g.nodes[0].inputs[1]].shape), shape_str({8, 3, k + 2, k + 2}));
    EXPECT_EQ(shape_str(g.values[g.outputs[0]].shape), shape_str(out));
    // the same products summed in the same order, plus exact zeros
    EXPECT_EQ(max_abs_diff(run_ref(g, xin), before), 0.0) << "kernel " << k;
  }
}

TEST(Fuse, WideOrOddConvIsNotSplit) {
  Builder b;
  int x = b.input("x", {1, 3, 21, 21});
  int w = b.constant("w", randn({16, 3, 8, 8}, 3));  // 16 output channels: no waste to remove
  int y = b.node("Conv", {x, w}, {{"strides", attr_ints({2, 2})}, {"pads", attr_ints({3, 3, 3, 3})}});
  Graph g = b.done(y, {1, 3, 21, 21});
  split_conv_output_phases(g);
  EXPECT_EQ(ops_of(g), (Ops{"Conv"}));
}

// A conv that the CPU kernel runs by FFT (engine/math/fft_conv_plan.h: kernels 32 and 8 at stride
// 2, 4 outputs) is neither split into output phases nor made channels-last; for bfloat16
// inference (fft false: its direct kernel is the faster) it is both.
TEST(Fuse, ConvByFftStaysAsItIs) {
  for (auto [k, fft] : {std::pair<int64_t, bool>{32, true}, {8, true}, {32, false}}) {
    Builder b;
    int x = b.input("x", {1, 8, 96, 96});
    int w = b.constant("w", randn({4, 8, k, k}, 3));
    int y = b.node("Conv", {x, w}, {{"strides", attr_ints({2, 2})}, {"pads", attr_ints({k / 2 - 1, k / 2 - 1, k / 2 - 1, k / 2 - 1})}});
    Graph g = b.done(y, {1, 8, 96, 96});
    split_conv_output_phases(g, fft);
    conv_channels_last(g, fft);
    if (fft)
      EXPECT_EQ(ops_of(g), (Ops{"Conv"}));
    else
      EXPECT_EQ(ops_of(g), (Ops{"Transpose", "ConvChannelsLast", "Transpose", "DepthToSpace"})) << k << " " << fft;
  }
}

TEST(Fuse, SameSizeResizeAndOneInputConcatGo) {
  Builder b;
  int x = b.input("x", {1, 2, 5, 7});
  int sizes = b.constant("sizes", Tensor::from_i64({1, 2, 5, 7}));
  int r = b.node("Resize", {x, -1, -1, sizes}, {{"mode", attr_s("linear")}});
  int c = b.node("Concat", {b.node("Relu", {r})}, {{"axis", attr_i(1)}});
  int y = b.node("Concat", {c, x}, {{"axis", attr_i(1)}});  // two inputs: stays
  Graph g = b.done(y, {1, 2, 5, 7});
  Tensor xin = randn({1, 2, 5, 7}, 1);
  Tensor before = run_ref(g, xin);
  remove_identity_ops(g);
  EXPECT_EQ(ops_of(g), (Ops{"Relu", "Concat"}));
  EXPECT_EQ(max_abs_diff(run_ref(g, xin), before), 0.0);
}

// torch's nn.GELU as exported: Div(x, sqrt2) -> Erf -> Add 1 -> Mul x -> Mul 0.5
int gelu_chain(Builder& b, int x) {
  int d = b.node("Div", {x, b.scalar(1.4142135f)});
  int e = b.node("Erf", {d});
  int a = b.node("Add", {e, b.scalar(1.f)});
  int m = b.node("Mul", {x, a});
  return b.node("Mul", {m, b.scalar(0.5f)});
}

// CREDIT's boundary padding as exported (a 5-D (B, C, T, lat, lon) input): the longitude rolled
// by half (two Slices, a Concat), the pole rows flipped from the rolled field (Slices with step
// -1), stacked above and below (Concat), a one-input Concat, the longitude wrapped (two Slices, a
// Concat), the time dim squeezed; then a layer; then the crop (Slices on two axes). Each chain
// becomes one PlaneGather with the same numbers; so does the mirror padding (a reflect Pad); a
// chain whose intermediate is read elsewhere, or that slices a leading dim, keeps those nodes.
TEST(Fuse, PaddingAndCropChainsBecomePlaneGathers) {
  auto ints = [](std::vector<int64_t> v) { return Tensor::from_i64(v); };
  const Shape xs{2, 3, 1, 9, 16};
  auto build = [&](bool share_roll, bool slice_channels) {
    Builder b;
    int x = b.input("x", xs);
    auto k = [&](int64_t v) { return b.constant("k" + std::to_string(b.g.values.size()), ints({v})); };
    auto slice = [&](int v, int64_t start, int64_t end, int64_t axis, int64_t step) {
      return b.node("Slice", {v, k(start), k(end), k(axis), k(step)});
    };
    const int64_t big = std::numeric_limits<int64_t>::max();
    int rolled = b.node("Concat", {slice(x, -8, big, 4, 1), slice(x, 0, -8, 4, 1)}, {{"axis", attr_i(4)}});
    int top = slice(slice(rolled, 0, 3, 3, 1), -1, -big, 3, -1);
    int bottom = slice(slice(rolled, -3, big, 3, 1), -1, -big, 3, -1);
    int lat = b.node("Concat", {top, x, bottom}, {{"axis", attr_i(3)}});
    int copy = b.node("Concat", {lat}, {{"axis", attr_i(0)}});
    int wrapped = b.node("Concat", {slice(copy, -2, big, 4, 1), copy, slice(copy, 0, 2, 4, 1)}, {{"axis", attr_i(-1)}});
    int sq = b.node("Squeeze", {wrapped, k(2)});
    if (slice_channels) sq = slice(sq, 0, 2, 1, 1);
    int layer = b.node("Relu", {sq});
    int y = slice(slice(layer, 3, 12, 2, 1), 2, 18, 3, 1);
    if (share_roll) y = b.node("Add", {y, b.node("ReduceMean", {rolled}, {{"keepdims", attr_i(0)}})});
    return b.done(y, xs);
  };
  const Tensor x = randn(xs, 7);
  {
    Graph g = build(false, false);
    const Tensor before = run_ref(g, x);
    remove_identity_ops(g);
    fuse_plane_gathers(g);
    ASSERT_EQ(ops_of(g), (Ops{"PlaneGather", "Relu", "PlaneGather"}));
    EXPECT_EQ(g.nodes[0].ints("lead"), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(shape_str(g.values[g.nodes[0].outputs[0]].shape), shape_str({2, 3, 15, 20}));
    const Tensor after = run_ref(g, x);
    ASSERT_EQ(after.shape, before.shape);
    EXPECT_EQ(max_abs_diff(after, before), 0.0);
    // through the fast executor's own pipeline too (optimize_for_cpu takes this pass)
    Executor fast(build(false, false));
    EXPECT_EQ(max_abs_diff(fast.run({{"x", x}})[0], before), 0.0);
  }
  {  // the rolled field also read by another layer: it is a value of its own (one gather), and the
     // chains after it read two sources (x and it): their pieces of one source are gathers
    Graph g = build(true, false);
    const Tensor before = run_ref(g, x);
    remove_identity_ops(g);
    fuse_plane_gathers(g);
    const Ops ops = ops_of(g);
    EXPECT_EQ(ops.front(), "PlaneGather");
    EXPECT_EQ(g.values[g.nodes[0].outputs[0]].shape, xs);
    EXPECT_GE(std::count(ops.begin(), ops.end(), std::string("PlaneGather")), 3);
    EXPECT_EQ(max_abs_diff(run_ref(g, x), before), 0.0);
  }
  {  // CREDIT's mirror padding: the longitude wrapped, the latitude reflected by a Pad; a Pad with
     // a constant fill is not a gather (its zeros come from no element of x)
    for (const char* mode : {"reflect", "constant"}) {
      Builder b;
      int xv = b.input("x", xs);
      auto k = [&](std::vector<int64_t> v) { return b.constant("k" + std::to_string(b.g.values.size()), ints(v)); };
      const int64_t big = std::numeric_limits<int64_t>::max();
      int wrapped = b.node("Concat",
                           {b.node("Slice", {xv, k({-3}), k({big}), k({4}), k({1})}), xv,
                            b.node("Slice", {xv, k({0}), k({3}), k({4}), k({1})})},
                           {{"axis", attr_i(4)}});
      int padded = b.node("Pad", {wrapped, k({0, 0, 0, 2, 0, 0, 0, 0, 2, 0})}, {{"mode", attr_s(mode)}});
      int y = b.node("Relu", {b.node("Squeeze", {padded, k({2})})});
      Graph g = b.done(y, xs);
      const Tensor before = run_ref(g, x);
      fuse_plane_gathers(g);
      const bool reflect = std::string(mode) == "reflect";
      EXPECT_EQ(ops_of(g), reflect ? (Ops{"PlaneGather", "Relu"}) : (Ops{"PlaneGather", "Pad", "Squeeze", "Relu"}))
          << mode;
      EXPECT_EQ(max_abs_diff(run_ref(g, x), before), 0.0) << mode;
    }
  }
  {  // a Slice of the channels (a leading dim) is not a plane's movement
    Graph g = build(false, true);
    const Tensor before = run_ref(g, x);
    remove_identity_ops(g);
    fuse_plane_gathers(g);
    const Ops ops = ops_of(g);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), std::string("Slice")), 1);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), std::string("PlaneGather")), 2);
    EXPECT_EQ(max_abs_diff(run_ref(g, x), before), 0.0);
  }
}

TEST(Fuse, GeluChainBecomesGelu) {
  Builder b;
  int x = b.input("x", {2, 3, 4});
  int y = b.node("Relu", {gelu_chain(b, x)});
  Graph g = b.done(y, {2, 3, 4});
  Tensor xin = randn({2, 3, 4}, 1, 2.f);
  Tensor before = run_ref(g, xin);
  fuse_gelu(g);
  EXPECT_EQ(ops_of(g), (Ops{"Gelu", "Relu"}));
  expect_close(run_ref(g, xin), before, 1e-6, 1e-6);
}

TEST(Fuse, GeluChainWithASharedIntermediateStays) {
  Builder b;
  int x = b.input("x", {2, 3});
  int d = b.node("Div", {x, b.scalar(1.4142135f)});
  int e = b.node("Erf", {d});
  int a = b.node("Add", {e, b.scalar(1.f)});
  int m = b.node("Mul", {x, a});
  int h = b.node("Mul", {m, b.scalar(0.5f)});
  int y = b.node("Add", {h, e});  // the Erf is read outside the pattern
  Graph g = b.done(y, {2, 3});
  fuse_gelu(g);
  EXPECT_EQ(g.nodes.size(), 6u);
}

// CREDIT's channel LayerNorm as exported (two ReduceMean of x, two Subs)
int layernorm_chain(Builder& b, int x, int64_t C) {
  std::map<std::string, Attr> ax{{"axes", attr_ints({1})}, {"keepdims", attr_i(1)}};
  int m0 = b.node("ReduceMean", {x}, ax);
  int s0 = b.node("Sub", {x, m0});
  int sq = b.node("Mul", {s0, s0});
  int var = b.node("ReduceMean", {sq}, ax);
  int m1 = b.node("ReduceMean", {x}, ax);
  int s1 = b.node("Sub", {x, m1});
  int ve = b.node("Add", {var, b.scalar(1e-5f)});
  int sd = b.node("Sqrt", {ve});
  int dv = b.node("Div", {s1, sd});
  int gm = b.node("Mul", {dv, b.constant("g", randn({1, C, 1, 1}, 7))});
  return b.node("Add", {gm, b.constant("b", randn({1, C, 1, 1}, 8))});
}

TEST(Fuse, ChannelLayerNormChainBecomesOneNode) {
  Builder b;
  int x = b.input("x", {2, 5, 3, 4});
  int y = b.node("Relu", {layernorm_chain(b, x, 5)});
  Graph g = b.done(y, {2, 5, 3, 4});
  Tensor xin = randn({2, 5, 3, 4}, 1, 3.f);
  Tensor before = run_ref(g, xin);
  fuse_channel_layernorm(g);
  EXPECT_EQ(ops_of(g), (Ops{"ChannelLayerNorm", "Relu"}));
  EXPECT_FLOAT_EQ(g.nodes[0].f("epsilon", 0), 1e-5f);
  expect_close(run_ref(g, xin), before, 2e-6, 2e-6);
}

TEST(Fuse, LayerNormOverAnotherAxisStays) {
  Builder b;
  int x = b.input("x", {2, 5, 3});
  std::map<std::string, Attr> ax{{"axes", attr_ints({2})}};
  int m0 = b.node("ReduceMean", {x}, ax);
  int s0 = b.node("Sub", {x, m0});
  int sq = b.node("Mul", {s0, s0});
  int var = b.node("ReduceMean", {sq}, ax);
  int sd = b.node("Sqrt", {b.node("Add", {var, b.scalar(1e-5f)})});
  int dv = b.node("Div", {s0, sd});
  int y = b.node("Add", {b.node("Mul", {dv, b.constant("g", randn({3}, 7))}), b.constant("b", randn({3}, 8))});
  Graph g = b.done(y, {2, 5, 3});
  size_t before = g.nodes.size();
  fuse_channel_layernorm(g);
  EXPECT_EQ(g.nodes.size(), before);
}

TEST(Fuse, LinearThenGeluBecomesLinearWithActivation) {
  Builder b;
  int x = b.input("x", {2, 6, 3, 4});
  int w = b.constant("w", randn({8, 6}, 2));
  int bias = b.constant("bias", randn({8}, 3));
  int l = b.node("Linear", {x, w, bias}, {{"axis", attr_i(1)}});
  int y = b.node("Relu", {b.node("Gelu", {l})});
  Graph g = b.done(y, {2, 6, 3, 4});
  Tensor xin = randn({2, 6, 3, 4}, 1);
  Tensor before = run_ref(g, xin);
  fuse_linear_gelu(g);
  EXPECT_EQ(ops_of(g), (Ops{"Linear", "Relu"}));
  EXPECT_EQ(g.nodes[0].s("activation", ""), "gelu");
  EXPECT_EQ(max_abs_diff(run_ref(g, xin), before), 0.0);
}

TEST(Fuse, OptimizeForCpuOnAFeedForwardBlock) {
  // LayerNorm -> Linear -> GELU -> Linear -> residual Add, as in every CREDIT transformer
  Builder b;
  int x = b.input("x", {1, 4, 3, 5});
  int ln = layernorm_chain(b, x, 4);
  int up = b.node("Linear", {ln, b.constant("w1", randn({16, 4}, 2)), b.constant("b1", randn({16}, 3))},
                  {{"axis", attr_i(1)}});
  int down = b.node("Linear", {gelu_chain(b, up), b.constant("w2", randn({4, 16}, 4)), b.constant("b2", randn({4}, 5))},
                    {{"axis", attr_i(1)}});
  int y = b.node("Add", {down, x});
  Graph g = b.done(y, {1, 4, 3, 5});
  Tensor xin = randn({1, 4, 3, 5}, 1);
  Tensor before = run_ref(g, xin);
  optimize_for_cpu(g);
  EXPECT_EQ(ops_of(g), (Ops{"ChannelLayerNorm", "Linear", "Linear", "Add"}));
  expect_close(run_ref(g, xin), before, 1e-5, 1e-5);
}

TEST(Fuse, FastExecutorRunsTheOptimizedCopy) {
  Builder b;
  int x = b.input("x", {2, 3, 4});
  int y = gelu_chain(b, x);
  Graph g = b.done(y, {2, 3, 4});
  Executor fast(g, {0, KernelKind::Fast});
  EXPECT_EQ(ops_of(fast.graph()), (Ops{"Gelu"}));
  EXPECT_EQ(g.nodes.size(), 5u);  // the caller's graph is unchanged
  Executor ref(g, {0, KernelKind::Reference});
  EXPECT_EQ(&ref.graph(), &g);  // the oracle runs the graph as given
  Tensor xin = randn({2, 3, 4}, 1);
  expect_close(fast.run({{"x", xin}})[0], ref.run({{"x", xin}})[0], 1e-6, 1e-6);
}

}  // namespace

namespace {

// CREDIT's window attention as torch.onnx.export writes it (crossformer.py Attention), from
// the image x (B, D, H, W) back to the image, plus the residual Add.
struct AttnSpec {
  int64_t B = 2, D = 8, H = 8, W = 12, heads = 2, th = 2, tw = 3;
  bool strided = false, out_bias = true;
  Shape bias_shape;  // default (1, heads, T, T)
};

Graph attention_graph(const AttnSpec& s) {
  Builder b;
  const int64_t T = s.th * s.tw, I = s.D, dh = I / s.heads, nW = s.B * (s.H / s.th) * (s.W / s.tw);
  auto shape = [&](std::vector<int64_t> v) { return b.constant("shape" + std::to_string(b.g.values.size()), Tensor::from_i64(v)); };
  int x = b.input("x", {s.B, s.D, s.H, s.W});
  const std::vector<int64_t> perm = s.strided ? std::vector<int64_t>{0, 3, 5, 1, 2, 4} : std::vector<int64_t>{0, 2, 4, 1, 3, 5};
  const std::vector<int64_t> six = s.strided ? std::vector<int64_t>{s.B, s.D, s.th, s.H / s.th, s.tw, s.W / s.tw}
                                             : std::vector<int64_t>{s.B, s.D, s.H / s.th, s.th, s.W / s.tw, s.tw};
  int r6 = b.node("Reshape", {x, shape(six)});
  int tr = b.node("Transpose", {r6}, {{"perm", attr_ints(perm)}});
  int x3 = b.node("Reshape", {tr, shape({nW, s.D, s.th, s.tw})});
  int heads_qkv[3];
  for (int m = 0; m < 3; ++m) {
    int l = b.node("Linear", {x3, b.constant("w" + std::to_string(m), randn({I, s.D}, 10 + m, 0.5f))},
                   {{"axis", attr_i(1)}});
    int a = b.node("Reshape", {l, shape({nW, s.heads, dh, s.th, s.tw})});
    int t = b.node("Transpose", {a}, {{"perm", attr_ints({0, 1, 3, 4, 2})}});
    heads_qkv[m] = b.node("Reshape", {t, shape({nW, s.heads, T, dh})});
  }
  int qs = b.node("Mul", {heads_qkv[0], b.scalar(1.f / std::sqrt((float)dh))});
  int sc = b.node("Einsum", {qs, heads_qkv[1]}, {{"equation", attr_s("b h i d, b h j d -> b h i j")}});
  Shape bs = s.bias_shape.empty() ? Shape{1, s.heads, T, T} : s.bias_shape;
  int sb = b.node("Add", {sc, b.constant("pos_bias", randn(bs, 20))});
  int p = b.node("Softmax", {sb}, {{"axis", attr_i(-1)}});
  int o = b.node("Einsum", {p, heads_qkv[2]}, {{"equation", attr_s("b h i j, b h j d -> b h i d")}});
  int o1 = b.node("Reshape", {o, shape({nW, s.heads, s.th, s.tw, dh})});
  int o2 = b.node("Transpose", {o1}, {{"perm", attr_ints({0, 1, 4, 2, 3})}});
  int o3 = b.node("Reshape", {o2, shape({nW, I, s.th, s.tw})});
  std::vector<int> lin_in{o3, b.constant("wo", randn({s.D, I}, 30, 0.5f))};
  if (s.out_bias) lin_in.push_back(b.constant("bo", randn({s.D}, 31)));
  int y = b.node("Linear", lin_in, {{"axis", attr_i(1)}});
  std::vector<int64_t> inv(6);
  for (int i = 0; i < 6; ++i) inv[perm[i]] = i;
  Shape x2(6);
  for (int i = 0; i < 6; ++i) x2[i] = six[perm[i]];
  int y6 = b.node("Reshape", {y, shape(x2)});
  int yt = b.node("Transpose", {y6}, {{"perm", attr_ints(inv)}});
  int yi = b.node("Reshape", {yt, shape({s.B, s.D, s.H, s.W})});
  int out = b.node("Add", {yi, x});
  return b.done(out, {s.B, s.D, s.H, s.W});
}

void check_attention(const AttnSpec& s) {
  Graph g = attention_graph(s);
  Tensor x = randn({s.B, s.D, s.H, s.W}, 1);
  Tensor before = run_ref(g, x);
  fuse_window_attention(g);
  ASSERT_EQ(ops_of(g), (Ops{"WindowAttention"}));
  const Node& n = g.nodes[0];
  EXPECT_EQ(n.i("heads", 0), s.heads);
  EXPECT_EQ(n.ints("window"), (std::vector<int64_t>{s.th, s.tw}));
  EXPECT_EQ(n.i("strided", -1), s.strided ? 1 : 0);
  Tensor ref = run_ref(g, x);
  expect_close(ref, before, 1e-5, 1e-5);  // the fused op equals the exported subgraph
  Executor fast(g, {0, KernelKind::Fast});
  expect_close(fast.run({{"x", x}})[0], ref, 1e-5, 1e-5);  // oneDNN / loop kernel equals the oracle
}

TEST(Fuse, WindowAttentionContiguousWindows) { check_attention({}); }

TEST(Fuse, WindowAttentionStridedWindowsOfManyTokens) {
  AttnSpec s;
  s.strided = true;
  s.th = 4;
  s.tw = 3;  // 12 tokens: batched matmuls
  s.bias_shape = {s.heads, 12, 12};
  check_attention(s);
}

TEST(Fuse, WindowAttentionManyChunksNoOutputBias) {
  AttnSpec s;
  s.B = 1;
  s.D = 4;
  s.heads = 1;
  s.H = 96;
  s.W = 96;
  s.th = s.tw = 4;  // 576 windows of 16 tokens: two chunks
  s.out_bias = false;
  s.bias_shape = {16, 16};
  check_attention(s);
}

TEST(Fuse, WindowAttentionOneTokenWindows) {
  AttnSpec s;
  s.strided = true;
  s.th = s.tw = 1;
  check_attention(s);
}

TEST(Fuse, AttentionWithABiasPerWindowIsNotFused) {
  AttnSpec s;
  s.bias_shape = {2 * 4 * 4, 2, 6, 6};  // differs per window: not what the fused op supports
  Graph g = attention_graph(s);
  size_t before = g.nodes.size();
  fuse_window_attention(g);
  EXPECT_EQ(g.nodes.size(), before);
}

}  // namespace

namespace {

TEST(Fuse, ConvsGoChannelsLastSharingTheInputTranspose) {
  Builder b;
  int x = b.input("x", {1, 3, 12, 16});
  std::map<std::string, Attr> a{{"pads", attr_ints({2, 2, 2, 2})}, {"dilations", attr_ints({2, 2})}};
  int c1 = b.node("Conv", {x, b.constant("w1", randn({4, 3, 3, 3}, 2))}, a);
  int c2 = b.node("Conv", {x, b.constant("w2", randn({4, 3, 3, 3}, 3)), b.constant("b2", randn({4}, 4))}, a);
  int p = b.node("Conv", {c1, b.constant("w3", randn({4, 4, 1, 1}, 5))});  // 1x1: stays plain
  int y = b.node("Add", {p, c2});
  Graph g = b.done(y, {1, 3, 12, 16});
  Tensor xin = randn({1, 3, 12, 16}, 1);
  Tensor before = run_ref(g, xin);
  conv_channels_last(g);
  EXPECT_EQ(ops_of(g), (Ops{"Transpose", "ConvChannelsLast", "Transpose", "ConvChannelsLast", "Transpose", "Conv", "Add"}));
  expect_close(run_ref(g, xin), before, 1e-6, 1e-6);
}

// 3x3 stride-1 convs stay NCHW (their CPU kernel, conv_winograd.h, reorders into its own
// blocked layout from either); a 3x3 stride-2 conv goes channels-last.
TEST(Fuse, ThreeByThreeStrideOneConvsStayChannelsFirst) {
  Builder b;
  int x = b.input("x", {1, 3, 12, 16});
  int c1 = b.node("Conv", {x, b.constant("w1", randn({4, 3, 3, 3}, 2))}, {{"pads", attr_ints({1, 1, 1, 1})}});
  int c2 = b.node("Conv", {c1, b.constant("w2", randn({4, 4, 3, 3}, 3))},
                  {{"pads", attr_ints({1, 1, 1, 1})}, {"strides", attr_ints({2, 2})}});
  Graph g = b.done(c2, {1, 3, 12, 16});
  Tensor xin = randn({1, 3, 12, 16}, 1);
  Tensor before = run_ref(g, xin);
  conv_channels_last(g);
  EXPECT_EQ(ops_of(g), (Ops{"Conv", "Transpose", "ConvChannelsLast", "Transpose"}));
  expect_close(run_ref(g, xin), before, 1e-6, 1e-6);
}

// ------------------------------------------------------------------ executor memory plan

TEST(ExecutorPlan, ValuesAliveTogetherNeverShareBytes) {
  // a long-lived value read at the end, short-lived ones around it, views and two outputs
  Builder b;
  int x = b.input("x", {4, 8});
  int a = b.node("Relu", {x});
  int t = a;
  for (int i = 0; i < 6; ++i) t = b.node(i % 2 ? "Neg" : "Sigmoid", {t});
  int shp = b.constant("shape", Tensor::from_i64({8, 4}));
  int v = b.node("Reshape", {t, shp});
  int v2 = b.node("Reshape", {v, b.constant("shape2", Tensor::from_i64({4, 8}))});
  int y = b.node("Add", {v2, a});
  int z = b.node("Mul", {y, a});
  Graph g = b.done(z, {4, 8});
  g.outputs.push_back(v);  // an output that is a view of an intermediate
  Tensor xin = randn({4, 8}, 1);
  Executor fast(g, {1, KernelKind::Fast});
  std::vector<Tensor> first = fast.run({{"x", xin}});
  std::vector<Tensor> ref = Executor(g, {1, KernelKind::Reference}).run({{"x", xin}});
  ASSERT_EQ(first.size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(max_abs_diff(first[k], ref[k]), 0.0);
  // a second run on other data leaves the first run's outputs alone
  Tensor first_z = first[0].clone();
  std::vector<Tensor> second = fast.run({{"x", randn({4, 8}, 2)}});
  EXPECT_EQ(max_abs_diff(first[0], first_z), 0.0);
  EXPECT_GT(max_abs_diff(second[0], first_z), 0.0);
  // 8 intermediates of 128 bytes: at most 3 are alive at once (a, the chain's current two)
  EXPECT_LE(fast.peak_activation_bytes(), 3 * 128u + 2 * 128u);
}

}  // namespace

namespace {

TEST(Fuse, PixelShuffleBetweenChannelsLastConvsStaysChannelsLast) {
  for (const char* mode : {"CRD", "DCR"}) {
    Builder b;
    int x = b.input("x", {1, 3, 5, 6});
    std::map<std::string, Attr> a{{"pads", attr_ints({2, 2, 2, 2})}, {"dilations", attr_ints({2, 2})}};
    int c1 = b.node("Conv", {x, b.constant("w1", randn({8, 3, 3, 3}, 2))}, a);
    int d = b.node("DepthToSpace", {c1}, {{"blocksize", attr_i(2)}, {"mode", attr_s(mode)}});
    int y = b.node("Conv", {d, b.constant("w2", randn({3, 2, 3, 3}, 3))}, a);
    Graph g = b.done(y, {1, 3, 5, 6});
    Tensor xin = randn({1, 3, 5, 6}, 1);
    Tensor before = run_ref(g, xin);
    conv_channels_last(g);
    depth_to_space_channels_last(g);
    EXPECT_EQ(ops_of(g), (Ops{"Transpose", "ConvChannelsLast", "DepthToSpaceChannelsLast", "ConvChannelsLast",
                              "Transpose"}))
        << mode;
    expect_close(run_ref(g, xin), before, 1e-6, 1e-6);
  }
}

}  // namespace

namespace {

TEST(Fuse, DynamoStyleGeluAndLayerNormAreFusedToo) {
  // the dynamo exporter: x * (0.5 * (1 + erf(x / sqrt 2))); the variance as ReduceMean
  // keepdims 0 and a Reshape back; one Sub shared by the square and the numerator
  Builder b;
  int x = b.input("x", {1, 4, 3, 5});
  int m = b.node("ReduceMean", {x}, {{"axes", attr_ints({1})}});
  int d = b.node("Sub", {x, m});
  int var = b.node("ReduceMean", {b.node("Mul", {d, d})}, {{"axes", attr_ints({1})}, {"keepdims", attr_i(0)}});
  int var4 = b.node("Reshape", {var, b.constant("s", Tensor::from_i64({1, 1, 3, 5}))});
  int sd = b.node("Sqrt", {b.node("Add", {var4, b.scalar(1e-5f)})});
  int ln = b.node("Add", {b.node("Mul", {b.node("Div", {d, sd}), b.constant("g", randn({4, 1, 1}, 7))}),
                          b.constant("bb", randn({4, 1, 1}, 8))});
  int e = b.node("Erf", {b.node("Div", {ln, b.scalar(1.4142135f)})});
  int half = b.node("Mul", {b.scalar(0.5f), b.node("Add", {e, b.scalar(1.f)})});
  int y = b.node("Mul", {ln, half});
  Graph g = b.done(y, {1, 4, 3, 5});
  Tensor xin = randn({1, 4, 3, 5}, 1, 2.f);
  Tensor before = run_ref(g, xin);
  fuse_gelu(g);
  fuse_channel_layernorm(g);
  EXPECT_EQ(ops_of(g), (Ops{"ChannelLayerNorm", "Gelu"}));
  expect_close(run_ref(g, xin), before, 2e-6, 2e-6);
}

}  // namespace

// A crop after the last convolutions (CREDIT's decoder: Conv -> DepthToSpace -> Conv -> crop):
// each Conv is marked with the rows its readers read, the kernel computes those (zero the
// others), and the model's output is the reference's.
TEST(Fuse, CroppedConvsComputeTheRowsRead) {
  const Shape xs{1, 32, 40, 48};
  auto build = [&] {
    Builder b;
    int x = b.input("x", xs);
    auto k = [&](int64_t v) { return b.constant("k" + std::to_string(b.g.values.size()), Tensor::from_i64({v})); };
    const std::vector<std::pair<std::string, Attr>> pads{{"pads", attr_ints({1, 1, 1, 1})}};
    int a = b.node("Conv", {x, b.constant("wa", randn({128, 32, 3, 3}, 3)), b.constant("ba", randn({128}, 4))},
                   {pads.begin(), pads.end()});
    int d = b.node("DepthToSpace", {a}, {{"blocksize", attr_i(2)}});
    int c = b.node("Conv", {d, b.constant("wb", randn({32, 32, 3, 3}, 5))}, {pads.begin(), pads.end()});
    int rows = b.node("Slice", {c, k(11), k(60), k(2), k(1)});
    return b.done(b.node("Slice", {rows, k(5), k(90), k(3), k(1)}), xs);
  };
  const Tensor x = randn(xs, 6);
  Graph g = build();
  const Tensor ref = run_ref(g, x);
  optimize_for_cpu(g);
  std::vector<std::vector<int64_t>> marked;
  for (const Node& n : g.nodes)
    if (n.op == "Conv") marked.push_back(n.ints("rows"));
  // the last conv: the crop's rows 11..59; the first: the rows DepthToSpace takes for rows 10..60
  ASSERT_EQ(marked.size(), 2u);
  EXPECT_EQ(marked[0], (std::vector<int64_t>{5, 31}));
  EXPECT_EQ(marked[1], (std::vector<int64_t>{11, 60}));
  Executor fast(build());
  const Tensor y = fast.run({{"x", x}})[0];
  ASSERT_EQ(y.shape, ref.shape);
  EXPECT_LT(rel_l2(y, ref), 2e-6);
  // the kernel alone: the marked rows as the whole conv's, the others zero
  Node n = make_node("Conv", 2, 1, {{"pads", attr_ints({1, 1, 1, 1})}, {"rows", attr_ints({7, 30})}});
  const Tensor xi = randn({1, 32, 80, 96}, 8), w = randn({32, 32, 3, 3}, 9);
  const Tensor part = run_node(n, {&xi, &w}, KernelKind::Fast)[0];
  n.attrs.erase("rows");
  const Tensor whole = run_node(n, {&xi, &w}, KernelKind::Reference)[0];
  const int64_t plane = 80 * 96;
  double inside = 0, norm = 0, outside = 0;
  for (int64_t c = 0; c < 32; ++c)
    for (int64_t i = 0; i < plane; ++i) {
      const int64_t e = c * plane + i, r = i / 96;
      const double d = part.data<float>()[e] - whole.data<float>()[e];
      if (r >= 7 && r < 30) {
        inside += d * d;
        norm += (double)whole.data<float>()[e] * whole.data<float>()[e];
      } else {
        outside = std::max(outside, std::abs((double)part.data<float>()[e]));
      }
    }
  EXPECT_LT(std::sqrt(inside / norm), 2e-6);
  EXPECT_EQ(outside, 0.0);
}
