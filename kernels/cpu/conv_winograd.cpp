// 3x3 stride-1 Conv on oneDNN's Winograd kernel, in bands of rows (see conv_winograd.h).
#include "kernels/cpu/conv_winograd.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {

using namespace onednn;

std::atomic<bool> g_on{true};
constexpr size_t kBandBytes = size_t(32) << 20;
std::atomic<int64_t> g_band_rows{0};

enum Pass { kForward, kData, kWeights };

// One band: output rows [r0, r1), the input rows [a, b) they read with the band's own top and
// bottom pads (zero where the band borders other rows), and the input rows [k0, k1) that
// backward-data keeps (exact there: every output row that reaches them is in the band).
struct Band {
  int64_t r0 = 0, r1 = 0, a = 0, b = 0, pt = 0, pb = 0, k0 = 0, k1 = 0;
};

// Output rows [r0, r1) over input rows [a, b): the band's pads make output row i read input
// rows i - pad .. i - pad + 2 as in the whole conv (out = in + pt + pb - 2).
Band band_over(const ConvGeom& g, int64_t r0, int64_t r1, int64_t a, int64_t b) {
  Band B;
  B.r0 = r0;
  B.r1 = r1;
  B.a = B.k0 = a;
  B.b = B.k1 = b;
  B.pt = a - (r0 - g.pb[1]);
  B.pb = (r1 - r0) + 2 - (b - a) - B.pt;
  return B;
}

// The forward's (and the weight gradient's) band: every input row its output rows read.
Band band_of(const ConvGeom& g, int64_t r0, int64_t r1) {
  return band_over(g, r0, r1, std::max<int64_t>(r0 - g.pb[1], 0), std::min<int64_t>(r1 - g.pb[1] + 2, g.in[1]));
}

// Backward-data's band for input rows [k0, k1): the output rows that reach them,
// [k0 + pad - 2, k1 + pad) clipped, over input rows [k0 - 1, k1 + 1) clipped; the rows those
// output rows also read beyond that are the band's pads (their gradient is not kept).
Band data_band_of(const ConvGeom& g, int64_t k0, int64_t k1) {
  Band B = band_over(g, std::max<int64_t>(k0 + g.pb[1] - 2, 0), std::min<int64_t>(k1 + g.pb[1], g.out[1]),
                     std::max<int64_t>(k0 - 1, 0), std::min<int64_t>(k1 + 1, g.in[1]));
  B.k0 = k0;
  B.k1 = k1;
  return B;
}

// The primitives and staging reorders of one band shape.
struct BandPrims {
  bool ok = false;
  dnnl::primitive prim;             // the pass's own primitive
  memory::desc in, in2, out, wei;   // what it reads (in2: dy of the weights pass), writes, and its weights
  memory::desc in_user, in2_user, out_user;  // the caller's views of the band (strided, offset 0)
  dnnl::reorder in_r, in2_r, out_r;
  dnnl::reorder wei_r;  // the weights (O, C, 3, 3) to `wei`, when their layouts differ (forward, backward-data)
  memory::desc pad;  // scratchpad
  size_t bytes = 0;  // scratchpad and staged operands
};

// Dims (N, C, rows, W) of a tensor with H rows, nchw or nhwc strides.
memory::desc rows_md(int64_t N, int64_t C, int64_t rows, int64_t H, int64_t W, bool nhwc) {
  const Dims s = nhwc ? Dims{H * W * C, 1, W * C, C} : Dims{C * H * W, H * W, W, 1};
  return memory::desc({N, C, rows, W}, dt::f32, s);
}

