// The CUDA kernels' index math (kernels/cuda/index_math.h, __host__ __device__) run on the
// host against the CPU reference kernels: the same walks, pad maps, reductions, resize taps
// and einsum strides the GPU kernels use, checked without a GPU.
#include "engine/math/spectral_norm_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/index_math.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;
using namespace wxe::cuda;

namespace {

// dst[b] = src[a] over the walk, on the host.
Tensor host_copy(const Walk& w, const Tensor& src, const Shape& out) {
  Tensor dst = Tensor::zeros(DType::F32, out);
  for (int64_t i = 0; i < w.count; ++i) {
    int64_t a, b;
    walk_offsets(w, i, &a, &b);
    dst.data<float>()[b] = src.data<float>()[a];
  }
  return dst;
}

Tensor i64(std::vector<int64_t> v) { return Tensor::from_i64(v); }

}  // namespace

TEST(CudaIndexMath, TransposeWalkMatchesCpu) {
  Tensor x = randn({2, 3, 4, 5, 6}, 1);
  for (auto perm : std::vector<std::vector<int64_t>>{{0, 2, 3, 1, 4}, {4, 3, 2, 1, 0}, {0, 1, 2, 4, 3}, {0, 1, 2, 3, 4}}) {
    Walk w;
    ASSERT_TRUE(transpose_walk(x.shape, perm, &w));
    Tensor ref = run_node(make_node("Transpose", 1, 1, {{"perm", attr_ints(perm)}}), {&x})[0];
    expect_close(host_copy(w, x, ref.shape), ref, 0, 0);
  }
}

TEST(CudaIndexMath, WalkMergesContiguousDims) {
  Walk w;
  ASSERT_TRUE(make_walk({2, 3, 4}, {12, 4, 1}, {12, 4, 1}, 0, 0, &w));
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.count, 24);
  // 9 dims that do not merge are too many
  std::vector<int64_t> size(9, 2), st(9), perm_st(9);
  for (int d = 0; d < 9; ++d) st[d] = int64_t(1) << (8 - d), perm_st[d] = int64_t(1) << d;
  EXPECT_FALSE(make_walk(size, perm_st, st, 0, 0, &w));
}

TEST(CudaIndexMath, BroadcastWalkMatchesCpuAdd) {
  Tensor a = randn({2, 1, 4, 5}, 2), b = randn({3, 1, 5}, 3);
  Tensor ref = run_node(make_node("Add", 2), {&a, &b})[0];
  Walk w;
  ASSERT_TRUE(make_walk(ref.shape, broadcast_strides(a.shape, ref.shape), broadcast_strides(b.shape, ref.shape), 0, 0, &w));
  Tensor got(DType::F32, ref.shape);
  for (int64_t i = 0; i < w.count; ++i) {
    int64_t ia, ib;
    walk_offsets(w, i, &ia, &ib);
    got.data<float>()[i] = a.data<float>()[ia] + b.data<float>()[ib];
  }
  expect_close(got, ref, 0, 0);
}

TEST(CudaIndexMath, SliceWalkWithNegativeStepsMatchesCpu) {
  Tensor x = randn({4, 6, 5}, 4);
  Tensor st = i64({-1, 1, 0}), en = i64({-100, 6, 5}), ax = i64({0, 1, 2}), sp = i64({-1, 2, -2});
  Node n = make_node("Slice", 5);
  Tensor ref = run_node(n, {&x, &st, &en, &ax, &sp})[0];
  auto plan = cpu::slice_plan(n, x.shape, st.to_i64(), en.to_i64(), ax.to_i64(), sp.to_i64());
  auto xs = contiguous_strides(x.shape);
  int64_t base = 0;
  std::vector<int64_t> sst;
  Shape shape;
  for (size_t d = 0; d < plan.size(); ++d) {
    base += plan[d].start * xs[d];
    sst.push_back(plan[d].step * xs[d]);
    shape.push_back(plan[d].len);
  }
  Walk w;
  ASSERT_TRUE(make_walk(shape, sst, contiguous_strides(shape), base, 0, &w));
  expect_close(host_copy(w, x, ref.shape), ref, 0, 0);
}

