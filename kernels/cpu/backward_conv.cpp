// Backward kernels of Conv and ConvTranspose (1-D, 2-D, 3-D; strides, pads, dilations, group,
// auto_pad, output_padding / output_shape, optional bias). See engine/ir/ops.h (BackwardFn) for
// the contract. Geometry comes from conv_geometry (conv.cpp), as in the forward kernels.
//
// Reference loops (the oracle). Both ops relate a "wide" tensor (Conv: the input;
// ConvTranspose: the output) to a "narrow" one (Conv: the output; ConvTranspose: the input):
// wide position p and narrow position q meet through kernel tap k when
// p = q * s - pad_begin + k * d on every spatial axis, and the weight is
// (C_narrow, C_wide / group, k...) in both ops. Conv computes narrow from wide, ConvTranspose
// wide from narrow, so three loop nests over that relation give every gradient:
//   narrow_from_wide  narrow[n, cn, q] = sum_{cwg, k} wide[n, cw, q*s - pb + k*d] W[cn, cwg, k]
//                     (ConvTranspose dx from dy)
//   wide_from_narrow  wide[n, cw, p] = sum_{cng, k, q: p = q*s - pb + k*d} narrow[n, cn, q] W[cn, cwg, k]
//                     (Conv dx from dy)
//   weight_grad       dW[cn, cwg, k] = sum_{n, q} narrow[n, cn, q] wide[n, cw, q*s - pb + k*d]
//                     (Conv: narrow = dy, wide = x; ConvTranspose: narrow = x, wide = dy)
// with cw = group(cn) * C_wide / group + cwg; and db[c] = sum_{n, spatial} dy[n, c, ...].
// Accumulation in double; each loop nest is parallel over the elements it writes.
//
// Fast path: oneDNN (2.6) convolution / deconvolution backward-data and backward-weights
// primitives for float32, created once per geometry (cached in a PrimCache, dnnl_util.h)
// with the same translation of the ONNX attributes as make_conv in dnnl.cpp; backward-data
// runs only when dx is wanted, and the scratchpads are per-thread buffers (user mode). A Conv
// with few output channels and a wide kernel takes its weight gradient from conv_small_oc.h
// instead (oneDNN's is im2col + gemm there), one whose kernel is a whole number of strides on
// input channels oneDNN would stage (and a ConvTranspose of that shape) from conv_s2d.h, a 3x3
// stride-1 Conv both gradients from conv_winograd.h. Anything it does not take (negative pads
// of a ConvTranspose with output_shape, empty tensors, a geometry oneDNN rejects) runs the loops.
// A Conv with precision = "bf16" (finetune --precision bf16) stages dy, W and x as bfloat16
// (the operand reorders convert) and gets float32 dx and dW: bfloat16 products, float32
// accumulation; the bias gradient and conv_small_oc's weight gradient stay float32.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_conv.h"
#include "kernels/cpu/backward_layers.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/conv_fft.h"
#include "kernels/cpu/conv_s2d.h"
#include "kernels/cpu/conv_small_oc.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"

