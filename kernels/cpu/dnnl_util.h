// Private helpers shared by the CPU kernels (not part of the engine API): the Einsum
// equation parser and the Conv / ConvTranspose geometry (ONNX attribute rules), so the
// reference kernels, the shape rules and the oneDNN fast path read attributes the same way;
// and the oneDNN plumbing (engine, stream, primitive cache, scratch buffers, matmul
// primitives) that the forward fast path (dnnl.cpp) and the backward kernels
// (backward_conv.cpp, backward_layers.cpp) share. Definitions in dnnl_util.cpp.
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/ir/ops.h"

namespace wxe::cpu {

// Fails naming the node unless every present input is float32.
inline void require_f32(const Node& n, const std::vector<const Tensor*>& in) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i])
      WXE_CHECK(in[i]->dtype == DType::F32, "node ", n.name, " (", n.op, "): input ", i,
                " is ", dtype_name(in[i]->dtype), ", only float32 is supported");
}

// The op's reference kernel (what the fast path runs on what it does not take).
inline void reference(const Node& n, const std::vector<const Tensor*>& in,
               const std::vector<Tensor*>& out) {
  kernel_for(n.op, KernelKind::Reference)(n, in, out);
}

// Every present input and every output is float32.
inline bool all_f32(const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  for (auto* t : in)
    if (t && t->dtype != DType::F32) return false;
  for (auto* t : out)
    if (t->dtype != DType::F32) return false;
  return true;
}

// A float's bits: an exact attribute value for cache keys.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- Einsum (linalg.cpp) ----
// A parsed equation: one subscript string per operand and the output subscripts (the
// implicit output of an equation without "->" is filled in: letters appearing exactly once,
// in ASCII order). Spaces are dropped. Ellipsis and other characters are errors.
struct EinsumEq {
  std::vector<std::string> in;
  std::string out;
};
EinsumEq parse_einsum(const Node& n, size_t num_inputs);

// ---- Conv / ConvTranspose geometry (conv.cpp) ----
// Spatial quantities are stored right-aligned in arrays of 3: for a 2-D conv index 0 is a
// dummy axis (in = out = k = s = d = 1, pads 0), 1 is H, 2 is W. ConvTranspose pads may be
// negative (output_shape larger than the natural size).
struct ConvGeom {
  int nsp = 0;  // spatial rank, 1..3
  bool transpose = false;
  int64_t N = 0, C_in = 0, C_out = 0, group = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
  int first() const { return 3 - nsp; }  // index of the first real spatial axis
  Shape out_shape() const {
    Shape o{N, C_out};
    for (int i = first(); i < 3; ++i) o.push_back(out[i]);
    return o;
  }
};
// Validates shapes/attributes (x: (N, C, spatial...), w: Conv (C_out, C_in/group, k...),
// ConvTranspose (C_in, C_out/group, k...)) and resolves auto_pad / output_shape.
ConvGeom conv_geometry(const Node& n, const Shape& x, const Shape& w, bool transpose);

// Window attributes shared by Conv and the pools: the int list `name` of `len` values
// (default `def` each); auto_pad (NOTSET when absent or empty), one of ONNX's four; the
// SAME_UPPER / SAME_LOWER pads (begin, end) of one axis, `total` of them split with the odd
// one at the end (upper) or the beginning (lower).
std::vector<int64_t> ints_attr(const Node& n, const char* name, size_t len, int64_t def);
std::string auto_pad_of(const Node& n);
void split_same_pads(int64_t total, bool upper, int64_t* begin, int64_t* end);
// The begin/end pads of one spatial axis of a sliding window (Conv, pooling) of extent
// (k - 1) * d + 1: auto_pad NOTSET takes `begin`/`end` (negative: an error naming the node as
// `op`); SAME_UPPER/SAME_LOWER pad so that the output is ceil(in / stride); VALID leaves them.
void window_pads(const Node& n, const std::string& op, const std::string& auto_pad, int64_t begin, int64_t end,
                 int64_t in, int64_t stride, int64_t extent, int64_t* pb, int64_t* pe);

