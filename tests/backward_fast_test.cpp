// The fast backward kernels (the registered ones) against the reference paths they replace
// (the oracle: the loops with double accumulation, the reference Einsum kernel, the
// source-map scatter of the data ops), on CrossFormer-like shapes and on the attribute
// variants each fast path handles or hands back to the reference. Input gradients start as
// NaN, so an element the fast path forgets to write fails the comparison. Also the broadcast
// helpers (kernels/cpu/broadcast.h) against plain index loops.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/backward_layers.h"
#include "kernels/cpu/backward_pointwise.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/test_util.h"

namespace wxe::test {

namespace {

using Attrs = std::map<std::string, Attr>;
using cpu::Ins;
using cpu::Outs;

template <void (*F)(const Node&, const Ins&, const Ins&, const Ins&, const Outs&, KernelKind), KernelKind K>
void with_kind(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  F(n, in, out, gout, gin, K);
}

Tensor nan_filled(const Shape& s) {
  Tensor t(DType::F32, s);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

// Input gradients of node n by `fn`, for the inputs flagged in want (others: empty tensors),
// from a random output gradient; the forward runs the reference kernel.
std::vector<Tensor> grads(const Node& n, const std::vector<Tensor>& inputs, const std::vector<bool>& want,
                          BackwardFn fn, unsigned seed = 7) {
  std::vector<const Tensor*> in;
  for (const Tensor& t : inputs) in.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outs = run_node(n, in);
  std::vector<Tensor> gouts;
  for (size_t k = 0; k < outs.size(); ++k) gouts.push_back(randn(outs[k].shape, seed + (unsigned)k));
  std::vector<const Tensor*> out, gout;
  for (size_t k = 0; k < outs.size(); ++k) {
    out.push_back(&outs[k]);
    gout.push_back(&gouts[k]);
  }
  std::vector<Tensor> g(inputs.size());
  std::vector<Tensor*> gin(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (want[i]) {
      g[i] = nan_filled(inputs[i].shape);
      gin[i] = &g[i];
    }
  fn(n, in, out, gout, gin);
  return g;
}

// Every wanted gradient of the fast path within rel_l2 tol of the reference path's.
void expect_same_grads(const std::string& what, const Node& n, const std::vector<Tensor>& inputs,
                       const std::vector<bool>& want, BackwardFn fast, BackwardFn ref, double tol = 1e-5) {
  const std::vector<Tensor> gf = grads(n, inputs, want, fast), gr = grads(n, inputs, want, ref);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!want[i]) continue;
    const double e = rel_l2(gf[i], gr[i]);
    EXPECT_TRUE(e <= tol) << what << ": gradient of input " << i << " rel_l2 " << e;
  }
}

void expect_linear(const std::string& what, const std::vector<Tensor>& in, Attrs a, std::vector<bool> want) {
  expect_same_grads(what, make_node("Linear", (int)in.size(), 1, std::move(a)), in, want,
                    with_kind<cpu::linear_backward, KernelKind::Fast>,
                    with_kind<cpu::linear_backward, KernelKind::Reference>);
}

void expect_matmul(const std::string& what, const std::vector<Tensor>& in, std::vector<bool> want = {true, true}) {
  expect_same_grads(what, make_node("MatMul", 2), in, want, with_kind<cpu::matmul_backward, KernelKind::Fast>,
                    with_kind<cpu::matmul_backward, KernelKind::Reference>);
}

void expect_einsum(const std::string& eq, const std::vector<Tensor>& in) {
  expect_same_grads("Einsum " + eq, make_node("Einsum", (int)in.size(), 1, {{"equation", attr_s(eq)}}), in,
                    std::vector<bool>(in.size(), true), with_kind<cpu::einsum_backward, KernelKind::Fast>,
                    with_kind<cpu::einsum_backward, KernelKind::Reference>);
}

void expect_pointwise(const std::string& what, const std::string& op, const std::vector<Tensor>& in, Attrs a = {},
                      double tol = 1e-6) {
  register_cpu_kernels();
  std::vector<bool> want;
  for (const Tensor& t : in) want.push_back(t.dtype == DType::F32);
  expect_same_grads(what, make_node(op, (int)in.size(), 1, std::move(a)), in, want,
                    cpu::pointwise_backward_kernel(op, KernelKind::Fast),
                    cpu::pointwise_backward_kernel(op, KernelKind::Reference), tol);
}

}  // namespace

TEST(BackwardFast, LinearMatchesReference) {
  register_cpu_kernels();
  const Attrs ax1{{"axis", attr_i(1)}};
  // feed-forward up projection on a full-resolution feature map (features on dim 1)
  expect_linear("axis 1 (1,64,24,48) W (256,64) bias", {randn({1, 64, 24, 48}, 1), randn({256, 64}, 2, 0.1f), randn({256}, 3)},
                ax1, {true, true, true});
  // attention projections on windows: (windows, D, th, tw)
  expect_linear("axis 1 windows (24,64,2,2) W (64,64)", {randn({24, 64, 2, 2}, 4), randn({64, 64}, 5, 0.1f)}, ax1,
                {true, true});
  expect_linear("axis 1 windows (96,16,4,4) W (16,16) bias, only dW", {randn({96, 16, 4, 4}, 6), randn({16, 16}, 7), randn({16}, 8)},
                ax1, {false, true, false});
  expect_linear("axis 1 batch 2 (2,32,5,7) W (48,32) bias, only dX and db",
                {randn({2, 32, 5, 7}, 9), randn({48, 32}, 10), randn({48}, 11)}, ax1, {true, false, true});
  expect_linear("axis -1 (25,16) W (32,16) bias", {randn({25, 16}, 12), randn({32, 16}, 13), randn({32}, 14)}, {},
                {true, true, true});
  expect_linear("axis -1 (3,5,16) W (8,16)", {randn({3, 5, 16}, 15), randn({8, 16}, 16)}, {}, {true, true});
  expect_linear("gelu axis 1 (2,8,3,5) W (12,8) bias",
                {randn({2, 8, 3, 5}, 17), randn({12, 8}, 18, 0.3f), randn({12}, 19)},
                {{"axis", attr_i(1)}, {"activation", attr_s("gelu")}}, {true, true, true});
  expect_linear("gelu axis -1 (6,8) W (4,8) bias", {randn({6, 8}, 20), randn({4, 8}, 21, 0.3f), randn({4}, 22)},
                {{"activation", attr_s("gelu")}}, {true, true, true});
}

// precision = "bf16" (finetune --precision bf16): the fast Linear backward multiplies in bfloat16
// with float32 accumulation. Against the float32 reference: within bfloat16's rounding (8
// significant bits: 2^-9 relative per operand, about 3e-3 relative L2 over random sums); and
// visibly apart from the float32 fast path (bfloat16 really ran). The bias gradient sums the
// float32 gradient: as float32.
TEST(BackwardFast, LinearBf16NearReference) {
  register_cpu_kernels();
  if (!cpu::native_bf16())
    GTEST_SKIP() << "needs native bfloat16 products (avx512_bf16 or AMX), oneDNN ISA here: " << cpu::isa_name()
                 << "; ConvBackward.Bf16WithoutNativeProductsIsFloat32 checks the float32 that runs instead";
  struct Case {
    std::string what;
    std::vector<Tensor> in;
    Attrs attrs;
  };
  const Attrs ax1{{"axis", attr_i(1)}};
  const std::vector<Case> cases = {
      {"axis 1 (1,64,24,48) W (256,64) bias", {randn({1, 64, 24, 48}, 1), randn({256, 64}, 2, 0.1f), randn({256}, 3)}, ax1},
      {"axis 1 windows (24,64,2,2) W (64,64) bias", {randn({24, 64, 2, 2}, 4), randn({64, 64}, 5, 0.1f), randn({64}, 6)}, ax1},
      {"axis -1 (250,32) W (48,32) bias", {randn({250, 32}, 12), randn({48, 32}, 13), randn({48}, 14)}, {}},
      {"gelu axis 1 (2,32,6,5) W (64,32) bias", {randn({2, 32, 6, 5}, 17), randn({64, 32}, 18, 0.3f), randn({64}, 19)},
       {{"axis", attr_i(1)}, {"activation", attr_s("gelu")}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Attrs a16 = c.attrs;
    a16["precision"] = attr_s("bf16");
    const Node n32 = make_node("Linear", (int)c.in.size(), 1, c.attrs), n16 = make_node("Linear", (int)c.in.size(), 1, a16);
    const std::vector<bool> all(c.in.size(), true);
    const std::vector<Tensor> ref = grads(n32, c.in, all, with_kind<cpu::linear_backward, KernelKind::Reference>);
    const std::vector<Tensor> f32 = grads(n32, c.in, all, with_kind<cpu::linear_backward, KernelKind::Fast>);
    const std::vector<Tensor> b16 = grads(n16, c.in, all, with_kind<cpu::linear_backward, KernelKind::Fast>);
    for (size_t i = 0; i < 2; ++i) {  // dX, dW: bfloat16 products
      const double e16 = rel_l2(b16[i], ref[i]), e32 = rel_l2(f32[i], ref[i]);
      EXPECT_LT(e16, 1e-2) << "gradient of input " << i;
      EXPECT_GT(e16, 1e-4) << "gradient of input " << i << ": bfloat16 did not run";
      EXPECT_GT(e16, 20 * e32) << "gradient of input " << i;
      std::printf("Linear bf16 %s: gradient of input %zu rel_l2 %.2e (float32 fast path %.2e)\n", c.what.c_str(), i,
                  e16, e32);
    }
    // the bias gradient: float32 sums of gY (with gelu: of gY Gelu'(Z), Z from the bfloat16 forward)
    EXPECT_LT(rel_l2(b16[2], ref[2]), c.attrs.count("activation") ? 1e-2 : 1e-6);
    // dX alone, dW and db without dX: the same bits
    for (const std::vector<bool>& want : {std::vector<bool>{true, false, false}, std::vector<bool>{false, true, true}}) {
      const std::vector<Tensor> some = grads(n16, c.in, want, with_kind<cpu::linear_backward, KernelKind::Fast>);
      for (size_t i = 0; i < 3; ++i) {
        if (want[i]) {
          EXPECT_EQ(max_abs_diff(some[i], b16[i]), 0.0) << "gradient of input " << i << " alone";
        }
      }
    }
  }
}

TEST(BackwardFast, MatMulAndGemmMatchReference) {
  register_cpu_kernels();
  expect_matmul("batched x 2-D (8,64,32) x (32,48)", {randn({8, 64, 32}, 30), randn({32, 48}, 31)});
  expect_matmul("equal batch (3,4,16,8) x (3,4,8,12)", {randn({3, 4, 16, 8}, 32), randn({3, 4, 8, 12}, 33)});
  expect_matmul("2-D x 2-D, only gB", {randn({7, 5}, 34), randn({5, 9}, 35)}, {false, true});
  expect_matmul("1-D x 2-D", {randn({6}, 36), randn({6, 4}, 37)});
  expect_matmul("batched x 1-D", {randn({2, 3, 6}, 38), randn({6}, 39)});
  // broadcasts the fast path hands to the loops
  expect_matmul("broadcast (2,1,3,4) x (3,4,2)", {randn({2, 1, 3, 4}, 40), randn({3, 4, 2}, 41)});
  expect_matmul("2-D x batched (3,4) x (2,4,5)", {randn({3, 4}, 42), randn({2, 4, 5}, 43)});
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t M = 25, K = 16, N = 32;
      Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, 44), B = randn(tb ? Shape{N, K} : Shape{K, N}, 45);
      for (Shape cs : {Shape{N}, Shape{M, N}, Shape{M, 1}}) {
        const Node n = make_node("Gemm", 3, 1,
                                 {{"transA", attr_i(ta)}, {"transB", attr_i(tb)}, {"alpha", attr_f(0.5f)}, {"beta", attr_f(2.f)}});
        expect_same_grads(str("Gemm transA ", ta, " transB ", tb, " C ", shape_str(cs)), n, {A, B, randn(cs, 46)},
                          {true, true, true}, with_kind<cpu::gemm_backward, KernelKind::Fast>,
                          with_kind<cpu::gemm_backward, KernelKind::Reference>);
      }
    }
}

TEST(BackwardFast, EinsumMatchesReference) {
  register_cpu_kernels();
  // attention scores and weighted values, as in the exported CrossFormer
  expect_einsum("bhid,bhjd->bhij", {randn({1, 4, 64, 16}, 50), randn({1, 4, 64, 16}, 51)});
  expect_einsum("bhij,bhjd->bhid", {randn({1, 4, 64, 64}, 52), randn({1, 4, 64, 16}, 53)});
  expect_einsum("bhij,bhjd->bhid", {randn({24, 8, 4, 4}, 54), randn({24, 8, 4, 8}, 55)});
  expect_einsum("b h i d, b h j d -> b h i j", {randn({96, 2, 16, 8}, 56), randn({96, 2, 16, 8}, 57)});
  // letters only in one operand (summed: the gradient broadcasts) and a repeated letter
  // (diagonal): the fast path scatters like the reference
  expect_einsum("ij,jk->i", {randn({5, 6}, 58), randn({6, 7}, 59)});
  expect_einsum("ii,i->i", {randn({4, 4}, 60), randn({4}, 61)});
  expect_einsum("ij,kj->ik", {randn({9, 12}, 62), randn({10, 12}, 63)});
  expect_einsum("i,j->ij", {randn({9}, 64), randn({10}, 65)});
}

TEST(BackwardFast, ReduceSumAndMeanMatchReference) {
  register_cpu_kernels();
  struct Case {
    std::string op;
    Shape x;
    std::vector<int64_t> axes;
    int keepdims;
  };
  const std::vector<Case> cases = {
      {"ReduceMean", {1, 16, 32, 48}, {1}, 1},       // channel LayerNorm statistics
      {"ReduceMean", {2, 16, 8, 12}, {-1, -2}, 0},
      {"ReduceSum", {2, 3, 4, 5}, {0, 2}, 1},
      {"ReduceSum", {2, 3, 4}, {}, 0},               // all axes
      {"ReduceMean", {6, 7}, {0}, 0},
  };
  for (const Case& c : cases) {
    Attrs a{{"keepdims", attr_i(c.keepdims)}};
    if (!c.axes.empty()) a["axes"] = attr_ints(c.axes);
    expect_same_grads(c.op + " " + shape_str(c.x), make_node(c.op, 1, 1, a), {randn(c.x, 70)}, {true},
                      with_kind<cpu::reduce_backward, KernelKind::Fast>,
                      with_kind<cpu::reduce_backward, KernelKind::Reference>, 1e-7);
  }
  // noop_with_empty_axes: the gradient passes through
  expect_same_grads("ReduceSum noop", make_node("ReduceSum", 1, 1, {{"noop_with_empty_axes", attr_i(1)}}),
                    {randn({3, 4}, 71)}, {true}, with_kind<cpu::reduce_backward, KernelKind::Fast>,
                    with_kind<cpu::reduce_backward, KernelKind::Reference>, 0);
}

TEST(BackwardFast, BinaryOpsMatchReference) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{1, 16, 32, 48}, {1, 16, 32, 48}},  // same shape
      {{1, 16, 32, 48}, {1, 16, 1, 1}},    // per-channel scale / bias
      {{1, 16, 32, 48}, {16, 1, 1}},
      {{1, 64, 8, 12}, {1, 1, 8, 12}},     // LayerNorm mean / std over channels
      {{2, 8, 6, 5}, {}},                  // scalar
      {{3, 1, 5}, {1, 4, 1}},              // both broadcast
      {{2, 3, 4, 5}, {2, 1, 4, 1}},
  };
  unsigned seed = 80;
  for (const std::string op : {"Add", "Sub", "Mul", "Div", "Max", "Min"})
    for (auto [sa, sb] : shapes) {
      Tensor b = randn(sb, seed++);
      if (op == "Div")  // away from 0
        for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = 1.5f + std::fabs(b.data<float>()[i]);
      expect_pointwise(op + " " + shape_str(sa) + " " + shape_str(sb), op, {randn(sa, seed++), b});
    }
  Tensor base = randn({2, 3, 4}, 90);
  for (int64_t i = 0; i < base.numel(); ++i) base.data<float>()[i] = 0.5f + std::fabs(base.data<float>()[i]);
  expect_pointwise("Pow (2,3,4) ^ (3,1)", "Pow", {base, randn({3, 1}, 91)});
  expect_pointwise("Pow (2,3,4) ^ int64 2", "Pow", {base, Tensor::from_i64({2})});
  // ties of Max / Min split the gradient
  Tensor t = randn({4, 5}, 92);
  expect_pointwise("Max with ties", "Max", {t, t});
}