BandPrims make_band(const ConvGeom& g, Pass pass, const Band& B, bool bias, bool x_nhwc, bool y_nhwc) {
  BandPrims r;
  const int64_t N = g.N, C = g.C_in, O = g.C_out, W = g.in[2], OW = g.out[2];
  const int64_t in_rows = B.b - B.a, out_rows = B.r1 - B.r0;
  const auto any = memory::format_tag::any;
  const memory::desc x_md({N, C, in_rows, W}, dt::f32, any), y_md({N, O, out_rows, OW}, dt::f32, any);
  const memory::desc w_md({O, C, 3, 3}, dt::f32, any);
  const memory::desc b_md = bias ? plain_md({O}) : memory::desc();
  const Dims st{1, 1}, dil{0, 0}, pl{B.pt, g.pb[2]}, pr{B.pb, g.pe[2]};
  const auto alg = dnnl::algorithm::convolution_winograd;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, alg, x_md, w_md, b_md, y_md, st, dil, pl, pr);
    dnnl::convolution_forward::primitive_desc fpd(fd, attr, eng());
    std::string impl;
    if (pass == kForward) {
      r.prim = dnnl::convolution_forward(fpd);
      r.in = fpd.src_desc();
      r.out = fpd.dst_desc();
      r.wei = fpd.weights_desc();
      r.pad = fpd.scratchpad_desc();
      r.in_user = rows_md(N, C, in_rows, g.in[1], W, x_nhwc);
      r.out_user = rows_md(N, O, out_rows, g.out[1], OW, y_nhwc);
      r.out_r = reorder_of(r.out, r.out_user);
      impl = fpd.impl_info_str();
    } else if (pass == kData) {
      dnnl::convolution_backward_data::desc dd(alg, x_md, w_md, y_md, st, dil, pl, pr);
      dnnl::convolution_backward_data::primitive_desc dpd(dd, attr, eng(), fpd);
      r.prim = dnnl::convolution_backward_data(dpd);
      r.in = dpd.diff_dst_desc();
      r.out = dpd.diff_src_desc();
      r.wei = dpd.weights_desc();
      r.pad = dpd.scratchpad_desc();
      r.in_user = rows_md(N, O, out_rows, g.out[1], OW, false);
      r.out_user = rows_md(N, C, B.k1 - B.k0, g.in[1], W, false);
      r.out_r = reorder_of(r.out.submemory_desc({N, C, B.k1 - B.k0, W}, {0, 0, B.k0 - B.a, 0}), r.out_user);
      impl = dpd.impl_info_str();
    } else {
      dnnl::convolution_backward_weights::desc wd(alg, x_md, w_md, y_md, st, dil, pl, pr);
      dnnl::convolution_backward_weights::primitive_desc wpd(wd, attr, eng(), fpd);
      r.prim = dnnl::convolution_backward_weights(wpd);
      r.in = wpd.src_desc();
      r.in2 = wpd.diff_dst_desc();
      r.out = wpd.diff_weights_desc();
      r.pad = wpd.scratchpad_desc();
      r.in_user = rows_md(N, C, in_rows, g.in[1], W, false);
      r.in2_user = rows_md(N, O, out_rows, g.out[1], OW, false);
      r.in2_r = reorder_of(r.in2_user, r.in2);
      r.out_user = plain_md({O, C, 3, 3});
      r.out_r = reorder_of(r.out, r.out_user);
      impl = wpd.impl_info_str();
    }
    if (impl.find("wino") == std::string::npos) return r;
    r.in_r = reorder_of(r.in_user, r.in);
    if (pass != kWeights && !(r.wei == plain_md({O, C, 3, 3}))) r.wei_r = reorder_of(plain_md({O, C, 3, 3}), r.wei);
    r.bytes = r.pad.get_size() + r.in.get_size() + r.in2.get_size() + r.out.get_size();
    r.ok = true;
  } catch (const dnnl::error&) {
    r.ok = false;
  }
  return r;
}

// A pass's bands and the primitives of their shapes (a band height splits the rows into a first,
// middle and last shape, or one).
struct Plan {
  bool ok = false;
  std::vector<Band> bands;
  std::vector<std::shared_ptr<BandPrims>> prims;  // per band
};

