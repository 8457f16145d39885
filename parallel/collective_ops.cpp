#include "parallel/collective_ops.h"

#include <algorithm>
#include <cstring>

#include "engine/exec/backend.h"
#include "engine/ir/ops.h"

namespace wxe {

namespace {

thread_local Communicator* g_tp = nullptr;      // per thread: tests run ranks as threads
thread_local Communicator* g_domain = nullptr;  // the domain group (domain parallelism)

// The group a collective node runs over: attribute group "domain" (parallel/bands.h
// domain_parallel), else tp.
Communicator* group_of(const Node& n) { return n.s("group", "tp") == "domain" ? g_domain : g_tp; }

std::vector<TypeShape> same_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0], "node ", n.name, " (", n.op, "): needs one input");
  return {{in[0]->dtype, in[0]->shape}};
}

// The backend whose memory t is in: the first registered one of its kind that can run here
// (a build with CUDA registers its cuda backend on machines without a GPU too).
Backend& backend_of(const Tensor& t) {
  for (const std::string& name : backend_names()) {
    Backend* b = find_backend(name);
    if (b->device() == t.device() && (b->device() == DeviceKind::CPU || b->available(nullptr))) return *b;
  }
  fail("no backend holds ", device_name(t.device()), " memory");
}

// The three primitives of the collectives, in whichever memory the tensors live: host
// memory, or a device backend's (the copy is the backend's own Identity kernel; the sum goes
// to the communicator as it is when it takes device buffers (NCCL), else through a host copy).
void copy_into(const Tensor& from, Tensor& to) {
  if (to.raw() == from.raw() || !from.nbytes()) return;
  if (from.device() == DeviceKind::CPU) {
    std::memcpy(to.raw(), from.raw(), from.nbytes());
    return;
  }
  Backend& b = backend_of(from);
  const BackendKernel* k = b.kernel("Identity");
  WXE_CHECK(k, b.name(), " has no Identity kernel");
  Node n;
  n.op = "Identity";
  n.name = "collective copy";
  k->forward(n, {&from}, {&to});
}

void zero(Tensor& t) {
  if (t.device() == DeviceKind::CPU) {
    std::memset(t.raw(), 0, t.nbytes());
    return;
  }
  Tensor z = Tensor::zeros(t.dtype, t.shape);
  if (t.nbytes()) backend_of(t).copy_to_device(t.raw(), z.raw(), t.nbytes());
}

// In place over node n's group; nothing to do for a group of one (or none: one process).
void sum_over_group(const Node& n, Tensor& t) {
  Communicator* c = group_of(n);
  if (!c || c->size() <= 1) return;
  if (t.device() == DeviceKind::CPU || c->takes_device_buffers()) {
    if (t.device() != DeviceKind::CPU) backend_of(t).synchronize();  // the kernels that wrote t
    c->all_reduce_sum(t);
    return;
  }
  Backend& b = backend_of(t);
  b.synchronize();
  Tensor h = b.download(t);
  c->all_reduce_sum(h);
  if (t.nbytes()) b.copy_to_device(t.raw(), h.raw(), t.nbytes());
}

// The pair of conjugate collectives, one kernel each for every backend:
//   AllReduceTP: forward sum over tp, backward identity (attribute grad "sum": the sum over the
//     group too, for partial sums whose readers each hold a part: domain parallelism's
//     GroupNorm statistics);
//   CopyToTP: forward identity, backward sum over tp.
// Every rank computes the same graph, so every rank reaches each collective (or none does).
void all_reduce_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  copy_into(*in[0], *out[0]);
  sum_over_group(n, *out[0]);
}

// gin = gout (zeros without one), then summed over the group when `sum`: every rank joins the
// sum, with or without a gradient
void pass_gradient(const Node& n, const Tensor* gout, Tensor* gin, bool sum) {
  if (!gin) return;
  if (gout)
    copy_into(*gout, *gin);
  else
    zero(*gin);
  if (sum) sum_over_group(n, *gin);
}

void all_reduce_tp_backward(const Node& n, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                            const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  pass_gradient(n, gout[0], gin[0], n.s("grad", "identity") == "sum");
}

