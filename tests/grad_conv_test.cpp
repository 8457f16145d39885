// Conv and ConvTranspose backward: gradient cases for the finite-difference harness
// (tests/grad_check.h; the registered backward, i.e. the oneDNN path where it applies), the
// reference loops against the same finite differences, and the oneDNN path against the
// reference loops on CrossFormer-like shapes.
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/backward_conv.h"
#include "kernels/cpu/conv_fft.h"
#include "kernels/cpu/conv_s2d.h"
#include "kernels/cpu/conv_small_oc.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {

namespace {

using Attrs = std::map<std::string, Attr>;

// x, w and an optional bias (bias_len 0: none).
std::vector<Tensor> conv_inputs(Shape x, Shape w, int64_t bias_len, unsigned seed) {
  std::vector<Tensor> v{randn(std::move(x), seed), randn(std::move(w), seed + 1, 0.5f)};
  if (bias_len > 0) v.push_back(randn({bias_len}, seed + 2));
  return v;
}

Attrs pads2(int64_t h0, int64_t w0, int64_t h1, int64_t w1) { return {{"pads", attr_ints({h0, w0, h1, w1})}}; }

Attrs with(Attrs a, const std::string& k, Attr v) {
  a[k] = std::move(v);
  return a;
}

}  // namespace

GRAD_CASES("Conv") {
  const Attr s2 = attr_ints({2, 2});
  return {
      grad_case("Conv 3x3 stride 1 pad 1 bias", "Conv", conv_inputs({1, 3, 5, 6}, {4, 3, 3, 3}, 4, 1), pads2(1, 1, 1, 1)),
      grad_case("Conv 3x3 stride 2 pad 1 batch 2", "Conv", conv_inputs({2, 2, 7, 6}, {3, 2, 3, 3}, 0, 2),
                with(pads2(1, 1, 1, 1), "strides", s2)),
      grad_case("Conv 1x1 bias", "Conv", conv_inputs({2, 4, 3, 3}, {5, 4, 1, 1}, 5, 3)),
      grad_case("Conv 4x4 stride 4 bias", "Conv", conv_inputs({1, 2, 8, 8}, {3, 2, 4, 4}, 3, 4),
                {{"strides", attr_ints({4, 4})}}),
      // CREDIT cross-embed: kernel k, stride 2, padding (k - 2) / 2
      grad_case("Conv cross-embed k4 s2", "Conv", conv_inputs({1, 2, 8, 8}, {2, 2, 4, 4}, 2, 5),
                with(pads2(1, 1, 1, 1), "strides", s2)),
      grad_case("Conv cross-embed k8 s2", "Conv", conv_inputs({1, 1, 10, 10}, {2, 1, 8, 8}, 0, 6),
                with(pads2(3, 3, 3, 3), "strides", s2)),
      // stride 2 with a leftover row/column that no output reads (its gradient is zero)
      grad_case("Conv asymmetric pads stride 2", "Conv", conv_inputs({1, 2, 6, 7}, {2, 2, 3, 2}, 2, 7),
                with(pads2(0, 1, 2, 1), "strides", s2)),
      grad_case("Conv dilation 2", "Conv", conv_inputs({1, 2, 7, 7}, {3, 2, 3, 3}, 0, 8),
                with(pads2(2, 2, 2, 2), "dilations", attr_ints({2, 2}))),
      grad_case("Conv group 2 bias", "Conv", conv_inputs({1, 4, 5, 5}, {6, 2, 3, 3}, 6, 9),
                with(pads2(1, 1, 1, 1), "group", attr_i(2))),
      grad_case("Conv depthwise stride 2", "Conv", conv_inputs({1, 3, 6, 6}, {3, 1, 3, 3}, 3, 10),
                with(with(pads2(1, 1, 1, 1), "group", attr_i(3)), "strides", s2)),
      grad_case("Conv 1-D stride 2 bias", "Conv", conv_inputs({2, 3, 9}, {4, 3, 3}, 4, 11),
                {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 0})}}),
      grad_case("Conv auto_pad SAME_UPPER stride 2", "Conv", conv_inputs({1, 2, 7, 6}, {2, 2, 3, 3}, 0, 12),
                {{"auto_pad", attr_s("SAME_UPPER")}, {"strides", s2}}),
      grad_case("Conv auto_pad SAME_LOWER 2x2", "Conv", conv_inputs({1, 2, 5, 5}, {2, 2, 2, 2}, 2, 13),
                {{"auto_pad", attr_s("SAME_LOWER")}}),
      grad_case("Conv 3-D", "Conv", conv_inputs({1, 2, 3, 4, 4}, {2, 2, 2, 3, 3}, 2, 14),
                {{"strides", attr_ints({1, 2, 1})}, {"pads", attr_ints({0, 1, 1, 1, 0, 1})}}),
  };
}

GRAD_CASES("ConvTranspose") {
  const Attr s2 = attr_ints({2, 2});
  return {
      grad_case("ConvTranspose stride 2 kernel 2 bias", "ConvTranspose", conv_inputs({1, 3, 4, 5}, {3, 2, 2, 2}, 2, 21),
                {{"strides", s2}}),
      grad_case("ConvTranspose stride 2 kernel 3 output_padding 1", "ConvTranspose",
                conv_inputs({1, 2, 4, 4}, {2, 3, 3, 3}, 3, 22),
                with(with(pads2(1, 1, 1, 1), "strides", s2), "output_padding", attr_ints({1, 1}))),
      grad_case("ConvTranspose 3x3 group 2", "ConvTranspose", conv_inputs({1, 4, 4, 4}, {4, 2, 3, 3}, 0, 23),
                with(pads2(1, 1, 1, 1), "group", attr_i(2))),
      grad_case("ConvTranspose depthwise stride 2", "ConvTranspose", conv_inputs({1, 3, 3, 4}, {3, 1, 2, 2}, 3, 24),
                {{"strides", s2}, {"group", attr_i(3)}}),
      grad_case("ConvTranspose dilation 2 stride 2", "ConvTranspose", conv_inputs({1, 2, 3, 3}, {2, 2, 3, 3}, 0, 25),
                {{"strides", s2}, {"dilations", attr_ints({2, 2})}}),
      grad_case("ConvTranspose asymmetric pads", "ConvTranspose", conv_inputs({1, 2, 4, 3}, {2, 2, 3, 3}, 2, 26),
                with(pads2(0, 2, 1, 0), "strides", s2)),
      // output_shape above the natural size: negative end pads (the loops handle it)
      grad_case("ConvTranspose output_shape", "ConvTranspose", conv_inputs({1, 2, 3, 4}, {2, 2, 3, 3}, 0, 27),
                {{"strides", s2}, {"output_shape", attr_ints({8, 10})}}),
      grad_case("ConvTranspose auto_pad SAME_UPPER", "ConvTranspose", conv_inputs({1, 2, 3, 3}, {2, 2, 3, 3}, 2, 28),
                {{"strides", s2}, {"auto_pad", attr_s("SAME_UPPER")}}),
      grad_case("ConvTranspose 1-D", "ConvTranspose", conv_inputs({2, 3, 5}, {3, 2, 4}, 2, 29),
                {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 1})}}),
  };
}

namespace {

void reference_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
                        const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  cpu::conv_backward(n, in, out, gout, gin, KernelKind::Reference);
}