// Rows [lo, hi) of the pass's own rows (output rows, or input rows for kData) split into bands
// of `rows`.
Plan plan_with(const ConvGeom& g, Pass pass, int64_t rows, bool bias, bool x_nhwc, bool y_nhwc, int64_t lo,
               int64_t hi) {
  Plan p;
  std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<BandPrims>>> shapes;
  for (int64_t r0 = lo; r0 < hi; r0 += rows) {
    const int64_t r1 = std::min(hi, r0 + rows);
    const Band B = pass == kData ? data_band_of(g, r0, r1) : band_of(g, r0, r1);
    // oneDNN 2.6's Winograd backward-data is wrong with unequal pads on an axis (tests/grad_conv_test.cpp)
    if (pass == kData && (B.pt != B.pb || g.pb[2] != g.pe[2])) return p;
    const std::vector<int64_t> key{B.b - B.a, B.r1 - B.r0, B.pt, B.pb, B.k0 - B.a, B.k1 - B.k0};
    auto it = std::find_if(shapes.begin(), shapes.end(), [&](const auto& s) { return s.first == key; });
    if (it == shapes.end()) {
      shapes.emplace_back(key, std::make_shared<BandPrims>(make_band(g, pass, B, bias, x_nhwc, y_nhwc)));
      if (!shapes.back().second->ok) return p;
      it = shapes.end() - 1;
    }
    p.bands.push_back(B);
    p.prims.push_back(it->second);
  }
  p.ok = true;
  return p;
}

size_t most_bytes(const Plan& p) {
  size_t most = 0;
  for (const auto& b : p.prims) most = std::max(most, b->bytes);
  return most;
}

// The tallest bands (a multiple of 4 rows, the kernel's tile, or all rows) whose largest shape
// fits the band budget. Halving stops where it saves less than a quarter: then the transformed
// weights (many channels on a small grid: 512 x 256 channels take 19 MB), not the rows, fill
// the scratchpad, and every band would transform them again. Not ok (the direct kernel runs)
// where the bands still need more than 1.5 x the budget (the weight gradient of 256 -> 512
// channels on 16 x 24: 74 MB).
std::shared_ptr<const Plan> plan_for(const ConvGeom& g, Pass pass, bool bias, bool x_nhwc, bool y_nhwc,
                                     int64_t lo = -1, int64_t hi = -1);

Plan make_plan(const ConvGeom& g, Pass pass, bool bias, bool x_nhwc, bool y_nhwc, int64_t lo, int64_t hi) {
  if (g_band_rows > 0) return plan_with(g, pass, g_band_rows, bias, x_nhwc, y_nhwc, lo, hi);
  if (lo > 0 || hi < (pass == kData ? g.in[1] : g.out[1])) {  // part of the rows: the whole plan's band height
    auto whole = plan_for(g, pass, bias, x_nhwc, y_nhwc);
    if (!whole->ok) return Plan();
    const Band& B = whole->bands[0];
    return plan_with(g, pass, pass == kData ? B.k1 - B.k0 : B.r1 - B.r0, bias, x_nhwc, y_nhwc, lo, hi);
  }
  const size_t budget = kBandBytes;
  int64_t rows = hi - lo;
  Plan p = plan_with(g, pass, rows, bias, x_nhwc, y_nhwc, lo, hi);
  while (p.ok && rows > 4 && most_bytes(p) > budget) {
    rows = std::max<int64_t>(4, (rows / 2 + 3) / 4 * 4);
    Plan q = plan_with(g, pass, rows, bias, x_nhwc, y_nhwc, lo, hi);
    if (!q.ok || most_bytes(q) * 4 > most_bytes(p) * 3) break;
    p = std::move(q);
  }
  if (most_bytes(p) * 2 > budget * 3) p.ok = false;  // the direct kernel's scratch is small
  return p;
}

PrimCache<Plan> plan_cache;