namespace wxe::cpu {

namespace {

// ---------------------------------------------------------------- reference loops
struct Sides {
  int64_t N = 0, G = 1, Cw = 0, Cn = 0;  // batch, group, wide and narrow channels
  int64_t wide[3], narrow[3], k[3], s[3], d[3], pb[3];
  int64_t wide_plane() const { return wide[0] * wide[1] * wide[2]; }
  int64_t narrow_plane() const { return narrow[0] * narrow[1] * narrow[2]; }
  int64_t kvol() const { return k[0] * k[1] * k[2]; }
};

Sides sides_of(const ConvGeom& g) {
  Sides r;
  r.N = g.N;
  r.G = g.group;
  r.Cw = g.transpose ? g.C_out : g.C_in;
  r.Cn = g.transpose ? g.C_in : g.C_out;
  for (int a = 0; a < 3; ++a) {
    r.wide[a] = g.transpose ? g.out[a] : g.in[a];
    r.narrow[a] = g.transpose ? g.in[a] : g.out[a];
    r.k[a] = g.k[a];
    r.s[a] = g.s[a];
    r.d[a] = g.d[a];
    r.pb[a] = g.pb[a];
  }
  return r;
}

// narrow (N, Cn, narrow...) from wide (N, Cw, wide...) and W (Cn, Cw/G, k...).
// Parallel over (batch, narrow channel) planes.
void narrow_from_wide(const Sides& S, const float* wide, const float* W, float* narrow) {
  const int64_t Cwg = S.Cw / S.G, Cng = S.Cn / S.G;
  const int64_t PD = S.wide[0], PH = S.wide[1], PW = S.wide[2];
  const int64_t QD = S.narrow[0], QH = S.narrow[1], QW = S.narrow[2];
  const int64_t KD = S.k[0], KH = S.k[1], KW = S.k[2];
  const int64_t plane = S.narrow_plane(), wplane = S.wide_plane(), kvol = S.kvol();
#pragma omp parallel
  {
    std::vector<double> acc((size_t)plane);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < S.N * S.Cn; ++t) {
      const int64_t nb = t / S.Cn, cn = t % S.Cn, grp = cn / Cng;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t cwg = 0; cwg < Cwg; ++cwg) {
        const float* wc = wide + (nb * S.Cw + grp * Cwg + cwg) * wplane;
        const float* Wc = W + (cn * Cwg + cwg) * kvol;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const double wv = Wc[(kd * KH + kh) * KW + kw];
              for (int64_t qd = 0; qd < QD; ++qd) {
                const int64_t pd = qd * S.s[0] - S.pb[0] + kd * S.d[0];
                if (pd < 0 || pd >= PD) continue;
                for (int64_t qh = 0; qh < QH; ++qh) {
                  const int64_t ph = qh * S.s[1] - S.pb[1] + kh * S.d[1];
                  if (ph < 0 || ph >= PH) continue;
                  const float* wr = wc + (pd * PH + ph) * PW;
                  double* ar = acc.data() + (qd * QH + qh) * QW;
                  for (int64_t qw = 0; qw < QW; ++qw) {
                    const int64_t pw = qw * S.s[2] - S.pb[2] + kw * S.d[2];
                    if (pw >= 0 && pw < PW) ar[qw] += wv * wr[pw];
                  }
                }
              }
            }
      }
      float* o = narrow + t * plane;
      for (int64_t q = 0; q < plane; ++q) o[q] = (float)acc[q];
    }
  }
}

// wide (N, Cw, wide...) from narrow (N, Cn, narrow...) and W (Cn, Cw/G, k...), in gather
// form (each wide position collects the narrow positions that reach it).
// Parallel over (batch, wide channel) planes.
void wide_from_narrow(const Sides& S, const float* narrow, const float* W, float* wide) {
  const int64_t Cwg = S.Cw / S.G, Cng = S.Cn / S.G;
  const int64_t PD = S.wide[0], PH = S.wide[1], PW = S.wide[2];
  const int64_t QD = S.narrow[0], QH = S.narrow[1], QW = S.narrow[2];
  const int64_t KD = S.k[0], KH = S.k[1], KW = S.k[2];
  const int64_t plane = S.wide_plane(), nplane = S.narrow_plane(), kvol = S.kvol();
  // narrow index for wide position p and tap k on axis a, or -1
  auto src = [&](int a, int64_t p, int64_t k, int64_t size) -> int64_t {
    const int64_t t = p + S.pb[a] - k * S.d[a];
    if (t < 0 || t % S.s[a] != 0) return -1;
    const int64_t q = t / S.s[a];
    return q < size ? q : -1;
  };
#pragma omp parallel
  {
    std::vector<double> acc((size_t)plane);
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < S.N * S.Cw; ++t) {
      const int64_t nb = t / S.Cw, cw = t % S.Cw, grp = cw / Cwg, cwg = cw % Cwg;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t cng = 0; cng < Cng; ++cng) {
        const int64_t cn = grp * Cng + cng;
        const float* nc = narrow + (nb * S.Cn + cn) * nplane;
        const float* Wc = W + (cn * Cwg + cwg) * kvol;
        for (int64_t kd = 0; kd < KD; ++kd)
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {
              const double wv = Wc[(kd * KH + kh) * KW + kw];
              for (int64_t pd = 0; pd < PD; ++pd) {
                const int64_t qd = src(0, pd, kd, QD);
                if (qd < 0) continue;
                for (int64_t ph = 0; ph < PH; ++ph) {
                  const int64_t qh = src(1, ph, kh, QH);
                  if (qh < 0) continue;
                  const float* nr = nc + (qd * QH + qh) * QW;
                  double* ar = acc.data() + (pd * PH + ph) * PW;
                  for (int64_t pw = 0; pw < PW; ++pw) {
                    const int64_t qw = src(2, pw, kw, QW);
                    if (qw >= 0) ar[pw] += wv * nr[qw];
                  }
                }
              }
            }
      }
      float* o = wide + t * plane;
      for (int64_t p = 0; p < plane; ++p) o[p] = (float)acc[p];
    }
  }
}