// The reference loops are the oracle of the fast path: check them against finite
// differences on every case above (the harness itself checks the registered backward).
TEST(ConvBackward, ReferenceLoopsMatchFiniteDifferences) {
  register_cpu_kernels();
  std::string failures;
  int cases = 0;
  for (const char* op : {"Conv", "ConvTranspose"}) {
    BackwardFn saved = backward_kernel(op);
    register_backward(op, reference_backward);
    auto range = grad_case_registry().equal_range(op);
    for (auto it = range.first; it != range.second; ++it)
      for (GradCase c : it->second()) {
        c.max_probes = 24;  // fewer than the harness: the loops are also checked against oneDNN below
        failures += check_grad(c);
        ++cases;
      }
    register_backward(op, saved);
  }
  EXPECT_EQ(failures, "");
  EXPECT_GE(cases, 20);
}

struct Grads {
  std::vector<Tensor> t;  // one per input; undefined = not wanted
  bool dnnl = false;
};

// Runs the backward of node n on the chosen path; gradients start as NaN so that an element
// the kernel does not write shows up.
Grads backward(const Node& n, const std::vector<Tensor>& x, const Tensor& y, const Tensor* dy,
               const std::vector<bool>& want, KernelKind kind) {
  Grads g;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> gin;
  for (size_t i = 0; i < x.size(); ++i) {
    in.push_back(&x[i]);
    g.t.emplace_back();
    if (want[i]) {
      g.t[i] = Tensor(DType::F32, x[i].shape);
      std::fill(g.t[i].data<float>(), g.t[i].data<float>() + g.t[i].numel(), std::numeric_limits<float>::quiet_NaN());
    }
  }
  for (size_t i = 0; i < x.size(); ++i) gin.push_back(want[i] ? &g.t[i] : nullptr);
  g.dnnl = cpu::conv_backward(n, in, {&y}, {dy}, gin, kind);
  return g;
}

struct FastCase {
  std::string label, op;
  Shape x, w;
  int64_t bias;  // bias length, 0: none
  Attrs attrs;
  bool dnnl = true;  // the fast path is expected to take it
};

// Case c on a kernel of the fast path (`takes`: that kernel takes its geometry) against the
// reference kernel and loops: the forward, then each subset of gradients (flags per input,
// false past the end) computed alone.
void expect_path_matches_reference(const FastCase& c, unsigned seed, bool (*takes)(const cpu::ConvGeom&),
                                   const std::vector<std::vector<bool>>& subsets) {
  std::vector<Tensor> x = conv_inputs(c.x, c.w, c.bias, seed);
  std::vector<const Tensor*> px;
  for (auto& t : x) px.push_back(&t);
  Node n = make_node(c.op, (int)x.size(), 1, c.attrs);
  EXPECT_TRUE(takes(cpu::conv_geometry(n, c.x, c.w, false)));
  Tensor y = run_node(n, px)[0], yf = run_node(n, px, KernelKind::Fast)[0];
  EXPECT_LT(rel_l2(yf, y), 1e-5) << "forward";
  EXPECT_LT(max_abs_diff(yf, y), 1e-3) << "forward";
  Tensor dy = randn(y.shape, seed + 1);
  const std::vector<bool> all(x.size(), true);
  Grads ref = backward(n, x, y, &dy, all, KernelKind::Reference);
  for (std::vector<bool> want : subsets) {
    want.resize(x.size());
    Grads fast = backward(n, x, y, &dy, want, KernelKind::Fast);
    EXPECT_TRUE(fast.dnnl);
    for (size_t i = 0; i < x.size(); ++i)
      if (want[i]) {
        EXPECT_LT(rel_l2(fast.t[i], ref.t[i]), 1e-5) << "gradient of input " << i;
        EXPECT_LT(max_abs_diff(fast.t[i], ref.t[i]), 1e-3) << "gradient of input " << i;
      }
  }
}

// precision = "bf16" (finetune --precision bf16): Conv backward-data and backward-weights
// multiply in bfloat16 with float32 accumulation. Against the float32 reference loops: within
// bfloat16's rounding (1e-2 relative L2; about 2.5e-3 seen), and visibly apart from the float32
// fast path (bfloat16 really ran). What stays float32: the bias gradient; ConvTranspose (as in
// the forward); the weight gradient of the few-output-channel wide-kernel convs
// (conv_small_oc.h, float32 AVX loops).
TEST(ConvBackward, Bf16NearReferenceLoops) {
  register_cpu_kernels();
  if (!cpu::native_bf16())
    GTEST_SKIP() << "needs native bfloat16 products (avx512_bf16 or AMX), oneDNN ISA here: " << cpu::isa_name()
                 << "; ConvBackward.Bf16WithoutNativeProductsIsFloat32 checks the float32 that runs instead";
  const Attr s2 = attr_ints({2, 2});
  struct Case {
    std::string label, op;
    Shape x, w;
    int64_t bias;
    Attrs attrs;
    bool dx16, dw16;  // expected in bfloat16
  };
  const std::vector<Case> cases = {
      {"3x3 pad 1 bias", "Conv", {2, 16, 12, 20}, {24, 16, 3, 3}, 24, pads2(1, 1, 1, 1), true, true},
      {"3x3 pad 1, 64 channels", "Conv", {1, 64, 12, 16}, {64, 64, 3, 3}, 64, pads2(1, 1, 1, 1), true, true},
      {"cross-embed k4 s2", "Conv", {1, 4, 16, 20}, {8, 4, 4, 4}, 8, with(pads2(1, 1, 1, 1), "strides", s2), true, true},
      {"cross-embed k8 s2", "Conv", {1, 32, 16, 20}, {16, 32, 8, 8}, 0, with(pads2(3, 3, 3, 3), "strides", s2), true,
       true},
      {"cross-embed k16 s2, 4 outputs (dW: small_oc, float32)", "Conv", {1, 3, 32, 32}, {4, 3, 16, 16}, 4,
       {{"strides", s2}}, true, false},
      {"1x1 bias", "Conv", {1, 32, 8, 10}, {48, 32, 1, 1}, 48, {}, true, true},
      {"1x1 batch 2", "Conv", {2, 64, 6, 10}, {32, 64, 1, 1}, 0, {}, true, true},
      {"T stride 2 kernel 2 (float32)", "ConvTranspose", {1, 16, 8, 10}, {16, 8, 2, 2}, 8, {{"strides", s2}}, false,
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + " " + c.label);
    std::vector<Tensor> x = conv_inputs(c.x, c.w, c.bias, 50);
    std::vector<const Tensor*> px;
    for (auto& t : x) px.push_back(&t);
    Node n = make_node(c.op, (int)x.size(), 1, c.attrs);
    Node n16 = n;
    n16.attrs["precision"] = attr_s("bf16");
    Tensor y = run_node(n, px)[0];
    Tensor dy = randn(y.shape, 51);
    const std::vector<bool> all(x.size(), true);
    Grads ref = backward(n, x, y, &dy, all, KernelKind::Reference);
    Grads f32 = backward(n, x, y, &dy, all, KernelKind::Fast);
    Grads b16 = backward(n16, x, y, &dy, all, KernelKind::Fast);
    EXPECT_TRUE(b16.dnnl);
    {  // the forward: bfloat16 for Conv (the small_oc convs too), float32 for ConvTranspose
      const double e16 = rel_l2(run_node(n16, px, KernelKind::Fast)[0], y);
      if (c.dx16) {
        EXPECT_LT(e16, 1e-2) << "forward";
        EXPECT_GT(e16, 1e-4) << "forward: bfloat16 did not run";
      } else {
        EXPECT_LT(e16, 1e-5) << "forward";
      }
    }
    for (size_t i = 0; i < x.size(); ++i) {
      const double e16 = rel_l2(b16.t[i], ref.t[i]), e32 = rel_l2(f32.t[i], ref.t[i]);
      const bool in_bf16 = i == 0 ? c.dx16 : i == 1 ? c.dw16 : false;
      if (in_bf16) {
        EXPECT_LT(e16, 1e-2) << "gradient of input " << i;
        EXPECT_GT(e16, 1e-4) << "gradient of input " << i << ": bfloat16 did not run";
        EXPECT_GT(e16, 20 * e32) << "gradient of input " << i;
      } else {  // float32 (the float32 fast path may take another kernel: FFT for the small_oc case)
        EXPECT_LT(e16, 1e-5) << "gradient of input " << i << " should be float32";
      }
      std::printf("Conv bf16 %s: gradient of input %zu rel_l2 %.2e (float32 fast path %.2e)\n", c.label.c_str(), i,
                  e16, e32);
    }
    // dx alone and dW alone take the same path
    for (const std::vector<bool>& want : {std::vector<bool>{true, false}, std::vector<bool>{false, true}}) {
      std::vector<bool> w = want;
      w.resize(x.size(), false);
      Grads some = backward(n16, x, y, &dy, w, KernelKind::Fast);
      for (size_t i = 0; i < 2; ++i)
        if (w[i]) {
          EXPECT_EQ(max_abs_diff(some.t[i], b16.t[i]), 0.0) << "gradient of input " << i << " alone";
        }
    }
  }
}

