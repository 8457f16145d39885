// MatMul, Gemm, Einsum, Linear: shape rules and plain reference kernels (the oracle).
// Reference kernels are simple loops over float32 data accumulating in double; they are
// parallel over independent output rows only, so results do not depend on the thread count.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

namespace {

const Value& input(const Node& n, const std::vector<const Value*>& in, size_t i) {
  WXE_CHECK(i < in.size() && in[i], "node ", n.name, " (", n.op, "): missing input ", i);
  return *in[i];
}

bool has_input(const std::vector<const Value*>& in, size_t i) {
  return i < in.size() && in[i] != nullptr;
}

// For every flat (row-major) index of `out`, the flat index into `src` when src is
// broadcast to out (numpy rules: src right-aligned, size-1 dims repeated).
std::vector<int64_t> broadcast_index(const Shape& src, const Shape& out) {
  const size_t r = out.size();
  Shape s(r, 1);
  for (size_t i = 0; i < src.size(); ++i) s[r - src.size() + i] = src[i];
  std::vector<int64_t> sstr = strides_of(s);
  std::vector<int64_t> idx((size_t)numel(out));
  std::vector<int64_t> c(r, 0);
  for (size_t f = 0; f < idx.size(); ++f) {
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off += (s[d] == 1 ? 0 : c[d]) * sstr[d];
    idx[f] = off;
    for (size_t d = r; d-- > 0;) {
      if (++c[d] < out[d]) break;
      c[d] = 0;
    }
  }
  return idx;
}

// ---------------------------------------------------------------- MatMul
struct MatMulDims {
  Shape batch;           // broadcast batch shape of the output
  Shape a_batch, b_batch;  // operands' batch shapes (unpadded)
  int64_t M = 1, K = 1, N = 1;
  Shape out;
};

MatMulDims matmul_dims(const Node& n, const Shape& a, const Shape& b) {
  WXE_CHECK(!a.empty() && !b.empty(), "node ", n.name, " (MatMul): operands must have rank >= 1, got ",
            shape_str(a), " and ", shape_str(b));
  MatMulDims d;
  Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  d.M = a2[a2.size() - 2];
  d.K = a2.back();
  d.N = b2.back();
  WXE_CHECK(b2[b2.size() - 2] == d.K, "node ", n.name, " (MatMul): inner dimensions differ: ",
            shape_str(a), " x ", shape_str(b));
  d.a_batch.assign(a2.begin(), a2.end() - 2);
  d.b_batch.assign(b2.begin(), b2.end() - 2);
  d.batch = broadcast_shapes(d.a_batch, d.b_batch, n);
  d.out = d.batch;
  if (a.size() > 1) d.out.push_back(d.M);
  if (b.size() > 1) d.out.push_back(d.N);
  return d;
}

std::vector<TypeShape> matmul_shape(const Node& n, const std::vector<const Value*>& in) {
  const Value& a = input(n, in, 0);
  const Value& b = input(n, in, 1);
  WXE_CHECK(a.dtype == b.dtype, "node ", n.name, " (MatMul): operand dtypes differ (",
            dtype_name(a.dtype), ", ", dtype_name(b.dtype), ")");
  return {{a.dtype, matmul_dims(n, a.shape, b.shape).out}};
}

void matmul_ref(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  require_f32(n, in);
  MatMulDims d = matmul_dims(n, in[0]->shape, in[1]->shape);
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  float* Y = out[0]->data<float>();
  const int64_t M = d.M, K = d.K, N = d.N;
  std::vector<int64_t> ai = broadcast_index(d.a_batch, d.batch);
  std::vector<int64_t> bi = broadcast_index(d.b_batch, d.batch);
  const int64_t nb = (int64_t)ai.size();
#pragma omp parallel
  {
    std::vector<double> acc((size_t)N);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < nb * M; ++t) {
      const int64_t b = t / M, i = t % M;
      const float* a = A + ai[b] * M * K + i * K;
      const float* bb = B + bi[b] * K * N;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const double av = a[k];
        const float* brow = bb + k * N;
        for (int64_t j = 0; j < N; ++j) acc[j] += av * brow[j];
      }
      float* y = Y + b * M * N + i * N;
      for (int64_t j = 0; j < N; ++j) y[j] = (float)acc[j];
    }
  }
}

// ---------------------------------------------------------------- Gemm
struct GemmDims {
  int64_t M, K, N;
};