// dW (Cn, Cw/G, k...) from narrow (N, Cn, narrow...) and wide (N, Cw, wide...).
// Parallel over narrow channels (Conv: output channels), each writing its own weight rows.
void weight_grad(const Sides& S, const float* narrow, const float* wide, float* dW) {
  const int64_t Cwg = S.Cw / S.G, Cng = S.Cn / S.G;
  const int64_t PD = S.wide[0], PH = S.wide[1], PW = S.wide[2];
  const int64_t QD = S.narrow[0], QH = S.narrow[1], QW = S.narrow[2];
  const int64_t KD = S.k[0], KH = S.k[1], KW = S.k[2];
  const int64_t nplane = S.narrow_plane(), wplane = S.wide_plane(), kvol = S.kvol();
#pragma omp parallel for schedule(dynamic)
  for (int64_t cn = 0; cn < S.Cn; ++cn) {
    const int64_t grp = cn / Cng;
    for (int64_t cwg = 0; cwg < Cwg; ++cwg) {
      const int64_t cw = grp * Cwg + cwg;
      for (int64_t kd = 0; kd < KD; ++kd)
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            double acc = 0;
            for (int64_t nb = 0; nb < S.N; ++nb) {
              const float* nc = narrow + (nb * S.Cn + cn) * nplane;
              const float* wc = wide + (nb * S.Cw + cw) * wplane;
              for (int64_t qd = 0; qd < QD; ++qd) {
                const int64_t pd = qd * S.s[0] - S.pb[0] + kd * S.d[0];
                if (pd < 0 || pd >= PD) continue;
                for (int64_t qh = 0; qh < QH; ++qh) {
                  const int64_t ph = qh * S.s[1] - S.pb[1] + kh * S.d[1];
                  if (ph < 0 || ph >= PH) continue;
                  const float* nr = nc + (qd * QH + qh) * QW;
                  const float* wr = wc + (pd * PH + ph) * PW;
                  for (int64_t qw = 0; qw < QW; ++qw) {
                    const int64_t pw = qw * S.s[2] - S.pb[2] + kw * S.d[2];
                    if (pw >= 0 && pw < PW) acc += (double)nr[qw] * wr[pw];
                  }
                }
              }
            }
            dW[(cn * Cwg + cwg) * kvol + (kd * KH + kh) * KW + kw] = (float)acc;
          }
    }
  }
}

// db[c] = sum over batch and space of dy (N, C, plane).
void bias_grad(const float* dy, int64_t N, int64_t C, int64_t plane, float* db) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t nb = 0; nb < N; ++nb) {
      const float* p = dy + (nb * C + c) * plane;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < plane; ++i) acc += p[i];
    }
    db[c] = (float)acc;
  }
}