// oneDNN's backward against the reference loops on shapes like the CrossFormer's.
TEST(ConvBackward, FastPathMatchesReferenceLoops) {
  register_cpu_kernels();
  const Attr s2 = attr_ints({2, 2});
  const std::vector<FastCase> cases = {
      {"3x3 pad 1 bias", "Conv", {2, 16, 12, 20}, {24, 16, 3, 3}, 24, pads2(1, 1, 1, 1)},
      {"1x1 bias", "Conv", {1, 32, 8, 10}, {48, 32, 1, 1}, 48, {}},
      {"1x1 no bias", "Conv", {2, 8, 5, 7}, {12, 8, 1, 1}, 0, {}},
      {"4x4 stride 4", "Conv", {1, 3, 16, 24}, {8, 3, 4, 4}, 8, {{"strides", attr_ints({4, 4})}}},
      {"cross-embed k4 s2", "Conv", {1, 4, 16, 20}, {8, 4, 4, 4}, 8, with(pads2(1, 1, 1, 1), "strides", s2)},
      {"cross-embed k8 s2", "Conv", {1, 4, 16, 20}, {8, 4, 8, 8}, 0, with(pads2(3, 3, 3, 3), "strides", s2)},
      {"cross-embed k16 s2", "Conv", {1, 3, 32, 32}, {4, 3, 16, 16}, 4, with(pads2(7, 7, 7, 7), "strides", s2)},
      {"cross-embed k32 s2", "Conv", {1, 2, 40, 40}, {2, 2, 32, 32}, 0, with(pads2(15, 15, 15, 15), "strides", s2)},
      {"asymmetric pads stride 2, leftover", "Conv", {1, 5, 11, 10}, {6, 5, 3, 2}, 6, with(pads2(0, 1, 2, 1), "strides", s2)},
      {"dilation 2", "Conv", {1, 8, 9, 9}, {8, 8, 3, 3}, 0, with(pads2(2, 2, 2, 2), "dilations", attr_ints({2, 2}))},
      {"group 2", "Conv", {1, 8, 9, 10}, {12, 4, 3, 3}, 12, with(pads2(1, 1, 1, 1), "group", attr_i(2))},
      {"depthwise stride 2", "Conv", {2, 16, 10, 10}, {16, 1, 3, 3}, 16,
       with(with(pads2(1, 1, 1, 1), "group", attr_i(16)), "strides", s2)},
      {"1-D", "Conv", {2, 6, 17}, {8, 6, 3}, 8, {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 1})}}},
      {"3-D", "Conv", {1, 4, 4, 6, 6}, {4, 4, 2, 3, 3}, 4, {{"pads", attr_ints({0, 1, 1, 1, 1, 1})}}},
      {"T stride 2 kernel 2 bias", "ConvTranspose", {1, 16, 8, 10}, {16, 8, 2, 2}, 8, {{"strides", s2}}},
      {"T stride 2 kernel 3 output_padding", "ConvTranspose", {2, 8, 6, 5}, {8, 6, 3, 3}, 6,
       with(with(pads2(1, 1, 1, 1), "strides", s2), "output_padding", attr_ints({1, 1}))},
      {"T group 2 kernel 4 stride 2", "ConvTranspose", {1, 8, 5, 6}, {8, 3, 4, 4}, 0,
       with(with(pads2(1, 1, 1, 1), "group", attr_i(2)), "strides", s2)},
      {"T output_shape (negative pads: loops)", "ConvTranspose", {1, 4, 3, 4}, {4, 2, 3, 3}, 0,
       {{"strides", s2}, {"output_shape", attr_ints({8, 10})}}, false},
  };
  for (const FastCase& c : cases) {
    SCOPED_TRACE(c.op + " " + c.label);
    std::vector<Tensor> x = conv_inputs(c.x, c.w, c.bias, 40);
    std::vector<const Tensor*> px;
    for (auto& t : x) px.push_back(&t);
    Node n = make_node(c.op, (int)x.size(), 1, c.attrs);
    Tensor y = run_node(n, px)[0];
    Tensor dy = randn(y.shape, 41);
    const std::vector<bool> all(x.size(), true);
    Grads ref = backward(n, x, y, &dy, all, KernelKind::Reference);
    Grads fast = backward(n, x, y, &dy, all, KernelKind::Fast);
    EXPECT_FALSE(ref.dnnl);
    EXPECT_EQ(fast.dnnl, c.dnnl);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_LT(rel_l2(fast.t[i], ref.t[i]), 1e-5) << "gradient of input " << i;
      EXPECT_LT(max_abs_diff(fast.t[i], ref.t[i]), 1e-3) << "gradient of input " << i;
    }
    // some gradients only: dx alone; dW alone; db alone; dW and db without dx (the first layer,
    // whose input needs no gradient: backward-data does not run)
    std::vector<std::vector<bool>> subsets = {{true, false}, {false, true}};
    if (c.bias) subsets = {{true, false, false}, {false, true, false}, {false, false, true}, {false, true, true}};
    for (const std::vector<bool>& want : subsets) {
      Grads some = backward(n, x, y, &dy, want, KernelKind::Fast);
      EXPECT_EQ(some.dnnl, (want[0] || want[1]) && c.dnnl);
      for (size_t i = 0; i < x.size(); ++i) {
        if (!want[i]) continue;
        EXPECT_LT(rel_l2(some.t[i], ref.t[i]), 1e-5)
            << "gradient of input " << i << " with dx " << want[0] << " dW " << want[1];
      }
    }
  }
}