// The plan for the pass's rows [lo, hi) (-1: all of them), in bands as tall as the whole rows'.
std::shared_ptr<const Plan> plan_for(const ConvGeom& g, Pass pass, bool bias, bool x_nhwc, bool y_nhwc, int64_t lo,
                                     int64_t hi) {
  if (lo < 0) {
    lo = 0;
    hi = pass == kData ? g.in[1] : g.out[1];
  }
  std::string key = str(pass, "|", g.N, ",", g.C_in, ">", g.C_out, "|", bias, x_nhwc, y_nhwc, "|", g_band_rows.load(),
                        "|", lo, ",", hi);
  for (int a = 1; a < 3; ++a) key += str("|", g.in[a], ",", g.out[a], ",", g.pb[a], ",", g.pe[a]);
  return plan_cache.get(key, [&] { return make_plan(g, pass, bias, x_nhwc, y_nhwc, lo, hi); });
}

// Scratch slots: staged input band, the weights pass's dy band, the written band, the staged
// weights (or a band's weight gradient), the scratchpad.
enum { kIn, kIn2, kOut, kWei, kPad, kFlipped };

void run_reorder(const Node& n, const dnnl::reorder& r, const memory& from, const memory& to) {
  execute(n, r, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
}

// A buffer of layout md in scratch slot `slot`.
memory scratch_mem(const memory::desc& md, int slot) { return mem(md, scratch_slot(slot).get(md.get_size())); }

// The caller's rows (the view `user` at `from`) copied by r into a buffer of layout `to`.
memory staged(const Node& n, const dnnl::reorder& r, const memory::desc& user, const float* from,
              const memory::desc& to, int slot) {
  memory m = scratch_mem(to, slot);
  run_reorder(n, r, mem(user, from), m);
  return m;
}

// The weights (O, C, 3, 3) in the band primitives' layout, staged once per call for every band
// that shares it (all do; a band with another layout stages again).
struct StagedWeights {
  const float* w;
  memory::desc md;
  memory m;
  memory get(const Node& n, const BandPrims& P, const ConvGeom& g) {
    if (!m || !(md == P.wei)) {
      m = P.wei_r ? staged(n, P.wei_r, plain_md({g.C_out, g.C_in, 3, 3}), w, P.wei, kWei) : mem(P.wei, w);
      md = P.wei;
    }
    return m;
  }
};

int64_t row_offset(const ConvGeom& g, int64_t row, bool in, bool nhwc) {
  const int64_t W = in ? g.in[2] : g.out[2], C = in ? g.C_in : g.C_out;
  return row * W * (nhwc ? C : 1);
}

// The forward and backward-data alike, band by band: rows of `from` (x; dy) staged into the
// primitive's layout, the primitive with the weights and the scratchpad, its rows reordered out
// to `to` (y; dx's exact rows).
void run_bands(const Node& n, const ConvGeom& g, Pass pass, const Plan& p, const float* w, const float* from,
               bool from_nhwc, const float* bias, float* to, bool to_nhwc) {
  const bool fwd = pass == kForward;
  StagedWeights sw{w, {}, {}};
  for (size_t i = 0; i < p.bands.size(); ++i) {
    const Band& B = p.bands[i];
    const BandPrims& P = *p.prims[i];
    memory in = staged(n, P.in_r, P.in_user, from + row_offset(g, fwd ? B.a : B.r0, fwd, from_nhwc), P.in, kIn);
    memory out = scratch_mem(P.out, kOut);
    Args args{{fwd ? DNNL_ARG_SRC : DNNL_ARG_DIFF_DST, in}, {DNNL_ARG_WEIGHTS, sw.get(n, P, g)},
              {fwd ? DNNL_ARG_DST : DNNL_ARG_DIFF_SRC, out}, {DNNL_ARG_SCRATCHPAD, scratch_mem(P.pad, kPad)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, mem(plain_md({g.C_out}), bias));
    execute(n, P.prim, args);
    run_reorder(n, P.out_r, out, mem(P.out_user, to + row_offset(g, fwd ? B.r0 : B.k0, !fwd, to_nhwc)));
  }
}

}  // namespace

void zero_rows_outside(float* t, int64_t N, int64_t C, int64_t H, int64_t W, int64_t lo, int64_t hi) {
#pragma omp parallel for schedule(static) if (N * C * H * W > (1 << 16))
  for (int64_t nc = 0; nc < N * C; ++nc) {
    float* p = t + nc * H * W;
    std::fill(p, p + lo * W, 0.f);
    std::fill(p + hi * W, p + H * W, 0.f);
  }
}

RowRange nonzero_rows(const float* t, int64_t N, int64_t C, int64_t H, int64_t W) {
  auto zero_row = [&](int64_t r) {  // -0 counts as zero, NaN does not
    for (int64_t nc = 0; nc < N * C; ++nc) {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(t + (nc * H + r) * W);
      uint32_t any = 0;
#pragma omp simd reduction(| : any)
      for (int64_t w = 0; w < W; ++w) any |= p[w] & 0x7fffffffu;
      if (any) return false;
    }
    return true;
  };
  RowRange r{0, H};
  while (r.lo < H && zero_row(r.lo)) ++r.lo;
  while (r.hi > r.lo && zero_row(r.hi - 1)) --r.hi;
  return r;
}

void set_winograd(bool on) { g_on = on; }
bool winograd_enabled() { return g_on; }
void set_winograd_band_rows(int64_t rows) { g_band_rows = rows; }

bool winograd_applies(const ConvGeom& g) {
  if (!g_on || !winograd_isa() || g.transpose || g.group != 1 || g.nsp != 2) return false;
  for (int a = 1; a < 3; ++a)
    if (g.k[a] != 3 || g.s[a] != 1 || g.d[a] != 1 || g.pb[a] < 0 || g.pb[a] > 1 || g.pe[a] < 0 || g.pe[a] > 1)
      return false;
  const double flops = 2.0 * g.N * g.C_in * g.C_out * 9 * g.out[1] * g.out[2];
  return std::min(g.C_in, g.C_out) >= 16 && flops >= 1e8;
}

namespace {

// The forward's output rows [lo, hi) (the others are not written).
bool forward_rows(const Node& n, const ConvGeom& g, const float* x, bool x_nhwc, const float* w, const float* bias,
                  float* y, bool y_nhwc, int64_t lo, int64_t hi) {
  if (!winograd_applies(g)) return false;
  auto p = plan_for(g, kForward, bias != nullptr, x_nhwc, y_nhwc, lo, hi);
  if (!p->ok) return false;
  run_bands(n, g, kForward, *p, w, x, x_nhwc, bias, y, y_nhwc);
  return true;
}

// Backward-data as the forward conv of dy with the kernel flipped and its channels swapped
// (dx[c, p] = sum over o, k' of dy[o, p - (2 - pb) + k'] w[o, c, 2 - k']): pads 2 - pb and 2 - pe,
// so pads of 1 stay 1. oneDNN's forward Winograd kernel is faster than its backward-data one
// (2 threads: CREDIT's 84 -> 84 channels on 256 x 384 50 vs 60 ms, 64 -> 336 on 128 x 192 32
// vs 38 ms). False where the flipped pads leave the forward's range or oneDNN has no forward
// Winograd kernel for the flipped geometry.
bool data_by_flipped_forward(const Node& n, const ConvGeom& g, const float* w, const float* dy, float* dx,
                             RowRange rows) {
  if (g.pb[1] != 1 || g.pe[1] != 1 || g.pb[2] != 1 || g.pe[2] != 1) return false;
  ConvGeom t = g;
  std::swap(t.C_in, t.C_out);
  for (int a = 1; a < 3; ++a) {
    std::swap(t.in[a], t.out[a]);
    t.pb[a] = 2 - g.pb[a];
    t.pe[a] = 2 - g.pe[a];
  }
  if (!winograd_applies(t)) return false;
  const int64_t O = g.C_out, C = g.C_in;
  float* wt = scratch_slot(kFlipped).floats(O * C * 9);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c)
    for (int64_t o = 0; o < O; ++o)
      for (int k = 0; k < 9; ++k) wt[(c * O + o) * 9 + 8 - k] = w[(o * C + c) * 9 + k];
  // dy's rows [lo, hi) reach dx's rows [lo - 1, hi + 1): only those are computed
  const int64_t a = std::max<int64_t>(rows.lo - 1, 0), b = std::min<int64_t>(rows.hi + 1, g.in[1]);
  if (a >= b) {
    std::fill(dx, dx + g.N * C * g.in[1] * g.in[2], 0.f);
    return true;
  }
  if (!forward_rows(n, t, dy, false, wt, nullptr, dx, false, a, b)) return false;
  zero_rows_outside(dx, g.N, C, g.in[1], g.in[2], a, b);
  return true;
}

}  // namespace