// dx and dW by the loops (either pointer may be null: not wanted).
void backward_loops(const ConvGeom& g, const float* x, const float* W, const float* dy, float* dx,
                    float* dW) {
  const Sides S = sides_of(g);
  if (!g.transpose) {  // x wide, y narrow
    if (dx) wide_from_narrow(S, dy, W, dx);
    if (dW) weight_grad(S, dy, x, dW);
  } else {  // x narrow, y wide
    if (dx) narrow_from_wide(S, dy, W, dx);
    if (dW) weight_grad(S, x, dy, dW);
  }
}

// ---------------------------------------------------------------- oneDNN fast path
using namespace onednn;  // engine, stream, Scratch, execute (dnnl_util.h)

// One tensor argument of a primitive: the tensor's own layout and the primitive's. When they
// differ (blocked activations, the weights) the tensor is copied by a oneDNN reorder. (With a
// forward_training hint oneDNN 2.6 picks blocked nChw16c layouts here, not the nhwc that the
// forward path transposes to by hand, so plain reorders suffice.)
struct Operand {
  memory::desc user, prim;
  bool copy = false;
  dnnl::reorder reorder;  // input: user -> prim; output: prim -> user
};

Operand operand(const memory::desc& user, const memory::desc& prim, bool input) {
  Operand o;
  o.user = user;
  o.prim = prim;
  o.copy = !(user == prim);
  if (o.copy)
    o.reorder = input ? reorder_of(user, prim) : reorder_of(prim, user);
  return o;
}

// The primitive's view of an input tensor: the tensor itself, or its copy in buf.
memory stage_in(const Node& n, const Operand& o, const float* data, Scratch& buf) {
  memory user = mem(o.user, data);
  if (!o.copy) return user;
  memory m = mem(o.prim, buf.get(o.prim.get_size()));
  execute(n, o.reorder, {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, m}});
  return m;
}

// Where the primitive writes an output: the tensor itself, or buf (then stage_out copies).
memory out_mem(const Operand& o, float* data, Scratch& buf) {
  return o.copy ? mem(o.prim, buf.get(o.prim.get_size())) : mem(o.user, data);
}

void stage_out(const Node& n, const Operand& o, const memory& m, float* data) {
  if (o.copy) execute(n, o.reorder, {{DNNL_ARG_FROM, m}, {DNNL_ARG_TO, mem(o.user, data)}});
}

// Backward-data (dy, W -> dx) and backward-weights (x, dy -> dW) primitives of one geometry,
// in oneDNN's terms for both ops: src = x, dst = y. Scratchpads are the caller's (user mode),
// from per-thread buffers. The bias gradient is not oneDNN's: its float sum depends on the
// thread count (2e-5 relative between tp ranks running 1 and 2 threads, tp_train_test), the
// plain sum in double (bias_grad) does not.
struct BackwardPrims {
  bool use_ref = false;
  bool bf16 = false;  // dy, W and x staged as bfloat16 (the Operand reorders convert)
  bool reference = false;  // oneDNN's reference kernel ("ref:any") for either pass
  dnnl::primitive data, weights;
  Operand data_dy, data_w, data_dx;
  Operand wts_x, wts_dy, wts_dw;
  memory::desc data_pad, wts_pad;  // scratchpads
};

