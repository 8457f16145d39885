// Index arithmetic of the CUDA kernels as __host__ __device__ functions on small plain
// structs passed to kernels by value. The CPU tests (tests/cuda_index_test.cpp) run the same
// functions on the host against the CPU reference kernels, so this header compiles with and
// without nvcc and needs no CUDA header.
//
// Every walk is row-major over an N-d `size` (at most kMaxRank dims after merging): element i
// of the walk has coordinates c_d, and reads or writes at offset + sum_d c_d * stride[d].
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/window_attention.h"
#include "engine/math/host_device.h"

namespace wxe::cuda {

constexpr int kMaxRank = 8;

// One walk with one or two strided sides (source and destination, or two operands).
struct Walk {
  int rank = 0;
  int64_t size[kMaxRank] = {};
  int64_t sa[kMaxRank] = {};  // side a strides (elements)
  int64_t sb[kMaxRank] = {};  // side b strides (elements)
  int64_t oa = 0, ob = 0;     // base offsets
  int64_t count = 1;          // product of size
};

// Offsets of element i on both sides.
WXE_HD void walk_offsets(const Walk& w, int64_t i, int64_t* a, int64_t* b) {
  int64_t pa = w.oa, pb = w.ob;
  for (int d = w.rank - 1; d >= 0; --d) {
    const int64_t c = i % w.size[d];
    i /= w.size[d];
    pa += c * w.sa[d];
    pb += c * w.sb[d];
  }
  *a = pa;
  *b = pb;
}

// Builds a walk: drops size-1 dims and merges adjacent dims that both sides step through
// contiguously. Returns false when more than kMaxRank dims remain.
inline bool make_walk(const std::vector<int64_t>& size, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb, int64_t oa, int64_t ob, Walk* w) {
  *w = Walk();
  w->oa = oa;
  w->ob = ob;
  std::vector<int64_t> s, a, b;
  for (size_t d = 0; d < size.size(); ++d) {
    w->count *= size[d];
    if (size[d] == 1) continue;
    if (!s.empty() && a.back() == sa[d] * size[d] && b.back() == sb[d] * size[d]) {
      s.back() *= size[d];
      a.back() = sa[d];
      b.back() = sb[d];
    } else {
      s.push_back(size[d]);
      a.push_back(sa[d]);
      b.push_back(sb[d]);
    }
  }
  if (s.size() > (size_t)kMaxRank) return false;
  w->rank = (int)s.size();
  for (int d = 0; d < w->rank; ++d) {
    w->size[d] = s[d];
    w->sa[d] = a[d];
    w->sb[d] = b[d];
  }
  return true;
}

inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

// Transpose: output dim d is input dim perm[d]; side a the input, side b the output.
inline bool transpose_walk(const std::vector<int64_t>& in, const std::vector<int64_t>& perm, Walk* w) {
  const auto st = contiguous_strides(in);
  std::vector<int64_t> out, sst;
  for (int64_t p : perm) {
    out.push_back(in[p]);
    sst.push_back(st[p]);
  }
  return make_walk(out, sst, contiguous_strides(out), 0, 0, w);
}

// DepthToSpace of x (N, C, H, W), block b: output (N, Co, H, b, W, b) reads x viewed as
// (N, b, b, Co, H, W) (DCR: channel (bh * b + bw) * Co + c) or (N, Co, b, b, H, W) (CRD:
// channel c * b * b + bh * b + bw).
inline bool depth_to_space_walk(const std::vector<int64_t>& x, int64_t b, bool crd, Walk* w) {
  const int64_t N = x[0], C = x[1], H = x[2], W = x[3], Co = C / (b * b), HW = H * W;
  const std::vector<int64_t> sst = crd ? std::vector<int64_t>{C * HW, b * b * HW, W, b * HW, 1, HW}
                                       : std::vector<int64_t>{C * HW, HW, W, b * Co * HW, 1, Co * HW};
  const std::vector<int64_t> size{N, Co, H, b, W, b};
  return make_walk(size, sst, contiguous_strides(size), 0, 0, w);
}

// Strides (elements) of `in` broadcast to `out` (numpy rules, right-aligned): 0 on the dims
// where `in` has size 1 or is missing.
inline std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t acc = 1;
  const size_t off = out.size() - in.size();
  for (size_t d = in.size(); d-- > 0;) {
    st[off + d] = in[d] == 1 ? 0 : acc;
    acc *= in[d];
  }
  return st;
}

