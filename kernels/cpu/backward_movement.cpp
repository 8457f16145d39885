// Backward kernels of the shape and data ops (engine/ir/ops.h BackwardFn), registered by
// backward_pointwise.cpp's register_pointwise_backward.
//
// Data-movement ops (Slice, Gather, GatherND, Transpose, Pad, DepthToSpace, Split, Tile,
// Expand, Concat): every output element is a copy of one input element or of a constant.
// Running the op's own reference kernel on the inputs' element numbers (an integer tensor)
// gives that source map, and the gradient is the output gradient scattered (added) through
// it. So the backward follows every attribute, mode, clamping rule and opset variant of the
// forward exactly, without a second copy of that logic.
//
// Resize: the transpose of the forward's per-axis taps (cpu_ops.h resize_axis_taps).
//
// Fast paths (the registered kernels; backward_pointwise.h gives tests either one): Transpose
// as the inverse transpose of the gradient, Concat as a split of it, DepthToSpace as the row
// copies of its forward run backwards, Slice as row copies into zeros, Resize one axis at a
// time. The code above them stays as the reference.
#include "kernels/cpu/backward_movement.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "engine/ir/ops.h"
#include "kernels/cpu/backward_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/transpose.h"

namespace wxe::cpu::pointwise_bw {

// ---------------------------------------------------------------------------------------
// Data movement through the forward kernel's source map (see the top of the file).

// Input gradients of op n from its output gradients. `data` lists the inputs whose elements
// the outputs copy; the others (indices, pads, repeats, ...) pass to the forward unchanged.
// Element e of data input data[j] is numbered first[j] + e, from 1; 0 marks an output element
// that copies no input element (Pad's constant), whose gradients sum into *gconst.
// `injective`: no two output elements copy the same input element (parallel scatter).
namespace {

template <class I>
void scatter_bw_typed(const Node& n, Ins in, const Ins& out, const Gouts& gout, const Gins& gin,
                      const std::vector<int>& data, bool injective, double* gconst) {
  const DType it = sizeof(I) == 4 ? DType::I32 : DType::I64;
  std::vector<Tensor> numbers;
  numbers.reserve(data.size());
  std::vector<int64_t> first;
  int64_t next = 1;
  for (int k : data) {
    numbers.emplace_back(it, in[k]->shape);
    I* p = numbers.back().data<I>();
    const int64_t cnt = in[k]->numel();
    for (int64_t e = 0; e < cnt; ++e) p[e] = (I)(next + e);
    first.push_back(next);
    next += cnt;
    in[k] = &numbers.back();
  }
  std::vector<Tensor> maps;
  maps.reserve(out.size());
  Outs pm;
  for (const Tensor* o : out) {  // an output nothing reads may be absent (Split)
    maps.push_back(o ? Tensor(it, o->shape) : Tensor());
    pm.push_back(o ? &maps.back() : nullptr);
  }
  kernel_for(n.op, KernelKind::Reference)(n, in, pm);
  std::vector<double> acc((size_t)next, 0.0);
  for (size_t k = 0; k < out.size(); ++k) {
    if (!gout[k] || !out[k]) continue;
    const I* m = maps[k].data<I>();
    const float* g = gout[k]->data<float>();
    const int64_t cnt = maps[k].numel();
    if (injective) {
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
      for (int64_t i = 0; i < cnt; ++i) acc[m[i]] += g[i];
    } else {
      for (int64_t i = 0; i < cnt; ++i) acc[m[i]] += g[i];
    }
  }
  for (size_t j = 0; j < data.size(); ++j) {
    Tensor* t = gin[data[j]];
    if (!t) continue;
    float* G = t->data<float>();
    const double* a = acc.data() + first[j];
    const int64_t cnt = t->numel();
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
    for (int64_t e = 0; e < cnt; ++e) G[e] = (float)a[e];
  }
  if (gconst) *gconst = acc[0];
}

}  // namespace

void scatter_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin,
                const std::vector<int>& data, bool injective, double* gconst) {
  for (size_t i = 0; i < gin.size(); ++i)
    if (std::find(data.begin(), data.end(), (int)i) == data.end()) zero(gin[i]);
  int64_t count = 0;
  for (int k : data) count += in[k]->numel();
  if (count < std::numeric_limits<int32_t>::max())
    scatter_bw_typed<int32_t>(n, in, out, gout, gin, data, injective, gconst);
  else
    scatter_bw_typed<int64_t>(n, in, out, gout, gin, data, injective, gconst);
}