TEST(CudaIndexMath, PadMapMatchesCpuInEveryMode) {
  Tensor x = randn({2, 3, 5, 4}, 5);
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    Tensor pads = i64({0, 0, 2, -1, 0, 1, 3, 2});
    Node n = make_node("Pad", 2, 1, {{"mode", attr_s(mode)}});
    Tensor ref = run_node(n, {&x, &pads})[0];
    cpu::PadPlan p = cpu::pad_plan(n, x.shape, pads.to_i64(), {});
    const PadMode m = std::string(mode) == "constant" ? PadMode::Constant
                      : std::string(mode) == "reflect" ? PadMode::Reflect
                      : std::string(mode) == "edge"    ? PadMode::Edge
                                                       : PadMode::Wrap;
    PadIndex pi;
    ASSERT_TRUE(make_pad(x.shape, p.begin, p.end, m, &pi));
    Tensor got(DType::F32, ref.shape);
    for (int64_t i = 0; i < got.numel(); ++i) {
      const int64_t s = pad_offset(pi, i);
      got.data<float>()[i] = s < 0 ? 0.f : x.data<float>()[s];
    }
    expect_close(got, ref, 0, 0);
  }
}

TEST(CudaIndexMath, ReduceIndexMatchesCpuReduceSum) {
  Tensor x = randn({3, 4, 5, 6}, 6);
  for (auto axes : std::vector<std::vector<int64_t>>{{1}, {0, 2}, {3}, {0, 1, 2, 3}}) {
    Tensor a = i64(axes);
    Tensor ref = run_node(make_node("ReduceSum", 2), {&x, &a})[0];
    std::vector<bool> red(4, false);
    for (int64_t d : axes) red[d] = true;
    ReduceIndex r;
    ASSERT_TRUE(make_reduce(x.shape, red, &r));
    Tensor got(DType::F32, ref.shape);
    ASSERT_EQ(r.kept.count, got.numel());
    for (int64_t i = 0; i < r.kept.count; ++i) {
      double s = 0;
      for (int64_t j = 0; j < r.red.count; ++j) s += x.data<float>()[reduce_offset(r, i, j)];
      got.data<float>()[i] = (float)s;
    }
    expect_close(got, ref, 1e-5, 1e-5);
  }
}

TEST(CudaIndexMath, DepthToSpaceWalkMatchesCpu) {
  Tensor x = randn({2, 12, 3, 4}, 7);
  for (const char* mode : {"DCR", "CRD"}) {
    SCOPED_TRACE(mode);
    Tensor ref = run_node(make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}, {"mode", attr_s(mode)}}), {&x})[0];
    Walk w;
    ASSERT_TRUE(depth_to_space_walk(x.shape, 2, std::string(mode) == "CRD", &w));
    expect_close(host_copy(w, x, ref.shape), ref, 0, 0);
  }
}

TEST(CudaIndexMath, ResizeTapsMatchCpu) {
  Tensor x = randn({1, 2, 5, 7}, 8);
  Tensor scales = Tensor::from_f32({4}, {1, 1, 2.f, 1.5f});
  for (const char* mode : {"nearest", "linear", "cubic"}) {
    SCOPED_TRACE(mode);
    Node n = make_node("Resize", 3, 1, {{"mode", attr_s(mode)}});
    Tensor ref = run_node(n, {&x, nullptr, &scales})[0];
    auto taps = cpu::resize_axis_taps(n, {&x, nullptr, &scales}, ref.shape);
    std::vector<int> k;
    std::vector<std::vector<int64_t>> ti;
    std::vector<std::vector<float>> tw;
    for (auto& t : taps) {
      k.push_back(t.k);
      ti.push_back(t.idx);
      tw.push_back(t.w);
    }
    ResizeIndex r;
    std::vector<int64_t> idx;
    std::vector<float> w;
    ASSERT_TRUE(make_resize(x.shape, ref.shape, k, ti, tw, &r, &idx, &w));
    Tensor got(DType::F32, ref.shape);
    for (int64_t i = 0; i < got.numel(); ++i) got.data<float>()[i] = resize_at(r, idx.data(), w.data(), x.data<float>(), i);
    expect_close(got, ref, 1e-5, 1e-5);
  }
}