template <class Fwd, class BwdData, class BwdWeights>
void make_pair(BackwardPrims& r, dnnl::algorithm alg, const memory::desc& x_user, const memory::desc& w_user,
               const memory::desc& y_user, memory::format_tag act, const Dims& strides, const Dims& dil,
               const Dims& pl, const Dims& pr, bool bf16) {
  // bf16: the operands the products read (x, W, dy) in bfloat16; what they write (dx, dW) float32
  const dt ct = bf16 ? dt::bf16 : dt::f32;
  // plain (pointwise Conv) in bfloat16: the row-major layout, converted
  auto act_md = [&](const memory::desc& user, dt t) {
    const Dims d = user.dims();
    return act != memory::format_tag::undef ? memory::desc(d, t, act)
           : t == dt::bf16                  ? memory::desc(d, t, Dims(strides_of(Shape(d.begin(), d.end()))))
                                            : user;
  };
  const memory::desc x_md = act_md(x_user, ct), dx_md = act_md(x_user, dt::f32), y_md = act_md(y_user, ct);
  const memory::desc w_md(w_user.dims(), ct, memory::format_tag::any);
  const memory::desc dw_md(w_user.dims(), dt::f32, memory::format_tag::any);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // oneDNN requires the forward primitive desc as a hint for the backward ones
  typename Fwd::desc fd(dnnl::prop_kind::forward_training, alg, x_md, w_md, y_md, strides, dil, pl, pr);
  typename Fwd::primitive_desc fpd(fd, eng());
  typename BwdData::desc dd(alg, dx_md, w_md, y_md, strides, dil, pl, pr);
  typename BwdData::primitive_desc dpd(dd, attr, eng(), fpd);
  typename BwdWeights::desc wd(alg, x_md, dw_md, y_md, strides, dil, pl, pr);
  typename BwdWeights::primitive_desc wpd(wd, attr, eng(), fpd);
  r.data = BwdData(dpd);
  r.weights = BwdWeights(wpd);
  r.data_dy = operand(y_user, dpd.diff_dst_desc(), true);
  r.data_w = operand(w_user, dpd.weights_desc(), true);
  r.data_dx = operand(x_user, dpd.diff_src_desc(), false);
  r.wts_x = operand(x_user, wpd.src_desc(), true);
  r.wts_dy = operand(y_user, wpd.diff_dst_desc(), true);
  r.wts_dw = operand(w_user, wpd.diff_weights_desc(), false);
  r.data_pad = dpd.scratchpad_desc();
  r.wts_pad = wpd.scratchpad_desc();
  r.bf16 = bf16;
  r.reference = std::string(dpd.impl_info_str()).rfind("ref", 0) == 0 || std::string(wpd.impl_info_str()).rfind("ref", 0) == 0;
}