void copy_to_tp(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  if (in[0]->device() == DeviceKind::CPU) {  // the training executor's host values: the same storage
    *out[0] = *in[0];
    return;
  }
  copy_into(*in[0], *out[0]);
}

void copy_to_tp_backward(const Node& n, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                         const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  pass_gradient(n, gout[0], gin[0], true);
}

// ---- sequence parallelism (parallel/bands.h): a tensor split into tp bands along
// attribute `axis` (rank r holds rows [r n/T, (r+1) n/T) of it) ----

// The tp (or domain) group a band op runs over: attribute `parts` is its size.
Communicator& band_group(const Node& n) {
  const int64_t parts = n.i("parts", 0);
  Communicator* c = group_of(n);
  WXE_CHECK(c && c->size() == parts, "node ", n.name, " (", n.op, "): made for ", parts, " ",
            n.s("group", "tp"), " ranks, the ", n.s("group", "tp"), " group has ", c ? c->size() : 1);
  return *c;
}

struct Bands {
  int64_t outer = 1, rows = 0, inner = 1;  // of one band: outer x rows x inner elements
};

Bands bands_of(const Node& n, const Shape& full) {
  const int64_t a = n.i("axis", 2), parts = n.i("parts", 1);
  WXE_CHECK(a >= 0 && a < (int64_t)full.size() && full[a] % parts == 0, "node ", n.name, " (", n.op, "): axis ", a,
            " of ", shape_str(full), " is not divisible into ", parts, " bands");
  Bands b;
  for (int64_t d = 0; d < a; ++d) b.outer *= full[d];
  for (size_t d = a + 1; d < full.size(); ++d) b.inner *= full[d];
  b.rows = full[a] / parts;
  return b;
}

// The band collectives run over slices of the outer dimension, so that their staging buffers
// hold at most about 4 MB per rank's part instead of the whole tensor twice (the gather of a
// model's output was the training step's peak under --tp). Every rank takes the same slices.
int64_t outer_step(const Bands& b, int64_t parts) {
  return std::clamp<int64_t>(((int64_t)1 << 20) / std::max<int64_t>(b.rows * b.inner * parts, 1), 1,
                             std::max<int64_t>(b.outer, 1));
}

// A gather's crop (AllGatherTP attribute crop = {first row, end row, first column, end column}
// of the whole tensor's band axis and the axis after it, the last; parallel/bands.cpp fuses a
// crop of the grid so): the whole tensor's rows and columns when absent.
struct Crop {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};
Crop crop_of(const Node& n, const Bands& b, int64_t parts) {
  const std::vector<int64_t> c = n.ints("crop", {0, b.rows * parts, 0, b.inner});
  WXE_CHECK(c.size() == 4 && 0 <= c[0] && c[0] <= c[1] && c[1] <= b.rows * parts && 0 <= c[2] && c[2] <= c[3] &&
                c[3] <= b.inner,
            "node ", n.name, " (", n.op, "): crop out of the tensor's ", b.rows * parts, " rows and ", b.inner,
            " columns");
  return {c[0], c[1], c[2], c[3]};
}

// The whole tensor's bands from one rank's band.
Bands bands_of_band(const Node& n, const Shape& band) {
  const int64_t a = n.i("axis", 2);
  WXE_CHECK(a >= 0 && a < (int64_t)band.size(), "node ", n.name, " (", n.op, "): axis ", a, " of ", shape_str(band));
  Shape whole = band;
  whole[a] *= n.i("parts", 1);
  return bands_of(n, whole);
}

