// oneDNN (2.6) fast path for MatMul, Gemm, Einsum, Linear, Conv, ConvTranspose, Gelu, Softmax
// (WindowAttention: dnnl_attention.cpp).
//
// - One static dnnl::engine (CPU) and one static in-order stream. The CPU runtime is OpenMP,
//   so oneDNN uses omp_get_max_threads() threads. Every execution waits on the stream before
//   returning.
// - Primitives are cached by a string key built from the op, the shapes and every attribute
//   that changes the primitive (mutex-protected map, see PrimCache). Repeated runs of the same
//   node, and the thousands of identically shaped attention einsums, create the primitive
//   once. A key whose primitive oneDNN cannot create is cached as "use the reference kernel".
// - Inputs and outputs are used in place as the plain row-major tensors they are
//   (row-major / strided views for transposes), no copies, except for Einsum operands
//   whose index groups cannot be described by strides (those are copied) and for
//   convolutions, see below.
// - Convolutions let oneDNN pick its weights layout ("any") and reorder the plain weights
//   into it. By default that happens on every call: in fine-tuning the optimizer updates
//   weights in place, and a memory plan may reuse an address for a different tensor of the
//   same shape, so a cache keyed by data pointer alone could serve stale weights. A node
//   with the attribute `constant_weights` (set by optimize_for_cpu on the inference
//   executor's own graph, whose weights nothing writes) keeps its reordered weights in
//   WeightCache, which holds a reference to the weights' storage so the address stays
//   theirs. Conv (not 1x1) also runs on channels-last activations, reordered in and out
//   through per-thread scratch buffers (see make_conv for the measurements behind that).
// - A Conv or Linear node with the attribute precision = "bf16" (optimize_for_cpu with
//   Precision::BF16; the training graph of finetune --precision bf16, whose backward kernels
//   read the same attribute) multiplies bfloat16 activations and weights with float32
//   accumulation and output (avx512_bf16: half the time of float32); the reference kernels
//   stay float32.
// - Anything the fast path does not handle (non-float32 inputs, equations it cannot map,
//   shapes oneDNN rejects) runs the reference kernel of the op.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "engine/ir/ops.h"
#include "engine/math/conv_phases.h"
#include "kernels/cpu/conv_fft.h"
#include "kernels/cpu/conv_s2d.h"
#include "kernels/cpu/conv_small_oc.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/transpose.h"
#include "kernels/cpu/window_attention.h"