GemmDims gemm_dims(const Node& n, const Shape& a, const Shape& b, const Shape* c) {
  WXE_CHECK(a.size() == 2 && b.size() == 2, "node ", n.name, " (Gemm): A and B must be 2-D, got ",
            shape_str(a), " and ", shape_str(b));
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  GemmDims d;
  d.M = ta ? a[1] : a[0];
  d.K = ta ? a[0] : a[1];
  const int64_t kb = tb ? b[1] : b[0];
  d.N = tb ? b[0] : b[1];
  WXE_CHECK(kb == d.K, "node ", n.name, " (Gemm): inner dimensions differ: A ", shape_str(a),
            (ta ? " (transposed)" : ""), ", B ", shape_str(b), (tb ? " (transposed)" : ""));
  if (c) {
    WXE_CHECK(c->size() <= 2, "node ", n.name, " (Gemm): C must have rank <= 2, got ",
              shape_str(*c));
    Shape c2(2, 1);
    for (size_t i = 0; i < c->size(); ++i) c2[2 - c->size() + i] = (*c)[i];
    WXE_CHECK((c2[0] == 1 || c2[0] == d.M) && (c2[1] == 1 || c2[1] == d.N), "node ", n.name,
              " (Gemm): C ", shape_str(*c), " does not broadcast to (", d.M, ", ", d.N, ")");
  }
  return d;
}

std::vector<TypeShape> gemm_shape(const Node& n, const std::vector<const Value*>& in) {
  const Value& a = input(n, in, 0);
  const Value& b = input(n, in, 1);
  const Shape* c = has_input(in, 2) ? &in[2]->shape : nullptr;
  GemmDims d = gemm_dims(n, a.shape, b.shape, c);
  return {{a.dtype, {d.M, d.N}}};
}

void gemm_ref(const Node& n, const std::vector<const Tensor*>& in,
              const std::vector<Tensor*>& out) {
  require_f32(n, in);
  const Tensor* C = in.size() > 2 ? in[2] : nullptr;
  GemmDims d = gemm_dims(n, in[0]->shape, in[1]->shape, C ? &C->shape : nullptr);
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const double alpha = n.f("alpha", 1.f), beta = n.f("beta", 1.f);
  const float* A = in[0]->data<float>();
  const float* B = in[1]->data<float>();
  float* Y = out[0]->data<float>();
  const int64_t M = d.M, K = d.K, N = d.N;
  int64_t cm = 1, cn = 1;
  if (C) {
    if (C->rank() == 2) cm = C->shape[0];
    if (C->rank() >= 1) cn = C->shape.back();
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = ta ? A[k * M + i] : A[i * K + k];
        const double bv = tb ? B[j * K + k] : B[k * N + j];
        acc += av * bv;
      }
      double y = alpha * acc;
      if (C && beta != 0)  // beta == 0 ignores C (BLAS convention: Inf/NaN in C do not leak)
        y += beta * (double)C->data<float>()[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
      Y[i * N + j] = (float)y;
    }
  }
}

// ---------------------------------------------------------------- Linear
// wxe op: Y = X W^T + b over one axis of X (attribute `axis`, default -1 = last, as in
// torch.nn.functional.linear; axis 1 is a 1x1 convolution on NCHW). W (N, K), b (N).
// X is viewed as (P, K, Q) around the axis; Y is (P, N, Q).
struct LinearDims {
  int64_t P = 1, K = 1, Q = 1, N = 1;
  Shape out;
};

LinearDims linear_dims(const Node& n, const Shape& x, const Shape& w, const Shape* bias) {
  WXE_CHECK(x.size() >= 1, "node ", n.name, " (Linear): X must have rank >= 1");
  WXE_CHECK(w.size() == 2, "node ", n.name, " (Linear): W must be 2-D (N, K), got ", shape_str(w));
  const int64_t axis = norm_axis(n.i("axis", -1), (int64_t)x.size(), n);
  LinearDims d;
  d.K = x[axis];
  d.N = w[0];
  WXE_CHECK(d.K == w[1], "node ", n.name, " (Linear): X ", shape_str(x), " (features on axis ", axis,
            ") and W ", shape_str(w), " disagree on K");
  if (bias)
    WXE_CHECK(*bias == Shape{d.N}, "node ", n.name, " (Linear): bias ", shape_str(*bias),
              " must be (", d.N, ")");
  for (int64_t i = 0; i < axis; ++i) d.P *= x[i];
  for (size_t i = axis + 1; i < x.size(); ++i) d.Q *= x[i];
  d.out = x;
  d.out[axis] = d.N;
  return d;
}

// Attribute `activation`: absent or "" (none), or "gelu" (erf form, applied after the bias;
// set by the fusion pass engine/passes/fuse.h).
bool linear_gelu(const Node& n) {
  const std::string a = n.s("activation", "");
  WXE_CHECK(a.empty() || a == "gelu", "node ", n.name, " (Linear): unknown activation '", a, "'");
  return a == "gelu";
}