// out = every rank's band, in rank order along the axis (cropped, with attribute crop)
void gather_bands(const Node& n, const Tensor& band, Tensor& out) {
  Communicator& c = band_group(n);
  const Bands b = bands_of_band(n, band.shape);
  const int64_t run = b.rows * b.inner, P = c.size(), step = outer_step(b, P);
  const Crop k = crop_of(n, b, P);
  const int64_t orows = k.r1 - k.r0, ocols = k.c1 - k.c0;
  WXE_CHECK(out.numel() == b.outer * orows * ocols, "node ", n.name, ": output of ", out.numel(), " elements");
  Tensor send, all;  // staging, made again only for a shorter last slice
  for (int64_t o0 = 0; o0 < b.outer; o0 += step) {
    const int64_t m = std::min(step, b.outer - o0);
    if (!send.defined() || send.numel() != m * run) {
      send = Tensor(DType::F32, {m * run});
      all = Tensor(DType::F32, {m * run * P});
    }
    std::memcpy(send.raw(), band.data<float>() + o0 * run, m * run * sizeof(float));
    c.all_gather(send, all);
    for (int64_t r = 0; r < P; ++r)
      for (int64_t o = 0; o < m; ++o)
        for (int64_t i = 0; i < b.rows; ++i) {
          const int64_t row = r * b.rows + i;
          if (row < k.r0 || row >= k.r1) continue;
          std::memcpy(out.data<float>() + ((o0 + o) * orows + row - k.r0) * ocols,
                      all.data<float>() + (r * m + o) * run + i * b.inner + k.c0, ocols * sizeof(float));
        }
  }
}

// band = this rank's band of the sum over ranks of `full`
void reduce_scatter_bands(const Node& n, const Tensor& full, Tensor& band) {
  Communicator& c = band_group(n);
  const Bands b = bands_of(n, full.shape);
  const int64_t run = b.rows * b.inner, P = c.size(), step = outer_step(b, P);
  Tensor blocks, mine;  // staging, made again only for a shorter last slice
  for (int64_t o0 = 0; o0 < b.outer; o0 += step) {
    const int64_t k = std::min(step, b.outer - o0);
    if (!mine.defined() || mine.numel() != k * run) {
      blocks = Tensor(DType::F32, {k * run * P});
      mine = Tensor(DType::F32, {k * run});
    }
    for (int64_t r = 0; r < P; ++r)
      for (int64_t o = 0; o < k; ++o)
        std::memcpy(blocks.data<float>() + (r * k + o) * run, full.data<float>() + ((o0 + o) * P + r) * run,
                    run * sizeof(float));
    c.reduce_scatter_sum(blocks, mine);
    std::memcpy(band.data<float>() + o0 * run, mine.raw(), k * run * sizeof(float));
  }
}

// band = this rank's band of the whole tensor whose crop (attribute crop) `full` is: zeros
// outside it
void take_band(const Node& n, const Tensor& full, Tensor& band) {
  Communicator& c = band_group(n);
  const Bands b = bands_of_band(n, band.shape);
  const Crop k = crop_of(n, b, c.size());
  const int64_t orows = k.r1 - k.r0, ocols = k.c1 - k.c0;
  for (int64_t o = 0; o < b.outer; ++o)
    for (int64_t i = 0; i < b.rows; ++i) {
      float* x = band.data<float>() + (o * b.rows + i) * b.inner;
      const int64_t row = c.rank() * b.rows + i;
      if (row < k.r0 || row >= k.r1 || ocols < b.inner) std::memset(x, 0, b.inner * sizeof(float));
      if (row >= k.r0 && row < k.r1)
        std::memcpy(x + k.c0, full.data<float>() + (o * orows + row - k.r0) * ocols, ocols * sizeof(float));
    }
}

std::vector<TypeShape> band_shape(const Node& n, const std::vector<const Value*>& in, bool gather) {
  WXE_CHECK(in.size() == 1 && in[0] && in[0]->dtype == DType::F32, "node ", n.name, " (", n.op,
            "): needs one float32 input");
  Shape s = in[0]->shape;
  const int64_t a = n.i("axis", 2), parts = n.i("parts", 0);
  WXE_CHECK(parts > 0 && a >= 0 && a < (int64_t)s.size() && (gather || s[a] % parts == 0), "node ", n.name, " (",
            n.op, "): axis ", a, " of ", shape_str(s), " cannot be split into ", parts, " bands");
  s[a] = gather ? s[a] * parts : s[a] / parts + n.i("top", 0) + n.i("bottom", 0);  // ScatterTP: with a halo
  if (gather && n.has("crop")) {  // the crop of the whole tensor's rows and (the last axis) columns
    const std::vector<int64_t> c = n.ints("crop");
    WXE_CHECK(c.size() == 4 && a + 2 == (int64_t)s.size() && 0 <= c[0] && c[0] <= c[1] && c[1] <= s[a] && 0 <= c[2] &&
                  c[2] <= c[3] && c[3] <= s[a + 1],
              "node ", n.name, " (", n.op, "): crop out of ", shape_str(s));
    s[a] = c[1] - c[0];
    s[a + 1] = c[3] - c[2];
  }
  return {{DType::F32, s}};
}