// ---- oneDNN (2.6) plumbing ----
// One CPU engine and one in-order stream for the whole process (the CPU runtime is OpenMP,
// so oneDNN uses omp_get_max_threads() threads); every execution waits on the stream.
namespace onednn {

using dnnl::memory;
using Dims = memory::dims;
using dt = memory::data_type;
using Args = std::unordered_map<int, memory>;

dnnl::engine& eng();
dnnl::stream& strm();

// A memory object over caller-owned data (no copy).
inline memory mem(const memory::desc& md, const void* p) { return memory(md, eng(), const_cast<void*>(p)); }

// Row-major float32 desc of these dims.
inline memory::desc plain_md(const Dims& dims) {
  return memory::desc(dims, dt::f32, Dims(strides_of(Shape(dims.begin(), dims.end()))));
}

// The reorder primitive copying memory of layout `from` into layout `to` (throws dnnl::error
// when oneDNN has none).
inline dnnl::reorder reorder_of(const memory::desc& from, const memory::desc& to) {
  return dnnl::reorder(dnnl::reorder::primitive_desc(eng(), from, eng(), to));
}

// Runs p and waits; a oneDNN error fails naming the node.
void execute(const Node& n, const dnnl::primitive& p, const Args& args);

// String -> cached object (primitive + descs). Creation happens outside the lock; if two
// threads race on a new key both build it and the first insertion wins. Bounded: a model
// has far fewer keys than kMaxEntries.
template <class T>
class PrimCache {
 public:
  template <class Make>
  std::shared_ptr<const T> get(const std::string& key, Make make) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    auto p = std::make_shared<const T>(make());
    std::lock_guard<std::mutex> lk(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    return map_.emplace(key, std::move(p)).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const T>> map_;
};

// A cache entry that says "run the reference kernel" (T has a bool use_ref).
template <class T>
T ref_only() {
  T t;
  t.use_ref = true;
  return t;
}

// Per-thread scratch (staged operands, reordered weights, blocked activations): a kernel call
// finishes before its thread runs the next one, so each thread reuses its buffers (grown on
// demand, never shrunk; page-faulting fresh buffers on every call cost more than some of the
// convolutions). 64-byte aligned.
struct Scratch {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> p;
  size_t cap = 0;
  void* get(size_t bytes) {
    if (bytes > cap) {
      p.reset();
      void* q = nullptr;
      WXE_ASSERT(posix_memalign(&q, 64, std::max<size_t>(bytes, 64)) == 0);
      p.reset(q);
      cap = bytes;
    }
    return p.get();
  }
  float* floats(int64_t count) { return static_cast<float*>(get((size_t)count * sizeof(float))); }
};

// A matmul primitive on descs given by the caller (strided descs express transposes and
// broadcast batch dims). use_ref when oneDNN cannot create it; impl names oneDNN's kernel
// ("ref..." is its slow reference one).
struct MatMulPrim {
  bool use_ref = false;
  dnnl::matmul prim;
  memory::desc src, wei, bias, dst;
  std::string impl;
};

MatMulPrim make_matmul(const memory::desc& src, const memory::desc& wei, const memory::desc* bias,
                       const memory::desc& dst, const dnnl::primitive_attr& attr = {});

// f as bfloat16 bits: round to nearest even, NaN kept NaN (oneDNN's f32 -> bf16 rounding).
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return (uint16_t)(nan ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// dst[i] = bf16_bits(src[i]) for i < count; parallel over large arrays.
void to_bf16(const float* src, int64_t count, uint16_t* dst);

// Softmax over the middle axis of (outer, len, inner) float32 data on oneDNN (src == dst allowed),
// the primitive cached per shape: the Softmax op's fast kernel and the window attention's
// backward, which makes the forward's rows again.
void softmax_lines(const Node& n, const float* src, float* dst, int64_t outer, int64_t len, int64_t inner);

// The thread's scratch buffers, one pool for every kernel (scratch_slot(i), i < kScratchSlots):
// kernels run one at a time on a thread, so they take the same slots and the pool holds the
// largest need of any one kernel, not the sum over kernels (wxformer_v2026's training step: 226
// MB of per-kernel buffers before). A kernel must not call another that takes slots while it
// still reads its own.
constexpr int kScratchSlots = 6;
Scratch& scratch_slot(int i);

}  // namespace onednn

}  // namespace wxe::cpu