std::vector<TypeShape> linear_shape(const Node& n, const std::vector<const Value*>& in) {
  linear_gelu(n);
  const Value& x = input(n, in, 0);
  const Value& w = input(n, in, 1);
  WXE_CHECK(x.dtype == w.dtype, "node ", n.name, " (Linear): X and W dtypes differ");
  LinearDims d = linear_dims(n, x.shape, w.shape, has_input(in, 2) ? &in[2]->shape : nullptr);
  return {{x.dtype, d.out}};
}

void linear_ref(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  require_f32(n, in);
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  LinearDims d = linear_dims(n, in[0]->shape, in[1]->shape, bias ? &bias->shape : nullptr);
  const int64_t P = d.P, K = d.K, Q = d.Q, N = d.N;
  const bool gelu = linear_gelu(n);
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  float* Y = out[0]->data<float>();
#pragma omp parallel
  {
    std::vector<double> acc((size_t)Q);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < P * N; ++t) {
      const int64_t p = t / N, j = t % N;
      std::fill(acc.begin(), acc.end(), bias ? (double)bias->data<float>()[j] : 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const double wv = W[j * K + k];
        const float* x = X + (p * K + k) * Q;
        for (int64_t q = 0; q < Q; ++q) acc[q] += wv * x[q];
      }
      float* y = Y + (p * N + j) * Q;
      if (gelu)  // Gelu of the float result, as the Gelu op computes it
        for (int64_t q = 0; q < Q; ++q) {
          const double v = (float)acc[q];
          y[q] = (float)(0.5 * v * (1 + std::erf(v * M_SQRT1_2)));
        }
      else
        for (int64_t q = 0; q < Q; ++q) y[q] = (float)acc[q];
    }
  }
}

// ---------------------------------------------------------------- Einsum
// Size of every letter; checks operand ranks and consistent sizes.
std::map<char, int64_t> einsum_sizes(const Node& n, const EinsumEq& eq,
                                     const std::vector<const Shape*>& shapes) {
  const std::string eqs = n.s("equation", "");
  std::map<char, int64_t> size;
  for (size_t i = 0; i < eq.in.size(); ++i) {
    const Shape& s = *shapes[i];
    WXE_CHECK(s.size() == eq.in[i].size(), "node ", n.name, " (Einsum): operand ", i, " ",
              shape_str(s), " has rank ", s.size(), " but subscripts '", eq.in[i], "' in equation '",
              eqs, "'");
    for (size_t j = 0; j < s.size(); ++j) {
      char c = eq.in[i][j];
      auto it = size.find(c);
      if (it == size.end())
        size[c] = s[j];
      else
        WXE_CHECK(it->second == s[j], "node ", n.name, " (Einsum): index '", c, "' has sizes ",
                  it->second, " and ", s[j], " in equation '", eqs, "'");
    }
  }
  return size;
}

std::vector<TypeShape> einsum_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(!in.empty(), "node ", n.name, " (Einsum): no inputs");
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < in.size(); ++i) shapes.push_back(&input(n, in, i).shape);
  for (size_t i = 1; i < in.size(); ++i)
    WXE_CHECK(in[i]->dtype == in[0]->dtype, "node ", n.name, " (Einsum): operand dtypes differ");
  EinsumEq eq = parse_einsum(n, in.size());
  auto size = einsum_sizes(n, eq, shapes);
  Shape o;
  for (char c : eq.out) o.push_back(size.at(c));
  return {{in[0]->dtype, o}};
}