TEST(CudaIndexMath, GenericEinsumMatchesCpu) {
  struct C {
    std::string eq;
    std::vector<Shape> shapes;
  };
  for (const C& c : std::vector<C>{{"bhid,bhjd->bhij", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
                                   {"ii->i", {{4, 4}}},
                                   {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
                                   {"ikj,kl->lji", {{4, 3, 5}, {3, 6}}},
                                   {"ij->", {{3, 4}}}}) {
    SCOPED_TRACE(c.eq);
    std::vector<Tensor> in;
    std::vector<const Tensor*> p;
    std::vector<std::vector<int64_t>> shapes;
    for (size_t i = 0; i < c.shapes.size(); ++i) in.push_back(randn(c.shapes[i], 10 + (unsigned)i));
    for (auto& t : in) {
      p.push_back(&t);
      shapes.push_back(t.shape);
    }
    Node n = make_node("Einsum", (int)in.size(), 1, {{"equation", attr_s(c.eq)}});
    Tensor ref = run_node(n, p)[0];
    const std::string lhs = c.eq.substr(0, c.eq.find("->"));
    std::vector<std::string> subs;
    for (size_t s = 0, e; s <= lhs.size(); s = e + 1) {
      e = lhs.find(',', s);
      if (e == std::string::npos) e = lhs.size();
      subs.push_back(lhs.substr(s, e - s));
    }
    EinsumIndex e;
    ASSERT_TRUE(make_einsum(subs, c.eq.substr(c.eq.find("->") + 2), shapes, &e));
    Tensor got(DType::F32, ref.shape);
    const float* a = in[0].data<float>();
    const float* b = in.size() > 1 ? in[1].data<float>() : nullptr;
    const float* d = in.size() > 2 ? in[2].data<float>() : nullptr;
    for (int64_t i = 0; i < got.numel(); ++i) got.data<float>()[i] = einsum_at(e, a, b, d, i);
    expect_close(got, ref, 1e-5, 1e-5);
  }
}

// ---- the backward kernels' index math (kernels/cuda/backward.cu)

namespace {

// The CPU backward kernel of a one-node case: the gradient of input 0 for output gradient g.
Tensor cpu_input_grad(const Node& n, const std::vector<const Tensor*>& in, const Tensor& g) {
  std::vector<Tensor> out = run_node(n, in);
  std::vector<const Tensor*> op;
  for (auto& t : out) op.push_back(&t);
  Tensor gx(DType::F32, in[0]->shape);
  std::vector<Tensor*> gin(in.size(), nullptr);
  gin[0] = &gx;
  backward_kernel(n.op)(n, in, op, {&g}, gin);
  return gx;
}

}  // namespace

TEST(CudaIndexMath, ReversedWalksMatchCpuBackward) {
  Tensor x = randn({2, 3, 4, 5}, 20);
  Walk w;
  // Transpose
  std::vector<int64_t> perm = {0, 2, 3, 1};
  Node t = make_node("Transpose", 1, 1, {{"perm", attr_ints(perm)}});
  ASSERT_TRUE(transpose_walk(x.shape, perm, &w));
  Tensor g = randn({2, 4, 5, 3}, 21);
  expect_close(host_copy(reversed_walk(w), g, x.shape), cpu_input_grad(t, {&x}, g), 0, 0);
  // DepthToSpace
  Tensor y = randn({2, 8, 3, 4}, 22);
  Node d = make_node("DepthToSpace", 1, 1, {{"blocksize", attr_i(2)}, {"mode", attr_s("CRD")}});
  ASSERT_TRUE(depth_to_space_walk(y.shape, 2, true, &w));
  Tensor gd = randn({2, 2, 6, 8}, 23);
  expect_close(host_copy(reversed_walk(w), gd, y.shape), cpu_input_grad(d, {&y}, gd), 0, 0);
  // Slice with a negative step: the backward walk writes into a zeroed input gradient
  Tensor st = i64({-1, 1}), en = i64({-100, 5}), ax = i64({1, 3}), sp = i64({-2, 2});
  Node s = make_node("Slice", 5);
  auto plan = cpu::slice_plan(s, x.shape, st.to_i64(), en.to_i64(), ax.to_i64(), sp.to_i64());
  auto xs = contiguous_strides(x.shape);
  int64_t base = 0;
  std::vector<int64_t> sst;
  Shape shape;
  for (size_t k = 0; k < plan.size(); ++k) {
    base += plan[k].start * xs[k];
    sst.push_back(plan[k].step * xs[k]);
    shape.push_back(plan[k].len);
  }
  ASSERT_TRUE(make_walk(shape, contiguous_strides(shape), sst, 0, base, &w));  // as backward.cu slice_bw
  Tensor gs = randn(shape, 24);
  expect_close(host_copy(w, gs, x.shape), cpu_input_grad(s, {&x, &st, &en, &ax, &sp}, gs), 0, 0);
}

TEST(CudaIndexMath, SumToMatchesCpuExpandBackward) {
  for (auto [to, from] : std::vector<std::pair<Shape, Shape>>{
           {{3, 1, 5}, {2, 3, 4, 5}}, {{1, 4, 1}, {2, 3, 4, 5}}, {{5}, {2, 3, 4, 5}}, {{2, 3, 4, 5}, {2, 3, 4, 5}}, {{1}, {7, 2}}}) {
    Tensor x = randn(to, 25);
    Tensor shp = i64(std::vector<int64_t>(from.begin(), from.end()));
    Tensor g = randn(from, 26);
    Tensor ref = cpu_input_grad(make_node("Expand", 2), {&x, &shp}, g);
    ReduceIndex r;
    ASSERT_TRUE(make_sum_to(from, to, &r));
    ASSERT_EQ(r.kept.count, numel(to));
    Tensor got(DType::F32, to);
    for (int64_t i = 0; i < r.kept.count; ++i) {
      double a = 0;
      for (int64_t j = 0; j < r.red.count; ++j) a += g.data<float>()[reduce_offset(r, i, j)];
      got.data<float>()[i] = (float)a;
    }
    expect_close(got, ref, 1e-5, 1e-5);
  }
  ReduceIndex r;
  EXPECT_FALSE(make_sum_to({2, 3}, {4}, &r));  // not a broadcast
}

TEST(CudaIndexMath, PadScatterMatchesCpuPadBackward) {
  Tensor x = randn({2, 3, 5, 4}, 27);
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    Tensor pads = i64({0, 0, 2, -1, 0, 1, 3, 2});
    Node n = make_node("Pad", 2, 1, {{"mode", attr_s(mode)}});
    cpu::PadPlan p = cpu::pad_plan(n, x.shape, pads.to_i64(), {});
    const std::string m = mode;
    PadIndex pi;
    ASSERT_TRUE(make_pad(x.shape, p.begin, p.end,
                         m == "constant" ? PadMode::Constant : m == "reflect" ? PadMode::Reflect
                                                         : m == "edge"      ? PadMode::Edge
                                                                            : PadMode::Wrap,
                         &pi));
    Shape os;
    for (int d = 0; d < pi.rank; ++d) os.push_back(pi.out[d]);
    Tensor g = randn(os, 28);
    Tensor got = Tensor::zeros(DType::F32, x.shape);
    for (int64_t i = 0; i < g.numel(); ++i) {  // as pad_bw_kernel, serially
      const int64_t s = pad_offset(pi, i);
      if (s >= 0) got.data<float>()[s] += g.data<float>()[i];
    }
    expect_close(got, cpu_input_grad(n, {&x, &pads}, g), 1e-5, 1e-5);
  }
}

namespace {

// The WindowAttention node and its inputs (x, Wq, Wk, Wv, Wo, bo?, bias, residual?).
struct AttnCase {
  Node n;
  std::vector<Tensor> in;  // bo / residual undefined when absent
};

AttnCase attn_case(Shape x, int64_t I, int64_t heads, int64_t th, int64_t tw, bool strided, bool bo, bool res,
                   uint64_t seed) {
  const int64_t D = x[1], T = th * tw;
  AttnCase c;
  c.n = make_node("WindowAttention", 8, 1,
                  {{"heads", attr_i(heads)}, {"scale", attr_f(0.35f)}, {"window", attr_ints({th, tw})},
                   {"strided", attr_i(strided)}});
  c.in = {randn(x, seed),          randn({I, D}, seed + 1, 0.5f), randn({I, D}, seed + 2, 0.5f),
          randn({I, D}, seed + 3, 0.5f), randn({D, I}, seed + 4, 0.5f), bo ? randn({D}, seed + 5) : Tensor(),
          randn({heads, T, T}, seed + 6), res ? randn(x, seed + 7) : Tensor()};
  return c;
}

// rows (R, K) W^T for W (N, K), on the host (the CUDA kernel calls cuBLAS here).
std::vector<float> project(const std::vector<float>& rows, int64_t R, int64_t K, const Tensor& w) {
  const int64_t N = w.shape[0];
  std::vector<float> y(R * N);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < N; ++j) {
      double a = 0;
      for (int64_t k = 0; k < K; ++k) a += (double)rows[r * K + k] * w.data<float>()[j * K + k];
      y[r * N + j] = (float)a;
    }
  return y;
}

// The CUDA kernel's steps with its index math on the host.
Tensor host_window_attention(const AttnCase& c) {
  const Tensor& x = c.in[0];
  const cpu::WindowGeom g = cpu::window_geometry(c.n, x.shape, c.in[1].shape);
  const int64_t R = g.B * g.nW * g.T, D = g.D, I = g.I, dh = I / g.heads;
  std::vector<float> rows(R * D);
  for (int64_t i = 0; i < R * D; ++i) rows[i] = x.data<float>()[window_token_offset(g, i / D, i % D)];
  std::vector<float> q = project(rows, R, D, c.in[1]), k = project(rows, R, D, c.in[2]), v = project(rows, R, D, c.in[3]);
  std::vector<float> o(R * I);
  for (int64_t bw = 0; bw < g.B * g.nW; ++bw)
    for (int64_t h = 0; h < g.heads; ++h)
      for (int64_t i = 0; i < g.T; ++i) {
        const int64_t base = bw * g.T * I + h * dh;
        attention_row(&q[base + i * I], &k[base], &v[base], I, c.in[6].data<float>() + (h * g.T + i) * g.T, g.T, dh,
                      c.n.f("scale", 1.f), &o[base + i * I]);
      }
  rows = project(o, R, I, c.in[4]);
  Tensor y = Tensor::zeros(DType::F32, x.shape);
  for (int64_t i = 0; i < R * D; ++i) {
    const int64_t ch = i % D, at = window_token_offset(g, i / D, ch);
    const float a = rows[i] + (c.in[5].defined() ? c.in[5].data<float>()[ch] : 0.f);
    y.data<float>()[at] = c.in[7].defined() ? a + c.in[7].data<float>()[at] : a;
  }
  return y;
}

}  // namespace

