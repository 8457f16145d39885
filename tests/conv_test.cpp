// Conv and ConvTranspose: reference kernels against hand-computed values and independent
// naive formulas (a per-output gather for Conv, a per-input scatter for ConvTranspose); the
// oneDNN fast path against the reference on shapes like the CrossFormer's; error cases.
#include <string>
#include <vector>

#include "test_util.h"

namespace wxe::test {
namespace {

Tensor T(Shape s, std::vector<float> v) { return Tensor::from_f32(std::move(s), v); }

const KernelKind kBoth[] = {KernelKind::Reference, KernelKind::Fast};

struct Conv2dParams {
  int64_t sh = 1, sw = 1, ph0 = 0, pw0 = 0, ph1 = 0, pw1 = 0, dh = 1, dw = 1, group = 1;
};

// Independent 2-D convolution: one output element at a time, straight from the definition
// y[n,o,i,j] = b[o] + sum_{c,p,q} x[n, g*Cig + c, i*sh - ph0 + p*dh, j*sw - pw0 + q*dw] w[o,c,p,q].
Tensor naive_conv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& P) {
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t O = w.shape[0], Cig = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  const int64_t OH = (H + P.ph0 + P.ph1 - ((KH - 1) * P.dh + 1)) / P.sh + 1;
  const int64_t OW = (W + P.pw0 + P.pw1 - ((KW - 1) * P.dw + 1)) / P.sw + 1;
  const int64_t Cog = O / P.group;
  Tensor y(DType::F32, {N, O, OH, OW});
  auto X = [&](int64_t n, int64_t c, int64_t i, int64_t j) -> double {
    if (i < 0 || i >= H || j < 0 || j >= W) return 0.0;
    return x.data<float>()[((n * C + c) * H + i) * W + j];
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          const int64_t g = o / Cog;
          double s = b ? b->data<float>()[o] : 0.0;
          for (int64_t c = 0; c < Cig; ++c)
            for (int64_t p = 0; p < KH; ++p)
              for (int64_t q = 0; q < KW; ++q)
                s += X(n, g * Cig + c, i * P.sh - P.ph0 + p * P.dh, j * P.sw - P.pw0 + q * P.dw) *
                     w.data<float>()[((o * Cig + c) * KH + p) * KW + q];
          y.data<float>()[((n * O + o) * OH + i) * OW + j] = (float)s;
        }
  return y;
}

// Independent 2-D transposed convolution, scatter form: every input element adds
// x * w[c, o, p, q] to output (i*sh - ph0 + p*dh, j*sw - pw0 + q*dw) when that lies inside
// the (OH, OW) output.
Tensor scatter_conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor* b, int64_t OH,
                                int64_t OW, const Conv2dParams& P) {
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Cog = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  const int64_t Cig = C / P.group, O = Cog * P.group;
  std::vector<double> acc((size_t)(N * O * OH * OW), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H; ++i)
        for (int64_t j = 0; j < W; ++j) {
          const double xv = x.data<float>()[((n * C + c) * H + i) * W + j];
          const int64_t g = c / Cig;
          for (int64_t oc = 0; oc < Cog; ++oc)
            for (int64_t p = 0; p < KH; ++p)
              for (int64_t q = 0; q < KW; ++q) {
                const int64_t oi = i * P.sh - P.ph0 + p * P.dh, oj = j * P.sw - P.pw0 + q * P.dw;
                if (oi < 0 || oi >= OH || oj < 0 || oj >= OW) continue;
                const int64_t o = g * Cog + oc;
                acc[((n * O + o) * OH + oi) * OW + oj] +=
                    xv * w.data<float>()[((c * Cog + oc) * KH + p) * KW + q];
              }
        }
  Tensor y(DType::F32, {N, O, OH, OW});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < OH * OW; ++k) {
        const size_t idx = (size_t)((n * O + o) * OH * OW + k);
        y.data<float>()[idx] = (float)(acc[idx] + (b ? b->data<float>()[o] : 0.0));
      }
  return y;
}

Node conv(const Conv2dParams& P, int nin, bool transpose = false,
          std::map<std::string, Attr> extra = {}) {
  std::map<std::string, Attr> a = {
      {"strides", attr_ints({P.sh, P.sw})},
      {"pads", attr_ints({P.ph0, P.pw0, P.ph1, P.pw1})},
      {"dilations", attr_ints({P.dh, P.dw})},
      {"group", attr_i(P.group)}};
  for (auto& kv : extra) a[kv.first] = kv.second;
  return make_node(transpose ? "ConvTranspose" : "Conv", nin, 1, a);
}