// ReduceScatterTP: forward the sum over tp, this rank's band of it; backward all-gather.
void reduce_scatter_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  reduce_scatter_bands(n, *in[0], *out[0]);
}
void reduce_scatter_tp_backward(const Node& n, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                                const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  WXE_CHECK(gout[0], "node ", n.name, ": no output gradient");  // every rank must join the gather
  gather_bands(n, *gout[0], *gin[0]);
}

// AllGatherTP: forward the whole tensor from the bands. Backward, attribute grad: "sum" (the
// readers are tp-sharded layers: each rank's gradient is a part, summed and scattered:
// reduce-scatter), "slice" (replicated readers: every rank has the whole gradient already).
void all_gather_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  gather_bands(n, *in[0], *out[0]);
}
void all_gather_tp_backward(const Node& n, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                            const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  const bool sum = n.s("grad", "sum") == "sum";
  if (!gout[0]) {
    WXE_CHECK(!sum, "node ", n.name, ": no output gradient");
    std::memset(gin[0]->raw(), 0, gin[0]->nbytes());
    return;
  }
  WXE_CHECK(!sum || !n.has("crop"), "node ", n.name, ": a cropped gather's gradient is not summed");
  if (sum) reduce_scatter_bands(n, *gout[0], *gin[0]);
  else take_band(n, *gout[0], *gin[0]);
}

// Band r of `full` with `top` rows above and `bottom` below (outer, rows + top + bottom, inner)
// <-> full: to_band copies them out (zeros past the grid's edges), else back in (rows past
// the edges dropped).
void halo_band_copy(const Bands& b, int64_t r, int64_t parts, int64_t top, int64_t bottom, float* full, float* band,
                    bool to_band) {
  const int64_t full_rows = b.rows * parts, R = b.rows + top + bottom, first = r * b.rows - top;
  for (int64_t o = 0; o < b.outer; ++o)
    for (int64_t i = 0; i < R; ++i) {
      float* x = band + (o * R + i) * b.inner;
      const int64_t row = first + i;
      float* f = full + (o * full_rows + row) * b.inner;
      if (row < 0 || row >= full_rows) {
        if (to_band) std::memset(x, 0, b.inner * sizeof(float));
      } else if (to_band) {
        std::memcpy(x, f, b.inner * sizeof(float));
      } else {
        std::memcpy(f, x, b.inner * sizeof(float));
      }
    }
}

// ScatterTP: forward this rank's band of a replicated tensor, with attributes top / bottom
// that many rows of the bands above and below (zeros past the edges: a convolution's halo, taken
// without communication); backward all-gather (with a halo: each rank's rows placed in a
// tensor of zeros, summed over the group, so overlapping rows add up).
void scatter_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  const int64_t top = n.i("top", 0), bottom = n.i("bottom", 0);
  if (!top && !bottom) {
    take_band(n, *in[0], *out[0]);
    return;
  }
  Communicator& c = band_group(n);
  halo_band_copy(bands_of(n, in[0]->shape), c.rank(), c.size(), top, bottom, const_cast<float*>(in[0]->data<float>()),
                 out[0]->data<float>(), true);
}