// Activation layouts: as the forward path in dnnl.cpp, blocked for spatial Conv (nChw16c, named:
// with "any" oneDNN 2.6 picks a slower layout for some channel counts, backward-data of 84
// channels of 256 x 384 at 3x3: 269 ms vs 160 ms nChw16c, 1 thread), plain for pointwise Conv
// and for ConvTranspose.
// Measured (oneDNN 2.6, AVX-512, 1 thread, dx + dW): 3x3 on (1,64,48,90) 21 ms blocked vs
// 46 ms plain, kernel 8 stride 2 on (1,64,96,180) 108 vs 426 ms; 1x1 and ConvTranspose
// kernel 2 stride 2 about equal either way (plain gemm; the busy machine's noise was larger).
// bf16 (precision = "bf16", Conv only, as the forward in dnnl.cpp): bfloat16 operands, float32
// accumulation and gradients; where oneDNN has no bfloat16 primitive for the geometry, float32
// (BackwardPrims::bf16 says which ran).
BackwardPrims make_backward(const ConvGeom& g, bool want_bf16) {
  BackwardPrims r;
  const int f = g.first();
  const int64_t G = g.group, Cig = g.C_in / G, Cog = g.C_out / G;
  Dims src{g.N, g.C_in}, dst{g.N, g.C_out}, ks, strides, dil, pl, pr;
  int64_t kvol = 1;
  bool pointwise = true;
  for (int a = f; a < 3; ++a) {
    src.push_back(g.in[a]);
    dst.push_back(g.out[a]);
    ks.push_back(g.k[a]);
    kvol *= g.k[a];
    strides.push_back(g.s[a]);
    dil.push_back(g.d[a] - 1);
    pl.push_back(g.pb[a]);
    // oneDNN: out = (in - 1) * s + ext - pl - pr (transpose), out = (in + pl + pr - ext) / s + 1
    pr.push_back(g.transpose ? (g.in[a] - 1) * g.s[a] + (g.k[a] - 1) * g.d[a] + 1 - g.pb[a] - g.out[a]
                             : g.pe[a]);
    pointwise = pointwise && g.k[a] == 1 && g.s[a] == 1 && g.pb[a] == 0 && g.pe[a] == 0;
  }
  r.use_ref = true;  // until the primitives exist
  for (size_t i = 0; i < pl.size(); ++i)
    if (pl[i] < 0 || pr[i] < 0) return r;
  // Weights as oneDNN dims ({G,} OC/G, IC/G, k...) with the strides of the ONNX layout:
  // Conv (OC, IC/G, k...), ConvTranspose (IC, OC/G, k...).
  Dims wd, ws;
  std::vector<int64_t> kst = strides_of(Shape(ks.begin(), ks.end()));
  if (G > 1) {
    wd = {G, Cog, Cig};
    ws = g.transpose ? Dims{Cig * Cog * kvol, kvol, Cog * kvol} : Dims{Cog * Cig * kvol, Cig * kvol, kvol};
  } else {
    wd = {Cog, Cig};
    ws = g.transpose ? Dims{kvol, Cog * kvol} : Dims{Cig * kvol, kvol};
  }
  wd.insert(wd.end(), ks.begin(), ks.end());
  ws.insert(ws.end(), kst.begin(), kst.end());
  using tag = memory::format_tag;
  const bool blocked = !g.transpose && !pointwise;
  const tag act16[3] = {tag::nCw16c, tag::nChw16c, tag::nCdhw16c};
  const memory::desc x_user = plain_md(src), y_user = plain_md(dst), w_user(wd, dt::f32, ws);
  // blocked: nChw16c, else oneDNN's choice; plain: the tensors' own layout. Named only for
  // 16 channels or more on both sides: with fewer (CREDIT's first cross-embedding convs, 7 -> 2
  // channels at kernel 32) oneDNN 2.6 has only its reference kernel for nChw16c (0.1 GFLOP/s).
  // A layout for which oneDNN offers only its reference kernel ("ref:any", e.g. nChw16c for the
  // 640 x 1280 CrossFormer's first cross-embeddings: 74 -> 16 channels, kernel 32, stride 4,
  // 0.1 GFLOP/s: one training step took minutes) is passed over for the next one, down to the
  // tensors' own plain layout (im2col + gemm); a reference pair is kept only when nothing else
  // exists.
  const bool named = std::min(Cig, Cog) >= 16;
  std::vector<tag> acts{tag::undef};
  if (blocked) acts = named ? std::vector<tag>{act16[g.nsp - 1], tag::any, tag::undef} : std::vector<tag>{tag::any, tag::undef};
  std::vector<bool> types{false};
  if (want_bf16 && !g.transpose) types = {true, false};
  BackwardPrims fallback;
  fallback.use_ref = true;
  for (bool bf16 : types)
    for (tag act : acts) {
      try {
        if (!g.transpose)
          make_pair<dnnl::convolution_forward, dnnl::convolution_backward_data, dnnl::convolution_backward_weights>(
              r, dnnl::algorithm::convolution_direct, x_user, w_user, y_user, act, strides, dil, pl, pr, bf16);
        else
          make_pair<dnnl::deconvolution_forward, dnnl::deconvolution_backward_data,
                    dnnl::deconvolution_backward_weights>(r, dnnl::algorithm::deconvolution_direct, x_user, w_user,
                                                          y_user, act, strides, dil, pl, pr, bf16);
        r.use_ref = false;
        if (!r.reference) return r;
        if (fallback.use_ref) fallback = r;
      } catch (const dnnl::error&) {
      }
    }
  return fallback;
}

std::string geom_key(const ConvGeom& g) {
  std::string k = str(g.transpose ? "ConvT" : "Conv", g.nsp, "N", g.N, "C", g.C_in, ">", g.C_out, "g", g.group);
  for (int a = g.first(); a < 3; ++a)
    k += str("|", g.in[a], ",", g.out[a], ",", g.k[a], ",", g.s[a], ",", g.d[a], ",", g.pb[a], ",", g.pe[a]);
  return k;
}