void einsum_ref(const Node& n, const std::vector<const Tensor*>& in,
                const std::vector<Tensor*>& out) {
  require_f32(n, in);
  for (auto* t : in) WXE_CHECK(t, "node ", n.name, " (Einsum): missing input");
  EinsumEq eq = parse_einsum(n, in.size());
  std::vector<const Shape*> shapes;
  for (auto* t : in) shapes.push_back(&t->shape);
  auto size = einsum_sizes(n, eq, shapes);
  // Summed letters: in some input but not in the output.
  std::string sum;
  for (auto& kv : size)
    if (eq.out.find(kv.first) == std::string::npos) sum.push_back(kv.first);
  const size_t ni = in.size();
  // stride[i][letter]: element stride of the letter in operand i (a letter repeated within
  // one operand adds its strides: that walks the diagonal).
  std::vector<std::map<char, int64_t>> stride(ni);
  for (size_t i = 0; i < ni; ++i) {
    std::vector<int64_t> st = strides_of(in[i]->shape);
    for (size_t j = 0; j < eq.in[i].size(); ++j) stride[i][eq.in[i][j]] += st[j];
  }
  auto letter_stride = [&](size_t i, char c) {
    auto it = stride[i].find(c);
    return it == stride[i].end() ? int64_t(0) : it->second;
  };
  const size_t no = eq.out.size(), ns = sum.size();
  std::vector<int64_t> osize(no), ssize(ns);
  std::vector<std::vector<int64_t>> ostr(ni, std::vector<int64_t>(no)), sstr(ni, std::vector<int64_t>(ns));
  for (size_t k = 0; k < no; ++k) {
    osize[k] = size[eq.out[k]];
    for (size_t i = 0; i < ni; ++i) ostr[i][k] = letter_stride(i, eq.out[k]);
  }
  int64_t nsum = 1;
  for (size_t k = 0; k < ns; ++k) {
    ssize[k] = size[sum[k]];
    nsum *= ssize[k];
    for (size_t i = 0; i < ni; ++i) sstr[i][k] = letter_stride(i, sum[k]);
  }
  std::vector<const float*> src(ni);
  for (size_t i = 0; i < ni; ++i) src[i] = in[i]->data<float>();
  float* Y = out[0]->data<float>();
  const int64_t total = out[0]->numel();
#pragma omp parallel
  {
    std::vector<int64_t> base(ni), off(ni), cnt(ns);
#pragma omp for schedule(static)
    for (int64_t f = 0; f < total; ++f) {
      // decode the output index
      std::fill(base.begin(), base.end(), 0);
      int64_t r = f;
      for (size_t k = no; k-- > 0;) {
        const int64_t c = r % osize[k];
        r /= osize[k];
        for (size_t i = 0; i < ni; ++i) base[i] += c * ostr[i][k];
      }
      double acc = 0;
      std::fill(cnt.begin(), cnt.end(), 0);
      off = base;
      for (int64_t s = 0; s < nsum; ++s) {
        double p = 1;
        for (size_t i = 0; i < ni; ++i) p *= src[i][off[i]];
        acc += p;
        // odometer over the summed letters
        for (size_t k = ns; k-- > 0;) {
          for (size_t i = 0; i < ni; ++i) off[i] += sstr[i][k];
          if (++cnt[k] < ssize[k]) break;
          for (size_t i = 0; i < ni; ++i) off[i] -= cnt[k] * sstr[i][k];
          cnt[k] = 0;
        }
      }
      Y[f] = (float)acc;
    }
  }
}

}  // namespace

EinsumEq parse_einsum(const Node& n, size_t num_inputs) {
  WXE_CHECK(n.has("equation"), "node ", n.name, " (Einsum): missing attribute 'equation'");
  const std::string text = n.s("equation", "");
  std::string eq;
  for (char c : text)
    if (!std::isspace((unsigned char)c)) eq.push_back(c);
  WXE_CHECK(eq.find('.') == std::string::npos, "node ", n.name,
            " (Einsum): ellipsis ('...') is not supported in equation '", text, "'");
  EinsumEq r;
  std::string lhs = eq;
  const size_t arrow = eq.find("->");
  const bool explicit_out = arrow != std::string::npos;
  if (explicit_out) {
    lhs = eq.substr(0, arrow);
    r.out = eq.substr(arrow + 2);
  }
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    r.in.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  auto check_letters = [&](const std::string& s) {
    for (char c : s)
      WXE_CHECK(std::isalpha((unsigned char)c), "node ", n.name, " (Einsum): unexpected character '",
                c, "' in equation '", text, "'");
  };
  for (auto& s : r.in) check_letters(s);
  check_letters(r.out);
  WXE_CHECK(r.in.size() == num_inputs, "node ", n.name, " (Einsum): equation '", text, "' has ",
            r.in.size(), " operand(s) but the node has ", num_inputs, " input(s)");
  std::map<char, int> count;
  for (auto& s : r.in)
    for (char c : s) ++count[c];
  if (!explicit_out) {
    for (auto& kv : count)  // std::map iterates in ASCII order
      if (kv.second == 1) r.out.push_back(kv.first);
  } else {
    std::map<char, int> seen;
    for (char c : r.out) {
      WXE_CHECK(count.count(c), "node ", n.name, " (Einsum): output index '", c,
                "' appears in no operand of equation '", text, "'");
      WXE_CHECK(++seen[c] == 1, "node ", n.name, " (Einsum): output index '", c,
                "' repeated in equation '", text, "'");
    }
  }
  return r;
}

void register_linalg_ops() {
  register_op("MatMul", matmul_shape, matmul_ref);
  register_op("Gemm", gemm_shape, gemm_ref);
  register_op("Einsum", einsum_shape, einsum_ref);
  register_op("Linear", linear_shape, linear_ref);
}

}  // namespace wxe::cpu
