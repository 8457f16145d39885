// What backward_pointwise.cpp (the elementwise ops, the table and registration) and
// backward_movement.cpp (the shape and data ops) share: the gradient lists, the check every
// kernel runs behind, and the data-movement kernels the table registers. kernels/cpu only.
#pragma once
#include <cstring>
#include <vector>

#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_ops.h"  // Ins, NCHECK

namespace wxe::cpu::pointwise_bw {

using Gouts = std::vector<const Tensor*>;
using Gins = std::vector<Tensor*>;

constexpr int64_t kParallelMin = 1 << 15;  // elements; below this OpenMP costs more than it saves

inline void zero(Tensor* t) {
  if (t && t->nbytes()) std::memset(t->raw(), 0, t->nbytes());
}

inline void zero_from(const Gins& gin, size_t first) {
  for (size_t i = first; i < gin.size(); ++i) zero(gin[i]);
}

// Checks the gradient tensors, then runs F. When no output has a gradient every input
// gradient is zero, so F may assume gout[0] is set for single-output ops.
template <BackwardFn F>
void checked(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  bool want = false;
  for (size_t i = 0; i < gin.size(); ++i) {
    if (!gin[i]) continue;
    NCHECK(i < in.size() && in[i], "gradient asked for omitted input ", i);
    NCHECK(gin[i]->dtype == DType::F32 && gin[i]->numel() == in[i]->numel(), "gradient of input ", i,
           " must be float32 ", shape_str(in[i]->shape), ", got ", dtype_name(gin[i]->dtype), " ",
           shape_str(gin[i]->shape));
    want = true;
  }
  if (!want) return;
  bool any = false;
  for (size_t k = 0; k < gout.size(); ++k) {
    if (!gout[k]) continue;
    NCHECK(k < out.size() && out[k], "gradient given for absent output ", k);
    NCHECK(gout[k]->dtype == DType::F32 && gout[k]->numel() == out[k]->numel(),
           "gradient of output ", k, " must be float32 ", shape_str(out[k]->shape), ", got ",
           dtype_name(gout[k]->dtype), " ", shape_str(gout[k]->shape));
    any = true;
  }
  if (!any) {
    zero_from(gin, 0);
    return;
  }
  F(n, in, out, gout, gin);
}

// Data movement through the forward kernel's source map (backward_movement.cpp).

// Input gradients of op n from its output gradients. `data` lists the inputs whose elements
// the outputs copy; the others (indices, pads, repeats, ...) pass to the forward unchanged.
// Element e of data input data[j] is numbered first[j] + e, from 1; 0 marks an output element
// that copies no input element (Pad's constant), whose gradients sum into *gconst.
// `injective`: no two output elements copy the same input element (parallel scatter).
void scatter_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin,
                const std::vector<int>& data, bool injective, double* gconst = nullptr);

template <bool INJECTIVE>
void first_input_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin) {
  scatter_bw(n, in, out, gout, gin, {0}, INJECTIVE);
}

void concat_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void scatternd_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void pad_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void resize_bw(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);

// Their fast paths.
void transpose_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void concat_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void plane_gather_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void depth_to_space_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);
void slice_bw_fast(const Node& n, const Ins& in, const Ins&, const Gouts& gout, const Gins& gin);
void resize_bw_fast(const Node& n, const Ins& in, const Ins& out, const Gouts& gout, const Gins& gin);

}  // namespace wxe::cpu::pointwise_bw