// Conv geometries for conv_s2d.h (a kernel a whole number of strides, input channels not a
// multiple of 16, at least 16 outputs): the forward and the weight gradient against the
// reference kernel and loops: the 640 x 1280 CrossFormer's first layer at stride 4 (kernels 4,
// 8, 16 with its pads), unequal strides and kernel blocks, batch 2, asymmetric pads, an output
// whose rows end in a partial task and columns the pads reach.
TEST(ConvBackward, SpaceToDepthPathMatchesReference) {
  register_cpu_kernels();
  const Attr s4 = attr_ints({4, 4});
  const std::vector<FastCase> cases = {
      {"k4 s4 (patches), 64 outputs", "Conv", {1, 5, 36, 44}, {64, 5, 4, 4}, 64, {{"strides", s4}}},
      {"k8 s4 pads 2, 32 outputs, batch 2", "Conv", {2, 7, 29, 50}, {32, 7, 8, 8}, 32,
       {{"strides", s4}, {"pads", attr_ints({2, 2, 2, 2})}}},
      {"k16 s4 pads 6, 16 outputs", "Conv", {1, 3, 40, 56}, {16, 3, 16, 16}, 0,
       {{"strides", s4}, {"pads", attr_ints({6, 6, 6, 6})}}},
      {"k 6x4 s 3x2, asymmetric pads", "Conv", {1, 18, 23, 31}, {24, 18, 6, 4}, 24,
       {{"strides", attr_ints({3, 2})}, {"pads", attr_ints({2, 0, 1, 3})}}},
  };
  for (const FastCase& c : cases) {
    SCOPED_TRACE(c.label);
    expect_path_matches_reference(c, 80, cpu::s2d_conv_applies, {{false, true, c.bias > 0}});  // first layer: no dx
  }
  // ConvTranspose's weight gradient as the Conv's that reads its output gradient (CREDIT's last
  // decoder layer, 256 -> 71 channels, kernel 4, stride 2, pads 1), with output_padding too
  const Attr s2 = attr_ints({2, 2});
  const std::vector<FastCase> transposed = {
      {"T k4 s2 pads 1, 32 -> 7", "ConvTranspose", {1, 32, 9, 11}, {32, 7, 4, 4}, 7,
       {{"strides", s2}, {"pads", attr_ints({1, 1, 1, 1})}}},
      {"T k4 s2 output_padding 1, batch 2", "ConvTranspose", {2, 24, 6, 5}, {24, 5, 4, 4}, 0,
       {{"strides", s2}, {"pads", attr_ints({1, 1, 1, 1})}, {"output_padding", attr_ints({1, 1})}}},
  };
  for (const FastCase& c : transposed) {
    SCOPED_TRACE(c.label);
    std::vector<Tensor> x = conv_inputs(c.x, c.w, c.bias, 82);
    std::vector<const Tensor*> px;
    for (auto& t : x) px.push_back(&t);
    Node n = make_node(c.op, (int)x.size(), 1, c.attrs);
    Tensor y = run_node(n, px)[0];
    Tensor dy = randn(y.shape, 83);
    std::vector<bool> want(x.size(), true);
    Grads ref = backward(n, x, y, &dy, want, KernelKind::Reference);
    Grads fast = backward(n, x, y, &dy, want, KernelKind::Fast);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_LT(rel_l2(fast.t[i], ref.t[i]), 1e-5) << "gradient of input " << i;
      EXPECT_LT(max_abs_diff(fast.t[i], ref.t[i]), 1e-3) << "gradient of input " << i;
    }
    Tensor dw(DType::F32, c.w);  // and the weight gradient is this path's
    EXPECT_TRUE(cpu::s2d_conv_transpose_weight_grad(cpu::conv_geometry(n, c.x, c.w, true), x[0].data<float>(),
                                                    dy.data<float>(), dw.data<float>()));
    EXPECT_LT(rel_l2(dw, ref.t[1]), 1e-5);
  }
  auto applies = [](Shape xs, Shape ws, Attrs a) {
    return cpu::s2d_conv_applies(cpu::conv_geometry(make_node("Conv", 2, 1, a), xs, ws, false));
  };
  EXPECT_FALSE(applies({1, 16, 40, 40}, {32, 16, 4, 4}, {{"strides", s4}}));  // 16 channels: oneDNN in place
  EXPECT_FALSE(applies({1, 5, 40, 40}, {8, 5, 4, 4}, {{"strides", s4}}));     // 8 outputs
  EXPECT_FALSE(applies({1, 5, 40, 40}, {32, 5, 6, 6}, {{"strides", s4}}));    // 6 is not 4k
  EXPECT_FALSE(applies({1, 5, 40, 40}, {32, 5, 3, 3}, {}));                   // stride 1
  EXPECT_FALSE(applies({1, 5, 40, 40}, {32, 5, 4, 4}, {{"strides", s4}, {"dilations", attr_ints({2, 2})}}));
}

// Conv geometries for conv_small_oc.h (few output channels, kernel width 16 or 32): the forward
// and the weight gradient against the reference kernel and loops, with column counts past a
// whole number of vector blocks (the tail), odd channel counts, stride 1 (no column phases) and
// 3, batch 2, 1-D, and zero pads (even, asymmetric); the path must apply to each. The forward
// of those at stride 2 with at most 4 outputs and an even output size runs as a stride-4 conv
// of the 2 x 2 output phases on oneDNN instead (dnnl.cpp conv_by_output_phases: the padded
// cases and "k16 s2 even outputs, ..."), the rest on conv_small_oc: both against the reference.
TEST(ConvBackward, SmallOutputChannelPathMatchesReference) {
  register_cpu_kernels();
  const Attr s2 = attr_ints({2, 2});
  const std::vector<FastCase> cases = {
      {"k16 s2 batch 2, 29 columns", "Conv", {2, 3, 20, 72}, {4, 3, 16, 16}, 4, {{"strides", s2}}},
      {"k32 s2 2 outputs", "Conv", {1, 2, 36, 90}, {2, 2, 32, 32}, 2, {{"strides", s2}}},
      {"k16 stride 1, 6 outputs, 5 rows", "Conv", {1, 3, 20, 45}, {6, 3, 16, 16}, 0, {}},
      {"k16 stride 3, 3 outputs", "Conv", {1, 2, 17, 90}, {3, 2, 16, 16}, 3, {{"strides", attr_ints({3, 3})}}},
      {"k 5x16 s2 8 outputs", "Conv", {1, 4, 11, 80}, {8, 4, 5, 16}, 8, {{"strides", s2}}},
      {"1-D k32 s2", "Conv", {2, 3, 140}, {4, 3, 32}, 4, {{"strides", attr_ints({2})}}},
      {"15 outputs k16", "Conv", {1, 2, 16, 50}, {15, 2, 16, 16}, 15, {}},
      // zero pads (the training graph folds the cross-embeddings' Pads into their Convs)
      {"k16 s2 pads 7 (CREDIT's stage-0 cross-embedding)", "Conv", {1, 3, 24, 64}, {4, 3, 16, 16}, 4,
       {{"strides", s2}, {"pads", attr_ints({7, 7, 7, 7})}}},
      {"k32 s2 asymmetric pads 15, 3, 16, 2", "Conv", {1, 2, 20, 70}, {4, 2, 32, 32}, 4,
       {{"strides", s2}, {"pads", attr_ints({15, 3, 16, 2})}}},
      {"k16 stride 1 pads 2, 0, 1, 5", "Conv", {1, 3, 18, 40}, {3, 3, 16, 16}, 0, {{"pads", attr_ints({2, 0, 1, 5})}}},
      {"k16 s2 even outputs, no pads, kernel_shape", "Conv", {1, 3, 34, 66}, {4, 3, 16, 16}, 4,
       {{"strides", s2}, {"kernel_shape", attr_ints({16, 16})}}},
      {"1-D k16 s2 pads 7", "Conv", {1, 3, 50}, {2, 3, 16}, 2, {{"strides", attr_ints({2})}, {"pads", attr_ints({7, 7})}}},
  };
  for (const FastCase& c : cases) {
    SCOPED_TRACE(c.label);
    expect_path_matches_reference(c, 70, [](const cpu::ConvGeom& g) { return cpu::small_oc_conv_applies(g); },
                                  {{true, true, true}, {false, true, c.bias > 0}});
  }
  // 16 outputs at kernel 32, stride 4 (the 640 x 1280 CrossFormer's first layer, 74 -> 16
  // channels): the weight gradient on this path, the forward on oneDNN's, against the reference
  {
    const Shape xs{1, 5, 40, 72}, ws{16, 5, 32, 32};
    const Attrs a{{"strides", attr_ints({4, 4})}, {"pads", attr_ints({14, 14, 14, 14})}};
    const cpu::ConvGeom g = cpu::conv_geometry(make_node("Conv", 3, 1, a), xs, ws, false);
    EXPECT_TRUE(cpu::small_oc_conv_applies(g, true));
    EXPECT_FALSE(cpu::small_oc_conv_applies(g));
    std::vector<Tensor> x = conv_inputs(xs, ws, 16, 72);
    Node n = make_node("Conv", 3, 1, a);
    Tensor y = run_node(n, {&x[0], &x[1], &x[2]})[0];
    Tensor dy = randn(y.shape, 73);
    Grads ref = backward(n, x, y, &dy, {false, true, true}, KernelKind::Reference);
    Grads fast = backward(n, x, y, &dy, {false, true, true}, KernelKind::Fast);
    EXPECT_LT(rel_l2(fast.t[1], ref.t[1]), 1e-5);
    EXPECT_LT(rel_l2(fast.t[2], ref.t[2]), 1e-5);
  }
  // dilation, group, narrow kernels, 16 outputs: not this path
  auto applies = [](Shape xs, Shape ws, Attrs a) {
    return cpu::small_oc_conv_applies(cpu::conv_geometry(make_node("Conv", 2, 1, a), xs, ws, false));
  };
  EXPECT_FALSE(applies({1, 2, 40, 40}, {4, 2, 16, 16}, {{"dilations", attr_ints({1, 2})}}));
  EXPECT_FALSE(applies({1, 4, 40, 40}, {4, 2, 16, 16}, {{"group", attr_i(2)}}));
  EXPECT_FALSE(applies({1, 2, 40, 40}, {4, 2, 8, 8}, {}));
  EXPECT_FALSE(applies({1, 2, 40, 40}, {16, 2, 16, 16}, {}));
}

