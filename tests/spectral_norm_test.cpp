// SpectralNorm op (kernels/cpu/spectral_norm.cpp): the train-mode power iteration against
// plain double loops, u and v updated in place, the eval-mode fold (engine/passes/layout_rules.h)
// at power_iterations 0, shape-rule errors, no gradient for u and v. The weight gradient is
// checked by finite differences in grad_layers_test.cpp.
#include <cmath>

#include "engine/passes/layout_rules.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

using Mat = std::vector<std::vector<double>>;

// W_mat (rows, cols): weight (d0, d1, rest...) with dim `dim` moved first, in double.
Mat weight_matrix(const Tensor& w, int dim) {
  const int64_t d0 = w.shape[0], d1 = w.shape[1], rest = w.numel() / (d0 * d1);
  const int64_t rows = dim == 0 ? d0 : d1, other = dim == 0 ? d1 : d0;
  Mat m(rows, std::vector<double>(other * rest));
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t r = 0; r < rest; ++r) {
        const double x = w.data<float>()[(a * d1 + b) * rest + r];
        if (dim == 0) m[a][b * rest + r] = x;
        else m[b][a * rest + r] = x;
      }
  return m;
}

std::vector<double> normalized(std::vector<double> x, double eps) {
  double n = 0;
  for (double a : x) n += a * a;
  n = std::max(std::sqrt(n), eps);
  for (double& a : x) a /= n;
  return x;
}

struct Expected {
  std::vector<double> u, v;
  double sigma;
};

// PyTorch's train-mode power iteration, in double.
Expected power_iteration(const Mat& m, std::vector<double> u, std::vector<double> v, int iters, double eps) {
  const size_t rows = m.size(), cols = m[0].size();
  for (int it = 0; it < iters; ++it) {
    std::vector<double> mtu(cols, 0.0), mv(rows, 0.0);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) mtu[j] += m[i][j] * u[i];
    v = normalized(mtu, eps);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) mv[i] += m[i][j] * v[j];
    u = normalized(mv, eps);
  }
  double sigma = 0;
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) sigma += u[i] * m[i][j] * v[j];
  return {u, v, sigma};
}

std::vector<double> as_doubles(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

void expect_vec_near(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), (int64_t)want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got.data<float>()[i], want[i], tol) << what << " element " << i;
}

Node sn_node(int64_t dim, int64_t iters) {
  return make_node("SpectralNorm", 3, 1, {{"dim", attr_i(dim)}, {"power_iterations", attr_i(iters)}});
}

// Runs SpectralNorm with `iters` iterations on weight w and checks W, u and v (in place)
// against the double computation.
void check_power_iteration(const Shape& ws, int dim, int iters) {
  Tensor w = randn(ws, 1);
  const int64_t rows = ws[dim], cols = w.numel() / rows;
  Tensor u = randn({rows}, 2), v = randn({cols}, 3);
  const Expected e = power_iteration(weight_matrix(w, dim), as_doubles(u), as_doubles(v), iters, 1e-12);
  Tensor u0 = u.clone(), v0 = v.clone();
  Tensor y = run_node(sn_node(dim, iters), {&w, &u, &v})[0];
  expect_vec_near(u, e.u, 1e-5, "u");
  expect_vec_near(v, e.v, 1e-5, "v");
  EXPECT_GT(max_abs_diff(u, u0), 1e-2) << "u was not updated in place";
  EXPECT_GT(max_abs_diff(v, v0), 1e-2) << "v was not updated in place";
  Tensor want(DType::F32, ws);
  for (int64_t i = 0; i < w.numel(); ++i) want.data<float>()[i] = (float)(w.data<float>()[i] / e.sigma);
  expect_close(y, want, 1e-6, 1e-5);
  // after enough iterations sigma is the largest singular value: the output's spectral norm
  // (by a long double power iteration from fresh vectors) is 1
  if (iters >= 20) {
    const Expected out = power_iteration(weight_matrix(y, dim), as_doubles(randn({rows}, 4)),
                                         as_doubles(randn({cols}, 5)), 500, 1e-12);
    EXPECT_NEAR(out.sigma, 1.0, 1e-3);
  }
}

TEST(SpectralNorm, PowerIterationDim0MatchesDoubleLoops) {
  check_power_iteration({4, 3, 2}, 0, 1);
  check_power_iteration({4, 3, 2}, 0, 3);
  check_power_iteration({5, 3, 2, 2}, 0, 30);
}

// ConvTranspose weights (C_in, C_out, kh, kw) normalize over dim 1.
TEST(SpectralNorm, PowerIterationDim1MatchesDoubleLoops) {
  check_power_iteration({3, 4, 2, 2}, 1, 1);
  check_power_iteration({3, 4, 2, 2}, 1, 30);
}