// ScatterND: each output element copies a data element or an updates element (indices pass
// through): the gradient goes back to whichever it copied.
void scatternd_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  scatter_bw(n, in, out, gout, gin, {0, 2}, false);
}

void concat_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  std::vector<int> all;
  for (size_t i = 0; i < in.size(); ++i) all.push_back((int)i);
  scatter_bw(n, in, out, gout, gin, all, true);
}

// Pad: the padded border reads the data (reflect, edge, wrap: not injective) or the
// constant value, whose gradient is the sum over the constant positions.
void pad_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  Node m = n;
  m.attrs.erase("value");  // opset < 11 constant: the constant's number 0 comes in as input 2
  Ins pin = in;
  const bool has_value = in.size() > 2 && in[2] && in[2]->numel() > 0;
  int64_t count = in[0]->numel();
  Tensor number0 = Tensor::zeros(count < std::numeric_limits<int32_t>::max() ? DType::I32 : DType::I64, {});
  if (has_value) pin[2] = &number0;
  double gconst = 0;
  scatter_bw(m, pin, out, gout, gin, {0}, false, &gconst);
  if (has_value && gin[2]) gin[2]->data<float>()[0] = (float)gconst;
}

// ---------------------------------------------------------------------------------------
// Resize: out = (tensor product of per-axis tap matrices) x; gx = its transpose times gout.
// Rows along the last axis as in the forward kernel; scattered serially (taps of neighbouring
// rows overlap).

void resize_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // roi, scales, sizes: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const Tensor& x = *in[0];
  const Shape& os = out[0]->shape;
  const int r = x.rank();
  const int64_t total = numel(os);
  zero(gx);
  if (total == 0) return;
  const std::vector<ResizeAxisTaps> taps = resize_axis_taps(n, in, os);
  int64_t combos = 1;  // tap combinations over the axes before the last
  for (int d = 0; d < r - 1; ++d) combos *= taps[d].k;
  const auto st = strides_of(x.shape);
  const int64_t L = os[r - 1], rows = total / L, lst = st[r - 1];
  const ResizeAxisTaps& lt = taps[r - 1];
  const float* G = gout[0]->data<float>();
  std::vector<double> acc((size_t)x.numel(), 0.0);
  std::vector<int64_t> o((size_t)r), coff((size_t)combos);
  std::vector<double> cw((size_t)combos);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t rem = row;
    for (int d = r - 2; d >= 0; --d) {
      o[d] = rem % os[d];
      rem /= os[d];
    }
    for (int64_t c = 0; c < combos; ++c) {
      int64_t off = 0, cr = c;
      double w = 1;
      for (int d = r - 2; d >= 0; --d) {
        const ResizeAxisTaps& t = taps[d];
        const int j = (int)(cr % t.k);
        cr /= t.k;
        off += t.idx[o[d] * t.k + j] * st[d];
        w *= t.w[o[d] * t.k + j];
      }
      coff[c] = off;
      cw[c] = w;
    }
    const float* grow = G + row * L;
    for (int64_t j = 0; j < L; ++j)
      for (int64_t c = 0; c < combos; ++c) {
        const double gw = cw[c] * grow[j];
        for (int t = 0; t < lt.k; ++t)
          acc[coff[c] + lt.idx[j * lt.k + t] * lst] += gw * lt.w[j * lt.k + t];
      }
  }
  float* R = gx->data<float>();
  for (int64_t e = 0; e < x.numel(); ++e) R[e] = (float)acc[e];
}