// Where oneDNN's Winograd kernel cannot run (no avx512_core: an AVX2 CPU, or
// ONEDNN_MAX_CPU_ISA=AVX2 as the isa_avx2 test runs it) a 3x3 stride-1 conv it would take runs on
// the direct kernel, forward and backward within the reference's tolerance, and its path says
// which; on AVX-512 the path is Winograd (ConvBackward.WinogradBandsMatchReference checks it).
TEST(ConvBackward, WinogradFallsBackToDirect) {
  register_cpu_kernels();
  const Shape xs{1, 32, 37, 200}, ws{24, 32, 3, 3};
  const std::vector<Tensor> x = conv_inputs(xs, ws, 24, 90);
  const Node n = make_node("Conv", 3, 1, {{"pads", attr_ints({1, 1, 1, 1})}});
  const cpu::ConvGeom g = cpu::conv_geometry(n, xs, ws, false);
  EXPECT_EQ(cpu::winograd_applies(g), cpu::winograd_isa() && cpu::winograd_enabled());
  const std::string path = cpu::kernel_path_of(n, {xs, ws, Shape{24}});
  const Tensor yr = run_node(n, {&x[0], &x[1], &x[2]})[0];
  if (cpu::winograd_isa()) {
    EXPECT_EQ(path, "winograd");
  } else {
    EXPECT_EQ(path.rfind("onednn direct ", 0), 0u) << path;
    Tensor y(DType::F32, yr.shape);
    EXPECT_FALSE(cpu::winograd_conv_forward(n, g, x[0].data<float>(), false, x[1].data<float>(), x[2].data<float>(),
                                            y.data<float>(), false));
  }
  const Tensor y = run_node(n, {&x[0], &x[1], &x[2]}, KernelKind::Fast)[0];
  EXPECT_LT(rel_l2(y, yr), 2e-6) << path;
  const Tensor dy = randn(y.shape, 91);
  const Grads ref = backward(n, x, yr, &dy, {true, true, true}, KernelKind::Reference);
  const Grads fast = backward(n, x, y, &dy, {true, true, true}, KernelKind::Fast);
  for (int i = 0; i < 3; ++i) EXPECT_LT(rel_l2(fast.t[i], ref.t[i]), 2e-6) << path << ", gradient of input " << i;
}

// Where the CPU has no native bfloat16 products (an AVX2 CPU, or ONEDNN_MAX_CPU_ISA=AVX2 as the
// isa_avx2 test runs it), a Conv or Linear with precision = "bf16" runs float32: its path, its
// output and its gradients are the float32 node's, bit for bit. (With native products,
// ConvBackward.Bf16NearReferenceLoops and BackwardFast.LinearBf16NearReference check the
// bfloat16 that runs.)
TEST(ConvBackward, Bf16WithoutNativeProductsIsFloat32) {
  register_cpu_kernels();
  if (cpu::native_bf16())
    GTEST_SKIP() << "this CPU multiplies bfloat16 natively (oneDNN ISA " << cpu::isa_name()
                 << "); the isa_avx2 test runs this under ONEDNN_MAX_CPU_ISA=AVX2";
  struct Case {
    std::string op;
    std::vector<Tensor> x;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"Conv", conv_inputs({1, 32, 24, 40}, {48, 32, 3, 3}, 48, 60), pads2(1, 1, 1, 1)},
      {"Conv", conv_inputs({1, 16, 32, 32}, {32, 16, 4, 4}, 0, 61), {{"strides", attr_ints({2, 2})}}},
      {"Linear", {randn({1, 64, 12, 20}, 62), randn({96, 64}, 63, 0.1f), randn({96}, 64)}, {{"axis", attr_i(1)}}},
      {"Linear", {randn({250, 32}, 65), randn({48, 32}, 66), randn({48}, 67)}, {}},
  };
  for (const Case& c : cases) {
    Attrs a16 = c.attrs;
    a16["precision"] = attr_s("bf16");
    const Node n32 = make_node(c.op, (int)c.x.size(), 1, c.attrs), n16 = make_node(c.op, (int)c.x.size(), 1, a16);
    std::vector<Shape> shapes;
    std::vector<const Tensor*> in;
    for (const Tensor& t : c.x) {
      shapes.push_back(t.shape);
      in.push_back(&t);
    }
    const std::string path = cpu::kernel_path_of(n32, shapes);
    SCOPED_TRACE(c.op + " " + shape_str(c.x[0].shape) + ": " + path);
    EXPECT_EQ(cpu::kernel_path_of(n16, shapes), path);
    const Tensor y32 = run_node(n32, in, KernelKind::Fast)[0], y16 = run_node(n16, in, KernelKind::Fast)[0];
    EXPECT_EQ(max_abs_diff(y16, y32), 0.0) << "forward";
    const Tensor dy = randn(y32.shape, 68);
    std::vector<Tensor> g[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<Tensor*> gin;
      for (const Tensor& t : c.x) g[k].push_back(Tensor(DType::F32, t.shape));
      for (Tensor& t : g[k]) gin.push_back(&t);
      backward_kernel(c.op)(k ? n16 : n32, in, {&y32}, {&dy}, gin);
    }
    for (size_t i = 0; i < c.x.size(); ++i) EXPECT_EQ(max_abs_diff(g[1][i], g[0][i]), 0.0) << "gradient of input " << i;
  }
}