void scatter_tp_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& outs,
                         const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  const int64_t top = n.i("top", 0), bottom = n.i("bottom", 0);
  if (!top && !bottom) return reduce_scatter_tp_backward(n, in, outs, gout, gin);
  if (!gin[0]) return;
  WXE_CHECK(gout[0], "node ", n.name, ": no output gradient");  // every rank must join the sum
  Communicator& c = band_group(n);
  std::memset(gin[0]->raw(), 0, gin[0]->nbytes());
  halo_band_copy(bands_of(n, gin[0]->shape), c.rank(), c.size(), top, bottom, gin[0]->data<float>(),
                 const_cast<float*>(gout[0]->data<float>()), false);
  c.all_reduce_sum(*gin[0]);
}

// HaloTP: a band with `top` rows of the band above and `bottom` rows of the band below around it
// (zeros past the first and last band: a convolution's zero padding), so a convolution taller
// than one row runs on the band alone. Backward: the halo rows' gradients go back to the bands
// they came from and are added there. The boundary rows travel by one all-gather either way.
struct Halo {
  Bands b;  // of the band itself
  int64_t top = 0, bottom = 0;
};

Halo halo_of(const Node& n, const Shape& band) {
  Halo h;
  const int64_t a = n.i("axis", 2);
  Shape full = band;
  full[a] *= n.i("parts", 1);
  h.b = bands_of(n, full);
  h.top = n.i("top", 0);
  h.bottom = n.i("bottom", 0);
  WXE_CHECK(h.top >= 0 && h.bottom >= 0 && h.top <= h.b.rows && h.bottom <= h.b.rows, "node ", n.name,
            " (HaloTP): halo ", h.top, " + ", h.bottom, " rows around a band of ", h.b.rows);
  return h;
}

// rows [from, from + count) of each outer slice of t (outer, rows, inner) <-> buf (outer, count, inner)
void copy_rows(float* t, int64_t rows, float* buf, int64_t from, int64_t count, const Bands& b, bool to_buf, bool add = false) {
  for (int64_t o = 0; o < b.outer; ++o) {
    float* x = t + (o * rows + from) * b.inner;
    float* y = buf + o * count * b.inner;
    const int64_t n = count * b.inner;
    if (to_buf) std::memcpy(y, x, n * sizeof(float));
    else if (add) for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    else std::memcpy(x, y, n * sizeof(float));
  }
}

// every rank's (first part, second part) pair: `first`/`second` rows of (outer, rows, inner) buffers
Tensor exchange(Communicator& c, const Bands& b, const float* first, int64_t n1, const float* second, int64_t n2) {
  const int64_t a = b.outer * n1 * b.inner, z = b.outer * n2 * b.inner;
  Tensor send(DType::F32, {a + z}), all(DType::F32, {(a + z) * c.size()});
  if (a) std::memcpy(send.data<float>(), first, a * sizeof(float));
  if (z) std::memcpy(send.data<float>() + a, second, z * sizeof(float));
  c.all_gather(send, all);
  return all;
}

void halo_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  Communicator& c = band_group(n);
  const Halo h = halo_of(n, in[0]->shape);
  const int64_t rows = h.b.rows, R = rows + h.top + h.bottom, r = c.rank();
  float* x = const_cast<float*>(in[0]->data<float>());
  float* y = out[0]->data<float>();
  // what the neighbours need of this band: its last `top` rows (below), its first `bottom` (above)
  Tensor tail(DType::F32, {h.b.outer * h.top * h.b.inner}), head(DType::F32, {h.b.outer * h.bottom * h.b.inner});
  copy_rows(x, rows, tail.data<float>(), rows - h.top, h.top, h.b, true);
  copy_rows(x, rows, head.data<float>(), 0, h.bottom, h.b, true);
  Tensor all = exchange(c, h.b, tail.data<float>(), h.top, head.data<float>(), h.bottom);
  const int64_t per = h.b.outer * (h.top + h.bottom) * h.b.inner, a = h.b.outer * h.top * h.b.inner;
  std::memset(y, 0, out[0]->nbytes());
  copy_rows(y, R, x, h.top, rows, h.b, false);
  if (r > 0) copy_rows(y, R, all.data<float>() + (r - 1) * per, 0, h.top, h.b, false);
  if (r + 1 < c.size()) copy_rows(y, R, all.data<float>() + (r + 1) * per + a, h.top + rows, h.bottom, h.b, false);
}