namespace {

// dst = src permuted: dst (shape ds) element c reads src at sum c[d] * sst[d]. Adjacent dims
// that stay adjacent in src are merged; rows of the innermost dim are parallel, one index
// decomposition per row.
void permute_f32(const float* src, const Shape& ds, const std::vector<int64_t>& sst, float* dst) {
  std::vector<int64_t> dims, st;
  for (size_t d = 0; d < ds.size(); ++d) {
    if (ds[d] == 1) continue;
    if (!dims.empty() && st.back() == sst[d] * ds[d]) {
      dims.back() *= ds[d];
      st.back() = sst[d];
    } else {
      dims.push_back(ds[d]);
      st.push_back(sst[d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    st.push_back(1);
  }
  // rows of the innermost dim, two innermost dims when that one is short (window shuffles:
  // runs of 2 elements)
  const int m = (int)dims.size();
  const int64_t L = dims[m - 1], ls = st[m - 1], total = numel(ds);
  const int inner = m >= 2 && L < 64 ? 2 : 1;
  const int64_t L2 = inner == 2 ? dims[m - 2] : 1, ls2 = inner == 2 ? st[m - 2] : 0;
  const int64_t rows = total ? total / (L * L2) : 0;
  const int outer = m - inner;  // dims walked by an odometer, one division per chunk of rows
  const int64_t chunks = std::min<int64_t>(rows, 64);
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
    std::vector<int64_t> idx((size_t)outer);
    int64_t rem = r0, so = 0;
    for (int d = outer - 1; d >= 0; --d) {
      idx[d] = rem % dims[d];
      so += idx[d] * st[d];
      rem /= dims[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      float* o = dst + r * L * L2;
      for (int64_t i = 0; i < L2; ++i) {
        const float* s = src + so + i * ls2;
        for (int64_t j = 0; j < L; ++j) o[i * L + j] = s[j * ls];
      }
      for (int d = outer - 1; d >= 0; --d) {  // next row
        so += st[d];
        if (++idx[d] < dims[d]) break;
        so -= dims[d] * st[d];
        idx[d] = 0;
      }
    }
  }
}

}  // namespace

// Transpose: the gradient transposed back (gx[x] = gy[y] where y[i] = x[perm[i]]). The fast
// Transpose kernel when the permutation swaps two blocks of axes (its 8x8 tiles), else a
// strided copy.
void transpose_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const int64_t r = in[0]->rank();
  std::vector<int64_t> perm = n.ints("perm");
  if (!n.has("perm"))
    for (int64_t d = r - 1; d >= 0; --d) perm.push_back(d);
  NCHECK((int64_t)perm.size() == r, "perm has ", perm.size(), " entries for rank ", r);
  std::vector<int64_t> inv((size_t)r);
  for (int64_t d = 0; d < r; ++d) inv[perm[d]] = d;
  // inverse permutation a block swap (p fixed axes, then blocks of a and r - p - a axes)?
  int64_t p = 0;
  while (p < r && inv[p] == p) ++p;
  bool swap = p < r;
  const int64_t a = swap ? inv[p] - p : 0;
  for (int64_t i = p; i < r && swap; ++i) swap = inv[i] == (i < r - a ? i + a : p + i - (r - a));
  if (swap) {
    Node t;
    t.op = "Transpose";
    t.name = n.name + "/grad";
    t.attrs["perm"] = attr_ints(inv);
    t.inputs = {0};
    t.outputs = {1};
    kernel_for("Transpose", KernelKind::Fast)(t, {gout[0]}, {gin[0]});
    return;
  }
  const std::vector<int64_t> yst = strides_of(out[0]->shape);
  std::vector<int64_t> sst((size_t)r);
  for (int64_t i = 0; i < r; ++i) sst[perm[i]] = yst[i];
  permute_f32(gout[0]->data<float>(), in[0]->shape, sst, gin[0]->data<float>());
}

// Concat: each input's gradient is its slab of the output gradient.
void concat_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const Shape& os = out[0]->shape;
  const int64_t axis = norm_axis(n.i("axis", 0), (int64_t)os.size(), n);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  for (size_t d = axis + 1; d < os.size(); ++d) inner *= os[d];
  const int64_t out_row = os[axis] * inner;
  const float* G = gout[0]->data<float>();
  int64_t col = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t row = in[k]->shape[axis] * inner;
    if (gin[k]) {
      float* dst = gin[k]->data<float>();
#pragma omp parallel for schedule(static) if (outer * row > kParallelMin)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + o * row, G + o * out_row + col, (size_t)row * sizeof(float));
    }
    col += row;
  }
}

// PlaneGather (data_ops.cpp): each plane's gradient scattered back through the map, summed where
// the map repeats an index (padding copies), in map order.
void plane_gather_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const Shape& xs = in[0]->shape;
  const int64_t plane = xs[xs.size() - 2] * xs[xs.size() - 1], q = in[1]->numel();
  const int64_t planes = plane ? gin[0]->numel() / plane : 0;
  const int32_t* map = in[1]->data<int32_t>();
  const float* gy = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