// ---------------------------------------------------------------- reference semantics
TEST(ConvRef, HandComputed) {
  Tensor x = T({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = T({1, 1, 2, 2}, {1, 0, 0, -1});  // y = x[i][j] - x[i+1][j+1]
  for (auto kind : kBoth) {
    expect_close(run_node(make_node("Conv", 2), {&x, &w}, kind)[0], T({1, 1, 2, 2}, {-4, -4, -4, -4}));
    Conv2dParams P;
    P.sh = P.sw = 2;
    P.ph0 = P.pw0 = P.ph1 = P.pw1 = 1;
    expect_close(run_node(conv(P, 2), {&x, &w}, kind)[0], T({1, 1, 2, 2}, {-1, -3, -7, -4}));
    Conv2dParams D;
    D.dh = D.dw = 2;
    expect_close(run_node(conv(D, 2), {&x, &w}, kind)[0], T({1, 1, 1, 1}, {-8}));
    Tensor b = T({1}, {0.5f});
    expect_close(run_node(make_node("Conv", 3), {&x, &w, &b}, kind)[0],
                 T({1, 1, 2, 2}, {-3.5f, -3.5f, -3.5f, -3.5f}));
  }
}

TEST(ConvRef, StridePadDilationGroupAgainstNaive) {
  Tensor x = randn({2, 4, 7, 9}, 1);
  Tensor w = randn({6, 2, 3, 3}, 2);
  Tensor b = randn({6}, 3);
  Conv2dParams P;
  P.sh = 2; P.sw = 1; P.ph0 = 1; P.pw0 = 2; P.ph1 = 0; P.pw1 = 1; P.dh = 1; P.dw = 2; P.group = 2;
  Tensor ref = naive_conv2d(x, w, &b, P);
  ASSERT_EQ(shape_str(ref.shape), "(2, 6, 3, 8)");
  for (auto kind : kBoth) {
    expect_close(run_node(conv(P, 3), {&x, &w, &b}, kind)[0], ref, 1e-4, 1e-4);
    expect_close(run_node(conv(P, 3), {&x, &w, nullptr}, kind)[0], naive_conv2d(x, w, nullptr, P),
                 1e-4, 1e-4);
  }
}

TEST(ConvRef, OneDimensional) {
  // a 1-D conv equals the 2-D conv with H = 1
  Tensor x = randn({2, 3, 10}, 4), w = randn({4, 3, 3}, 5), b = randn({4}, 6);
  Node n = make_node("Conv", 3, 1,
                     {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 2})},
                      {"dilations", attr_ints({2})}});
  Conv2dParams P;
  P.sw = 2; P.pw0 = 1; P.pw1 = 2; P.dw = 2;
  Tensor ref = naive_conv2d(x.reshaped({2, 3, 1, 10}), w.reshaped({4, 3, 1, 3}), &b, P);
  for (auto kind : kBoth) {
    auto y = run_node(n, {&x, &w, &b}, kind);
    ASSERT_EQ(shape_str(y[0].shape), "(2, 4, 5)");
    expect_close(y[0].reshaped({2, 4, 1, 5}), ref, 1e-4, 1e-4);
  }
}

TEST(ConvRef, AutoPad) {
  // H = 5, W = 6, kernel (4, 3), stride 2: SAME output (3, 3);
  // total pads H: (3-1)*2+4-5 = 3, W: (3-1)*2+3-6 = 1
  Tensor x = randn({1, 2, 5, 6}, 7), w = randn({3, 2, 4, 3}, 8);
  Conv2dParams upper, lower, valid;
  upper.sh = upper.sw = lower.sh = lower.sw = valid.sh = valid.sw = 2;
  upper.ph0 = 1; upper.ph1 = 2; upper.pw0 = 0; upper.pw1 = 1;
  lower.ph0 = 2; lower.ph1 = 1; lower.pw0 = 1; lower.pw1 = 0;
  auto node = [](const std::string& ap) {
    return make_node("Conv", 2, 1, {{"auto_pad", attr_s(ap)}, {"strides", attr_ints({2, 2})}});
  };
  for (auto kind : kBoth) {
    expect_close(run_node(node("SAME_UPPER"), {&x, &w}, kind)[0], naive_conv2d(x, w, nullptr, upper),
                 1e-4, 1e-4);
    expect_close(run_node(node("SAME_LOWER"), {&x, &w}, kind)[0], naive_conv2d(x, w, nullptr, lower),
                 1e-4, 1e-4);
    auto v = run_node(node("VALID"), {&x, &w}, kind);
    EXPECT_EQ(shape_str(v[0].shape), "(1, 3, 1, 2)");
    expect_close(v[0], naive_conv2d(x, w, nullptr, valid), 1e-4, 1e-4);
  }
}