TEST(BackwardFast, ErfTransposeConcatDepthToSpaceMatchReference) {
  Tensor x = randn({1, 64, 32, 48}, 100, 2.f);
  x.data<float>()[0] = 12.f;  // exp(-144): below float range
  x.data<float>()[1] = -9.5f;
  x.data<float>()[2] = 0.f;
  x.data<float>()[3] = 1e-20f;
  expect_pointwise("Erf (1,64,32,48)", "Erf", {x}, {}, 1e-6);
  Tensor nan = Tensor::from_f32({2}, {std::numeric_limits<float>::quiet_NaN(), 1.f});
  const std::vector<Tensor> g = grads(make_node("Erf", 1), {nan}, {true},
                                      cpu::pointwise_backward_kernel("Erf", KernelKind::Fast));
  EXPECT_TRUE(std::isnan(g[0].data<float>()[0]));
  EXPECT_FALSE(std::isnan(g[0].data<float>()[1]));

  const std::vector<std::pair<Shape, std::vector<int64_t>>> perms = {
      {{24, 8, 8, 2, 2}, {0, 1, 3, 4, 2}},         // heads to the end (block swap)
      {{1, 16, 24, 16, 2, 2}, {0, 3, 1, 4, 2, 5}},  // window partition
      {{1, 64, 4, 2, 6, 2}, {0, 2, 4, 1, 3, 5}},
      {{2, 3, 4}, {2, 0, 1}},
      {{3, 5, 7}, {}},                              // default: reversed
  };
  for (auto& [s, p] : perms) {
    Attrs a;
    if (!p.empty()) a["perm"] = attr_ints(p);
    expect_pointwise("Transpose " + shape_str(s), "Transpose", {randn(s, 101)}, a, 0);
  }
  expect_pointwise("Concat axis 1 of three", "Concat", {randn({1, 16, 32, 48}, 102), randn({1, 8, 32, 48}, 103), randn({1, 16, 32, 48}, 104)},
                   {{"axis", attr_i(1)}}, 0);
  // DepthToSpace as in WXFormer's up blocks (pixel shuffle, CRD) and DCR with block 3
  expect_pointwise("DepthToSpace CRD (1,336,8,12) block 2", "DepthToSpace", {randn({1, 336, 8, 12}, 107)},
                   {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}}, 0);
  expect_pointwise("DepthToSpace DCR (2,18,3,5) block 3", "DepthToSpace", {randn({2, 18, 3, 5}, 108)},
                   {{"blocksize", attr_i(3)}}, 0);
  expect_pointwise("Concat axis -1", "Concat", {randn({2, 3, 2}, 105), randn({2, 3, 5}, 106)}, {{"axis", attr_i(-1)}}, 0);
}