// The walk of a backward pass: reads side b and writes side a of the forward's walk (for
// one-to-one maps such as Transpose, Slice, DepthToSpace: the input gradient from the output
// gradient, no collisions).
inline Walk reversed_walk(const Walk& w) {
  Walk r = w;
  for (int d = 0; d < w.rank; ++d) {
    r.sa[d] = w.sb[d];
    r.sb[d] = w.sa[d];
  }
  r.oa = w.ob;
  r.ob = w.oa;
  return r;
}

// ---- Pad ----
enum class PadMode : int { Constant, Reflect, Edge, Wrap };

// Source position along one axis for output position o, or -1 for the constant value. The
// axis keeps [crop_lo, crop_lo + len) of the input (negative pads crop) and puts it at
// max(begin, 0) of the output. Same rule as the CPU Pad kernel.
WXE_HD int64_t pad_source(PadMode mode, int64_t o, int64_t begin, int64_t crop_lo, int64_t len) {
  int64_t p = o - (begin > 0 ? begin : 0);
  if (p < 0 || p >= len) {
    switch (mode) {
      case PadMode::Constant: return -1;
      case PadMode::Edge: p = p < 0 ? 0 : len - 1; break;
      case PadMode::Reflect: {
        if (len == 1) {
          p = 0;
          break;
        }
        const int64_t per = 2 * (len - 1);
        p = ((p % per) + per) % per;
        if (p >= len) p = per - p;
        break;
      }
      case PadMode::Wrap: p = ((p % len) + len) % len; break;
    }
  }
  return crop_lo + p;
}

struct PadIndex {
  int rank = 0;
  PadMode mode = PadMode::Constant;
  int64_t out[kMaxRank] = {}, stride[kMaxRank] = {};  // output sizes, input strides
  int64_t begin[kMaxRank] = {}, crop_lo[kMaxRank] = {}, len[kMaxRank] = {};
};

// From per-dim begin/end pads (negative: crop) of an input of shape x.
inline bool make_pad(const std::vector<int64_t>& x, const std::vector<int64_t>& begin,
                     const std::vector<int64_t>& end, PadMode mode, PadIndex* p) {
  if (x.size() > (size_t)kMaxRank) return false;
  *p = PadIndex();
  p->rank = (int)x.size();
  p->mode = mode;
  const auto st = contiguous_strides(x);
  for (int d = 0; d < p->rank; ++d) {
    p->out[d] = x[d] + begin[d] + end[d];
    p->stride[d] = st[d];
    p->begin[d] = begin[d];
    p->crop_lo[d] = begin[d] < 0 ? -begin[d] : 0;
    p->len[d] = x[d] - p->crop_lo[d] - (end[d] < 0 ? -end[d] : 0);
  }
  return true;
}

// Input offset of output element i, or -1 for the constant value.
WXE_HD int64_t pad_offset(const PadIndex& p, int64_t i) {
  int64_t off = 0;
  bool constant = false;
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t o = i % p.out[d];
    i /= p.out[d];
    const int64_t s = pad_source(p.mode, o, p.begin[d], p.crop_lo[d], p.len[d]);
    if (s < 0) constant = true;
    off += s * p.stride[d];
  }
  return constant ? -1 : off;
}

// ---- reductions over a set of axes ----
// Output element i (over the kept dims) and reduced element j (over the reduced dims) read
// the input at kept(i) + red(j).
struct ReduceIndex {
  Walk kept;  // sa: input strides of the kept dims
  Walk red;   // sa: input strides of the reduced dims
};

WXE_HD int64_t reduce_offset(const ReduceIndex& r, int64_t i, int64_t j) {
  int64_t a, b, c, d;
  walk_offsets(r.kept, i, &a, &b);
  walk_offsets(r.red, j, &c, &d);
  return a + c;
}

// Splits x's dims into kept and reduced (is_reduced per dim).
inline bool make_reduce(const std::vector<int64_t>& x, const std::vector<bool>& is_reduced, ReduceIndex* r) {
  std::vector<int64_t> st(x.size());
  int64_t acc = 1;
  for (size_t d = x.size(); d-- > 0;) {
    st[d] = acc;
    acc *= x[d];
  }
  std::vector<int64_t> ks, kst, rs, rst;
  for (size_t d = 0; d < x.size(); ++d) {
    (is_reduced[d] ? rs : ks).push_back(x[d]);
    (is_reduced[d] ? rst : kst).push_back(st[d]);
  }
  return make_walk(ks, kst, kst, 0, 0, &r->kept) && make_walk(rs, rst, rst, 0, 0, &r->red);
}