namespace wxe::cpu {

namespace {

using namespace onednn;  // engine, stream, PrimCache, Scratch, make_matmul (dnnl_util.h)

// ---------------------------------------------------------------- MatMul
PrimCache<MatMulPrim> matmul_cache;

void matmul_fast(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  if (!all_f32(in, out)) return reference(n, in, out);
  const Shape& a = in[0]->shape;
  const Shape& b = in[1]->shape;
  if (a.empty() || b.empty()) return reference(n, in, out);
  Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  const int64_t M = a2[a2.size() - 2], K = a2.back(), N = b2.back();
  if (b2[b2.size() - 2] != K) return reference(n, in, out);  // reference reports it
  if (out[0]->numel() == 0) return;
  if (K == 0) {
    std::memset(out[0]->raw(), 0, out[0]->nbytes());
    return;
  }
  const std::string key = str("MatMul", shape_str(a), shape_str(b));
  auto p = matmul_cache.get(key, [&]() -> MatMulPrim {
    Shape ab(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
    const size_t r = std::max(ab.size(), bb.size());
    ab.insert(ab.begin(), r - ab.size(), 1);
    bb.insert(bb.begin(), r - bb.size(), 1);
    bool b_flat = true;
    for (auto v : bb) b_flat = b_flat && v == 1;
    if (b_flat) {  // one big (batch*M, K) x (K, N)
      const int64_t Mt = numel(ab) * M;
      return make_matmul(plain_md({Mt, K}), plain_md({K, N}), nullptr, plain_md({Mt, N}));
    }
    // Merge neighbouring batch dims that broadcast the same way; drop dims of size 1 in both.
    Dims da, db, dd;
    int last = -1;  // pattern of the previous kept dim
    for (size_t i = 0; i < r; ++i) {
      const int64_t o = std::max(ab[i], bb[i]);
      if (ab[i] != bb[i] && ab[i] != 1 && bb[i] != 1) return ref_only<MatMulPrim>();
      if (o == 1) continue;
      const int pat = (ab[i] == 1 ? 1 : 0) | (bb[i] == 1 ? 2 : 0);
      if (pat == last) {
        da.back() *= ab[i];
        db.back() *= bb[i];
        dd.back() *= o;
      } else {
        da.push_back(ab[i]);
        db.push_back(bb[i]);
        dd.push_back(o);
        last = pat;
      }
    }
    if (dd.empty()) {
      da.push_back(1);
      db.push_back(1);
      dd.push_back(1);
    }
    if (dd.size() + 2 > DNNL_MAX_NDIMS) return ref_only<MatMulPrim>();
    da.push_back(M);
    da.push_back(K);
    db.push_back(K);
    db.push_back(N);
    dd.push_back(M);
    dd.push_back(N);
    return make_matmul(plain_md(da), plain_md(db), nullptr, plain_md(dd));
  });
  if (p->use_ref) return reference(n, in, out);
  execute(n, p->prim, {{DNNL_ARG_SRC, mem(p->src, in[0]->raw())},
                       {DNNL_ARG_WEIGHTS, mem(p->wei, in[1]->raw())},
                       {DNNL_ARG_DST, mem(p->dst, out[0]->raw())}});
}

// ---------------------------------------------------------------- Gemm
PrimCache<MatMulPrim> gemm_cache;

void gemm_fast(const Node& n, const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) {
  if (!all_f32(in, out)) return reference(n, in, out);
  const Tensor* C = in.size() > 2 ? in[2] : nullptr;
  const Shape& a = in[0]->shape;
  const Shape& b = in[1]->shape;
  if (a.size() != 2 || b.size() != 2) return reference(n, in, out);
  const bool ta = n.i("transA", 0) != 0, tb = n.i("transB", 0) != 0;
  const float alpha = n.f("alpha", 1.f), beta = n.f("beta", 1.f);
  const int64_t M = ta ? a[1] : a[0], K = ta ? a[0] : a[1], N = tb ? b[0] : b[1];
  if ((tb ? b[1] : b[0]) != K || out[0]->shape != Shape{M, N}) return reference(n, in, out);
  const bool use_c = C && beta != 0.f;
  if (use_c && (C->rank() > 2 || K == 0)) return reference(n, in, out);
  if (M == 0 || N == 0) return;
  if (K == 0) return reference(n, in, out);
  const std::string key = str("Gemm", shape_str(a), shape_str(b), ta, tb, float_bits(alpha), "/",
                              float_bits(use_c ? beta : 0.f));
  auto p = gemm_cache.get(key, [&] {
    memory::desc ma = ta ? memory::desc({M, K}, dt::f32, Dims{1, M}) : plain_md({M, K});
    memory::desc mb = tb ? memory::desc({K, N}, dt::f32, Dims{1, K}) : plain_md({K, N});
    dnnl::primitive_attr attr;
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (use_c) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    return make_matmul(ma, mb, nullptr, plain_md({M, N}), attr);
  });
  if (p->use_ref) return reference(n, in, out);
  float* Y = out[0]->data<float>();
  if (use_c) {  // Y = C broadcast to (M, N); the sum post-op adds beta * Y
    const int64_t cm = C->rank() == 2 ? C->shape[0] : 1, cn = C->rank() >= 1 ? C->shape.back() : 1;
    if ((cm != 1 && cm != M) || (cn != 1 && cn != N)) return reference(n, in, out);
    const float* c = C->data<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) Y[i * N + j] = c[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  }
  execute(n, p->prim, {{DNNL_ARG_SRC, mem(p->src, in[0]->raw())},
                       {DNNL_ARG_WEIGHTS, mem(p->wei, in[1]->raw())},
                       {DNNL_ARG_DST, mem(p->dst, Y)}});
}

// Reordered weights of graph constants, kept between calls when the node carries
// `constant_weights` (set by optimize_for_cpu on the executor's private copy of an inference
// graph: nothing writes those weights while it runs). Keyed by the weights' storage and
// offset and the primitive's layout; each entry holds a reference to the storage, so its
// address cannot be reused by other data while the entry exists. Entries whose storage only
// the cache still holds (their graph is gone) are dropped whenever a new entry is added.
struct PackedWeights {
  std::shared_ptr<Storage> source;
  std::shared_ptr<void> data;
};

class WeightCache {
 public:
  // The packed copy of w under layout_key, made by pack(destination) the first time: bytes long.
  template <class Pack>
  const void* get_made(const std::string& layout_key, const Tensor& w, size_t bytes, Pack pack) {
    const std::string key = str(layout_key, "@", (const void*)w.storage.get(), "+", w.offset);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.data.get();
    for (auto e = map_.begin(); e != map_.end();)
      e = e->second.source.use_count() == 1 ? map_.erase(e) : std::next(e);
    void* q = nullptr;
    WXE_ASSERT(posix_memalign(&q, 64, std::max<size_t>(bytes, 64)) == 0);
    PackedWeights pw{w.storage, std::shared_ptr<void>(q, [](void* p) { std::free(p); })};
    pack(q);
    return map_.emplace(key, std::move(pw)).first->second.data.get();
  }
  // w reordered from the layout user to packed.
  const void* get(const std::string& layout_key, const Tensor& w, const memory::desc& user,
                  const memory::desc& packed, const dnnl::reorder& reorder) {
    return get_made(layout_key, w, packed.get_size(), [&](void* q) {
      memory from = mem(user, w.raw()), to = mem(packed, q);
      reorder.execute(strm(), from, to);
      strm().wait();
    });
  }

 private:
  std::mutex mu_;
  std::map<std::string, PackedWeights> map_;
};

WeightCache weight_cache;

// ---------------------------------------------------------------- Linear
// With precision = "bf16": X and W converted to bfloat16 by oneDNN reorders (X into scratch
// on every call, W into WeightCache when the node has constant_weights), float32
// accumulation, bias and output.
struct LinearPrim {
  bool use_ref = false;
  bool bf16 = false;
  bool aug = false;  // features inner, bias as W's K + 1st column against a row of ones under X
  MatMulPrim mm;
  memory::desc x_f32, w_f32;             // X and W as stored
  memory::desc x_bf16, w_bf16;           // as the matmul reads them (bf16)
  dnnl::reorder x_to_bf16, w_to_bf16;
};

PrimCache<LinearPrim> linear_cache;

// The Linear's products (P, K) x (K, N) (Q == 1: features last) or (N, K) x (K, Q) for each of
// P (features on an inner axis); *key: the cache key (the weight cache's too).
std::shared_ptr<const LinearPrim> linear_prim(const Node& n, int64_t P, int64_t K, int64_t Q, int64_t N, bool bias,
                                              std::string* key_out = nullptr) {
  const bool gelu = n.s("activation", "") == "gelu";
  const bool bf16 = runs_bf16(n);
  const std::string key =
      str("Linear", P, "x", K, "x", Q, ">", N, bias ? "b" : "", gelu ? "gelu" : "", bf16 ? "bf16" : "");
  if (key_out) *key_out = key;
  return linear_cache.get(key, [&] {
    LinearPrim r;
    r.bf16 = bf16;
    const dt cdt = bf16 ? dt::bf16 : dt::f32;
    dnnl::post_ops po;
    dnnl::primitive_attr attr;
    memory::desc mb = plain_md({1, N});
    if (Q == 1) {  // features last: (P, K) x W^T -> (P, N)
      r.x_f32 = plain_md({P, K});
      r.w_f32 = memory::desc({K, N}, dt::f32, Dims{1, K});
      r.x_bf16 = memory::desc({P, K}, cdt, Dims{K, 1});
      r.w_bf16 = memory::desc({K, N}, cdt, Dims{1, K});
      if (gelu) po.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f);
      if (gelu) attr.set_post_ops(po);
      r.mm = make_matmul(r.x_bf16, r.w_bf16, bias ? &mb : nullptr, plain_md({P, N}), attr);
    } else {
      // features on an inner axis (NCHW): W (N, K) x X_p (K, Q) -> Y_p (N, Q) for each p,
      // W broadcast over the batch. A per-row bias makes oneDNN 2.6 take its slow reference
      // matmul, so it is either a K + 1st column of W against a row of ones under X (copies of
      // W and X: cheaper than writing Y twice when K < N), or written into Y first and added
      // by a sum post-op.
      r.aug = bias && !bf16 && K < N;
      const int64_t Ka = r.aug ? K + 1 : K;
      r.x_f32 = plain_md({P, Ka, Q});
      r.w_f32 = plain_md({1, N, Ka});
      r.x_bf16 = memory::desc({P, Ka, Q}, cdt, Dims{Ka * Q, Q, 1});
      r.w_bf16 = memory::desc({1, N, Ka}, cdt, Dims{N * Ka, Ka, 1});
      if (bias && !r.aug) po.append_sum(1.f);
      if (gelu) po.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f);
      if ((bias && !r.aug) || gelu) attr.set_post_ops(po);
      r.mm = make_matmul(r.w_bf16, r.x_bf16, nullptr, plain_md({P, N, Q}), attr);
    }
    r.use_ref = r.mm.use_ref;
    if (bf16 && !r.use_ref) {
      try {
        r.x_to_bf16 = reorder_of(r.x_f32, r.x_bf16);
        r.w_to_bf16 = reorder_of(r.w_f32, r.w_bf16);
      } catch (const dnnl::error&) {
        r.use_ref = true;
      }
    }
    return r;
  });
}

// P, K, Q, N of a Linear on x (..., K at axis, ...) and w (N, K); false where the shapes do
// not fit (the reference kernel reports them).
bool linear_dims(const Node& n, const Shape& x, const Shape& w, int64_t* P, int64_t* K, int64_t* Q, int64_t* N) {
  const int64_t axis = n.i("axis", -1) < 0 ? n.i("axis", -1) + (int64_t)x.size() : n.i("axis", -1);
  if (x.empty() || w.size() != 2 || axis < 0 || axis >= (int64_t)x.size() || x[axis] != w[1]) return false;
  *K = w[1];
  *N = w[0];
  *P = *Q = 1;
  for (int64_t i = 0; i < axis; ++i) *P *= x[i];
  for (size_t i = axis + 1; i < x.size(); ++i) *Q *= x[i];
  return true;
}

void linear_fast(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  if (!all_f32(in, out)) return reference(n, in, out);
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  int64_t P, K, Q, N;
  if (!linear_dims(n, in[0]->shape, in[1]->shape, &P, &K, &Q, &N)) return reference(n, in, out);
  if (P == 0 || Q == 0 || N == 0) return;
  if (K == 0) return reference(n, in, out);
  const std::string act = n.s("activation", "");
  if (act != "gelu" && !act.empty()) return reference(n, in, out);  // it reports it
  std::string key;
  auto p = linear_prim(n, P, K, Q, N, bias != nullptr, &key);
  if (p->use_ref) return reference(n, in, out);
  const void* xp = in[0]->raw();
  const void* wp = in[1]->raw();
  if (p->aug) {  // [W | b] and [X; 1]
    float* wa = scratch_slot(1).floats(N * (K + 1));
    float* xa = scratch_slot(0).floats(P * (K + 1) * Q);
    const float* W = in[1]->data<float>();
    const float* X = in[0]->data<float>();
    for (int64_t o = 0; o < N; ++o) {
      std::copy(W + o * K, W + (o + 1) * K, wa + o * (K + 1));
      wa[o * (K + 1) + K] = bias->data<float>()[o];
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < P * (K + 1); ++t) {
      float* row = xa + t * Q;
      if (t % (K + 1) == K)
        std::fill(row, row + Q, 1.f);
      else
        std::memcpy(row, X + ((t / (K + 1)) * K + t % (K + 1)) * Q, Q * sizeof(float));
    }
    xp = xa;
    wp = wa;
  } else if (bias && Q > 1) {
    float* y = out[0]->data<float>();
    const float* b = bias->data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < P * N; ++t) std::fill(y + t * Q, y + (t + 1) * Q, b[t % N]);
  }
  if (p->bf16) {
    memory xb = mem(p->x_bf16, scratch_slot(0).get(p->x_bf16.get_size()));
    memory xf = mem(p->x_f32, xp);
    p->x_to_bf16.execute(strm(), xf, xb);
    xp = xb.get_data_handle();
    if (n.i("constant_weights", 0)) {
      wp = weight_cache.get(key, *in[1], p->w_f32, p->w_bf16, p->w_to_bf16);
    } else {
      memory wb = mem(p->w_bf16, scratch_slot(1).get(p->w_bf16.get_size()));
      memory wf = mem(p->w_f32, wp);
      p->w_to_bf16.execute(strm(), wf, wb);
      wp = wb.get_data_handle();
    }
  }
  // for Q > 1 the primitive's "src" is W and its "weights" is X
  Args args{{DNNL_ARG_SRC, mem(p->mm.src, Q == 1 ? xp : wp)},
            {DNNL_ARG_WEIGHTS, mem(p->mm.wei, Q == 1 ? wp : xp)},
            {DNNL_ARG_DST, mem(p->mm.dst, out[0]->raw())}};
  if (bias && Q == 1) args.emplace(DNNL_ARG_BIAS, mem(p->mm.bias, bias->raw()));
  execute(n, p->mm.prim, args);
}