TEST(CudaIndexMath, WindowAttentionMatchesCpu) {
  std::vector<AttnCase> cases = {
      attn_case({2, 6, 4, 6}, 8, 2, 2, 3, false, true, true, 10),     // contiguous windows
      attn_case({1, 5, 8, 6}, 12, 3, 4, 3, true, true, false, 20),    // strided (long-range)
      attn_case({1, 4, 20, 10}, 8, 1, 10, 10, false, false, true, 30),  // 100 tokens, CREDIT's window
      attn_case({2, 3, 3, 3}, 4, 2, 1, 1, true, false, false, 40),    // one-token windows
  };
  for (const AttnCase& c : cases) {
    std::vector<const Tensor*> in;
    for (const Tensor& t : c.in) in.push_back(t.defined() ? &t : nullptr);
    Tensor ref = run_node(c.n, in)[0];
    expect_close(host_window_attention(c), ref, 1e-5, 1e-5);
  }
}

// The whole-matrix element <-> W_mat (row, col) maps of the CUDA SpectralNorm and the CPU's
// fast path (engine/math/spectral_norm_math.h) against the geometry's for_each, for dim 0 (Conv,
// Linear) and dim 1 (ConvTranspose).
TEST(CudaIndexMath, SpectralNormMatrixMatchesCpu) {
  for (int dim : {0, 1})
    for (Shape w : std::vector<Shape>{{6, 4, 3, 2}, {5, 7}, {3, 4, 1, 5}}) {
      const sn::Geometry d = sn::geometry(dim, w);
      const sn::MatrixIndex s = sn::matrix_index(d);
      int64_t seen = 0;
      d.for_each([&](int64_t e, int64_t row, int64_t col) {
        EXPECT_EQ(sn::offset(s, row, col), e) << shape_str(w) << " dim " << dim;
        int64_t r = -1, c = -1;
        sn::row_col(s, e, &r, &c);
        EXPECT_EQ(r, row);
        EXPECT_EQ(c, col);
        ++seen;
      });
      EXPECT_EQ(seen, numel(w));
    }
}