#pragma omp parallel for schedule(static) if (planes * q > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    float* d = gx + p * plane;
    const float* s = gy + p * q;
    std::fill(d, d + plane, 0.f);
    for (int64_t i = 0; i < q; ++i) d[map[i]] += s[i];
  }
}

// DepthToSpace (a permutation): the gradient copied back row by row, the forward's loop
// (fast.cpp) with its sides swapped: gx[n, ic(c, i, j), h, w] = gy[n, c, h b + i, w b + j],
// CRD: ic = c b^2 + i b + j, DCR: ic = (i b + j) C_out + c.
void depth_to_space_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  const std::string mode = n.s("mode", "DCR");
  const int64_t b = n.i("blocksize", 0);
  if (in[0]->rank() != 4 || b <= 0 || (mode != "CRD" && mode != "DCR")) return first_input_bw<true>(n, in, out, gout, gin);
  const Shape& s = in[0]->shape;
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3], Co = C / (b * b), Wo = W * b;
  const bool crd = mode == "CRD";
  const float* gy = gout[0]->data<float>();
  float* gx = gin[0]->data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N * Co * H; ++row) {
    const int64_t h = row % H, nc = row / H, c = nc % Co, bn = nc / Co;
    for (int64_t i = 0; i < b; ++i) {
      const float* g = gy + ((nc * H + h) * b + i) * Wo;
      for (int64_t j = 0; j < b; ++j) {
        const int64_t ic = crd ? c * b * b + i * b + j : (i * b + j) * Co + c;
        float* d = gx + ((bn * C + ic) * H + h) * W;
        for (int64_t w = 0; w < W; ++w) d[w] = g[w * b + j];
      }
    }
  }
}

namespace {

// Zeros in parallel (a whole-tensor gradient of tens of MB).
void zero_parallel(Tensor* t) {
  const int64_t cnt = t->numel();
  float* p = t->data<float>();
  constexpr int64_t kBlock = 1 << 16;
#pragma omp parallel for schedule(static) if (cnt > kParallelMin)
  for (int64_t b = 0; b < (cnt + kBlock - 1) / kBlock; ++b)
    std::memset(p + b * kBlock, 0, sizeof(float) * (size_t)std::min(kBlock, cnt - b * kBlock));
}

// Slice: zeros, and the gradient's rows copied to where the forward read them (slice_plan:
// the forward's own clamping of starts, ends and steps).
// Zeroes what of gx the slice's copy will not write: with one axis cut at step 1 (CREDIT's crops)
// only the rows before and after the slice, else all of gx.
void zero_outside_slice(Tensor* gx, const std::vector<SliceDim>& plan) {
  const Shape& s = gx->shape;
  int cut = -1;
  for (size_t d = 0; d < plan.size(); ++d)
    if (plan[d].start != 0 || plan[d].step != 1 || plan[d].len != s[d]) {
      if (cut >= 0 || plan[d].step != 1) return zero_parallel(gx);
      cut = (int)d;
    }
  if (cut < 0) return;  // the whole tensor
  const int64_t inner = prod(s, cut + 1, s.size()), outer = prod(s, 0, cut), row = s[cut] * inner;
  const int64_t a = plan[cut].start * inner, b = a + plan[cut].len * inner;
  float* g = gx->data<float>();
#pragma omp parallel for schedule(static) if (outer * (row - (b - a)) > (1 << 16))
  for (int64_t o = 0; o < outer; ++o) {
    std::fill(g + o * row, g + o * row + a, 0.f);
    std::fill(g + o * row + b, g + (o + 1) * row, 0.f);
  }
}

}  // namespace

void slice_bw_fast(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // starts, ends, axes, steps: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const std::vector<SliceDim> plan = slice_plan(n, in[0]->shape, in[1]->to_i64(), in[2]->to_i64(), opt_ints(in, 3),
                                                opt_ints(in, 4));
  zero_outside_slice(gx, plan);
  const std::vector<int64_t> st = strides_of(in[0]->shape);
  std::vector<int64_t> dims, gst = strides_of(gout[0]->shape), dst;
  int64_t base = 0;
  for (size_t d = 0; d < plan.size(); ++d) {
    base += plan[d].start * st[d];
    dims.push_back(plan[d].len);
    dst.push_back(plan[d].step * st[d]);
  }
  if (gout[0]->numel() > 0) strided_copy_f32(dims, gout[0]->data<float>(), gst, gx->data<float>() + base, dst);
}

