// Reading an op's inputs in shape rules (Values) and kernels (Ins): optional inputs, constant
// contents, axes. Shared by the CPU data-movement kernels (data_ops.cpp, resize.cpp).
#pragma once
#include <set>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

inline const Value* opt_v(const Values& in, size_t i) { return i < in.size() ? in[i] : nullptr; }
inline const Tensor* opt_t(const Ins& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

inline const Value& req_v(const Node& n, const Values& in, size_t i) {
  NCHECK(i < in.size() && in[i], "missing input ", i);
  return *in[i];
}

// An optional input that is present and not an empty tensor.
inline bool given_v(const Values& in, size_t i) {
  const Value* v = opt_v(in, i);
  if (!v) return false;
  if (v->is_const()) return v->constant->numel() > 0;
  return !(v->shape_known && numel(v->shape) == 0);
}
inline bool given_t(const Ins& in, size_t i) {
  const Tensor* t = opt_t(in, i);
  return t && t->numel() > 0;
}

// Constant int64 contents of optional input i ({} when absent or empty).
inline std::vector<int64_t> opt_const_ints(const Node& n, const Values& in, size_t i) {
  if (!given_v(in, i)) return {};
  return const_ints(n, in, i);
}
inline std::vector<int64_t> opt_ints(const Ins& in, size_t i) {
  if (!given_t(in, i)) return {};
  return in[i]->to_i64();
}

inline std::vector<float> const_floats(const Node& n, const Values& in, size_t i) {
  const Value& v = req_v(n, in, i);
  NCHECK(v.is_const(), "input ", i, " ('", v.name, "') must be known before running the graph");
  Tensor f = v.constant->to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}
inline std::vector<float> floats_of(const Tensor& t) {
  Tensor f = t.to_f32();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// Normalizes a list of axes against rank r; rejects out-of-range and repeated axes.
inline std::vector<int64_t> norm_axes(const Node& n, std::vector<int64_t> axes, int64_t r) {
  std::set<int64_t> seen;
  for (auto& a : axes) {
    a = norm_axis(a, r, n);
    NCHECK(seen.insert(a).second, "axis ", a, " repeated");
  }
  return axes;
}

}  // namespace wxe::cpu