// ---------------------------------------------------------------- Einsum
// One einsum operand (or the output) as seen by the matmul.
struct EinsumOperand {
  bool copy = false;                   // staged through a contiguous buffer
  std::vector<int64_t> letter_dims;    // canonical letter order (copy only)
  std::vector<int64_t> letter_strides; // strides of those letters in the tensor (copy only)
  int64_t numel = 0;
};

struct EinsumPlan {
  bool use_ref = false;
  MatMulPrim mm;
  EinsumOperand op[3];  // A, B, output
};

// Strides of the letters of a subscript string in a contiguous tensor of that shape.
std::map<char, int64_t> letter_strides(const std::string& sub, const Shape& s) {
  std::map<char, int64_t> r;
  std::vector<int64_t> st = strides_of(s);
  for (size_t i = 0; i < sub.size(); ++i) r[sub[i]] = st[i];
  return r;
}

EinsumPlan plan_einsum(const EinsumEq& eq, const Shape& sa, const Shape& sb, const Shape& so,
                       bool force_copy) {
  EinsumPlan plan;
  const std::string &la = eq.in[0], &lb = eq.in[1], &lo = eq.out;
  auto has = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  auto unique = [](const std::string& s) {
    std::string t = s;
    std::sort(t.begin(), t.end());
    return std::adjacent_find(t.begin(), t.end()) == t.end();
  };
  if (!unique(la) || !unique(lb) || la.size() != sa.size() || lb.size() != sb.size() ||
      lo.size() != so.size())
    return ref_only<EinsumPlan>();
  std::map<char, int64_t> size;
  for (size_t i = 0; i < la.size(); ++i) size[la[i]] = sa[i];
  for (size_t i = 0; i < lb.size(); ++i) {
    if (size.count(lb[i]) && size[lb[i]] != sb[i]) return ref_only<EinsumPlan>();
    size[lb[i]] = sb[i];
  }
  std::string batch, gm, gn, gk;
  for (char c : lo) {
    if (has(la, c) && has(lb, c)) batch.push_back(c);
    else if (has(la, c)) gm.push_back(c);
    else gn.push_back(c);
  }
  for (char c : la)
    if (has(lb, c) && !has(lo, c)) gk.push_back(c);
  for (char c : la)
    if (!has(lb, c) && !has(lo, c)) return ref_only<EinsumPlan>();  // summed over one operand only
  for (char c : lb)
    if (!has(la, c) && !has(lo, c)) return ref_only<EinsumPlan>();

  const std::string subs[3] = {la, lb, lo};
  const Shape shapes[3] = {sa, sb, so};
  std::map<char, int64_t> st[3];
  for (int t = 0; t < 3; ++t) st[t] = letter_strides(subs[t], shapes[t]);

  // A group of letters forms one dim if, skipping size-1 letters, each letter's stride is the
  // next one's stride times its size.
  auto merge = [&](const std::string& g, const std::map<char, int64_t>& s, int64_t* stride) {
    int64_t prev = -1;
    bool any = false;
    for (size_t i = g.size(); i-- > 0;) {
      const char c = g[i];
      if (size[c] == 1) continue;
      if (any && s.at(c) != prev) return false;
      if (!any) *stride = s.at(c);
      any = true;
      prev = s.at(c) * size[c];
    }
    if (!any) *stride = -1;  // size-1 dim: stride chosen later
    return true;
  };
  // batch as one dim if it merges in all three tensors, else one dim per letter
  std::vector<std::string> bgroups;
  bool bmerge = !force_copy;
  for (int t = 0; t < 3 && bmerge; ++t) {
    int64_t dummy;
    bmerge = merge(batch, st[t], &dummy);
  }
  if (force_copy || bmerge || batch.size() <= 1) {  // copies put batch letters together
    bgroups.push_back(batch);
  } else {
    for (char c : batch) bgroups.push_back(std::string(1, c));
  }
  if (bgroups.size() + 2 > DNNL_MAX_NDIMS) return ref_only<EinsumPlan>();
  // groups of each tensor in matmul order
  std::vector<std::string> groups[3];
  for (int t = 0; t < 3; ++t) groups[t] = bgroups;
  groups[0].push_back(gm);
  groups[0].push_back(gk);
  groups[1].push_back(gk);
  groups[1].push_back(gn);
  groups[2].push_back(gm);
  groups[2].push_back(gn);
  memory::desc md[3];
  for (int t = 0; t < 3; ++t) {
    std::vector<int64_t> gstride(groups[t].size());
    bool ok = !force_copy;
    for (size_t g = 0; g < groups[t].size() && ok; ++g) ok = merge(groups[t][g], st[t], &gstride[g]);
    EinsumOperand& o = plan.op[t];
    if (!ok) {  // stage through a contiguous buffer in canonical letter order
      o.copy = true;
      std::string order;
      for (auto& g : groups[t]) order += g;
      for (char c : order) {
        o.letter_dims.push_back(size[c]);
        o.letter_strides.push_back(st[t].at(c));
      }
      o.numel = numel(Shape(o.letter_dims.begin(), o.letter_dims.end()));
      std::map<char, int64_t> cst = letter_strides(order, Shape(o.letter_dims.begin(), o.letter_dims.end()));
      for (size_t g = 0; g < groups[t].size(); ++g) WXE_ASSERT(merge(groups[t][g], cst, &gstride[g]));
    }
    Dims dims(groups[t].size());
    for (size_t g = 0; g < groups[t].size(); ++g) {
      dims[g] = 1;
      for (char c : groups[t][g]) dims[g] *= size[c];
    }
    // size-1 dims get the stride a plain layout would give them
    for (size_t g = dims.size(); g-- > 0;)
      if (gstride[g] < 0) gstride[g] = g + 1 == dims.size() ? 1 : gstride[g + 1] * dims[g + 1];
    md[t] = memory::desc(dims, dt::f32, Dims(gstride.begin(), gstride.end()));
  }
  plan.mm = make_matmul(md[0], md[1], nullptr, md[2]);
  if (plan.mm.use_ref) plan.use_ref = true;
  return plan;
}