// oneDNN 2.6 offers only its reference kernel (0.1 GFLOP/s) for some geometries in the blocked
// layout the fast path names first: the 640 x 1280 CrossFormer's first cross-embeddings (74 ->
// 16 channels, kernels 16 and 32, stride 4) took minutes per training step. The backward pair
// passes such a layout over for one with a real kernel.
// 3x3 stride-1 convs on oneDNN's Winograd kernel in bands of rows (conv_winograd.h): forward
// (nchw and nhwc in and out), backward-data (by the flipped forward with pads 1, by oneDNN's
// Winograd backward-data with pads 0) and the weight gradient against the reference
// kernel and loops, with whole-plane bands and with bands of 4, 8 and 12 rows (every band's
// halo, the first and last bands' pads, a last band shorter than the others); pads of 0 and 1
// on either side; then through the registered Conv kernels.
TEST(ConvBackward, WinogradBandsMatchReference) {
  register_cpu_kernels();
  if (!cpu::winograd_isa())
    GTEST_SKIP() << "oneDNN's Winograd kernel needs avx512_core, oneDNN ISA here: " << cpu::isa_name()
                 << "; the direct kernel runs these convs (ConvBackward.WinogradFallsBackToDirect)";
  if (!cpu::winograd_enabled()) GTEST_SKIP() << "winograd off";
  auto nhwc_of = [](const Tensor& t) {
    return run_node(make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 2, 3, 1})}}), {&t})[0];
  };
  struct Case {
    std::string label;
    Shape x;
    int64_t co;
    std::vector<int64_t> pads;
  };
  const std::vector<Case> cases = {
      {"pads 1, 37 rows", {1, 32, 37, 200}, 24, {1, 1, 1, 1}},
      {"pads 0 (valid), batch 2", {2, 20, 42, 120}, 32, {0, 0, 0, 0}},
      {"pads 0, 1, 1, 0", {1, 32, 45, 130}, 32, {0, 1, 1, 0}},
  };
  bool banded = false;
  for (const Case& c : cases) {
    const Shape ws{c.co, c.x[1], 3, 3};
    std::vector<Tensor> x = conv_inputs(c.x, ws, c.co, 80);
    Node n = make_node("Conv", 3, 1, {{"pads", attr_ints(c.pads)}});
    const cpu::ConvGeom g = cpu::conv_geometry(n, c.x, ws, false);
    Tensor y = run_node(n, {&x[0], &x[1], &x[2]})[0];
    Tensor dy = randn(y.shape, 81);
    Grads ref = backward(n, x, y, &dy, {true, true, false}, KernelKind::Reference);
    for (int64_t rows : {0, 4, 8, 12}) {
      SCOPED_TRACE(c.label + ", band rows " + std::to_string(rows));
      cpu::set_winograd_band_rows(rows);
      ASSERT_TRUE(cpu::winograd_applies(g));
      banded = banded || (rows > 0 && rows < g.out[1]);
      // forward, every layout pair
      const Tensor xl = nhwc_of(x[0]), yl_ref = nhwc_of(y);
      for (bool in_nhwc : {false, true})
        for (bool out_nhwc : {false, true}) {
          Tensor yf(DType::F32, out_nhwc ? yl_ref.shape : y.shape);
          ASSERT_TRUE(cpu::winograd_conv_forward(n, g, (in_nhwc ? xl : x[0]).data<float>(), in_nhwc,
                                                 x[1].data<float>(), x[2].data<float>(), yf.data<float>(), out_nhwc));
          EXPECT_LT(rel_l2(yf, out_nhwc ? yl_ref : y), 2e-6) << "forward, nhwc in/out " << in_nhwc << out_nhwc;
        }
      // backward against the loops
      Tensor dx(DType::F32, c.x), dw(DType::F32, ws);
      std::fill(dx.data<float>(), dx.data<float>() + dx.numel(), std::numeric_limits<float>::quiet_NaN());
      // backward-data only with equal pads on each axis, in every band (oneDNN 2.6's Winograd
      // backward-data is wrong otherwise): pads 1, or one whole-plane band of equal pads
      const bool whole = rows == 0 || rows >= c.x[2];
      const bool data = c.pads[1] == c.pads[3] && ((c.pads[0] == 1 && c.pads[2] == 1) || (whole && c.pads[0] == c.pads[2]));
      const cpu::RowRange all = cpu::nonzero_rows(dy.data<float>(), y.shape[0], y.shape[1], y.shape[2], y.shape[3]);
      EXPECT_EQ(all.lo, 0);
      EXPECT_EQ(all.hi, y.shape[2]);
      EXPECT_EQ(cpu::winograd_conv_backward_data(n, g, x[1].data<float>(), dy.data<float>(), dx.data<float>(), all), data);
      ASSERT_TRUE(cpu::winograd_conv_weight_grad(n, g, x[0].data<float>(), dy.data<float>(), dw.data<float>(), all));
      if (data) {
        EXPECT_LT(rel_l2(dx, ref.t[0]), 2e-6) << "backward-data";
      }
      EXPECT_LT(rel_l2(dw, ref.t[1]), 2e-6) << "weight gradient";
      // the registered kernels take this path (backward-data the direct one where it refused)
      Grads fast = backward(n, x, y, &dy, {true, true, true}, KernelKind::Fast);
      EXPECT_TRUE(fast.dnnl);
      EXPECT_LT(rel_l2(fast.t[0], ref.t[0]), 2e-6);
      if (data) {
        EXPECT_EQ(max_abs_diff(fast.t[0], dx), 0.0);
      }
      EXPECT_EQ(max_abs_diff(fast.t[1], dw), 0.0);
      // a gradient zero above and below a crop (rows 0-4 and the last 7, every channel): the
      // bands cover the other rows only, dx is exactly zero where nothing reaches it
      Tensor dyc = dy.clone();
      const int64_t H = y.shape[2], W = y.shape[3];
      for (int64_t nc = 0; nc < y.shape[0] * y.shape[1]; ++nc) {
        float* p = dyc.data<float>() + nc * H * W;
        std::fill(p, p + 5 * W, 0.f);
        std::fill(p + (H - 7) * W, p + H * W, nc % 2 ? -0.f : 0.f);
      }
      const cpu::RowRange part = cpu::nonzero_rows(dyc.data<float>(), y.shape[0], y.shape[1], H, W);
      EXPECT_EQ(part.lo, 5);
      EXPECT_EQ(part.hi, H - 7);
      Grads refc = backward(n, x, y, &dyc, {true, true, false}, KernelKind::Reference);
      std::fill(dx.data<float>(), dx.data<float>() + dx.numel(), std::numeric_limits<float>::quiet_NaN());
      EXPECT_EQ(cpu::winograd_conv_backward_data(n, g, x[1].data<float>(), dyc.data<float>(), dx.data<float>(), part), data);
      ASSERT_TRUE(cpu::winograd_conv_weight_grad(n, g, x[0].data<float>(), dyc.data<float>(), dw.data<float>(), part));
      if (data) {
        EXPECT_LT(rel_l2(dx, refc.t[0]), 2e-6) << "backward-data, cropped gradient";
      }
      EXPECT_LT(rel_l2(dw, refc.t[1]), 2e-6) << "weight gradient, cropped gradient";
    }
  }
  // a NaN row is not zero; an all-zero gradient has no rows
  {
    Tensor t = Tensor::zeros(DType::F32, {1, 2, 6, 5});
    EXPECT_EQ(cpu::nonzero_rows(t.data<float>(), 1, 2, 6, 5).hi, cpu::nonzero_rows(t.data<float>(), 1, 2, 6, 5).lo);
    t.data<float>()[30 + 3 * 5 + 4] = std::numeric_limits<float>::quiet_NaN();
    const cpu::RowRange r = cpu::nonzero_rows(t.data<float>(), 1, 2, 6, 5);
    EXPECT_EQ(r.lo, 3);
    EXPECT_EQ(r.hi, 4);
  }
  cpu::set_winograd_band_rows(0);
  EXPECT_TRUE(banded);
  // below the size where it pays, or not 3x3 stride 1: the direct kernels
  Node n = make_node("Conv", 2, 1, {{"pads", attr_ints({1, 1, 1, 1})}});
  EXPECT_FALSE(cpu::winograd_applies(cpu::conv_geometry(n, {1, 16, 16, 16}, {16, 16, 3, 3}, false)));
  Node s2 = make_node("Conv", 2, 1, {{"pads", attr_ints({1, 1, 1, 1})}, {"strides", attr_ints({2, 2})}});
  EXPECT_FALSE(cpu::winograd_applies(cpu::conv_geometry(s2, {1, 64, 128, 128}, {64, 64, 3, 3}, false)));
}