// The CUDA Gather's source map and deterministic backward sum against the CPU Gather and its
// backward (repeated and negative indices, inner and outer dims).
TEST(CudaIndexMath, GatherMatchesCpu) {
  struct Case {
    Shape data;
    Tensor indices;
    int64_t axis;
  };
  for (const Case& c : {Case{{4, 3}, i64({0, 2, 0, -1}), 0}, Case{{2, 5, 3}, i64({4, -5, 1, 4, 4}), 1},
                        Case{{3, 2, 4}, i64({3, 0}), 2}}) {
    Tensor x = randn(c.data, 7);
    Node n = make_node("Gather", 2, 1, {{"axis", attr_i(c.axis)}});
    Tensor y = run_node(n, {&x, &c.indices})[0];
    GatherIndex g;
    g.dim = c.data[c.axis];
    for (size_t d = c.axis + 1; d < c.data.size(); ++d) g.inner *= c.data[d];
    std::vector<int64_t> idx = c.indices.to_i64();
    for (auto& v : idx) v = v < 0 ? v + g.dim : v;
    g.ni = (int64_t)idx.size();
    Tensor got = Tensor::zeros(DType::F32, y.shape);
    for (int64_t i = 0; i < y.numel(); ++i) got.data<float>()[i] = x.data<float>()[gather_source(g, idx.data(), i)];
    expect_close(got, y, 0, 0);
    // backward: the CPU kernel's scatter against gather_grad
    Tensor gy = randn(y.shape, 8), gx(DType::F32, c.data), gx_host = Tensor::zeros(DType::F32, c.data);
    backward_kernel("Gather")(n, {&x, &c.indices}, {&y}, {&gy}, {&gx, nullptr});
    for (int64_t e = 0; e < gx.numel(); ++e) gx_host.data<float>()[e] = gather_grad(g, idx.data(), gy.data<float>(), e);
    expect_close(gx_host, gx, 0, 0);
  }
}