// Summing a contiguous tensor of shape `from` to a shape `to` that broadcasts to it (the
// gradient of a broadcast input): the reduced dims are those `to` lacks or has as 1; output
// element i (over the kept dims, in order) is the contiguous element i of `to`.
inline bool make_sum_to(const std::vector<int64_t>& from, const std::vector<int64_t>& to, ReduceIndex* r) {
  if (to.size() > from.size()) return false;
  const size_t off = from.size() - to.size();
  std::vector<bool> red(from.size());
  for (size_t d = 0; d < from.size(); ++d) {
    if (d >= off && to[d - off] != 1 && to[d - off] != from[d]) return false;
    red[d] = (d < off || to[d - off] == 1) && from[d] != 1;
  }
  return make_reduce(from, red, r);
}

// ---- Resize as a product of per-axis taps (kernels/cpu/cpu_ops.h ResizeAxisTaps) ----
// Output coordinate c of axis d reads input positions idx[tap[d] + c * k[d] + j] with weights
// w[...], j < k[d]; an output element sums over every combination of one tap per axis.
struct ResizeIndex {
  int rank = 0;
  int64_t out[kMaxRank] = {}, stride[kMaxRank] = {}, k[kMaxRank] = {}, tap[kMaxRank] = {};
};

// From per-axis taps (k, idx, w as kernels/cpu ResizeAxisTaps); idx and w get every axis's
// taps one after the other.
inline bool make_resize(const std::vector<int64_t>& x, const std::vector<int64_t>& out, const std::vector<int>& k,
                        const std::vector<std::vector<int64_t>>& tap_idx, const std::vector<std::vector<float>>& tap_w,
                        ResizeIndex* r, std::vector<int64_t>* idx, std::vector<float>* w) {
  if (x.size() > (size_t)kMaxRank) return false;
  *r = ResizeIndex();
  r->rank = (int)x.size();
  const auto st = contiguous_strides(x);
  idx->clear();
  w->clear();
  for (int d = 0; d < r->rank; ++d) {
    r->out[d] = out[d];
    r->stride[d] = st[d];
    r->k[d] = k[d];
    r->tap[d] = (int64_t)idx->size();
    idx->insert(idx->end(), tap_idx[d].begin(), tap_idx[d].end());
    w->insert(w->end(), tap_w[d].begin(), tap_w[d].end());
  }
  return true;
}

WXE_HD float resize_at(const ResizeIndex& r, const int64_t* idx, const float* w, const float* x, int64_t i) {
  int64_t c[kMaxRank];
  int64_t combos = 1;
  for (int d = r.rank - 1; d >= 0; --d) {
    c[d] = i % r.out[d];
    i /= r.out[d];
    combos *= r.k[d];
  }
  float acc = 0.f;
  for (int64_t t = 0; t < combos; ++t) {
    int64_t rem = t, off = 0;
    float wt = 1.f;
    for (int d = r.rank - 1; d >= 0; --d) {
      const int64_t e = r.tap[d] + c[d] * r.k[d] + rem % r.k[d];
      rem /= r.k[d];
      off += idx[e] * r.stride[d];
      wt *= w[e];
    }
    acc += wt * x[off];
  }
  return acc;
}

// ---- Einsum, any equation (the generic path): output element i sums, over every value of
// the summed letters, the product of one element of each operand.
struct EinsumIndex {
  int ni = 0, no = 0, ns = 0;  // operands (<= 3), output letters, summed letters
  int64_t osize[kMaxRank] = {}, ssize[kMaxRank] = {};
  int64_t ostr[3][kMaxRank] = {}, sstr[3][kMaxRank] = {};  // per operand, per letter
  int64_t nsum = 1;
};

// From the subscripts of each operand and of the output (a letter repeated within an operand
// walks its diagonal) and the operand shapes.
inline bool make_einsum(const std::vector<std::string>& in, const std::string& out,
                        const std::vector<std::vector<int64_t>>& shapes, EinsumIndex* e) {
  if (in.size() > 3) return false;
  std::map<char, int64_t> size;
  for (size_t i = 0; i < in.size(); ++i)
    for (size_t j = 0; j < in[i].size(); ++j) size[in[i][j]] = shapes[i][j];
  std::string sum;
  for (auto& kv : size)
    if (out.find(kv.first) == std::string::npos) sum.push_back(kv.first);
  if (out.size() > (size_t)kMaxRank || sum.size() > (size_t)kMaxRank) return false;
  *e = EinsumIndex();
  e->ni = (int)in.size();
  e->no = (int)out.size();
  e->ns = (int)sum.size();
  for (size_t i = 0; i < in.size(); ++i) {
    const auto st = contiguous_strides(shapes[i]);
    std::map<char, int64_t> ls;
    for (size_t j = 0; j < in[i].size(); ++j) ls[in[i][j]] += st[j];
    for (int k = 0; k < e->no; ++k) e->ostr[i][k] = ls.count(out[k]) ? ls[out[k]] : 0;
    for (int k = 0; k < e->ns; ++k) e->sstr[i][k] = ls.count(sum[k]) ? ls[sum[k]] : 0;
  }
  for (int k = 0; k < e->no; ++k) e->osize[k] = size[out[k]];
  for (int k = 0; k < e->ns; ++k) {
    e->ssize[k] = size[sum[k]];
    e->nsum *= e->ssize[k];
  }
  return true;
}