PrimCache<EinsumPlan> einsum_cache;

void einsum_fast(const Node& n, const std::vector<const Tensor*>& in,
                 const std::vector<Tensor*>& out) {
  if (in.size() != 2 || !in[0] || !in[1] || !all_f32(in, out)) return reference(n, in, out);
  if (out[0]->numel() == 0) return;
  for (auto* t : in)
    if (t->numel() == 0) return reference(n, in, out);
  const std::string key = str("Einsum", n.s("equation", ""), shape_str(in[0]->shape),
                              shape_str(in[1]->shape));
  auto plan = einsum_cache.get(key, [&] {
    EinsumEq eq;
    try {
      eq = parse_einsum(n, 2);
    } catch (const Error&) {
      return ref_only<EinsumPlan>();  // the reference kernel reports it
    }
    EinsumPlan p = plan_einsum(eq, in[0]->shape, in[1]->shape, out[0]->shape, false);
    // oneDNN's reference matmul is slow: prefer contiguous copies if that avoids it
    if (!p.use_ref && p.mm.impl.rfind("ref", 0) == 0) {
      EinsumPlan q = plan_einsum(eq, in[0]->shape, in[1]->shape, out[0]->shape, true);
      if (!q.use_ref && q.mm.impl.rfind("ref", 0) != 0) return q;
    }
    return p;
  });
  if (plan->use_ref) return reference(n, in, out);
  const void* ptr[3] = {in[0]->raw(), in[1]->raw(), out[0]->raw()};
  float* buf[3] = {nullptr, nullptr, nullptr};
  for (int t = 0; t < 3; ++t) {
    const EinsumOperand& o = plan->op[t];
    if (!o.copy) continue;
    buf[t] = static_cast<float*>(scratch_slot(t).get((size_t)o.numel * sizeof(float)));
    if (t < 2) {
      std::vector<int64_t> cst = strides_of(Shape(o.letter_dims.begin(), o.letter_dims.end()));
      strided_copy_f32(o.letter_dims, static_cast<const float*>(ptr[t]), o.letter_strides, buf[t], cst);
    }
    ptr[t] = buf[t];
  }
  execute(n, plan->mm.prim, {{DNNL_ARG_SRC, mem(plan->mm.src, ptr[0])},
                             {DNNL_ARG_WEIGHTS, mem(plan->mm.wei, ptr[1])},
                             {DNNL_ARG_DST, mem(plan->mm.dst, ptr[2])}});
  const EinsumOperand& o = plan->op[2];
  if (o.copy) {
    std::vector<int64_t> cst = strides_of(Shape(o.letter_dims.begin(), o.letter_dims.end()));
    strided_copy_f32(o.letter_dims, buf[2], cst, out[0]->data<float>(), o.letter_strides);
  }
}