void halo_tp_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                      const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  WXE_CHECK(gout[0], "node ", n.name, ": no output gradient");  // every rank must join the exchange
  Communicator& c = band_group(n);
  const Halo h = halo_of(n, in[0]->shape);
  const int64_t rows = h.b.rows, R = rows + h.top + h.bottom, r = c.rank();
  float* g = const_cast<float*>(gout[0]->data<float>());
  float* gx = gin[0]->data<float>();
  Tensor gtop(DType::F32, {h.b.outer * h.top * h.b.inner}), gbottom(DType::F32, {h.b.outer * h.bottom * h.b.inner});
  copy_rows(g, R, gtop.data<float>(), 0, h.top, h.b, true);
  copy_rows(g, R, gbottom.data<float>(), h.top + rows, h.bottom, h.b, true);
  Tensor all = exchange(c, h.b, gtop.data<float>(), h.top, gbottom.data<float>(), h.bottom);
  const int64_t per = h.b.outer * (h.top + h.bottom) * h.b.inner, a = h.b.outer * h.top * h.b.inner;
  Tensor mid(DType::F32, {h.b.outer * rows * h.b.inner});
  copy_rows(g, R, mid.data<float>(), h.top, rows, h.b, true);
  copy_rows(gx, rows, mid.data<float>(), 0, rows, h.b, false);
  // the band below took this band's last `top` rows; the band above its first `bottom` rows
  if (r + 1 < c.size()) copy_rows(gx, rows, all.data<float>() + (r + 1) * per, rows - h.top, h.top, h.b, false, true);
  if (r > 0) copy_rows(gx, rows, all.data<float>() + (r - 1) * per + a, 0, h.bottom, h.b, false, true);
}

// The band collectives on a device backend: their tensors brought to host memory, the host
// kernel above run on them, the outputs copied back. The exchange itself goes through the
// communicator's host path (MPI, or NCCL staging host buffers through the GPU). A shape-only
// tensor (a value the backward does not read) stays as it is: only its shape is read.
Backend* device_backend_of(std::initializer_list<const std::vector<const Tensor*>*> lists,
                           const std::vector<Tensor*>& outs) {
  for (const auto* l : lists)
    for (const Tensor* t : *l)
      if (t && t->defined() && t->device() != DeviceKind::CPU) return &backend_of(*t);
  for (const Tensor* t : outs)
    if (t && t->defined() && t->device() != DeviceKind::CPU) return &backend_of(*t);
  return nullptr;
}

struct HostCopies {
  std::vector<Tensor> keep;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;
  HostCopies(Backend* b, const std::vector<const Tensor*>& ins, const std::vector<Tensor*>& outs) {
    keep.reserve(ins.size() + outs.size());
    for (const Tensor* t : ins) {
      if (!t || !t->defined() || t->device() == DeviceKind::CPU) {
        in.push_back(t);
        continue;
      }
      keep.push_back(b->download(*t));
      in.push_back(&keep.back());
    }
    for (Tensor* t : outs) {
      if (!t || t->device() == DeviceKind::CPU) {
        out.push_back(t);
        continue;
      }
      keep.push_back(Tensor(t->dtype, t->shape));
      out.push_back(&keep.back());
    }
  }
  void upload(Backend* b, const std::vector<Tensor*>& outs) {
    for (size_t i = 0; i < outs.size(); ++i)
      if (out[i] != outs[i] && outs[i]->nbytes()) b->copy_to_device(outs[i]->raw(), out[i]->raw(), outs[i]->nbytes());
  }
};

template <KernelFn F>
void staged(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  Backend* b = device_backend_of({&in}, out);
  if (!b) return F(n, in, out);
  b->synchronize();  // the kernels that wrote the inputs
  HostCopies h(b, in, out);
  F(n, h.in, h.out);
  h.upload(b, out);
}