PrimCache<BackwardPrims> backward_cache;  // by geometry key

// Staging buffers by role; dx's buffer is reused for x and W's for dW, as the data pass
// finishes before the weights pass starts; one scratchpad for both passes. The widest buffers
// (staged x, the scratchpad) take the pool's first slots, which the forward kernels' widest
// (their staged input) take too, so the pool holds the larger of them, not the sum (on a
// 74-channel input at 640 x 1280 each is about 250 MB).
enum { kWide, kPad, kDy, kW, kDy2 };

// dx and dW by oneDNN (either pointer may be null); false when the geometry is not supported.
}  // namespace

bool conv_backward_on_onednn_reference(const ConvGeom& g) {
  auto p = backward_cache.get(geom_key(g), [&] { return make_backward(g, false); });
  return !p->use_ref && p->reference;
}

namespace {

bool backward_dnnl(const Node& n, const ConvGeom& g, const float* x, const float* W, const float* dy, float* dx,
                   float* dW) {
  const bool bf16 = n.op == "Conv" && runs_bf16(n);
  auto p = backward_cache.get(geom_key(g) + (bf16 ? "bf16" : ""), [&] { return make_backward(g, bf16); });
  if (p->use_ref) return false;
  memory dy_m;
  if (dx) {
    dy_m = stage_in(n, p->data_dy, dy, scratch_slot(kDy));
    memory w_m = stage_in(n, p->data_w, W, scratch_slot(kW));
    memory dx_m = out_mem(p->data_dx, dx, scratch_slot(kWide));
    memory pad = mem(p->data_pad, scratch_slot(kPad).get(p->data_pad.get_size()));
    execute(n, p->data,
            {{DNNL_ARG_DIFF_DST, dy_m}, {DNNL_ARG_WEIGHTS, w_m}, {DNNL_ARG_DIFF_SRC, dx_m}, {DNNL_ARG_SCRATCHPAD, pad}});
    stage_out(n, p->data_dx, dx_m, dx);
  }
  if (dW) {
    memory x_m = stage_in(n, p->wts_x, x, scratch_slot(kWide));
    if (!dx || !(p->wts_dy.prim == p->data_dy.prim)) dy_m = stage_in(n, p->wts_dy, dy, scratch_slot(kDy2));
    memory dw_m = out_mem(p->wts_dw, dW, scratch_slot(kW));
    Args args{{DNNL_ARG_SRC, x_m}, {DNNL_ARG_DIFF_DST, dy_m}, {DNNL_ARG_DIFF_WEIGHTS, dw_m},
              {DNNL_ARG_SCRATCHPAD, mem(p->wts_pad, scratch_slot(kPad).get(p->wts_pad.get_size()))}};
    execute(n, p->weights, args);
    stage_out(n, p->wts_dw, dw_m, dW);
  }
  return true;
}


void conv_backward_registered(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin) {
  conv_backward(n, in, out, gout, gin, KernelKind::Fast);
}

}  // namespace