TEST(ConvTransposeRef, HandComputed) {
  // kernel 2 stride 2 of ones: every input pixel becomes a 2x2 block
  Tensor x = T({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor w = T({1, 1, 2, 2}, {1, 1, 1, 1});
  Node n = make_node("ConvTranspose", 2, 1, {{"strides", attr_ints({2, 2})}});
  for (auto kind : kBoth)
    expect_close(run_node(n, {&x, &w}, kind)[0],
                 T({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // stride 1, one input channel, two output channels with kernels [1, 10] and [-1, 0]
  Tensor x1 = T({1, 1, 1, 3}, {1, 2, 3});
  Tensor w1 = T({1, 2, 1, 2}, {1, 10, -1, 0});
  for (auto kind : kBoth)
    expect_close(run_node(make_node("ConvTranspose", 2), {&x1, &w1}, kind)[0],
                 T({1, 2, 1, 4}, {1, 12, 23, 30, -1, -2, -3, 0}));
}

TEST(ConvTransposeRef, Stride2Pads1Kernel4AgainstScatter) {
  Tensor x = randn({2, 4, 5, 6}, 11);
  Tensor w = randn({4, 3, 4, 4}, 12);  // group 2: C_out = 6
  Tensor b = randn({6}, 13);
  Conv2dParams P;
  P.sh = P.sw = 2;
  P.ph0 = P.pw0 = P.ph1 = P.pw1 = 1;
  P.group = 2;
  // out = 2*(in-1) + 4 - 2
  Tensor ref = scatter_conv_transpose2d(x, w, &b, 10, 12, P);
  // with output_padding 1: one more row/column at the end
  Tensor ref_op = scatter_conv_transpose2d(x, w, &b, 11, 13, P);
  Node n_op = conv(P, 3, true, {{"output_padding", attr_ints({1, 1})}});
  // the same size given as output_shape (begin pads kept)
  Node n_os = conv(P, 3, true, {{"output_shape", attr_ints({11, 13})}});
  for (auto kind : kBoth) {
    expect_close(run_node(conv(P, 3, true), {&x, &w, &b}, kind)[0], ref, 1e-4, 1e-4);
    expect_close(run_node(n_op, {&x, &w, &b}, kind)[0], ref_op, 1e-4, 1e-4);
    expect_close(run_node(n_os, {&x, &w, &b}, kind)[0], ref_op, 1e-4, 1e-4);
  }
}

TEST(ConvTransposeRef, DilationOutputPaddingNoPadsAndAutoPad) {
  Tensor x = randn({1, 2, 4, 3}, 14), w = randn({2, 3, 3, 2}, 15);
  Conv2dParams P;
  P.sh = 3; P.sw = 2; P.dh = 2; P.dw = 1;
  // out H = 3*3 + 1 + (2*2+1) = 15, W = 2*2 + 1 + 2 = 7 (output_padding 1, no pads)
  Node n = conv(P, 2, true, {{"output_padding", attr_ints({1, 1})}});
  Tensor ref = scatter_conv_transpose2d(x, w, nullptr, 15, 7, P);
  // SAME_UPPER: out = in * stride = (12, 6); totals H: 3*3+5-12 = 2 (1,1), W: 2*2+2-6 = 0
  Conv2dParams S = P;
  S.ph0 = 1;
  Node same = make_node("ConvTranspose", 2, 1,
                        {{"auto_pad", attr_s("SAME_UPPER")}, {"strides", attr_ints({3, 2})},
                         {"dilations", attr_ints({2, 1})}});
  Tensor ref_same = scatter_conv_transpose2d(x, w, nullptr, 12, 6, S);
  // odd total: kernel 3 stride 2 on 3 -> natural 7, SAME output 6: UPPER puts the extra pad
  // at the end (begin 0), LOWER at the beginning (begin 1)
  Tensor x3 = randn({1, 1, 3, 3}, 16), w3 = randn({1, 1, 3, 3}, 17);
  Conv2dParams U, L;
  U.sh = U.sw = L.sh = L.sw = 2;
  L.ph0 = L.pw0 = 1;
  auto same_node = [](const std::string& ap) {
    return make_node("ConvTranspose", 2, 1, {{"auto_pad", attr_s(ap)}, {"strides", attr_ints({2, 2})}});
  };
  for (auto kind : kBoth) {
    expect_close(run_node(n, {&x, &w}, kind)[0], ref, 1e-4, 1e-4);
    expect_close(run_node(same, {&x, &w}, kind)[0], ref_same, 1e-4, 1e-4);
    expect_close(run_node(same_node("SAME_UPPER"), {&x3, &w3}, kind)[0],
                 scatter_conv_transpose2d(x3, w3, nullptr, 6, 6, U), 1e-4, 1e-4);
    expect_close(run_node(same_node("SAME_LOWER"), {&x3, &w3}, kind)[0],
                 scatter_conv_transpose2d(x3, w3, nullptr, 6, 6, L), 1e-4, 1e-4);
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
  auto again = run_node(n, in, KernelKind::Fast);  // cached primitive
  expect_close(again[0], ref[0], tol, tol);
}

Conv2dParams sp(int64_t s, int64_t p, int64_t group = 1, int64_t d = 1) {
  Conv2dParams P;
  P.sh = P.sw = s;
  P.ph0 = P.pw0 = P.ph1 = P.pw1 = p;
  P.group = group;
  P.dh = P.dw = d;
  return P;
}

TEST(ConvFast, CrossEmbedConvs) {
  Tensor x = randn({1, 7, 64, 128}, 21);
  Tensor w = randn({16, 7, 4, 4}, 22, 0.2f), b = randn({16}, 23);
  fast_vs_ref(conv(sp(2, 1), 3), {&x, &w, &b});
  // the bigger CrossEmbed kernels: (k - stride) / 2 padding
  Tensor w8 = randn({8, 7, 8, 8}, 24, 0.1f), w16 = randn({4, 7, 16, 16}, 25, 0.05f);
  fast_vs_ref(conv(sp(2, 3), 2), {&x, &w8});
  fast_vs_ref(conv(sp(2, 7), 2), {&x, &w16});
  Tensor xs = randn({1, 5, 40, 72}, 26), w32 = randn({4, 5, 32, 32}, 27, 0.03f), b32 = randn({4}, 28);
  fast_vs_ref(conv(sp(2, 15), 3), {&xs, &w32, &b32});
}

TEST(ConvFast, PointwiseGroupedDilatedAndOneDimensional) {
  Tensor x = randn({1, 64, 16, 32}, 31);
  Tensor w1 = randn({96, 64, 1, 1}, 32, 0.1f), b1 = randn({96}, 33);
  fast_vs_ref(conv(sp(1, 0), 3), {&x, &w1, &b1});
  Tensor wg = randn({32, 16, 3, 3}, 34, 0.1f);
  fast_vs_ref(conv(sp(1, 1, 4), 2), {&x, &wg});
  Tensor wd = randn({64, 1, 3, 3}, 35, 0.3f), bd = randn({64}, 36);  // depthwise
  fast_vs_ref(conv(sp(1, 1, 64), 3), {&x, &wd, &bd});
  Tensor wdil = randn({8, 64, 3, 3}, 37, 0.05f);
  fast_vs_ref(conv(sp(1, 2, 1, 2), 2), {&x, &wdil});
  Conv2dParams asym;
  asym.sh = 2; asym.sw = 1; asym.ph0 = 0; asym.ph1 = 1; asym.pw0 = 2; asym.pw1 = 0;
  fast_vs_ref(conv(asym, 2), {&x, &wdil});
  fast_vs_ref(make_node("Conv", 2, 1, {{"auto_pad", attr_s("SAME_UPPER")}, {"strides", attr_ints({2, 2})}}),
              {&x, &wdil});
  Tensor x1 = randn({2, 6, 50}, 38), w1d = randn({10, 6, 5}, 39, 0.2f);
  fast_vs_ref(make_node("Conv", 2, 1, {{"strides", attr_ints({2})}, {"pads", attr_ints({2, 2})}}),
              {&x1, &w1d});
  Tensor xb = randn({3, 7, 20, 36}, 42), wb = randn({16, 7, 4, 4}, 43, 0.2f);  // batch 3
  fast_vs_ref(conv(sp(2, 1), 2), {&xb, &wb});
  Tensor x3 = randn({1, 3, 6, 8, 8}, 40), w3 = randn({4, 3, 3, 3, 3}, 41, 0.2f);
  fast_vs_ref(make_node("Conv", 2, 1, {{"pads", attr_ints({1, 1, 1, 1, 1, 1})}}), {&x3, &w3});
}

TEST(ConvFast, TransposeDecoder) {
  Tensor x = randn({1, 64, 16, 32}, 51);
  Tensor w2 = randn({64, 32, 2, 2}, 52, 0.1f), b2 = randn({32}, 53);
  fast_vs_ref(conv(sp(2, 0), 3, true), {&x, &w2, &b2});
  Tensor w4 = randn({64, 16, 4, 4}, 54, 0.1f), b4 = randn({16}, 55);
  fast_vs_ref(conv(sp(2, 1), 3, true), {&x, &w4, &b4});
  Tensor w3 = randn({64, 8, 3, 3}, 56, 0.1f);
  fast_vs_ref(conv(sp(2, 1), 2, true, {{"output_padding", attr_ints({1, 1})}}), {&x, &w3});
  // output_padding beyond the end pads (oneDNN right padding -1)
  fast_vs_ref(conv(sp(2, 0), 2, true, {{"output_padding", attr_ints({1, 1})}}), {&x, &w3});
  Tensor wg = randn({64, 4, 4, 4}, 57, 0.1f);  // group 4 -> 16 channels
  fast_vs_ref(conv(sp(2, 1, 4), 2, true), {&x, &wg});
  Tensor wdil = randn({64, 4, 3, 3}, 58, 0.1f);
  fast_vs_ref(conv(sp(1, 1, 1, 2), 2, true), {&x, &wdil});
  // batch of 2, and a 1-D transposed conv
  Tensor x2 = randn({2, 16, 8, 12}, 59), w2b = randn({16, 8, 4, 4}, 60, 0.1f);
  fast_vs_ref(conv(sp(2, 1), 2, true), {&x2, &w2b});
  Tensor x1 = randn({2, 6, 20}, 61), w1 = randn({6, 5, 4}, 62, 0.2f), b1 = randn({5}, 63);
  fast_vs_ref(make_node("ConvTranspose", 3, 1, {{"strides", attr_ints({2})}, {"pads", attr_ints({1, 1})}}),
              {&x1, &w1, &b1});
}

// ---------------------------------------------------------------- errors
TEST(ConvErrors, BadShapes) {
  Tensor x = randn({1, 6, 8, 8}, 1);
  Tensor w_bad_group = randn({4, 3, 3, 3}, 2);
  EXPECT_THROW(run_node(conv(sp(1, 1, 4), 2), {&x, &w_bad_group}), Error);  // 6 % 4
  Tensor w_mismatch = randn({4, 5, 3, 3}, 3);
  EXPECT_THROW(run_node(conv(sp(1, 1), 2), {&x, &w_mismatch}), Error);  // 5 vs 6 channels
  try {
    run_node(conv(sp(1, 1), 2), {&x, &w_mismatch});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_Conv"), std::string::npos) << e.what();
  }
  Tensor w_ok = randn({4, 6, 3, 3}, 4);
  Tensor bias_bad = randn({5}, 5);
  EXPECT_THROW(run_node(conv(sp(1, 1), 3), {&x, &w_ok, &bias_bad}), Error);
  Tensor w_rank = randn({4, 6, 3}, 6);
  EXPECT_THROW(run_node(conv(sp(1, 1), 2), {&x, &w_rank}), Error);
  Tensor x_rank = randn({6, 8}, 7);
  EXPECT_THROW(run_node(make_node("Conv", 2), {&x_rank, &w_rank}), Error);
  Tensor w_big = randn({4, 6, 9, 9}, 8);  // kernel larger than the input
  EXPECT_THROW(run_node(make_node("Conv", 2), {&x, &w_big}), Error);
  Tensor w_oc = randn({4, 2, 3, 3}, 9);  // 4 output channels, group 3
  EXPECT_THROW(run_node(conv(sp(1, 1, 3), 2), {&x, &w_oc}), Error);
  Tensor w_g3 = randn({3, 2, 3, 3}, 10);
  EXPECT_NO_THROW(run_node(conv(sp(1, 1, 3), 2), {&x, &w_g3}));
  EXPECT_THROW(run_node(make_node("Conv", 2, 1, {{"kernel_shape", attr_ints({2, 2})}}), {&x, &w_ok}),
               Error);
  // ConvTranspose: weight dim 0 must be the input channels
  Tensor wt = randn({4, 2, 2, 2}, 11);
  EXPECT_THROW(run_node(conv(sp(2, 0), 2, true), {&x, &wt}), Error);
  Tensor wt6 = randn({6, 2, 2, 2}, 12);
  EXPECT_THROW(run_node(conv(sp(2, 0, 4), 2, true), {&x, &wt6}), Error);  // 6 % 4
}

}  // namespace
}  // namespace wxe::test