// ---------------------------------------------------------------- Conv / ConvTranspose
enum { kSrc, kWei, kDst };

struct ConvPrim {
  bool use_ref = false;
  dnnl::primitive prim;
  memory::desc src, wei, bias, dst;             // what the primitive runs on
  memory::desc src_user, wei_user, dst_user;    // the tensors' own plain layouts
  dnnl::reorder src_reorder, wei_reorder, dst_reorder;  // set when the layouts differ
  bool r_src = false, r_wei = false, r_dst = false;
  bool t_src = false, t_dst = false;  // the reorder is NCHW <-> NHWC: transpose_planes does it
                                      // (oneDNN 2.6's reorder takes 18.9 ms for 84 channels of
                                      // 256 x 384, 4x its time for 80)
  std::string impl;
};

PrimCache<ConvPrim> conv_cache;

std::string geom_key(const ConvGeom& g) {
  std::string k = str(g.transpose ? "ConvT" : "Conv", g.nsp, "N", g.N, "C", g.C_in, ">", g.C_out,
                      "g", g.group);
  for (int a = g.first(); a < 3; ++a)
    k += str("|", g.in[a], ",", g.out[a], ",", g.k[a], ",", g.s[a], ",", g.d[a], ",", g.pb[a], ",",
             g.pe[a]);
  return k;
}

// Layout choice (measured with oneDNN 2.6 on AVX-512, 2 threads, CrossFormer shapes):
// - Conv: blocked activations ("any", i.e. nChw16c) run oneDNN's brgconv kernels, 2-4x
//   faster than the im2col+gemm path oneDNN takes for plain nchw (kernel 16/32 stride 2
//   convs: ~100 ms vs ~385 ms), reorders included. Pointwise convs (1x1, stride 1, no
//   padding) are the exception: gemm on plain nchw beats the reorders.
// - ConvTranspose: plain activations; the blocked jit kernel is no faster.
// - Weights always "any"; reordered on every call unless the node has constant_weights (see
//   the top of this file).
// - Spatial convs run channels-last (oneDNN picks nhwc): NCHW inputs and outputs are
//   transposed around them (transpose_planes), ConvChannelsLast reads and writes nhwc.
ConvPrim make_conv(const ConvGeom& g, bool has_bias, bool src_nhwc = false, bool dst_nhwc = false,
                   bool bf16 = false) {
  ConvPrim r;
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
  for (auto v : pl)
    if (v < 0) return ref_only<ConvPrim>();
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
  const bool blocked = !g.transpose && !pointwise;
  if ((src_nhwc || dst_nhwc) && (g.nsp != 2 || !blocked)) return ref_only<ConvPrim>();
  try {
    r.src_user = src_nhwc ? memory::desc(src, dt::f32, memory::format_tag::nhwc) : plain_md(src);
    r.dst_user = dst_nhwc ? memory::desc(dst, dt::f32, memory::format_tag::nhwc) : plain_md(dst);
    r.wei_user = memory::desc(wd, dt::f32, ws);
    const auto any = memory::format_tag::any;
    // bf16 (Conv, not ConvTranspose): activations and weights converted by their reorders
    // (pointwise: to plain bfloat16 nchw), float32 accumulation, bias and output
    const dt cdt = bf16 && !g.transpose ? dt::bf16 : dt::f32;
    memory::desc s_md = blocked ? memory::desc(src, cdt, any)
                        : cdt == dt::bf16 ? memory::desc(src, cdt, Dims(strides_of(Shape(src.begin(), src.end()))))
                                          : r.src_user;
    memory::desc d_md = blocked ? memory::desc(dst, dt::f32, any) : r.dst_user;
    memory::desc w_md(wd, cdt, any);
    r.bias = has_bias ? plain_md({g.C_out}) : memory::desc();
    const auto pk = dnnl::prop_kind::forward_inference;
    if (!g.transpose) {
      dnnl::convolution_forward::desc d(pk, dnnl::algorithm::convolution_direct, s_md, w_md, r.bias,
                                        d_md, strides, dil, pl, pr);
      dnnl::convolution_forward::primitive_desc pd(d, eng());
      r.prim = dnnl::convolution_forward(pd);
      r.src = pd.src_desc();
      r.wei = pd.weights_desc();
      r.dst = pd.dst_desc();
      r.impl = pd.impl_info_str();
    } else {
      dnnl::deconvolution_forward::desc d(pk, dnnl::algorithm::deconvolution_direct, s_md, w_md,
                                          r.bias, d_md, strides, dil, pl, pr);
      dnnl::deconvolution_forward::primitive_desc pd(d, eng());
      r.prim = dnnl::deconvolution_forward(pd);
      r.src = pd.src_desc();
      r.wei = pd.weights_desc();
      r.dst = pd.dst_desc();
      r.impl = pd.impl_info_str();
    }
    r.r_src = !(r.src == r.src_user);
    r.r_wei = !(r.wei == r.wei_user);
    r.r_dst = !(r.dst == r.dst_user);
    if (g.nsp == 2) {
      r.t_src = !src_nhwc && r.src == memory::desc(src, dt::f32, memory::format_tag::nhwc);
      r.t_dst = !dst_nhwc && r.dst == memory::desc(dst, dt::f32, memory::format_tag::nhwc);
    }
    if (r.r_src) r.src_reorder = reorder_of(r.src_user, r.src);
    if (r.r_wei) r.wei_reorder = reorder_of(r.wei_user, r.wei);
    if (r.r_dst) r.dst_reorder = reorder_of(r.dst, r.dst_user);
  } catch (const dnnl::error&) {
    if (bf16) return make_conv(g, has_bias, src_nhwc, dst_nhwc, false);  // no bfloat16 kernel for it: float32
    return ref_only<ConvPrim>();
  }
  return r;
}

void conv_any_fast(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out,
                   bool transpose, bool channels_last);