WXE_HD float einsum_at(const EinsumIndex& e, const float* a, const float* b, const float* c, int64_t i) {
  const float* src[3] = {a, b, c};
  int64_t base[3] = {0, 0, 0};
  for (int k = e.no - 1; k >= 0; --k) {
    const int64_t v = i % e.osize[k];
    i /= e.osize[k];
    for (int t = 0; t < e.ni; ++t) base[t] += v * e.ostr[t][k];
  }
  double acc = 0;
  for (int64_t s = 0; s < e.nsum; ++s) {
    int64_t rem = s, off[3] = {base[0], base[1], base[2]};
    for (int k = e.ns - 1; k >= 0; --k) {
      const int64_t v = rem % e.ssize[k];
      rem /= e.ssize[k];
      for (int t = 0; t < e.ni; ++t) off[t] += v * e.sstr[t][k];
    }
    double p = 1;
    for (int t = 0; t < e.ni; ++t) p *= src[t][off[t]];
    acc += p;
  }
  return (float)acc;
}

// ---- erf-form GELU, as the CPU Gelu op computes it ----
WXE_HD float gelu_erf(float v) { return 0.5f * v * (1.f + erff(v * 0.70710678118654752f)); }

// ---- WindowAttention (kernels/cpu/window_attention.h) ----
// The CUDA kernel cuts the op into: gather the windows' tokens into rows (row r = window
// (b nW + w) T + token t, D channels), q, k, v = rows W^T (cuBLAS), the attention rows below
// (one per window, head and query token), out = o Wo^T (cuBLAS), scatter the rows back to the
// image (+ bo, + residual).

// Offset in x (B, D, H, W) of channel c of token row r.
WXE_HD int64_t window_token_offset(const cpu::WindowGeom& g, int64_t r, int64_t c) {
  const int64_t t = r % g.T, bw = r / g.T, b = bw / g.nW, w = bw % g.nW;
  return (b * g.D + c) * g.H * g.W + g.pixel(w / g.nwx, w % g.nwx, t);
}

// One query row of one head: o[d] = sum_j p_j v_j[d], p = softmax_j(scale q.k_j + bias[j]),
// for j < T keys; q, k_j = k + j ld, v_j = v + j ld and o hold dh floats each.
WXE_HD void attention_row(const float* q, const float* k, const float* v, int64_t ld, const float* bias,
                          int64_t T, int64_t dh, float scale, float* o) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < T; ++j) {
    float a = 0;
    for (int64_t d = 0; d < dh; ++d) a += q[d] * k[j * ld + d];
    mx = fmaxf(mx, a * scale + bias[j]);
  }
  for (int64_t d = 0; d < dh; ++d) o[d] = 0;
  float sum = 0;
  for (int64_t j = 0; j < T; ++j) {
    float a = 0;
    for (int64_t d = 0; d < dh; ++d) a += q[d] * k[j * ld + d];
    const float p = expf(a * scale + bias[j] - mx);
    sum += p;
    for (int64_t d = 0; d < dh; ++d) o[d] += p * v[j * ld + d];
  }
  for (int64_t d = 0; d < dh; ++d) o[d] /= sum;
}

// ---- Gather (data viewed as (outer, dim, inner) around the axis; ni indices in [0, dim)) ----
struct GatherIndex {
  int64_t dim = 1, ni = 0, inner = 1;
};

// Offset in data of output element i ((outer, ni, inner) row-major).
WXE_HD int64_t gather_source(const GatherIndex& g, const int64_t* idx, int64_t i) {
  const int64_t in = i % g.inner, j = i / g.inner % g.ni, o = i / (g.inner * g.ni);
  return (o * g.dim + idx[j]) * g.inner + in;
}

// Gradient of data element e: the output gradients of every output element that copied it,
// summed in double in output order (as the CPU's scatter backward), rounded to float.
WXE_HD float gather_grad(const GatherIndex& g, const int64_t* idx, const float* gy, int64_t e) {
  const int64_t in = e % g.inner, k = e / g.inner % g.dim, o = e / (g.inner * g.dim);
  double a = 0;
  for (int64_t j = 0; j < g.ni; ++j)
    if (idx[j] == k) a += gy[(o * g.ni + j) * g.inner + in];
  return (float)a;
}

}  // namespace wxe::cuda