// Slice as row copies into zeros and Resize one axis at a time, against the scatter through the
// forward's own index map (the gradient buffers start as NaN: every element must be written).
TEST(BackwardFast, SliceAndResizeMatchReference) {
  register_cpu_kernels();
  const BackwardFn slice_fast = cpu::pointwise_backward_kernel("Slice", KernelKind::Fast);
  const BackwardFn slice_ref = cpu::pointwise_backward_kernel("Slice", KernelKind::Reference);
  ASSERT_NE(slice_fast, slice_ref);
  struct SliceCase {
    std::string what;
    Shape x;
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const std::vector<SliceCase> slices = {
      {"CREDIT's crop of the rows (1,84,256,384)[:, :, 0:181]", {1, 84, 256, 384}, {0}, {181}, {2}, {1}},
      {"and of the columns, axis -1", {1, 4, 18, 38}, {0}, {36}, {-1}, {1}},
      {"a band of rows, gradient zero on both sides", {2, 3, 17, 10}, {4}, {11}, {2}, {1}},
      {"the whole tensor", {2, 3, 4}, {0}, {100}, {0}, {1}},
      {"two axes, ends past the end", {2, 5, 9, 11}, {1, 2}, {100, 9}, {1, 3}, {1, 1}},
      {"step 2 on the last axis, negative start", {3, 4, 20}, {-15}, {20}, {2}, {2}},
      {"negative step", {3, 7, 6}, {5, -1}, {0, -100}, {1, 2}, {-2, -1}},
      {"empty", {3, 4}, {2}, {2}, {1}, {1}},
  };
  for (const SliceCase& c : slices) {
    std::vector<Tensor> in = {randn(c.x, 110), Tensor::from_i64(c.starts), Tensor::from_i64(c.ends),
                              Tensor::from_i64(c.axes), Tensor::from_i64(c.steps)};
    expect_same_grads("Slice " + c.what, make_node("Slice", 5), in, {true, false, false, false, false}, slice_fast,
                      slice_ref, 0);
  }
  const BackwardFn resize_fast = cpu::pointwise_backward_kernel("Resize", KernelKind::Fast);
  const BackwardFn resize_ref = cpu::pointwise_backward_kernel("Resize", KernelKind::Reference);
  ASSERT_NE(resize_fast, resize_ref);
  struct ResizeCase {
    std::string what;
    Shape x, sizes;
    Attrs a;
  };
  const Attrs credit = {{"mode", attr_s("linear")}, {"coordinate_transformation_mode", attr_s("half_pixel")}};
  const std::vector<ResizeCase> resizes = {
      {"CREDIT's bilinear half_pixel back to the grid (1,6,64,96) -> (1,6,45,90)", {1, 6, 64, 96}, {1, 6, 45, 90}, credit},
      {"bilinear up 2x", {2, 3, 7, 5}, {2, 3, 14, 10}, credit},
      {"nearest up 2x", {1, 4, 6, 8}, {1, 4, 12, 16}, {{"mode", attr_s("nearest")}}},
      {"cubic, align_corners, rows only", {1, 2, 9, 7}, {1, 2, 13, 7},
       {{"mode", attr_s("cubic")}, {"coordinate_transformation_mode", attr_s("align_corners")}}},
      {"linear over the channels too", {1, 5, 4, 6}, {1, 3, 8, 6}, credit},
      {"same size (identity)", {1, 3, 5, 6}, {1, 3, 5, 6}, credit},
  };
  for (const ResizeCase& c : resizes) {
    std::vector<Tensor> in = {randn(c.x, 111), Tensor(), Tensor(), Tensor::from_i64(c.sizes)};
    expect_same_grads("Resize " + c.what, make_node("Resize", 4, 1, c.a), in, {true, false, false, false}, resize_fast,
                      resize_ref, 1e-6);
  }
}

// Broadcast expand and sum against index loops, and the sum's independence of the thread count.
TEST(BackwardFast, BroadcastHelpersMatchIndexLoops) {
  const Shape full{2, 16, 32, 48};  // large enough for the parallel paths
  const std::vector<Shape> smalls = {{1, 16, 1, 1}, {16, 1, 1}, {}, {1, 1, 32, 48}, {2, 1, 32, 1}, {48}, {2, 16, 32, 48},
                                     {1, 1, 1, 1}, {2, 1, 1, 1}};
  const Tensor f = randn(full, 110);
  for (const Shape& s : smalls) {
    const Shape sp = [&] {  // small padded to full's rank
      Shape r(full.size() - s.size(), 1);
      r.insert(r.end(), s.begin(), s.end());
      return r;
    }();
    const Tensor sm = randn(s, 111);
    const cpu::BroadcastPlan p = cpu::broadcast_plan(s, full);
    // index loop: small element of full element e
    std::vector<int64_t> src((size_t)numel(full));
    const auto sst = strides_of(sp);
    for (int64_t e = 0; e < numel(full); ++e) {
      int64_t rem = e, o = 0;
      for (size_t d = full.size(); d-- > 0;) {
        if (sp[d] != 1) o += rem % full[d] * sst[d];
        rem /= full[d];
      }
      src[e] = o;
    }
    Tensor ex(DType::F32, full), ex_ref(DType::F32, full);
    cpu::broadcast_expand(p, sm.data<float>(), ex.data<float>(), 0.5);
    for (int64_t e = 0; e < numel(full); ++e) ex_ref.data<float>()[e] = (float)(sm.data<float>()[src[e]] * 0.5);
    EXPECT_EQ(max_abs_diff(ex, ex_ref), 0.0) << "expand to " << shape_str(s);
    std::vector<double> acc((size_t)numel(s), 0.0);
    for (int64_t e = 0; e < numel(full); ++e) acc[src[e]] += f.data<float>()[e];
    Tensor sum_ref(DType::F32, s), sum1(DType::F32, s), sum2(DType::F32, s);
    for (int64_t i = 0; i < numel(s); ++i) sum_ref.data<float>()[i] = (float)(acc[i] * 2.0);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu::broadcast_sum(p, f.data<float>(), sum1.data<float>(), 2.0);
    omp_set_num_threads(2);
    cpu::broadcast_sum(p, f.data<float>(), sum2.data<float>(), 2.0);
    omp_set_num_threads(threads);
    expect_close(sum1, sum_ref, 1e-5, 1e-6);
    EXPECT_EQ(max_abs_diff(sum1, sum2), 0.0) << "sum to " << shape_str(s) << " depends on the thread count";
  }
}

}  // namespace wxe::test