// A stride-2 Conv with at most 4 output channels and a kernel of 8 or more (CREDIT's first-layer
// cross-embeddings, 80 -> 4 channels, kernels 16 and 32) as a stride-4 Conv whose 4 x C_out
// output channels are the output's 2 x 2 phases, then the phases interleaved: oneDNN blocks
// output channels by 16, so it has a direct kernel for that one and none for the original
// (engine/math/conv_phases.h; the inference pass does the same to constant weights, here the
// weights are expanded per call, as a training step's change every step).
// False when it does not apply.
bool output_phases_apply(const ConvGeom& g) {
  return !g.transpose && g.group == 1 && g.nsp == 2 && g.C_out <= 4 && g.s[1] == 2 && g.s[2] == 2 && g.d[1] == 1 &&
         g.d[2] == 1 && g.k[1] >= 8 && g.k[2] >= 8 && g.out[1] % 2 == 0 && g.out[2] % 2 == 0 &&
         phase_conv_end_pad(g.in[1], g.out[1], g.k[1], g.pb[1]) >= 0 &&
         phase_conv_end_pad(g.in[2], g.out[2], g.k[2], g.pb[2]) >= 0;
}

bool conv_by_output_phases(const Node& n, const ConvGeom& g, const Tensor& x, const Tensor& w, const Tensor* bias,
                           Tensor& y) {
  if (!output_phases_apply(g)) return false;
  const int64_t OC = g.C_out, C = g.C_in, KH = g.k[1], KW = g.k[2], OH = g.out[1], OW = g.out[2];
  const int64_t pe_h = phase_conv_end_pad(g.in[1], OH, KH, g.pb[1]), pe_w = phase_conv_end_pad(g.in[2], OW, KW, g.pb[2]);
  Tensor w2 = Tensor::zeros(DType::F32, {4 * OC, C, KH + 2, KW + 2});
  expand_phase_weights(w.data<float>(), OC, C, KH, KW, w2.data<float>());
  Tensor b2;
  if (bias) {
    b2 = Tensor(DType::F32, {4 * OC});
    for (int64_t o = 0; o < 4 * OC; ++o) b2.data<float>()[o] = bias->data<float>()[o / 4];
  }
  Node m = n;
  m.attrs["strides"] = attr_ints({4, 4});
  m.attrs["pads"] = attr_ints({g.pb[1], g.pb[2], pe_h, pe_w});
  m.attrs.erase("auto_pad");
  m.attrs.erase("kernel_shape");
  Tensor t(DType::F32, {g.N, 4 * OC, OH / 2, OW / 2});
  std::vector<const Tensor*> in2 = {&x, &w2};
  if (bias) in2.push_back(&b2);
  conv_any_fast(m, in2, {&t}, false, false);
  const float* T = t.data<float>();
  float* Y = y.data<float>();
  const int64_t H2 = OH / 2, W2c = OW / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < g.N * OC * OH; ++r) {  // output row r = (n, o, i)
    const int64_t i = r % OH, no = r / OH, py = i % 2;
    const float* p0 = T + ((no * 4 + py * 2) * H2 + i / 2) * W2c;  // phase (py, 0); (py, 1) follows
    const float* p1 = p0 + H2 * W2c;
    float* yr = Y + r * OW;
    for (int64_t j = 0; j < W2c; ++j) {
      yr[2 * j] = p0[j];
      yr[2 * j + 1] = p1[j];
    }
  }
  return true;
}

// A wide kernel at a small stride by FFT (conv_fft.h), the kernels' spectra kept with the
// packed weights when the node has constant weights (and they fit); false when the plan says
// direct.
bool conv_by_fft(const Node& n, const ConvGeom& g, const Tensor& x, bool x_nhwc, const Tensor& w, const Tensor* bias,
                 Tensor& y, bool y_nhwc) {
  const FftConvPlan p = fft_conv_plan(g, n.i("constant_weights", 0) != 0);
  if (!p.F) return false;
  const void* spectra = nullptr;
  if (p.cached)
    spectra = weight_cache.get_made(geom_key(g) + "fft", w, sizeof(float) * fft_conv_spectra_floats(g, p),
                                    [&](void* q) { fft_conv_spectra(g, p, w.data<float>(), (float*)q); });
  fft_conv_forward(g, p, x.data<float>(), x_nhwc, w.data<float>(), (const float*)spectra,
                   bias ? bias->data<float>() : nullptr, y.data<float>(), y_nhwc);
  return true;
}

// The forward paths of Conv, ConvTranspose and ConvChannelsLast, in the order they are taken
// (choose_conv_path). Each needs only the build's baseline but Winograd (winograd_applies:
// oneDNN's kernel needs avx512_core, cpu_isa.h); a bf16 node (runs_bf16) takes oneDNN's direct
// kernel. A Conv with the attribute rows (mark_needed_rows) computes those rows only, the others
// zero: by Winograd's own bands, or else as the conv of the input rows they read on the path
// that conv takes.
enum class ConvPath { WinogradRows, RowsBand, Fft, OutputPhases, Winograd, S2d, SmallOc, OneDnn };

const char* conv_path_name(ConvPath p) {
  switch (p) {
    case ConvPath::WinogradRows: return "winograd (rows)";
    case ConvPath::RowsBand: return "rows";
    case ConvPath::Fft: return "fft";
    case ConvPath::OutputPhases: return "output phases";
    case ConvPath::Winograd: return "winograd";
    case ConvPath::S2d: return "space-to-depth matmul";
    case ConvPath::SmallOc: return "small-oc avx loops";
    case ConvPath::OneDnn: return "onednn direct";
  }
  return "?";
}

// The node's rows attribute, clipped to the output; lo = 0, hi = all rows where there is none
// (or the conv is not a 2-D nchw Conv).
RowRange marked_rows(const Node& n, const ConvGeom& g, bool channels_last) {
  const std::vector<int64_t> rows = n.ints("rows");
  if (channels_last || g.transpose || g.nsp != 2 || rows.size() != 2) return {0, g.out[1]};
  const int64_t lo = std::clamp<int64_t>(rows[0], 0, g.out[1]);
  return {lo, std::clamp<int64_t>(rows[1], lo, g.out[1])};
}

ConvPath choose_conv_path(const Node& n, const ConvGeom& g, bool bias, bool src_nhwc, bool dst_nhwc,
                          bool channels_last) {
  const bool bf16 = runs_bf16(n);
  const RowRange rows = marked_rows(n, g, channels_last);
  if (rows.lo > 0 || rows.hi < g.out[1])
    return !bf16 && winograd_forward_plans(g, bias, false, false, rows) ? ConvPath::WinogradRows : ConvPath::RowsBand;
  if (!bf16 && fft_conv_plan(g, n.i("constant_weights", 0) != 0).F) return ConvPath::Fft;
  if (!channels_last && !bf16 && output_phases_apply(g)) return ConvPath::OutputPhases;
  if (!bf16 && winograd_forward_plans(g, bias, src_nhwc, dst_nhwc, {0, g.out[1]})) return ConvPath::Winograd;
  if (!channels_last && !bf16 && s2d_conv_applies(g)) return ConvPath::S2d;
  if (!channels_last && !bf16 && small_oc_conv_applies(g)) return ConvPath::SmallOc;
  return ConvPath::OneDnn;
}