bool winograd_conv_forward(const Node& n, const ConvGeom& g, const float* x, bool x_nhwc, const float* w,
                           const float* bias, float* y, bool y_nhwc) {
  return forward_rows(n, g, x, x_nhwc, w, bias, y, y_nhwc, 0, g.out[1]);
}

bool winograd_conv_forward_rows(const Node& n, const ConvGeom& g, const float* x, const float* w, const float* bias,
                                float* y, RowRange rows) {
  const int64_t lo = std::clamp<int64_t>(rows.lo, 0, g.out[1]), hi = std::clamp<int64_t>(rows.hi, lo, g.out[1]);
  if (!winograd_applies(g) || (lo < hi && !forward_rows(n, g, x, false, w, bias, y, false, lo, hi))) return false;
  zero_rows_outside(y, g.N, g.C_out, g.out[1], g.out[2], lo, hi);
  return true;
}

bool winograd_forward_plans(const ConvGeom& g, bool bias, bool x_nhwc, bool y_nhwc, RowRange rows) {
  return winograd_applies(g) && rows.lo < rows.hi && plan_for(g, kForward, bias, x_nhwc, y_nhwc, rows.lo, rows.hi)->ok;
}

bool winograd_conv_backward_data(const Node& n, const ConvGeom& g, const float* w, const float* dy, float* dx,
                                 RowRange dy_rows) {
  if (!winograd_applies(g)) return false;
  if (data_by_flipped_forward(n, g, w, dy, dx, dy_rows)) return true;
  auto p = plan_for(g, kData, false, false, false);
  if (!p->ok) return false;
  run_bands(n, g, kData, *p, w, dy, false, nullptr, dx, false);
  return true;
}