bool conv_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout, const Outs& gin,
                   KernelKind kind) {
  const bool transpose = n.op == "ConvTranspose";
  NCHECK(in.size() >= 2 && in[0] && in[1], "needs inputs X and W");
  require_f32(n, in);
  const ConvGeom g = conv_geometry(n, in[0]->shape, in[1]->shape, transpose);
  Tensor* gx = gin.size() > 0 ? gin[0] : nullptr;
  Tensor* gw = gin.size() > 1 ? gin[1] : nullptr;
  Tensor* gb = gin.size() > 2 && in.size() > 2 && in[2] ? gin[2] : nullptr;
  for (size_t i = 0; i < std::min<size_t>(3, gin.size()); ++i)
    if (gin[i]) NCHECK(in.size() > i && in[i] && gin[i]->shape == in[i]->shape, "gradient of input ", i, " has shape ",
                       shape_str(gin[i]->shape), ", expected that of the input");
  const Tensor* dy = gout.empty() ? nullptr : gout[0];
  if (!dy) {  // nothing reads the output: every gradient is zero
    fill_zero(gx);
    fill_zero(gw);
    fill_zero(gb);
    return false;
  }
  NCHECK(dy->dtype == DType::F32 && dy->shape == g.out_shape(), "output gradient ", shape_str(dy->shape),
         " must be float32 ", shape_str(g.out_shape()));
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  const float* DY = dy->data<float>();
  float* DX = gx ? gx->data<float>() : nullptr;
  float* DW = gw ? gw->data<float>() : nullptr;
  float* DB = gb ? gb->data<float>() : nullptr;
  // a 1x1 conv (stride 1, no pads, group 1: CREDIT's projections under spectral norm) is a Linear
  // over the channel axis: its backward the Linear's two matmuls
  const int64_t plane = g.out[0] * g.out[1] * g.out[2];
  bool pointwise = kind == KernelKind::Fast && !transpose && g.group == 1 && in[0]->numel() > 0;
  for (int a = g.first(); a < 3; ++a)
    pointwise = pointwise && g.k[a] == 1 && g.s[a] == 1 && g.pb[a] == 0 && g.pe[a] == 0;
  if (pointwise && (DX || DW) && linear_backward_pkq(n, in, DY, g.N, g.C_in, plane, g.C_out, gin)) return true;
  if (DB) bias_grad(DY, g.N, g.C_out, plane, DB);
  if (!DX && !DW) return false;
  const bool empty = in[0]->numel() == 0 || in[1]->numel() == 0 || dy->numel() == 0;
  if (kind != KernelKind::Fast || empty) {
    backward_loops(g, X, W, DY, DX, DW);
    return false;
  }
  // Each gradient by the first that takes it: the weight gradient of a kernel much wider than its
  // stride by FFT (conv_fft.h), of a kernel a whole number of strides by conv_s2d.h, of few
  // output channels with a wide kernel by conv_small_oc.h, 3x3 stride 1 (float32) by
  // conv_winograd.h, then oneDNN's direct kernels, then the loops.
  const bool bf16 = n.op == "Conv" && runs_bf16(n);
  if (DW && !bf16) {
    const FftConvPlan fp = fft_conv_plan(g, false);
    if (fp.F) {
      fft_conv_weight_grad(g, fp, X, DY, DW);
      DW = nullptr;
    }
  }
  if (DW && !bf16 && !transpose && s2d_conv_applies(g)) {
    s2d_conv_weight_grad(g, X, DY, DW);
    DW = nullptr;
  }
  if (DW && !bf16 && transpose && s2d_conv_transpose_weight_grad(g, X, DY, DW)) DW = nullptr;
  if (DW && small_oc_conv_applies(g, true)) {
    small_oc_conv_weight_grad(g, X, DY, DW);
    DW = nullptr;
  }
  if ((DW || DX) && !bf16 && winograd_applies(g)) {
    const RowRange rows = nonzero_rows(DY, g.N, g.C_out, g.out[1], g.out[2]);
    if (DW && winograd_conv_weight_grad(n, g, X, DY, DW, rows)) DW = nullptr;
    if (DX && winograd_conv_backward_data(n, g, W, DY, DX, rows)) DX = nullptr;
  }
  if ((DX || DW) && !backward_dnnl(n, g, X, W, DY, DX, DW)) {
    backward_loops(g, X, W, DY, DX, DW);
    return false;
  }
  return true;
}

void register_conv_backward() {
  register_backward("Conv", conv_backward_registered);
  for (const char* op : {"Conv", "ConvTranspose"}) register_backward_reads(op, {~0u, false});  // x, w: not y
  register_backward("ConvTranspose", conv_backward_registered);
}

}  // namespace wxe::cpu