// Wide kernels at small strides by FFT (conv_fft.h): the forward (nchw and nhwc in and out; the
// kernels' spectra given, or made per call 64 phase channels at a time: two chunks at stride 4
// below) and the weight gradient against the reference kernel and loops. Cases: CREDIT's stage-0
// cross-embeddings (kernels 32 and 16, stride 2, 80 channels cut to 5 here), the 640 x 1280
// grid's (16 outputs, kernel 32, stride 4), stride 1, an odd number of input and output channels
// (a transform with one real signal), asymmetric pads, a kernel of 20 x 32 (not a multiple of
// the stride), batch 2, outputs not a whole number of tiles. Then the plan's bounds.
TEST(ConvBackward, FftPathMatchesReference) {
  register_cpu_kernels();
  auto nhwc_of = [](const Tensor& t) {
    return run_node(make_node("Transpose", 1, 1, {{"perm", attr_ints({0, 2, 3, 1})}}), {&t})[0];
  };
  struct Case {
    std::string label;
    Shape x, w;
    int64_t s;
    std::vector<int64_t> pads;
  };
  const std::vector<Case> cases = {
      {"k32 s2 pads 15 (CREDIT stage 0)", {1, 5, 72, 100}, {4, 5, 32, 32}, 2, {15, 15, 15, 15}},
      {"k16 s2 pads 7, batch 2", {2, 5, 130, 140}, {4, 5, 16, 16}, 2, {7, 7, 7, 7}},
      {"k32 s4 16 outputs (640 x 1280 grid)", {1, 3, 160, 192}, {16, 3, 32, 32}, 4, {14, 14, 14, 14}},
      {"k24 stride 1, 3 in, 3 out", {1, 3, 70, 80}, {3, 3, 24, 24}, 1, {2, 0, 5, 3}},
      {"k20x32 s2, 7 in, 5 out, end pads 0, 1", {1, 7, 80, 90}, {5, 7, 20, 32}, 2, {9, 15, 0, 1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    std::vector<Tensor> x = conv_inputs(c.x, c.w, c.w[0], 90);
    Node n = make_node("Conv", 3, 1, {{"pads", attr_ints(c.pads)}, {"strides", attr_ints({c.s, c.s})}});
    const cpu::ConvGeom g = cpu::conv_geometry(n, c.x, c.w, false);
    const FftConvPlan p = cpu::fft_conv_plan(g, false);
    ASSERT_GT(p.F, 0);
    EXPECT_EQ(cpu::fft_conv_plan(g, true).F > 0, true);
    Tensor y = run_node(n, {&x[0], &x[1], &x[2]})[0];
    std::vector<float> spectra(cpu::fft_conv_spectra_floats(g, p));
    cpu::fft_conv_spectra(g, p, x[1].data<float>(), spectra.data());
    const Tensor xl = nhwc_of(x[0]), yl_ref = nhwc_of(y);
    for (bool in_nhwc : {false, true})
      for (bool out_nhwc : {false, true}) {
        Tensor yf(DType::F32, out_nhwc ? yl_ref.shape : y.shape);
        for (const float* sp : std::vector<const float*>{spectra.data(), nullptr}) {
          cpu::fft_conv_forward(g, p, (in_nhwc ? xl : x[0]).data<float>(), in_nhwc, x[1].data<float>(), sp,
                                x[2].data<float>(), yf.data<float>(), out_nhwc);
          EXPECT_LT(rel_l2(yf, out_nhwc ? yl_ref : y), 2e-6)
              << "forward, nhwc in/out " << in_nhwc << out_nhwc << ", spectra " << (sp ? "given" : "made per chunk");
        }
      }
    Tensor yf = run_node(n, {&x[0], &x[1], &x[2]}, KernelKind::Fast)[0];
    EXPECT_LT(rel_l2(yf, y), 2e-6) << "registered forward";
    Tensor dy = randn(y.shape, 91);
    Grads ref = backward(n, x, y, &dy, {true, true, true}, KernelKind::Reference);
    Tensor dw(DType::F32, c.w);
    std::fill(dw.data<float>(), dw.data<float>() + dw.numel(), std::numeric_limits<float>::quiet_NaN());
    cpu::fft_conv_weight_grad(g, p, x[0].data<float>(), dy.data<float>(), dw.data<float>());
    EXPECT_LT(rel_l2(dw, ref.t[1]), 2e-6) << "weight gradient";
    Grads fast = backward(n, x, y, &dy, {false, true, true}, KernelKind::Fast);
    EXPECT_EQ(max_abs_diff(fast.t[1], dw), 0.0) << "registered weight gradient";
    EXPECT_LT(rel_l2(fast.t[2], ref.t[2]), 1e-6) << "bias gradient";
  }
  // dilation, group, a transposed conv, unequal strides, narrow kernels, small outputs: direct
  auto plan = [](Shape xs, Shape ws, Attrs a, bool transpose = false) {
    return cpu::fft_conv_plan(cpu::conv_geometry(make_node(transpose ? "ConvTranspose" : "Conv", 2, 1, a), xs, ws,
                                                 transpose),
                              false)
        .F;
  };
  EXPECT_GT(plan({1, 8, 80, 80}, {4, 8, 32, 32}, {{"strides", attr_ints({2, 2})}}), 0);
  EXPECT_EQ(plan({1, 8, 80, 80}, {4, 8, 32, 32}, {{"strides", attr_ints({2, 1})}}), 0);
  EXPECT_EQ(plan({1, 8, 80, 80}, {4, 8, 16, 16}, {{"dilations", attr_ints({2, 2})}}), 0);
  EXPECT_EQ(plan({1, 8, 80, 80}, {4, 4, 32, 32}, {{"group", attr_i(2)}}), 0);
  EXPECT_EQ(plan({1, 8, 80, 80}, {8, 4, 32, 32}, {}, true), 0);
  EXPECT_EQ(plan({1, 64, 80, 80}, {64, 64, 3, 3}, {}), 0);
  EXPECT_EQ(plan({1, 8, 34, 34}, {4, 8, 32, 32}, {}), 0);  // a 3 x 3 output
  // the modelled time's choices on CREDIT's first layers: v2026's kernels 32, 16 and 8 by FFT
  // (kernel 8, 8 outputs: 16 vs 27 ms forward, 15 vs 23 ms weight gradient, 2 threads), its
  // kernel 4 direct, the 640 x 1280 grid's kernel 32 at stride 4 by FFT, its kernel 16 direct
  EXPECT_GT(plan_fft_conv(1, 80, 4, 128, 192, 32, 32, 2, false).F, 0);
  EXPECT_GT(plan_fft_conv(1, 80, 4, 128, 192, 16, 16, 2, false).F, 0);
  EXPECT_GT(plan_fft_conv(1, 80, 8, 128, 192, 8, 8, 2, false).F, 0);
  EXPECT_EQ(plan_fft_conv(1, 80, 16, 128, 192, 4, 4, 2, false).F, 0);
  EXPECT_GT(plan_fft_conv(1, 74, 16, 160, 320, 32, 32, 4, false).F, 0);
  EXPECT_EQ(plan_fft_conv(1, 74, 16, 160, 320, 16, 16, 4, false).F, 0);
  // constant weights' spectra are kept up to kFftSpectraCacheBytes: v2026's first layer (21.6
  // MB), not the 640 x 1280 grid's (74 -> 16 channels, kernel 32, stride 4)
  EXPECT_TRUE(plan_fft_conv(1, 80, 4, 128, 192, 32, 32, 2, true).cached);
  EXPECT_FALSE(plan_fft_conv(1, 80, 4, 128, 192, 32, 32, 2, false).cached);
  const FftConvPlan big = plan_fft_conv(1, 74, 16, 160, 320, 32, 32, 4, true);
  EXPECT_GT(big.F, 0);
  EXPECT_FALSE(big.cached);
}

TEST(ConvBackward, OneDnnReferenceKernelIsPassedOver) {
  register_cpu_kernels();
  for (int64_t k : {16, 32}) {
    const Attrs a{{"strides", attr_ints({4, 4})}, {"pads", attr_ints({(k - 4) / 2, (k - 4) / 2, (k - 4) / 2, (k - 4) / 2})}};
    const cpu::ConvGeom g = cpu::conv_geometry(make_node("Conv", 3, 1, a), {1, 74, 160, 320}, {16, 74, k, k}, false);
    EXPECT_FALSE(cpu::conv_backward_on_onednn_reference(g)) << "kernel " << k;
  }
}

// Weights updated in place between calls (as the optimizer does): the fast forward and backward
// read the new values (nothing keeps a stale reordered copy), on the oneDNN and small-output
// paths.
TEST(ConvBackward, WeightsUpdatedInPlaceAreSeen) {
  register_cpu_kernels();
  for (auto [xs, ws, a] : {std::tuple<Shape, Shape, Attrs>{{1, 16, 12, 20}, {24, 16, 3, 3}, pads2(1, 1, 1, 1)},
                           {{1, 3, 20, 72}, {4, 3, 16, 16}, {{"strides", attr_ints({2, 2})}}}}) {
    std::vector<Tensor> x = conv_inputs(xs, ws, ws[0], 80);
    Node n = make_node("Conv", 3, 1, a);
    Tensor dy = randn(run_node(n, {&x[0], &x[1], &x[2]})[0].shape, 81);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(str(shape_str(ws), " step ", step));
      float* w = x[1].data<float>();
      for (int64_t i = 0; i < x[1].numel(); ++i) w[i] = w[i] * 0.5f + 0.01f * (float)(i % 5);
      Tensor y = run_node(n, {&x[0], &x[1], &x[2]})[0], yf = run_node(n, {&x[0], &x[1], &x[2]}, KernelKind::Fast)[0];
      EXPECT_LT(rel_l2(yf, y), 1e-5);
      Grads ref = backward(n, x, y, &dy, {true, true, true}, KernelKind::Reference);
      Grads fast = backward(n, x, y, &dy, {true, true, true}, KernelKind::Fast);
      for (size_t i = 0; i < 3; ++i) EXPECT_LT(rel_l2(fast.t[i], ref.t[i]), 1e-5) << "gradient of input " << i;
    }
  }
}

// The reference loops checked by hand on a case small enough to write out: a 1-D conv of
// x = [1, 2, 3, 4] with w = [1, -1], stride 2, pads (1, 0): y = [-x0, x1 - x2] = [-1, -1].
TEST(ConvBackward, HandComputedOneD) {
  register_cpu_kernels();
  Node n = make_node("Conv", 2, 1, {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 0})}});
  std::vector<Tensor> x{Tensor::from_f32({1, 1, 4}, {1, 2, 3, 4}), Tensor::from_f32({1, 1, 2}, {1, -1})};
  Tensor y = run_node(n, {&x[0], &x[1]})[0];
  expect_close(y, Tensor::from_f32({1, 1, 2}, {-1, -1}));
  Tensor dy = Tensor::from_f32({1, 1, 2}, {10, 100});
  for (KernelKind kind : {KernelKind::Reference, KernelKind::Fast}) {
    Grads g = backward(n, x, y, &dy, {true, true}, kind);
    // y0 = -x0 (tap 0 reads the pad), y1 = x1 - x2
    expect_close(g.t[0], Tensor::from_f32({1, 1, 4}, {-10, 100, -100, 0}));
    // dw0 = dy1 * x1 = 200, dw1 = dy0 * x0 + dy1 * x2 = 10 + 300
    expect_close(g.t[1], Tensor::from_f32({1, 1, 2}, {200, 310}));
  }
}