bool winograd_conv_weight_grad(const Node& n, const ConvGeom& g, const float* x, const float* dy, float* dw,
                               RowRange dy_rows) {
  if (!winograd_applies(g)) return false;
  const int64_t wn = g.C_out * g.C_in * 9;
  // the rows of dy that are all zero add nothing: the bands cover the others
  const auto [lo, hi] = dy_rows;
  if (lo == hi) {
    std::fill(dw, dw + wn, 0.f);
    return true;
  }
  auto p = plan_for(g, kWeights, false, false, false, lo, hi);
  if (!p->ok) return false;
  float* band_dw = p->bands.size() > 1 ? scratch_slot(kWei).floats(wn) : nullptr;
  for (size_t i = 0; i < p->bands.size(); ++i) {
    const Band& B = p->bands[i];
    const BandPrims& P = *p->prims[i];
    memory xb = staged(n, P.in_r, P.in_user, x + row_offset(g, B.a, true, false), P.in, kIn);
    memory dyb = staged(n, P.in2_r, P.in2_user, dy + row_offset(g, B.r0, false, false), P.in2, kIn2);
    memory dwb = scratch_mem(P.out, kOut);
    execute(n, P.prim,
            {{DNNL_ARG_SRC, xb}, {DNNL_ARG_DIFF_DST, dyb}, {DNNL_ARG_DIFF_WEIGHTS, dwb},
             {DNNL_ARG_SCRATCHPAD, scratch_mem(P.pad, kPad)}});
    float* to = i == 0 ? dw : band_dw;  // the first band writes dw, the others are added to it
    run_reorder(n, P.out_r, dwb, mem(P.out_user, to));
    if (i > 0)
      for (int64_t j = 0; j < wn; ++j) dw[j] += band_dw[j];
  }
  return true;
}

}  // namespace wxe::cpu