// Successive forwards continue the iteration from the stored u, v (one step per training
// forward, as PyTorch): two runs of one step equal one run of two.
TEST(SpectralNorm, IterationContinuesAcrossForwards) {
  Tensor w = randn({4, 6}, 4), u = randn({4}, 5), v = randn({6}, 6);
  Tensor u2 = u.clone(), v2 = v.clone();
  run_node(sn_node(0, 1), {&w, &u, &v});
  Tensor y1 = run_node(sn_node(0, 1), {&w, &u, &v})[0];
  Tensor y2 = run_node(sn_node(0, 2), {&w, &u2, &v2})[0];
  expect_close(u, u2, 0, 0);
  expect_close(v, v2, 0, 0);
  expect_close(y1, y2, 0, 0);
}

// power_iterations 0 is the eval-mode fold of the ONNX import, for dims 0 and 1.
TEST(SpectralNorm, ZeroIterationsEqualsFold) {
  for (int dim : {0, 1}) {
    Tensor w = randn({3, 5, 2, 2}, 7 + dim);
    const int64_t rows = w.shape[dim], cols = w.numel() / rows;
    Tensor u = randn({rows}, 9), v = randn({cols}, 10);
    Tensor u0 = u.clone(), v0 = v.clone();
    Tensor y = run_node(sn_node(dim, 0), {&w, &u, &v})[0];
    expect_close(y, layout::fold_spectral_norm(w, u, v, "w", dim), 0, 1e-6);
    // the fold's own dim detection from the sizes of u and v agrees
    expect_close(y, layout::fold_spectral_norm(w, u, v, "w"), 0, 1e-6);
    expect_close(u, u0, 0, 0);  // no iteration: u, v untouched
    expect_close(v, v0, 0, 0);
  }
}

TEST(SpectralNorm, ShapeRuleErrorsNameTheNode) {
  Tensor w = randn({4, 3, 2}, 11), u = randn({4}, 12), v = randn({6}, 13), bad = randn({5}, 14);
  Node n = sn_node(0, 1);
  n.name = "enc.0.weight_sn";
  std::string e = error_of([&] { run_node(n, {&w, &bad, &v}); });
  EXPECT_NE(e.find("enc.0.weight_sn"), std::string::npos) << e;
  EXPECT_NE(e.find("do not fit"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { run_node(n, {&w, &u, &bad}); }), "<no error>");
  EXPECT_NE(error_of([&] { run_node(sn_node(2, 0), {&w, &u, &v}); }).find("dim"), std::string::npos);
  // dim 1 on a 1-D weight
  Tensor w1 = randn({4}, 15), one = randn({1}, 16);
  EXPECT_NE(error_of([&] { run_node(sn_node(1, 0), {&w1, &u, &one}); }), "<no error>");
  Tensor wi = Tensor::zeros(DType::I64, {4, 6});
  EXPECT_NE(error_of([&] { run_node(sn_node(0, 0), {&wi, &u, &v}); }).find("float32"), std::string::npos);
}

// u and v are buffers: their gradients, when asked, are zero; the weight gradient is
// orthogonal to W's own direction through sigma: sum(gin * w) = 0 when g = W (scale invariance
// of weight_orig / sigma(weight_orig)).
TEST(SpectralNorm, BackwardZeroForBuffersAndScaleInvariant) {
  register_cpu_kernels();
  Node n = sn_node(1, 0);
  Tensor w = randn({3, 4, 2}, 17), u = randn({4}, 18), v = randn({6}, 19);
  Tensor y = run_node(n, {&w, &u, &v})[0];
  Tensor gw(DType::F32, w.shape), gu(DType::F32, u.shape), gv(DType::F32, v.shape);
  for (Tensor* t : {&gu, &gv}) std::fill(t->data<float>(), t->data<float>() + t->numel(), 7.f);
  backward_kernel("SpectralNorm")(n, {&w, &u, &v}, {&y}, {&y}, {&gw, &gu, &gv});
  expect_close(gu, Tensor::zeros(DType::F32, u.shape), 0, 0);
  expect_close(gv, Tensor::zeros(DType::F32, v.shape), 0, 0);
  double dot = 0, norm = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    dot += (double)gw.data<float>()[i] * w.data<float>()[i];
    norm += (double)gw.data<float>()[i] * gw.data<float>()[i];
  }
  EXPECT_GT(norm, 1e-6);
  EXPECT_NEAR(dot, 0.0, 1e-5);
}

}  // namespace