// No output gradient (nothing reads the output): every requested gradient is zero.
TEST(ConvBackward, MissingOutputGradientGivesZeros) {
  register_cpu_kernels();
  std::vector<Tensor> x = conv_inputs({1, 2, 5, 5}, {3, 2, 3, 3}, 3, 50);
  Node n = make_node("Conv", 3, 1, pads2(1, 1, 1, 1));
  Tensor y = run_node(n, {&x[0], &x[1], &x[2]})[0];
  Grads g = backward(n, x, y, nullptr, {true, true, true}, KernelKind::Fast);
  for (auto& t : g.t) expect_close(t, Tensor::zeros(DType::F32, t.shape), 0, 0);
}

TEST(ConvBackward, RejectsWrongOutputGradientShape) {
  register_cpu_kernels();
  std::vector<Tensor> x = conv_inputs({1, 2, 5, 5}, {3, 2, 3, 3}, 0, 60);
  Node n = make_node("Conv", 2, 1);
  Tensor y = run_node(n, {&x[0], &x[1]})[0];
  Tensor bad = randn({1, 3, 5, 5}, 61);
  std::string e = error_of([&] { backward(n, x, y, &bad, {true, true}, KernelKind::Fast); });
  EXPECT_NE(e.find("output gradient (1, 3, 5, 5)"), std::string::npos) << e;
}

}  // namespace
}  // namespace wxe::test