// Resize: the per-axis taps' transposes applied one axis at a time, last axis first (each a
// scatter along one axis, parallel over the others, so no two threads add into one element);
// axes the forward leaves as they are are skipped.
void resize_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  zero_from(gin, 1);  // roi, scales, sizes: no gradient
  Tensor* gx = gin[0];
  if (!gx) return;
  const Shape& xs = in[0]->shape;
  Shape cur = out[0]->shape;
  const int r = (int)xs.size();
  if (numel(cur) == 0 || numel(xs) == 0) return zero(gx);
  const std::vector<ResizeAxisTaps> taps = resize_axis_taps(n, in, cur);
  std::vector<int> axes;
  for (int d = r - 1; d >= 0; --d)
    if (!resize_axis_is_identity(taps[d], xs[d], cur[d])) axes.push_back(d);
  if (axes.empty()) {
    std::memcpy(gx->raw(), gout[0]->raw(), gx->nbytes());
    return;
  }
  const int64_t planes = r >= 2 ? numel(xs) / (xs[r - 1] * xs[r - 2]) : 0;
  if (axes.back() >= r - 2 && planes >= omp_get_max_threads()) {
    // only the last two axes resized (CREDIT's interpolation): per plane, each output row's
    // gradient scattered along its row, then added into the input rows it read
    const ResizeAxisTaps &th = taps[r - 2], &tw = taps[r - 1];
    const int64_t H = xs[r - 2], W = xs[r - 1], OH = cur[r - 2], OW = cur[r - 1];
    const float* dy = gout[0]->data<float>();
    float* dx = gx->data<float>();
#pragma omp parallel
    {
      std::vector<float> row((size_t)W);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < planes; ++p) {
        float* dxp = dx + p * H * W;
        std::fill(dxp, dxp + H * W, 0.f);
        for (int64_t oh = 0; oh < OH; ++oh) {
          std::fill(row.begin(), row.end(), 0.f);
          const float* dyr = dy + (p * OH + oh) * OW;
          for (int64_t ow = 0; ow < OW; ++ow)
            for (int k = 0; k < tw.k; ++k) row[tw.idx[ow * tw.k + k]] += tw.w[ow * tw.k + k] * dyr[ow];
          for (int k = 0; k < th.k; ++k) {
            const float w = th.w[oh * th.k + k];
            float* dxr = dxp + th.idx[oh * th.k + k] * W;
            for (int64_t c = 0; c < W; ++c) dxr[c] += w * row[c];
          }
        }
      }
    }
    return;
  }
  Tensor a, b;  // ping-pong buffers; the last pass writes into gx
  const Tensor* src = gout[0];
  for (size_t i = 0; i < axes.size(); ++i) {
    const int d = axes[i];
    Shape next = cur;
    next[d] = xs[d];
    Tensor* dst = gx;
    if (i + 1 < axes.size()) {
      Tensor& t = src == &a ? b : a;
      t = Tensor(DType::F32, next);
      dst = &t;
    }
    zero_parallel(dst);
    int64_t outer = 1, inner = 1;
    for (int e = 0; e < d; ++e) outer *= cur[e];
    for (int e = d + 1; e < r; ++e) inner *= cur[e];
    const int64_t L = cur[d], Li = xs[d];
    const ResizeAxisTaps& t = taps[d];
    const float* S = src->data<float>();
    float* D = dst->data<float>();
#pragma omp parallel for schedule(static) if (outer * L * inner > kParallelMin)
    for (int64_t q = 0; q < outer; ++q)
      for (int64_t o = 0; o < L; ++o)
        for (int j = 0; j < t.k; ++j) {
          const float w = t.w[o * t.k + j];
          if (w == 0.f) continue;
          const float* s = S + (q * L + o) * inner;
          float* dd = D + (q * Li + t.idx[o * t.k + j]) * inner;
          for (int64_t e = 0; e < inner; ++e) dd[e] += w * s[e];
        }
    cur = next;
    src = dst;
  }
}
}  // namespace wxe::cpu::pointwise_bw
