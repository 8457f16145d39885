#include "data/quantile_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "engine/ir/error.h"

// torch rounds each float32 multiply and add of these kernels separately: CMakeLists.txt compiles
// this file without FMA contraction (-ffp-contract=off, the build's -mfma would fuse them); the
// fused multiply-adds torch's own kernels do have are written out as std::fma.

namespace wxe {

// ----------------------------------------------------------------------------------------------
// torch's CPU elementwise functions

namespace torch_cpu {
namespace {

// Cephes polevl as torch's Math.h has it; its AVX2 / AVX-512 kernels (what runs on any x86 machine
// of the last decade) are compiled with FMA contraction, which fuses result * x + A[i].
template <class T>
T polevl(T x, const T* A, int len) {
  T r = 0;
  for (int i = 0; i <= len; ++i) r = std::fma(r, x, A[i]);
  return r;
}

// torch's calc_ndtri (Math.h). Its ::log and ::sqrt are the double functions, for float too
// (y converts), and x0 = x - log(x) / x is computed in double and rounded once: bit for bit what
// torch.special.ndtri gives on float32 and float64 tensors (checked on 4e5 values).
template <class T>
T ndtri_t(T y0) {
  constexpr T s2pi = 2.50662827463100050242E0;
  constexpr T one = 1, zero = 0;
  static const T P0[5] = {-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
                          1.39312609387279679503E1, -1.23916583867381258016E0};
  static const T Q0[9] = {1.00000000000000000000E0,  1.95448858338141759834E0,  4.67627912898881538453E0,
                          8.63602421390890590575E1,  -2.25462687854119370527E2, 2.00260212380060660359E2,
                          -8.20372256168333339912E1, 1.59056225126211695515E1,  -1.18331621121330003142E0};
  static const T P1[9] = {4.05544892305962419923E0,  3.15251094599893866154E1,  5.71628192246421288162E1,
                          4.40805073893200834700E1,  1.46849561928858024014E1,  2.18663306850790267539E0,
                          -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4};
  static const T Q1[9] = {1.00000000000000000000E0,  1.57799883256466749731E1,  4.53907635128879210584E1,
                          4.13172038254672030440E1,  1.50425385692907503408E1,  2.50464946208309415979E0,
                          -1.42182922854787788574E-1, -3.80806407691578277194E-2, -9.33259480895457427372E-4};
  static const T P2[9] = {3.23774891776946035970E0,  6.91522889068984211695E0,  3.93881025292474443415E0,
                          1.33303460815807542389E0,  2.01485389549179081538E-1, 1.23716634817820021358E-2,
                          3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9};
  static const T Q2[9] = {1.00000000000000000000E0,  6.02427039364742014255E0,  3.67983563856160859403E0,
                          1.37702099489081330271E0,  2.16236993594496635890E-1, 1.34204006088543189037E-2,
                          3.28014464682127739104E-4, 2.89247864745380683936E-6, 6.79019408009981274425E-9};
  if (y0 == zero) return -std::numeric_limits<T>::infinity();
  if (y0 == one) return std::numeric_limits<T>::infinity();
  if (y0 < zero || y0 > one) return std::numeric_limits<T>::quiet_NaN();
  bool code = true;
  T y = y0;
  if (y > one - T{0.13533528323661269189}) {  // exp(-2)
    y = one - y;
    code = false;
  }
  if (y > T{0.13533528323661269189}) {
    y = y - T{0.5};
    const T y2 = y * y;
    const T x = std::fma(y, y2 * polevl(y2, P0, 4) / polevl(y2, Q0, 8), y);
    return x * s2pi;
  }
  T x = (T)std::sqrt((double)T{-2.0} * std::log((double)y));
  const T x0 = (T)((double)x - std::log((double)x) / (double)x);
  const T z = one / x;
  const T x1 = x < T{8.0} ? z * polevl(z, P1, 8) / polevl(z, Q1, 8) : z * polevl(z, P2, 8) / polevl(z, Q2, 8);
  x = x0 - x1;
  return code ? -x : x;
}

}  // namespace

float ndtri(float y) { return ndtri_t(y); }
double ndtri(double y) { return ndtri_t(y); }
// torch.special.ndtr on CPU is a composite, (1 + at::erf(x * M_SQRT1_2)) * 0.5, each step in the
// tensor's dtype. at::erf is MKL's vsErf / vdErf; erf in double rounded to float agrees with it
// but for 1 ulp on about 1 % of float32 arguments (1 + erf cancels below x = -2, so there the
// ulp is a large relative difference of the result, in torch as here).
float ndtr(float x) {
  const float u = x * (float)M_SQRT1_2;
  const float e = (float)std::erf((double)u);
  return (1.0f + e) * 0.5f;
}
double ndtr(double x) { return (1.0 + std::erf(x * M_SQRT1_2)) * 0.5; }
// logit (eps None): log(x / (1 - x)); sigmoid: 1 / (1 + exp(-x)). torch's vectorised log / exp
// (SLEEF, 1 ulp) can differ from libm's by an ulp.
float logit(float x) { return std::log(x / (1.0f - x)); }
double logit(double x) { return std::log(x / (1.0 - x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace torch_cpu

// ----------------------------------------------------------------------------------------------
// scaler JSON

namespace {

bool is_null(const Json* j) { return !j || (j->type == Json::Lit && j->s == "null"); }

// A numpy array as bridgescaler's NumpyEncoder writes it ({"__numpy__": base64, "dtype", "shape"})
// or a (nested) JSON list of numbers, flattened in C order.
struct Array {
  std::vector<double> v;
  std::vector<int64_t> shape;
};

void list_numbers(const Json& j, Array& a, size_t depth, const std::string& what) {
  if (j.type == Json::Num) {
    if (depth != a.shape.size()) fail(what, " is a ragged list");
    a.v.push_back(parse_double(j.s, what));
    return;
  }
  if (j.type != Json::Arr) fail(what, " is not numbers");
  if (depth == a.shape.size()) {
    if (!a.v.empty()) fail(what, " is a ragged list");
    a.shape.push_back((int64_t)j.items.size());
  } else if (depth > a.shape.size() || a.shape[depth] != (int64_t)j.items.size()) {
    fail(what, " is a ragged list");
  }
  for (const Json& x : j.items) list_numbers(x, a, depth + 1, what);
}

Array array_of(const Json& j, const std::string& what) {
  Array a;
  if (j.type == Json::Num || j.type == Json::Arr) {
    list_numbers(j, a, 0, what);
    return a;
  }
  const Json* b64 = j.type == Json::Obj ? j.get("__numpy__") : nullptr;
  const Json* dt = j.type == Json::Obj ? j.get("dtype") : nullptr;
  const Json* sh = j.type == Json::Obj ? j.get("shape") : nullptr;
  if (!b64 || b64->type != Json::Str || !dt || dt->type != Json::Str || !sh || sh->type != Json::Arr)
    fail(what, " is not a numpy array ({\"__numpy__\", \"dtype\", \"shape\"}) or a list of numbers");
  int64_t count = 1;
  for (const Json& d : sh->items) {
    const int64_t n = checked_index(d);
    if (n < 0 || (n > 0 && count > ((int64_t)1 << 40) / n)) fail(what, ": bad shape");
    a.shape.push_back(n);
    count *= n;
  }
  const std::string bytes = base64_decode(b64->s, what);
  const std::string& t = dt->s;
  const size_t esz = t == "<f8" || t == "<i8" ? 8 : t == "<f4" || t == "<i4" ? 4 : 0;
  if (!esz) fail(what, " has dtype ", t, " (<f8, <f4, <i8 or <i4 expected)");
  if (bytes.size() != (size_t)count * esz)
    fail(what, " holds ", bytes.size(), " bytes, its shape and dtype ", t, " need ", (size_t)count * esz);
  a.v.resize((size_t)count);
  for (int64_t i = 0; i < count; ++i) {
    const char* p = bytes.data() + i * esz;
    if (t == "<f8") {
      std::memcpy(&a.v[i], p, 8);
    } else if (t == "<f4") {
      float f;
      std::memcpy(&f, p, 4);
      a.v[i] = f;
    } else if (t == "<i8") {
      int64_t k;
      std::memcpy(&k, p, 8);
      a.v[i] = (double)k;
    } else {
      int32_t k;
      std::memcpy(&k, p, 4);
      a.v[i] = k;
    }
  }
  return a;
}

double number_of(const Json& j, const std::string& what) {
  if (j.type == Json::Num) return parse_double(j.s, what);
  Array a = array_of(j, what);  // a numpy scalar
  if (a.v.size() != 1) fail(what, " is not one number");
  return a.v[0];
}

bool bool_of(const Json& j, const std::string& what) {
  if (j.type == Json::Lit && (j.s == "true" || j.s == "false")) return j.s == "true";
  fail(what, " is not true or false");
}

void finite(const std::vector<double>& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) fail(what, "[", i, "] is ", v[i], " (must be finite)");
}

// torch.searchsorted on an ascending row (its binary search, NaN lands past the end).
template <class T>
int64_t search_left(const T* a, int64_t n, T v) {
  int64_t s = 0, e = n;
  while (s < e) {
    const int64_t m = s + ((e - s) >> 1);
    if (!(a[m] >= v)) s = m + 1;
    else e = m;
  }
  return s;
}
template <class T>
int64_t search_right(const T* a, int64_t n, T v) {
  int64_t s = 0, e = n;
  while (s < e) {
    const int64_t m = s + ((e - s) >> 1);
    if (!(a[m] > v)) s = m + 1;
    else e = m;
  }
  return s;
}

// torch.clamp: NaN stays NaN
template <class T>
T clamp(T x, T lo, T hi) {
  return std::isnan(x) ? x : std::min(std::max(x, lo), hi);
}

// torch.linspace on CPU (scalar form): the first half from start, the second from end.
std::vector<double> linspace(double start, double end, int64_t steps) {
  std::vector<double> v((size_t)steps);
  const double step = (end - start) / (double)(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i) v[i] = i < half ? start + step * (double)i : end - step * (double)(steps - i - 1);
  return v;
}

// numpy's sign: NaN for NaN
double npsign(double x) { return std::isnan(x) ? x : (double)((x > 0) - (x < 0)); }

// bridgescaler's compute_pchip_slopes for one row (numpy float64; x strictly increasing except
// where the tie bump could not separate knots, whose infinities and NaNs numpy carries on).
std::vector<double> pchip_slopes(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t M = x.size();
  std::vector<double> m(M, 0.0), h(M - 1), d(M - 1);
  for (size_t k = 0; k + 1 < M; ++k) {
    h[k] = x[k + 1] - x[k];
    d[k] = (y[k + 1] - y[k]) / h[k];
  }
  if (M < 3) {
    m[0] = d[0];
    m[M - 1] = d[M - 2];
    return m;
  }
  for (size_t k = 1; k + 1 < M; ++k) {
    const double hk = h[k], hk1 = h[k - 1], dk = d[k], dk1 = d[k - 1];
    const double w1 = 2 * hk + hk1, w2 = hk + 2 * hk1;
    const double mi = (w1 + w2) / (w1 / dk1 + w2 / dk);
    m[k] = dk1 * dk > 0 ? mi : 0.0;
  }
  auto edge = [](double h0, double h1, double d0, double d1) {
    double me = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1);
    if (npsign(me) != npsign(d0)) me = 0.0;  // NaN != NaN: numpy's where picks 0 as well
    if (npsign(d0) != npsign(d1) && std::fabs(me) > 3 * std::fabs(d0)) me = 3 * d0;
    return me;
  };
  m[0] = edge(h[0], h[1], d[0], d[1]);
  m[M - 1] = edge(h[M - 2], h[M - 3], d[M - 2], d[M - 3]);
  return m;
}

// pchip_eval_tensor: the Hermite cubic through knots (xk ascending, zk values, mk slopes), in T.
template <class T>
T pchip_eval(const std::vector<T>& xk, const std::vector<T>& zk, const std::vector<T>& mk, T v) {
  const int64_t M = (int64_t)xk.size();
  const int64_t i = std::min(std::max(search_left(xk.data(), M, v), (int64_t)1), M - 1);
  const T x0 = xk[i - 1], x1 = xk[i], y0 = zk[i - 1], y1 = zk[i], m0 = mk[i - 1], m1 = mk[i];
  const T h = x1 - x0;
  const T t = (v - x0) / (h == 0 ? T(1) : h);
  const T t2 = t * t, t3 = t2 * t;
  const T h00 = T(2) * t3 - T(3) * t2 + T(1);
  const T h10 = t3 - T(2) * t2 + t;
  const T h01 = T(-2) * t3 + T(3) * t2;
  const T h11 = t3 - t2;
  T z = h00 * y0 + h10 * h * m0 + h01 * y1 + h11 * h * m1;
  if (v <= xk[0]) z = zk[0];
  if (v >= xk[M - 1]) z = zk[M - 1];
  return z;
}

}  // namespace

const char* scaler_kind_name(ScalerKind k) {
  switch (k) {
    case ScalerKind::Standard: return "standard";
    case ScalerKind::Quantile: return "quantile";
    case ScalerKind::MinMax: return "minmax";
    default: return "none";
  }
}

ScalerKind scaler_kind(const Json& j, const std::string& where) {
  if (j.type != Json::Obj) return ScalerKind::None;
  const Json* t = j.get("type");
  if (t && t->type == Json::Str) {
    const std::string& s = t->s;
    if (s == "DStandardScalerTensor" || s == "DStandardScaler") return ScalerKind::Standard;
    if (s == "DQuantileScalerTensor" || s == "DQuantileScaler") return ScalerKind::Quantile;
    if (s == "DMinMaxScalerTensor" || s == "DMinMaxScaler") return ScalerKind::MinMax;
    fail(where, ": scaler type '", printable(s),
         "' is not one of bridgescaler's distributed scalers (DStandardScalerTensor, DQuantileScalerTensor, "
         "DMinMaxScalerTensor)");
  }
  if (j.get("mean_x_")) return ScalerKind::Standard;
  if (j.get("centroids_") || j.get("centroids_mean_stacked")) return ScalerKind::Quantile;
  if (j.get("min_x_")) return ScalerKind::MinMax;
  return ScalerKind::None;
}

QuantileScaler QuantileScaler::from_text(const std::string& text, const std::string& where) {
  return from_json(parse_json(text, where, "scaler JSON"), where);
}

QuantileScaler QuantileScaler::from_json(const Json& j, const std::string& where) {
  QuantileScaler s;
  s.where_ = where;
  if (j.type != Json::Obj) fail(where, ": a quantile scaler is a JSON object");
  const auto what = [&](const std::string& k) { return where + ": " + k; };
  const auto field = [&](const char* k) -> const Json* {
    const Json* p = j.get(k);
    return is_null(p) ? nullptr : p;
  };
  if (const Json* t = field("type")) {
    if (t->type != Json::Str || t->s != "DQuantileScalerTensor")
      fail(what("type"), " is '", t->type == Json::Str ? printable(t->s) : std::string("?"),
           "', not DQuantileScalerTensor (the torch quantile scaler of CREDIT's scaler_type: quantile)");
  }
  if (const Json* f = field("_fit"))
    if (!bool_of(*f, what("_fit"))) fail(what("_fit"), " is false: the scaler was never fit");
  if (const Json* d = field("distribution")) {
    if (d->type != Json::Str) fail(what("distribution"), " is not a string");
    if (d->s == "uniform") s.dist_ = Distribution::Uniform;
    else if (d->s == "normal") s.dist_ = Distribution::Normal;
    else if (d->s == "logistic") s.dist_ = Distribution::Logistic;
    else fail(what("distribution"), ": unknown distribution '", printable(d->s), "' (uniform, normal, logistic)");
  }
  if (const Json* v = field("min_val")) s.min_val_ = number_of(*v, what("min_val"));
  if (const Json* v = field("max_val")) s.max_val_ = number_of(*v, what("max_val"));
  if (!(s.min_val_ >= 0 && s.min_val_ <= s.max_val_ && s.max_val_ <= 1))
    fail(where, ": min_val ", s.min_val_, " and max_val ", s.max_val_, " must satisfy 0 <= min_val <= max_val <= 1");
  if (const Json* v = field("fast_transform")) s.fast_ = bool_of(*v, what("fast_transform"));
  if (const Json* v = field("channels_last")) s.channels_last_ = bool_of(*v, what("channels_last"));
  if (const Json* v = field("n_knots")) {
    const int64_t n = checked_index(*v);
    if (n < 0 || n > (1 << 20)) fail(what("n_knots"), " is not a count");
    s.n_knots_ = (int)n;
  }
  if (s.fast_ && s.n_knots_ < 4) fail(what("n_knots"), " is ", s.n_knots_, ": fast_transform needs at least 4");

  // centroids, per channel: means and weights padded to the common width K
  std::vector<std::vector<double>> means, weights;
  std::vector<int> counts;
  if (const Json* ms = field("centroids_mean_stacked")) {
    const Json* ws = field("centroids_weight_stacked");
    const Json* cs = field("centroids_count");
    if (!ws) fail(what("centroids_weight_stacked"), " is missing (centroids_mean_stacked has it beside it)");
    if (!cs) fail(what("centroids_count"), " is missing (centroids_mean_stacked has it beside it)");
    Array m = array_of(*ms, what("centroids_mean_stacked")), w = array_of(*ws, what("centroids_weight_stacked"));
    Array c = array_of(*cs, what("centroids_count"));
    if (m.shape.size() != 2) fail(what("centroids_mean_stacked"), " is not 2-D (channels, centroids)");
    if (w.shape != m.shape)
      fail(what("centroids_weight_stacked"),
           " and centroids_mean_stacked differ in shape (centroid arrays of different lengths)");
    if (c.shape.size() != 1 || c.shape[0] != m.shape[0])
      fail(what("centroids_count"), " has ", c.v.size(), " entries for ", m.shape[0], " channels");
    const int64_t V = m.shape[0], K = m.shape[1];
    for (int64_t v = 0; v < V; ++v) {
      const double n = c.v[v];
      if (!(n >= 1 && n <= (double)K && n == std::floor(n)))
        fail(what("centroids_count"), "[", v, "] is ", n, " (1 to ", K, ")");
      const std::string wv = str("[", v, "]");
      for (int64_t k = (int64_t)n; k < K; ++k)
        if (!(m.v[v * K + k] == INFINITY && w.v[v * K + k] == 0))
          fail(what("centroids_mean_stacked"), wv, ": padding after its ", n,
               " centroids is not mean +inf, weight 0 (centroids_weight_stacked)");
      counts.push_back((int)n);
      means.emplace_back(m.v.begin() + v * K, m.v.begin() + v * K + (int64_t)n);
      weights.emplace_back(w.v.begin() + v * K, w.v.begin() + v * K + (int64_t)n);
    }
    s.K_ = (int)K;
  } else {
    const Json* ml = field("centroids_mean_tensor");
    const Json* wl = field("centroids_weight_tensor");
    const Json* cl = field("centroids_");
    if (ml || wl) {
      if (!ml || !wl) fail(where, ": centroids_mean_tensor and centroids_weight_tensor come together");
      if (ml->type != Json::Arr || wl->type != Json::Arr)
        fail(where, ": centroids_mean_tensor / centroids_weight_tensor are not lists of arrays");
      if (ml->items.size() != wl->items.size())
        fail(where, ": centroids_mean_tensor has ", ml->items.size(), " channels, centroids_weight_tensor ",
             wl->items.size());
      for (size_t v = 0; v < ml->items.size(); ++v) {
        Array m = array_of(ml->items[v], str(what("centroids_mean_tensor"), "[", v, "]"));
        Array w = array_of(wl->items[v], str(what("centroids_weight_tensor"), "[", v, "]"));
        if (m.v.size() != w.v.size())
          fail(what("centroids_mean_tensor"), "[", v, "] has ", m.v.size(), " centroids, centroids_weight_tensor[",
               v, "] ", w.v.size(), " (centroid arrays of different lengths)");
        means.push_back(m.v);
        weights.push_back(w.v);
      }
    } else if (cl) {
      if (cl->type != Json::Arr) fail(what("centroids_"), " is not a list of (centroids, 2) arrays");
      for (size_t v = 0; v < cl->items.size(); ++v) {
        const std::string wv = str(what("centroids_"), "[", v, "]");
        Array a = array_of(cl->items[v], wv);
        if (a.shape.size() != 2 || a.shape[1] != 2) fail(wv, " is not a (centroids, 2) array of mean, weight");
        std::vector<double> m, w;
        for (int64_t k = 0; k < a.shape[0]; ++k) {
          m.push_back(a.v[2 * k]);
          w.push_back(a.v[2 * k + 1]);
        }
        means.push_back(m);
        weights.push_back(w);
      }
    } else {
      fail(where, ": no centroids (centroids_mean_stacked, centroids_mean_tensor or centroids_)");
    }
    for (size_t v = 0; v < means.size(); ++v) {
      if (means[v].empty()) fail(where, ": channel ", v, " has no centroids (an empty digest)");
      counts.push_back((int)means[v].size());
      s.K_ = std::max(s.K_, (int)means[v].size());
    }
  }
  const size_t V = means.size();
  if (V == 0) fail(where, ": the scaler has no channels");
  for (size_t v = 0; v < V; ++v) {
    const std::string wv = str("[", v, "]");
    finite(means[v], what("centroid means") + wv);
    finite(weights[v], what("centroid weights") + wv);
    for (size_t k = 0; k < means[v].size(); ++k) {
      if (k && means[v][k] < means[v][k - 1])
        fail(what("centroid means"), wv, " are not ascending (", means[v][k - 1], " then ", means[v][k], ")");
      if (!(weights[v][k] > 0)) fail(what("centroid weights"), wv, "[", k, "] is ", weights[v][k], " (must be > 0)");
    }
  }

  auto per_channel = [&](const char* k1, const char* k2) {
    const Json* a = field(k1);
    const char* k = k1;
    if (!a) {
      a = field(k2);
      k = k2;
    }
    if (!a) fail(where, ": ", k1, " (or ", k2, ") is missing");
    Array r = array_of(*a, what(k));
    if (r.v.size() != V) fail(what(k), " has ", r.v.size(), " entries for ", V, " channels");
    finite(r.v, what(k));
    return r.v;
  };
  const std::vector<double> mn = per_channel("min_tensor", "min_"), mx = per_channel("max_tensor", "max_");
  if (const Json* xc = field("x_columns_")) {
    if (xc->type != Json::Arr) fail(what("x_columns_"), " is not a list");
    if (xc->items.size() != V) fail(what("x_columns_"), " names ", xc->items.size(), " channels, the digests ", V);
  }

  s.ch_.resize(V);
  for (size_t v = 0; v < V; ++v) {
    Channel& c = s.ch_[v];
    c.n = counts[v];
    if (!(mn[v] <= mx[v])) fail(where, ": channel ", v, ": min ", mn[v], " > max ", mx[v]);
    auto fill = [&](auto& g) {
      using T = typename std::decay_t<decltype(g.mean)>::value_type;
      g.mean.assign((size_t)s.K_, std::numeric_limits<T>::infinity());
      g.weight.assign((size_t)s.K_, T(0));
      g.merged.resize((size_t)s.K_);
      for (int k = 0; k < c.n; ++k) {
        g.mean[k] = (T)means[v][k];
        g.weight[k] = (T)weights[v][k];
      }
      // torch.cumsum on CPU accumulates float in double (acc_type) and rounds each partial sum;
      // the total (weight.sum()) here is the double sum rounded once: torch's float32 sum
      // (cascaded, SIMD-width dependent) can differ in the last bit once it exceeds 2^24.
      double acc = 0, tot = 0;
      for (int k = 0; k < s.K_; ++k) {
        acc += (double)g.weight[k];
        g.merged[k] = (T)acc - g.weight[k] / T(2);
        tot += (double)g.weight[k];
      }
      g.total = (T)tot;
      g.min = (T)mn[v];
      g.max = (T)mx[v];
    };
    fill(c.f);
    fill(c.d);
  }

  if (s.fast_) {
    const Json* kx = field("knots_x_");
    const Json* kz = field("knots_z_");
    const Json* km = field("knots_m_");
    const Json* ki = field("knots_minv_");
    if (kx || kz || km || ki) {
      if (!kx || !kz || !km || !ki) fail(where, ": knots_x_, knots_z_, knots_m_ and knots_minv_ come together");
      Array ax = array_of(*kx, what("knots_x_")), az = array_of(*kz, what("knots_z_"));
      Array am = array_of(*km, what("knots_m_")), ai = array_of(*ki, what("knots_minv_"));
      const int64_t M = (int64_t)az.v.size();
      if (az.shape.size() != 1 || M < 4) fail(what("knots_z_"), " is not a list of at least 4 knots");
      const std::pair<const Array*, const char*> per_channel_knots[] = {
          {&ax, "knots_x_"}, {&am, "knots_m_"}, {&ai, "knots_minv_"}};
      for (const auto& [a, k] : per_channel_knots)
        if (a->shape != std::vector<int64_t>{(int64_t)V, M})
          fail(what(k), " is not (", V, ", ", M, ") (channels, knots of knots_z_)");
      finite(az.v, what("knots_z_"));
      finite(ax.v, what("knots_x_"));
      for (int64_t k = 1; k < M; ++k)
        if (!(az.v[k] > az.v[k - 1])) fail(what("knots_z_"), " is not increasing");
      s.knots_z_ = az.v;
      for (size_t v = 0; v < V; ++v) {
        s.ch_[v].kx.assign(ax.v.begin() + v * M, ax.v.begin() + (v + 1) * M);
        s.ch_[v].km.assign(am.v.begin() + v * M, am.v.begin() + (v + 1) * M);
        s.ch_[v].kminv.assign(ai.v.begin() + v * M, ai.v.begin() + (v + 1) * M);
        for (int64_t k = 1; k < M; ++k)
          if (!(s.ch_[v].kx[k] >= s.ch_[v].kx[k - 1])) fail(what("knots_x_"), "[", v, "] is not ascending");
      }
    } else {
      s.build_knots();
    }
    s.finish_knots();
  }
  return s;
}

// build_pchip_knots, in float64 (the stacked centroids' dtype)
void QuantileScaler::build_knots() {
  const int64_t M = n_knots_;
  std::vector<double> z, p;
  if (dist_ == Distribution::Normal) {
    z = linspace(torch_cpu::ndtri(min_val_), torch_cpu::ndtri(max_val_), M);
    for (double v : z) p.push_back(torch_cpu::ndtr(v));
  } else if (dist_ == Distribution::Logistic) {
    z = linspace(torch_cpu::logit(min_val_), torch_cpu::logit(max_val_), M);
    for (double v : z) p.push_back(torch_cpu::sigmoid(v));
  } else {
    z = linspace(min_val_, max_val_, M);
    p = z;
  }
  for (double& v : p) v = clamp(v, min_val_, max_val_);
  knots_z_ = z;
  for (int c = 0; c < channels(); ++c) {
    Channel& ch = ch_[c];
    std::vector<double> x((size_t)M);
    for (int64_t k = 0; k < M; ++k) x[k] = quantile_t<double>(p[k], c);
    // strictly increasing x for PCHIP, as bridgescaler: a running maximum, then every knot that
    // does not exceed its predecessor becomes the predecessor's value + 1e-12, all from the
    // values before this step (numpy's fancy assignment), so a run of three or more ties keeps
    // ties, and 1e-12 vanishes next to values above ~0.01
    for (int64_t k = 1; k < M; ++k) x[k] = std::isnan(x[k]) || std::isnan(x[k - 1]) ? NAN : std::max(x[k - 1], x[k]);
    std::vector<double> y = x;
    for (int64_t k = 0; k + 1 < M; ++k)
      if (x[k + 1] - x[k] <= 0) y[k + 1] = x[k] + 1e-12;
    ch.kx = y;
    ch.km = pchip_slopes(y, z);
    ch.kminv = pchip_slopes(z, y);
  }
}

void QuantileScaler::finish_knots() {
  for (Channel& ch : ch_) {
    // cast to the tensor's dtype, as transform / inverse_transform do (.to(xv.dtype))
    auto cast = [&](auto& k) {
      k.x.assign(ch.kx.begin(), ch.kx.end());
      k.m.assign(ch.km.begin(), ch.km.end());
      k.minv.assign(ch.kminv.begin(), ch.kminv.end());
      k.z.assign(knots_z_.begin(), knots_z_.end());
    };
    cast(ch.kf);
    cast(ch.kd);
  }
}

const QuantileScaler::Channel& QuantileScaler::at(int c) const {
  if (c < 0 || c >= channels()) fail(where_, ": channel ", c, " out of range (the scaler has ", channels(), ")");
  return ch_[c];
}

int QuantileScaler::centroids(int c) const { return at(c).n; }
double QuantileScaler::fitted_min(int c) const { return at(c).d.min; }
double QuantileScaler::fitted_max(int c) const { return at(c).d.max; }
const std::vector<double>& QuantileScaler::knots_x(int c) const { return at(c).kx; }
const std::vector<double>& QuantileScaler::knots_m(int c) const { return at(c).km; }
const std::vector<double>& QuantileScaler::knots_minv(int c) const { return at(c).kminv; }

template <class T>
const QuantileScaler::Digest<T>& QuantileScaler::digest(int c) const {
  if constexpr (std::is_same_v<T, float>) return ch_[c].f;
  else return ch_[c].d;
}
template <class T>
const QuantileScaler::Knots<T>& QuantileScaler::knots(int c) const {
  if constexpr (std::is_same_v<T, float>) return ch_[c].kf;
  else return ch_[c].kd;
}

// tdigest_cdf_tensor, one value. bridgescaler computes four candidates and selects by priority;
// the selected one is computed here, with the same operations in the same order.
//  - x below the first centroid (only possible when that centroid is not at min, i.e. holds more
//    than one value): a ramp from (min, 0) to (first mean, merged[0] / 2), half the merged weight
//    the cdf has just above the first mean, so the cdf jumps there (and the quantile function,
//    which ramps to merged[0], is not its inverse below the first centroid).
//  - x equal to a centroid mean: merged weight at searchsorted(right) = the centroid AFTER the
//    equal ones (the next one's merged weight, not its own; the last centroid keeps its own), so
//    the cdf is a spike above its neighbours at every exact centroid mean, common for float32
//    data in sparse tails where the centroids are single values.
//  - otherwise linear between neighbouring centroids, and past the last one a ramp to (max, 1).
//  - x >= max: 1; x <= min: 0 (in this order; NaN stays NaN).
// A single-centroid digest is a ramp from min to max (0.5 when max - min < eps of T).
template <class T>
T QuantileScaler::cdf_t(T x, int c) const {
  const Digest<T>& g = digest<T>(c);
  const int64_t n = ch_[c].n, K = K_, nlast = n - 1;
  if (n <= 1) {
    const T rng = g.max - g.min;
    if (x < g.min) return T(0);
    if (x > g.max) return T(1);
    if (rng < std::numeric_limits<T>::epsilon()) return T(0.5);
    return (x - g.min) / (rng == 0 ? T(1) : rng);
  }
  const T* mean = g.mean.data();
  const T* w = g.weight.data();
  const T* mw = g.merged.data();
  const int64_t il = search_left(mean, K, x);
  T r;
  if (x < mean[0]) {
    const T dw1 = mw[0] / T(2);
    const T d1 = mean[0] - g.min;
    r = dw1 * (x - g.min) / (d1 == 0 ? T(1) : d1) / g.total;
  } else if (il >= n) {
    const T dw2 = w[nlast] / T(2);
    const T d2 = g.max - mean[nlast];
    r = T(1) - dw2 * (g.max - x) / (d2 == 0 ? T(1) : d2) / g.total;
  } else if (mean[std::min(il, nlast)] == x) {
    const int64_t ir = search_right(mean, K, x);
    r = mw[std::min(ir, nlast)] / g.total;
  } else {
    const int64_t i =
        std::min(std::min(std::max(il, (int64_t)1), std::max(nlast, (int64_t)1)), std::max(K - 1, (int64_t)0));
    const T x0 = mean[i - 1], x1 = mean[i];
    const T dw4 = T(0.5) * (w[i - 1] + w[i]);
    const T d4 = x1 - x0;
    r = (mw[i - 1] + dw4 * (x - x0) / (d4 == 0 ? T(1) : d4)) / g.total;
  }
  if (x >= g.max) return T(1);
  if (x <= g.min) return T(0);
  return r;
}

// tdigest_quantile_tensor, one value: linear through (0, min), (merged[k], mean[k]),
// (total, max), found by searchsorted(left) of q * total in the merged weights; division by a
// zero width uses 1e-9 (in T). A single-centroid digest gives its mean inside (0, 1); q <= 0:
// min, q >= 1: max. The search runs over the padded width as bridgescaler's does; in torch the
// float32 total (weight.sum()) and the cumulative sum can round apart past 2^24, and a q * total
// above the cumulative sum then reaches the padding (NaN, for a channel with fewer centroids than
// the widest); here both are the one double sum, which never does.
template <class T>
T QuantileScaler::quantile_t(T q, int c) const {
  const Digest<T>& g = digest<T>(c);
  const int64_t n = ch_[c].n, K = K_, nlast = n - 1;
  if (q <= 0) return g.min;
  if (q >= 1) return g.max;
  if (n <= 1) return g.mean[0];
  const T tw = q * g.total;
  const int64_t ir = search_left(g.merged.data(), K, tw);
  const int64_t il = std::max(ir - 1, (int64_t)0);
  const bool at_end = ir >= n;
  const int64_t irc = std::min(ir, nlast);
  const T x0 = ir == 0 ? T(0) : g.merged[il];
  const T y0 = ir == 0 ? g.min : g.mean[il];
  const T x1 = at_end ? g.total : g.merged[irc];
  const T y1 = at_end ? g.max : g.mean[irc];
  const T denom = x1 - x0;
  return y0 + (tw - x0) * (y1 - y0) / (denom == 0 ? T(1e-9) : denom);
}

template <class T>
void QuantileScaler::transform_t(T* x, int64_t n, int c) const {
  at(c);
  if (fast_) {
    const Knots<T>& k = knots<T>(c);
    for (int64_t i = 0; i < n; ++i) x[i] = pchip_eval(k.x, k.z, k.m, x[i]);
    return;
  }
  const T lo = (T)min_val_, hi = (T)max_val_;
  for (int64_t i = 0; i < n; ++i) {
    T v = clamp(cdf_t(x[i], c), lo, hi);
    if (dist_ == Distribution::Normal) v = torch_cpu::ndtri(v);
    else if (dist_ == Distribution::Logistic) v = torch_cpu::logit(v);
    x[i] = v;
  }
}

template <class T>
void QuantileScaler::inverse_t(T* x, int64_t n, int c) const {
  at(c);
  if (fast_) {
    const Knots<T>& k = knots<T>(c);
    for (int64_t i = 0; i < n; ++i) x[i] = pchip_eval(k.z, k.x, k.minv, x[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    T q = x[i];
    if (dist_ == Distribution::Normal) q = torch_cpu::ndtr(q);
    else if (dist_ == Distribution::Logistic) q = torch_cpu::sigmoid(q);
    x[i] = quantile_t(q, c);
  }
}

void QuantileScaler::transform(float* x, int64_t n, int c) const { transform_t(x, n, c); }
void QuantileScaler::inverse_transform(float* x, int64_t n, int c) const { inverse_t(x, n, c); }
void QuantileScaler::transform(double* x, int64_t n, int c) const { transform_t(x, n, c); }
void QuantileScaler::inverse_transform(double* x, int64_t n, int c) const { inverse_t(x, n, c); }
float QuantileScaler::cdf(float x, int c) const {
  at(c);
  return cdf_t(x, c);
}
double QuantileScaler::cdf(double x, int c) const {
  at(c);
  return cdf_t(x, c);
}
float QuantileScaler::quantile(float q, int c) const {
  at(c);
  return quantile_t(q, c);
}
double QuantileScaler::quantile(double q, int c) const {
  at(c);
  return quantile_t(q, c);
}

}  // namespace wxe