// RowsBand: the node and geometry of the conv of the input rows [*a, *b) that output rows
// [r.lo, r.hi) read, with the pads that make each output row read what it reads in the whole
// conv; false where they read no input row (only padding).
bool rows_band(const Node& n, const ConvGeom& g, RowRange r, Node* m, int64_t* a, int64_t* b) {
  const int64_t ext = (g.k[1] - 1) * g.d[1] + 1;
  const int64_t top = r.lo * g.s[1] - g.pb[1], end = (r.hi - 1) * g.s[1] - g.pb[1] + ext;  // pads included
  *a = std::max<int64_t>(top, 0);
  *b = std::min<int64_t>(end, g.in[1]);
  if (*a >= *b) return false;
  *m = n;
  m->attrs.erase("rows");
  m->attrs.erase("auto_pad");
  m->attrs["pads"] = attr_ints({*a - top, g.pb[2], end - *b, g.pe[2]});
  return true;
}

// RowsBand: the rows of y (nchw) the node marks, by the conv of the input rows they read.
void conv_rows_by_band(const Node& n, const ConvGeom& g, const std::vector<const Tensor*>& in, Tensor& y, RowRange r) {
  const int64_t NC = g.N * g.C_in, H = g.in[1], W = g.in[2], NO = g.N * g.C_out, OH = g.out[1], OW = g.out[2];
  Node m;
  int64_t a = 0, b = 0;
  if (r.lo >= r.hi || !rows_band(n, g, r, &m, &a, &b)) {  // no rows, or rows of padding alone: the whole conv
    m = n;
    m.attrs.erase("rows");
    conv_any_fast(m, in, {&y}, false, false);
  } else {
    Tensor xb(DType::F32, {g.N, g.C_in, b - a, W}), yb(DType::F32, {g.N, g.C_out, r.hi - r.lo, OW});
    const float* X = in[0]->data<float>();
    float* XB = xb.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < NC; ++nc) std::memcpy(XB + nc * (b - a) * W, X + (nc * H + a) * W, (b - a) * W * 4);
    std::vector<const Tensor*> in2 = in;
    in2[0] = &xb;
    conv_any_fast(m, in2, {&yb}, false, false);
    const float* YB = yb.data<float>();
    float* Y = y.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t no = 0; no < NO; ++no)
      std::memcpy(Y + (no * OH + r.lo) * OW, YB + no * (r.hi - r.lo) * OW, (r.hi - r.lo) * OW * 4);
  }
  zero_rows_outside(y.data<float>(), g.N, g.C_out, OH, OW, r.lo, r.hi);
}

// Conv, ConvTranspose, and ConvChannelsLast (channels_last: x is (N, H, W, C), and so is the
// output with the attribute channels_last_output).
void conv_any_fast(const Node& n, const std::vector<const Tensor*>& in,
                   const std::vector<Tensor*>& out, bool transpose, bool channels_last) {
  const bool src_nhwc = channels_last, dst_nhwc = channels_last && n.i("channels_last_output", 0);
  if (!all_f32(in, out) || in.size() < 2 || !in[0] || !in[1]) return reference(n, in, out);
  if (src_nhwc && in[0]->rank() != 4) return reference(n, in, out);
  const Tensor* bias = in.size() > 2 ? in[2] : nullptr;
  const Shape xs = src_nhwc ? Shape{in[0]->shape[0], in[0]->shape[3], in[0]->shape[1], in[0]->shape[2]} : in[0]->shape;
  ConvGeom g = conv_geometry(n, xs, in[1]->shape, transpose);
  Shape os = g.out_shape();
  if (dst_nhwc) os = {os[0], os[2], os[3], os[1]};
  if (out[0]->shape != os) return reference(n, in, out);
  if (bias && bias->shape != Shape{g.C_out}) return reference(n, in, out);
  if (out[0]->numel() == 0 || in[0]->numel() == 0) return reference(n, in, out);
  const bool bf16 = runs_bf16(n);
  const float* X = in[0]->data<float>();
  const float* W = in[1]->data<float>();
  const float* B = bias ? bias->data<float>() : nullptr;
  float* Y = out[0]->data<float>();
  switch (choose_conv_path(n, g, bias != nullptr, src_nhwc, dst_nhwc, channels_last)) {
    case ConvPath::WinogradRows:
      if (winograd_conv_forward_rows(n, g, X, W, B, Y, marked_rows(n, g, channels_last))) return;
      [[fallthrough]];  // (planned, so not reached)
    case ConvPath::RowsBand:
      return conv_rows_by_band(n, g, in, *out[0], marked_rows(n, g, channels_last));
    case ConvPath::Fft:
      if (conv_by_fft(n, g, *in[0], src_nhwc, *in[1], bias, *out[0], dst_nhwc)) return;
      break;
    case ConvPath::OutputPhases:
      if (conv_by_output_phases(n, g, *in[0], *in[1], bias, *out[0])) return;
      break;
    case ConvPath::Winograd:
      if (winograd_conv_forward(n, g, X, src_nhwc, W, B, Y, dst_nhwc)) return;  // 3x3 stride 1: conv_winograd.h
      break;
    case ConvPath::S2d:  // kernel a whole number of strides: conv_s2d.h
      return s2d_conv_forward(g, X, W, B, Y);
    case ConvPath::SmallOc:  // few output channels, wide kernel: conv_small_oc.h
      return small_oc_conv_forward(g, X, W, B, Y);
    case ConvPath::OneDnn:
      break;
  }
  const std::string key = geom_key(g) + (bias ? "b" : "") + (src_nhwc ? "<nhwc" : "") + (dst_nhwc ? ">nhwc" : "") +
                          (bf16 ? "bf16" : "");
  auto p = conv_cache.get(key, [&] { return make_conv(g, bias != nullptr, src_nhwc, dst_nhwc, bf16); });
  if (p->use_ref) return reference(n, in, out);
  const int64_t HW = numel(Shape(xs.begin() + 2, xs.end()));
  const int64_t OHW = numel(Shape(os.begin() + 2, os.end()));
  memory x_user = mem(p->src_user, in[0]->raw()), x = x_user;
  memory w_user = mem(p->wei_user, in[1]->raw()), w = w_user;
  memory y_user = mem(p->dst_user, out[0]->raw()), y = y_user;
  if (p->r_src) x = mem(p->src, scratch_slot(kSrc).get(p->src.get_size()));
  if (p->r_wei && n.i("constant_weights", 0))
    w = mem(p->wei, weight_cache.get(key, *in[1], p->wei_user, p->wei, p->wei_reorder));
  else if (p->r_wei)
    w = mem(p->wei, scratch_slot(kWei).get(p->wei.get_size()));
  if (p->r_dst) y = mem(p->dst, scratch_slot(kDst).get(p->dst.get_size()));
  try {
    if (p->t_src)
      transpose_planes(in[0]->data<float>(), static_cast<float*>(x.get_data_handle()), g.N, g.C_in, HW);
    else if (p->r_src)
      p->src_reorder.execute(strm(), x_user, x);
    if (p->r_wei && !n.i("constant_weights", 0)) p->wei_reorder.execute(strm(), w_user, w);
  } catch (const dnnl::error& e) {
    fail("node ", n.name, " (", n.op, "): oneDNN reorder failed: ", e.what());
  }
  Args args{{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}};
  if (bias) args.emplace(DNNL_ARG_BIAS, mem(p->bias, bias->raw()));
  execute(n, p->prim, args);
  if (p->t_dst) {
    transpose_planes(static_cast<const float*>(y.get_data_handle()), out[0]->data<float>(), g.N, OHW, g.C_out);
  } else if (p->r_dst) {
    try {
      p->dst_reorder.execute(strm(), y, y_user);
      strm().wait();
    } catch (const dnnl::error& e) {
      fail("node ", n.name, " (", n.op, "): oneDNN reorder failed: ", e.what());
    }
  }
}

