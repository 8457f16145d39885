// MatMul, Gemm, Einsum, Linear: reference kernels against hand-computed ONNX semantics and
// independent loops; the oneDNN fast path against the reference; error cases.
#include <string>
#include <vector>

#include "test_util.h"

namespace wxe::test {
namespace {

Tensor T(Shape s, std::vector<float> v) { return Tensor::from_f32(std::move(s), v); }

const KernelKind kBoth[] = {KernelKind::Reference, KernelKind::Fast};

// Returns the message of the wxe::Error thrown by running n, or "" if none was thrown.
std::string error_of(const Node& n, const std::vector<const Tensor*>& in,
                     KernelKind kind = KernelKind::Reference) {
  try {
    run_node(n, in, kind);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Node einsum(const std::string& eq, int nin) {
  return make_node("Einsum", nin, 1, {{"equation", attr_s(eq)}});
}

// ---------------------------------------------------------------- reference semantics
TEST(LinalgMatMul, HandComputed2x3by3x2) {
  Tensor a = T({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = T({3, 2}, {7, 8, 9, 10, 11, 12});
  for (auto kind : kBoth) {
    auto y = run_node(make_node("MatMul", 2), {&a, &b}, kind);
    expect_close(y[0], T({2, 2}, {58, 64, 139, 154}));
  }
}

TEST(LinalgMatMul, OneDimensionalOperands) {
  Tensor v = T({3}, {1, 2, 3});
  Tensor a = T({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = T({3, 2}, {7, 8, 9, 10, 11, 12});
  Tensor bb = T({2, 3, 2}, {7, 8, 9, 10, 11, 12, 1, 0, 0, 1, 1, 1});
  for (auto kind : kBoth) {
    Node n = make_node("MatMul", 2);
    expect_close(run_node(n, {&v, &b}, kind)[0], T({2}, {58, 64}));       // (3) x (3,2)
    expect_close(run_node(n, {&a, &v}, kind)[0], T({2}, {14, 32}));       // (2,3) x (3)
    expect_close(run_node(n, {&v, &v}, kind)[0], T({}, {14}));            // (3) x (3)
    expect_close(run_node(n, {&v, &bb}, kind)[0], T({2, 2}, {58, 64, 4, 5}));  // (3) x (2,3,2)
  }
}

TEST(LinalgMatMul, BatchBroadcastAgainstLoop) {
  // (2,1,2,3) x (3,3,4) -> (2,3,2,4)
  Tensor a = randn({2, 1, 2, 3}, 1);
  Tensor b = randn({3, 3, 4}, 2);
  Tensor ref(DType::F32, {2, 3, 2, 4});
  const float* A = a.data<float>();
  const float* B = b.data<float>();
  for (int p = 0; p < 2; ++p)
    for (int q = 0; q < 3; ++q)
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) {
          double s = 0;
          for (int k = 0; k < 3; ++k) s += (double)A[(p * 2 + i) * 3 + k] * B[(q * 3 + k) * 4 + j];
          ref.data<float>()[((p * 3 + q) * 2 + i) * 4 + j] = (float)s;
        }
  for (auto kind : kBoth) expect_close(run_node(make_node("MatMul", 2), {&a, &b}, kind)[0], ref);
  // the other operand broadcast: (2,3) x (2,3,3,4) -> (2,3,2,4)
  Tensor a2 = randn({2, 3}, 3);
  Tensor b2 = randn({2, 3, 3, 4}, 4);
  Tensor ref2(DType::F32, {2, 3, 2, 4});
  for (int p = 0; p < 6; ++p)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0;
        for (int k = 0; k < 3; ++k)
          s += (double)a2.data<float>()[i * 3 + k] * b2.data<float>()[(p * 3 + k) * 4 + j];
        ref2.data<float>()[(p * 2 + i) * 4 + j] = (float)s;
      }
  for (auto kind : kBoth) expect_close(run_node(make_node("MatMul", 2), {&a2, &b2}, kind)[0], ref2);
}

TEST(LinalgGemm, TransAlphaBetaBroadcastC) {
  // A^T = [[1,2,3],[4,5,6]], B^T = [[7,8],[9,10],[11,12]]: A'B' = [[58,64],[139,154]]
  Tensor a = T({3, 2}, {1, 4, 2, 5, 3, 6});
  Tensor b = T({2, 3}, {7, 9, 11, 8, 10, 12});
  Node n = make_node("Gemm", 3, 1,
                     {{"transA", attr_i(1)}, {"transB", attr_i(1)}, {"alpha", attr_f(0.5f)},
                      {"beta", attr_f(2.f)}});
  Tensor c_row = T({2}, {1, -1});     // broadcast over rows
  Tensor c_col = T({2, 1}, {1, 10});  // broadcast over columns
  Tensor c_scalar = T({}, {3});
  for (auto kind : kBoth) {
    expect_close(run_node(n, {&a, &b, &c_row}, kind)[0], T({2, 2}, {31, 30, 71.5f, 75}));
    expect_close(run_node(n, {&a, &b, &c_col}, kind)[0], T({2, 2}, {31, 34, 89.5f, 97}));
    expect_close(run_node(n, {&a, &b, &c_scalar}, kind)[0], T({2, 2}, {35, 38, 75.5f, 83}));
    // no C
    expect_close(run_node(n, {&a, &b, nullptr}, kind)[0], T({2, 2}, {29, 32, 69.5f, 77}));
  }
  // no transposes, default alpha/beta, full C
  Tensor a2 = T({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b2 = T({3, 2}, {7, 8, 9, 10, 11, 12});
  Tensor c2 = T({2, 2}, {1, 2, 3, 4});
  for (auto kind : kBoth)
    expect_close(run_node(make_node("Gemm", 3), {&a2, &b2, &c2}, kind)[0],
                 T({2, 2}, {59, 66, 142, 158}));
}

TEST(LinalgLinear, ChannelAxis) {
  // axis 1 on (N, C, H, W): a 1x1 convolution
  Tensor x = T({1, 2, 1, 3}, {1, 2, 3, 10, 20, 30});  // channel 0: 1 2 3, channel 1: 10 20 30
  Tensor w = T({3, 2}, {1, 0, 0, 1, 1, -1});           // out channels: c0, c1, c0 - c1
  Tensor bias = T({3}, {0, 0, 100});
  Node n = make_node("Linear", 3, 1, {{"axis", attr_i(1)}});
  for (auto kind : kBoth)
    expect_close(run_node(n, {&x, &w, &bias}, kind)[0],
                 T({1, 3, 1, 3}, {1, 2, 3, 10, 20, 30, 91, 82, 73}));
  // equals the last-axis Linear on the channels-last tensor
  Tensor x4 = randn({2, 5, 3, 4}, 90), w4 = randn({6, 5}, 91), b4 = randn({6}, 92);
  Tensor xl(DType::F32, {2, 3, 4, 5});
  for (int p = 0; p < 2; ++p)
    for (int c = 0; c < 5; ++c)
      for (int q = 0; q < 12; ++q) xl.data<float>()[(p * 12 + q) * 5 + c] = x4.data<float>()[(p * 5 + c) * 12 + q];
  auto yl = run_node(make_node("Linear", 3), {&xl, &w4, &b4})[0];
  Tensor expect(DType::F32, {2, 6, 3, 4});
  for (int p = 0; p < 2; ++p)
    for (int c = 0; c < 6; ++c)
      for (int q = 0; q < 12; ++q) expect.data<float>()[(p * 6 + c) * 12 + q] = yl.data<float>()[(p * 12 + q) * 6 + c];
  for (auto kind : kBoth) {
    expect_close(run_node(n, {&x4, &w4, &b4}, kind)[0], expect, 1e-5, 1e-5);
    expect_close(run_node(make_node("Linear", 3, 1, {{"axis", attr_i(-3)}}), {&x4, &w4, &b4}, kind)[0],
                 expect, 1e-5, 1e-5);
  }
}

TEST(LinalgLinear, HandComputed) {
  Tensor x = T({1, 2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor w = T({2, 3}, {1, 0, -1, 0.5f, 0.5f, 0.5f});  // (N=2, K=3)
  Tensor bias = T({2}, {10, -10});
  for (auto kind : kBoth) {
    expect_close(run_node(make_node("Linear", 3), {&x, &w, &bias}, kind)[0],
                 T({1, 2, 2}, {8, -7, 8, -2.5f}));
    expect_close(run_node(make_node("Linear", 2), {&x, &w}, kind)[0],
                 T({1, 2, 2}, {-2, 3, -2, 7.5f}));
  }
}

// Attention einsums against explicit loops, with and without spaces.
TEST(LinalgEinsum, AttentionAgainstLoops) {
  const int B = 2, H = 3, I = 4, J = 5, D = 6;
  Tensor q = randn({B, H, I, D}, 11);
  Tensor k = randn({B, H, J, D}, 12);
  Tensor sim(DType::F32, {B, H, I, J});
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < I; ++i)
        for (int j = 0; j < J; ++j) {
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += (double)q.data<float>()[((b * H + h) * I + i) * D + d] *
                 k.data<float>()[((b * H + h) * J + j) * D + d];
          sim.data<float>()[((b * H + h) * I + i) * J + j] = (float)s;
        }
  Tensor attn = randn({B, H, I, J}, 13);
  Tensor v = randn({B, H, J, D}, 14);
  Tensor outv(DType::F32, {B, H, I, D});
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < I; ++i)
        for (int d = 0; d < D; ++d) {
          double s = 0;
          for (int j = 0; j < J; ++j)
            s += (double)attn.data<float>()[((b * H + h) * I + i) * J + j] *
                 v.data<float>()[((b * H + h) * J + j) * D + d];
          outv.data<float>()[((b * H + h) * I + i) * D + d] = (float)s;
        }
  for (auto kind : kBoth) {
    expect_close(run_node(einsum("b h i d, b h j d -> b h i j", 2), {&q, &k}, kind)[0], sim);
    expect_close(run_node(einsum("bhid,bhjd->bhij", 2), {&q, &k}, kind)[0], sim);
    expect_close(run_node(einsum("bhij,bhjd->bhid", 2), {&attn, &v}, kind)[0], outv);
    expect_close(run_node(einsum(" b h i j , b h j d -> b h i d ", 2), {&attn, &v}, kind)[0], outv);
  }
}

TEST(LinalgEinsum, OneOperandAndImplicitOutput) {
  Tensor m = T({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor mt = T({3, 2}, {1, 4, 2, 5, 3, 6});
  Tensor sq = T({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor b = T({3, 2}, {7, 8, 9, 10, 11, 12});
  for (auto kind : kBoth) {
    expect_close(run_node(einsum("ij->ji", 1), {&m}, kind)[0], mt);
    expect_close(run_node(einsum("ij", 1), {&m}, kind)[0], m);        // implicit: "ij"
    expect_close(run_node(einsum("ji", 1), {&m}, kind)[0], mt);       // implicit: "ij" = transpose
    expect_close(run_node(einsum("aB", 1), {&m}, kind)[0], mt);       // ASCII order: "Ba"
    expect_close(run_node(einsum("ij->i", 1), {&m}, kind)[0], T({2}, {6, 15}));
    expect_close(run_node(einsum("ij->", 1), {&m}, kind)[0], T({}, {21}));
    expect_close(run_node(einsum("ii", 1), {&sq}, kind)[0], T({}, {15}));      // trace
    expect_close(run_node(einsum("ii->i", 1), {&sq}, kind)[0], T({3}, {1, 5, 9}));  // diagonal
    expect_close(run_node(einsum("ij,jk", 2), {&m, &b}, kind)[0], T({2, 2}, {58, 64, 139, 154}));
    // implicit output: letters appearing once, sorted: "jk,ij" -> "ik" = m x b
    expect_close(run_node(einsum("jk,ij", 2), {&b, &m}, kind)[0], T({2, 2}, {58, 64, 139, 154}));
    // outer product (no contracted index) and an element-wise product kept in the output
    Tensor u = T({2}, {1, 2}), w = T({3}, {3, 4, 5});
    expect_close(run_node(einsum("i,j->ij", 2), {&u, &w}, kind)[0], T({2, 3}, {3, 4, 5, 6, 8, 10}));
    expect_close(run_node(einsum("i,i->i", 2), {&w, &w}, kind)[0], T({3}, {9, 16, 25}));
  }
}

// ---------------------------------------------------------------- fast vs reference
void fast_vs_ref(const Node& n, const std::vector<const Tensor*>& in, double tol = 1e-4) {
  register_cpu_kernels();
  ASSERT_NE(kernel_for(n.op, KernelKind::Fast), kernel_for(n.op, KernelKind::Reference))
      << "no fast kernel registered for " << n.op;
  auto ref = run_node(n, in, KernelKind::Reference);
  auto fast = run_node(n, in, KernelKind::Fast);
  expect_close(fast[0], ref[0], tol, tol);
  // a second run reuses the cached primitive and must agree too
  auto again = run_node(n, in, KernelKind::Fast);
  expect_close(again[0], ref[0], tol, tol);
}

TEST(LinalgFast, MatMulShapes) {
  Tensor a = randn({2, 4, 16, 8}, 21), b = randn({2, 4, 8, 16}, 22);
  fast_vs_ref(make_node("MatMul", 2), {&a, &b});
  Tensor w = randn({8, 24}, 23);
  fast_vs_ref(make_node("MatMul", 2), {&a, &w});  // weights broadcast over batch
  Tensor a3 = randn({4, 16, 8}, 24), b3 = randn({2, 1, 8, 5}, 25);
  fast_vs_ref(make_node("MatMul", 2), {&a3, &b3});  // both broadcast
  Tensor m = randn({8, 16}, 26), bb = randn({3, 16, 7}, 27);
  fast_vs_ref(make_node("MatMul", 2), {&m, &bb});  // A broadcast over B's batch
  Tensor v = randn({16}, 28);
  fast_vs_ref(make_node("MatMul", 2), {&v, &bb});
  Tensor v7 = randn({7}, 29);
  fast_vs_ref(make_node("MatMul", 2), {&bb, &v7});
  Tensor big_a = randn({96, 192}, 30), big_b = randn({192, 160}, 31);
  fast_vs_ref(make_node("MatMul", 2), {&big_a, &big_b});
}

TEST(LinalgFast, GemmVariants) {
  const int M = 37, K = 64, N = 45;
  Tensor a = randn({M, K}, 41), at = randn({K, M}, 42);
  Tensor b = randn({K, N}, 43), bt = randn({N, K}, 44);
  Tensor c_full = randn({M, N}, 45), c_row = randn({N}, 46), c_col = randn({M, 1}, 47);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Node n = make_node("Gemm", 3, 1,
                         {{"transA", attr_i(ta)}, {"transB", attr_i(tb)},
                          {"alpha", attr_f(0.75f)}, {"beta", attr_f(-1.5f)}});
      const Tensor* A = ta ? &at : &a;
      const Tensor* B = tb ? &bt : &b;
      fast_vs_ref(n, {A, B, &c_full});
      fast_vs_ref(n, {A, B, &c_row});
      fast_vs_ref(n, {A, B, &c_col});
      fast_vs_ref(n, {A, B, nullptr});
    }
  // torch Linear export: transB=1, C = bias (N)
  fast_vs_ref(make_node("Gemm", 3, 1, {{"transB", attr_i(1)}}), {&a, &bt, &c_row});
}

TEST(LinalgFast, LinearWithAndWithoutBias) {
  Tensor x = randn({2, 50, 64}, 51), w = randn({96, 64}, 52, 0.1f), bias = randn({96}, 53);
  fast_vs_ref(make_node("Linear", 3), {&x, &w, &bias});
  fast_vs_ref(make_node("Linear", 2), {&x, &w});
  Tensor x1 = randn({64}, 54);
  fast_vs_ref(make_node("Linear", 3), {&x1, &w, &bias});
  // features on the channel axis of NCHW activations (the rewritten 1x1 convs)
  Tensor xc = randn({1, 64, 24, 46}, 58), xc2 = randn({3, 64, 6, 10}, 59);
  Node ax1 = make_node("Linear", 3, 1, {{"axis", attr_i(1)}});
  Node ax1nb = make_node("Linear", 2, 1, {{"axis", attr_i(1)}});
  fast_vs_ref(ax1, {&xc, &w, &bias});
  fast_vs_ref(ax1nb, {&xc, &w});
  fast_vs_ref(ax1, {&xc2, &w, &bias});
  // (B*windows, tokens, D) like the attention projections
  Tensor x2 = randn({128, 49, 32}, 55), w2 = randn({96, 32}, 56, 0.2f), b2 = randn({96}, 57);
  fast_vs_ref(make_node("Linear", 3), {&x2, &w2, &b2});
}

TEST(LinalgFast, AttentionEinsums) {
  Tensor q = randn({1, 4, 16, 8}, 61), k = randn({1, 4, 16, 8}, 62);
  fast_vs_ref(einsum("b h i d, b h j d -> b h i j", 2), {&q, &k});
  Tensor attn = randn({1, 4, 16, 16}, 63), v = randn({1, 4, 16, 8}, 64);
  fast_vs_ref(einsum("b h i j, b h j d -> b h i d", 2), {&attn, &v});
  // many windows: (B*windows, heads, tokens, dim_head)
  Tensor q2 = randn({96, 4, 49, 32}, 65), k2 = randn({96, 4, 49, 32}, 66);
  fast_vs_ref(einsum("bhid,bhjd->bhij", 2), {&q2, &k2});
  Tensor a2 = randn({96, 4, 49, 49}, 67, 0.2f);
  fast_vs_ref(einsum("bhij,bhjd->bhid", 2), {&a2, &k2});
}

TEST(LinalgFast, EinsumLayoutsNeedingStridesOrCopies) {
  // heads in the middle of the operands and a permuted output
  Tensor a = randn({2, 5, 3, 4}, 71), b = randn({2, 6, 3, 4}, 72);
  fast_vs_ref(einsum("bihd,bjhd->bhij", 2), {&a, &b});
  fast_vs_ref(einsum("bihd,bjhd->jbhi", 2), {&a, &b});
  // two contracted letters in different orders (forces a copy of B)
  Tensor c = randn({3, 4, 5}, 73), d = randn({5, 4, 6}, 74);
  fast_vs_ref(einsum("ikj,jkl->il", 2), {&c, &d});
  fast_vs_ref(einsum("ijk,kjl->li", 2), {&c, &d});
  // two M letters, outer product, batch-only
  Tensor e = randn({2, 3, 4, 5}, 75), f = randn({2, 5, 7}, 76);
  fast_vs_ref(einsum("bxyd,bdj->bxyj", 2), {&e, &f});
  fast_vs_ref(einsum("bxyd,bdj->bjyx", 2), {&e, &f});
  // N letter between the M letters of the output (forces staging the output)
  Tensor xy = randn({3, 4, 5}, 81), dj = randn({5, 6}, 82);
  fast_vs_ref(einsum("xyd,dj->xjy", 2), {&xy, &dj});
  Tensor g = randn({6}, 77), h = randn({7}, 78);
  fast_vs_ref(einsum("i,j->ij", 2), {&g, &h});
  fast_vs_ref(einsum("i,i->i", 2), {&g, &g});
  fast_vs_ref(einsum("i,i", 2), {&g, &g});
  // letters summed over one operand only: reference fallback
  Tensor p = randn({3, 4}, 79), r = randn({4, 5}, 80);
  fast_vs_ref(einsum("ij,jk->k", 2), {&p, &r});
  // one operand: reference fallback
  fast_vs_ref(einsum("ijk->kji", 1), {&c});
}

// ---------------------------------------------------------------- errors
TEST(LinalgErrors, MismatchedInnerDims) {
  Tensor a = randn({2, 3}, 1), b = randn({4, 5}, 2);
  EXPECT_THROW(run_node(make_node("MatMul", 2), {&a, &b}), Error);
  std::string msg = error_of(make_node("MatMul", 2), {&a, &b});
  EXPECT_NE(msg.find("test_MatMul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MatMul"), std::string::npos) << msg;
  EXPECT_THROW(run_node(make_node("MatMul", 2), {&a, &b}, KernelKind::Fast), Error);
  Tensor ba = randn({2, 2, 3}, 3), bb = randn({3, 3, 2}, 4);
  EXPECT_THROW(run_node(make_node("MatMul", 2), {&ba, &bb}), Error);  // batch 2 vs 3
  EXPECT_THROW(run_node(make_node("Gemm", 2), {&a, &b}), Error);
  Tensor c_bad = randn({3}, 5), bt = randn({3, 4}, 6);
  EXPECT_THROW(run_node(make_node("Gemm", 3), {&a, &bt, &c_bad}), Error);  // C (3) vs (2,4)
  Tensor a3 = randn({2, 3, 2}, 7);
  EXPECT_THROW(run_node(make_node("Gemm", 2), {&a3, &bt}), Error);  // rank 3
  Tensor w = randn({5, 4}, 8);
  EXPECT_THROW(run_node(make_node("Linear", 2), {&a, &w}), Error);  // K 3 vs 4
  Tensor x = randn({2, 4}, 9), bias = randn({4}, 10);
  EXPECT_THROW(run_node(make_node("Linear", 3), {&x, &w, &bias}), Error);  // bias 4 vs 5
  EXPECT_NO_THROW(run_node(make_node("Linear", 2), {&x, &w}));
  Tensor xc = randn({2, 4, 3}, 11);  // axis 1 has 4 features, W wants 4: fine; axis -1 has 3
  EXPECT_NO_THROW(run_node(make_node("Linear", 2, 1, {{"axis", attr_i(1)}}), {&xc, &w}));
  EXPECT_THROW(run_node(make_node("Linear", 2), {&xc, &w}), Error);
  EXPECT_THROW(run_node(make_node("Linear", 2, 1, {{"axis", attr_i(3)}}), {&xc, &w}), Error);
}

TEST(LinalgErrors, EinsumEquations) {
  Tensor a = randn({2, 3}, 1), b = randn({4, 5}, 2);
  std::string msg = error_of(einsum("ij,jk->ik", 2), {&a, &b});  // j: 3 vs 4
  EXPECT_NE(msg.find("test_Einsum"), std::string::npos) << msg;
  msg = error_of(einsum("...ij,...jk->...ik", 2), {&a, &a});
  EXPECT_NE(msg.find("test_Einsum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("...ij,...jk->...ik"), std::string::npos) << msg;
  EXPECT_THROW(run_node(einsum("ij,jk->ik", 1), {&a}), Error);     // operand count
  EXPECT_THROW(run_node(einsum("ijk->ik", 1), {&a}), Error);       // rank
  EXPECT_THROW(run_node(einsum("ij->iz", 1), {&a}), Error);        // unknown output index
  EXPECT_THROW(run_node(einsum("ij->ii", 1), {&a}), Error);        // repeated output index
  EXPECT_THROW(run_node(einsum("i1->i", 1), {&a}), Error);         // bad character
  Tensor i64 = Tensor::from_i64({1, 2, 3});
  EXPECT_THROW(run_node(einsum("i->i", 1), {&i64}), Error);        // dtype
}

}  // namespace
}  // namespace wxe::test