template <BackwardFn F>
void staged_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& outs,
                     const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  Backend* b = device_backend_of({&in, &outs, &gout}, gin);
  if (!b) return F(n, in, outs, gout, gin);
  b->synchronize();
  std::vector<const Tensor*> reads = in;
  reads.insert(reads.end(), outs.begin(), outs.end());
  reads.insert(reads.end(), gout.begin(), gout.end());
  HostCopies h(b, reads, gin);
  const auto at = [&](size_t from, size_t count) {
    return std::vector<const Tensor*>(h.in.begin() + from, h.in.begin() + from + count);
  };
  F(n, at(0, in.size()), at(in.size(), outs.size()), at(in.size() + outs.size(), gout.size()), h.out);
  h.upload(b, gin);
}

}  // namespace

void register_collective_device_kernels() {
  for (const std::string& name : backend_names()) {
    auto* b = dynamic_cast<TableBackend*>(find_backend(name));
    if (!b || b->device() == DeviceKind::CPU || !b->kernel("Identity")) continue;
    b->register_kernel("AllReduceTP", all_reduce_tp);
    b->register_backward("AllReduceTP", all_reduce_tp_backward);
    b->register_kernel("CopyToTP", copy_to_tp);
    b->register_backward("CopyToTP", copy_to_tp_backward);
    b->register_kernel("ReduceScatterTP", staged<reduce_scatter_tp>);
    b->register_backward("ReduceScatterTP", staged_backward<reduce_scatter_tp_backward>);
    b->register_kernel("AllGatherTP", staged<all_gather_tp>);
    b->register_backward("AllGatherTP", staged_backward<all_gather_tp_backward>);
    b->register_kernel("ScatterTP", staged<scatter_tp>);
    b->register_backward("ScatterTP", staged_backward<scatter_tp_backward>);
    b->register_kernel("HaloTP", staged<halo_tp>);
    b->register_backward("HaloTP", staged_backward<halo_tp_backward>);
  }
}

void register_collective_ops() {
  register_op("AllReduceTP", same_shape, all_reduce_tp);
  register_backward("AllReduceTP", all_reduce_tp_backward);
  register_op("CopyToTP", same_shape, copy_to_tp);
  register_backward("CopyToTP", copy_to_tp_backward);
  register_op("ReduceScatterTP", [](const Node& n, const std::vector<const Value*>& in) { return band_shape(n, in, false); },
              reduce_scatter_tp);
  register_backward("ReduceScatterTP", reduce_scatter_tp_backward);
  register_op("AllGatherTP", [](const Node& n, const std::vector<const Value*>& in) { return band_shape(n, in, true); },
              all_gather_tp);
  register_backward("AllGatherTP", all_gather_tp_backward);
  register_op("ScatterTP", [](const Node& n, const std::vector<const Value*>& in) { return band_shape(n, in, false); },
              scatter_tp);
  register_backward("ScatterTP", scatter_tp_backward);  // the gradient's bands gathered
  register_op("HaloTP",
              [](const Node& n, const std::vector<const Value*>& in) {
                WXE_CHECK(in.size() == 1 && in[0] && in[0]->dtype == DType::F32, "node ", n.name,
                          " (HaloTP): needs one float32 input");
                Shape s = in[0]->shape;
                const int64_t a = n.i("axis", 2);
                WXE_CHECK(a >= 0 && a < (int64_t)s.size(), "node ", n.name, " (HaloTP): no axis ", a);
                s[a] += n.i("top", 0) + n.i("bottom", 0);
                return std::vector<TypeShape>{{DType::F32, s}};
              },
              halo_tp);
  register_backward("HaloTP", halo_tp_backward);
  // the backward passes read gradients only (and shapes): nothing of the forward is kept for them
  for (const char* op : {"AllReduceTP", "CopyToTP", "ReduceScatterTP", "AllGatherTP", "ScatterTP", "HaloTP"})
    register_backward_reads(op, {0u, false});
  register_spectral_norm_tp();
}

void set_tp_communicator(Communicator* tp) { g_tp = tp; }
Communicator* tp_communicator() { return g_tp; }
void set_domain_communicator(Communicator* domain) { g_domain = domain; }
Communicator* domain_communicator() { return g_domain; }

}  // namespace wxe