void conv_fast(const Node& n, const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) {
  conv_any_fast(n, in, out, false, false);
}

void conv_transpose_fast(const Node& n, const std::vector<const Tensor*>& in,
                         const std::vector<Tensor*>& out) {
  conv_any_fast(n, in, out, true, false);
}

void conv_channels_last_fast(const Node& n, const std::vector<const Tensor*>& in,
                             const std::vector<Tensor*>& out) {
  conv_any_fast(n, in, out, false, true);
}

// ---------------------------------------------------------------- Gelu
// oneDNN's eltwise gelu_erf: max abs error 4e-7 against the exact function on [-6, 6],
// as small as the float rounding of the exported Div/Erf/Add/Mul/Mul subgraph.
PrimCache<dnnl::eltwise_forward> eltwise_cache;

void gelu_fast(const Node& n, const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) {
  if (!all_f32(in, out) || n.s("approximate", "none") != "none" || in[0]->numel() == 0)
    return reference(n, in, out);
  const int64_t N = in[0]->numel();
  memory::desc md = plain_md({N});
  auto p = eltwise_cache.get(str("gelu_erf", N), [&] {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_gelu_erf,
                                  md, 0.f, 0.f);
    return dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(d, eng()));
  });
  execute(n, *p, {{DNNL_ARG_SRC, mem(md, in[0]->raw())}, {DNNL_ARG_DST, mem(md, out[0]->raw())}});
}

// ---------------------------------------------------------------- Softmax
// oneDNN softmax over the (outer, len, inner) view of the tensor around the axis.

void softmax_fast(const Node& n, const std::vector<const Tensor*>& in,
                  const std::vector<Tensor*>& out) {
  const Tensor& x = *in[0];
  if (!all_f32(in, out) || x.numel() == 0) return reference(n, in, out);
  int64_t axis = n.i("axis", -1);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return reference(n, in, out);  // it reports it
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  softmax_lines(n, x.data<float>(), out[0]->data<float>(), outer, x.shape[axis], inner);
}

}  // namespace

void register_dnnl_attention();  // dnnl_attention.cpp

std::string kernel_path_of(const Node& n, const std::vector<Shape>& in) {
  const bool conv = n.op == "Conv" || n.op == "ConvTranspose" || n.op == "ConvChannelsLast";
  if ((!conv && n.op != "Linear") || in.size() < 2 || in[0].empty() || in[1].empty()) return "";
  if (n.op == "Linear") {
    int64_t P, K, Q, N;
    if (!linear_dims(n, in[0], in[1], &P, &K, &Q, &N) || P * K * Q * N == 0) return "reference";
    auto p = linear_prim(n, P, K, Q, N, in.size() > 2 && !in[2].empty());
    return p->use_ref ? "reference" : str("onednn matmul ", p->mm.impl, p->bf16 ? " bf16" : "");
  }
  const bool cl = n.op == "ConvChannelsLast", src_nhwc = cl, dst_nhwc = cl && n.i("channels_last_output", 0);
  if (cl && in[0].size() != 4) return "reference";
  const Shape xs = cl ? Shape{in[0][0], in[0][3], in[0][1], in[0][2]} : in[0];
  const ConvGeom g = conv_geometry(n, xs, in[1], n.op == "ConvTranspose");
  const bool bias = in.size() > 2 && !in[2].empty();
  const ConvPath path = choose_conv_path(n, g, bias, src_nhwc, dst_nhwc, cl);
  if (path == ConvPath::RowsBand) {  // the path of the band's own conv
    const RowRange r = marked_rows(n, g, cl);
    Node m;
    int64_t a = 0, b = 0;
    if (r.lo >= r.hi || !rows_band(n, g, r, &m, &a, &b)) return "rows, whole conv";
    std::vector<Shape> in2 = in;
    in2[0] = {g.N, g.C_in, b - a, g.in[2]};
    return str("rows ", r.lo, "..", r.hi, " by ", kernel_path_of(m, in2));
  }
  if (path != ConvPath::OneDnn) return conv_path_name(path);
  const bool bf16 = runs_bf16(n);
  const std::string key = geom_key(g) + (bias ? "b" : "") + (src_nhwc ? "<nhwc" : "") + (dst_nhwc ? ">nhwc" : "") +
                          (bf16 ? "bf16" : "");
  auto p = conv_cache.get(key, [&] { return make_conv(g, bias, src_nhwc, dst_nhwc, bf16); });
  return p->use_ref ? "reference" : str(conv_path_name(path), " ", p->impl);
}

void register_dnnl_kernels() {
  register_dnnl_attention();
  register_fast_kernel("Gelu", gelu_fast);
  register_fast_kernel("Softmax", softmax_fast);
  register_fast_kernel("MatMul", matmul_fast);
  register_fast_kernel("Gemm", gemm_fast);
  register_fast_kernel("Einsum", einsum_fast);
  register_fast_kernel("Linear", linear_fast);
  register_fast_kernel("Conv", conv_fast);
  register_fast_kernel("ConvTranspose", conv_transpose_fast);
  register_fast_kernel("ConvChannelsLast", conv_channels_last_fast);
}

}  // namespace wxe::cpu
