// SpectralNormTP: the SpectralNorm op (kernels/cpu/spectral_norm.cpp) on a tensor-parallel
// rank's block of weight_orig, with sigma and the power iteration of the whole (unsharded)
// matrix, summed over the thread's tp communicator (collective_ops.h).
//
//   inputs   weight_orig block: block `index` of `parts` along weight axis `axis` (0 or 1),
//            within each of `groups` equal groups of that axis (engine/io/safetensors.h
//            TensorSlice); u (rows of the whole W_mat), v (cols of the whole W_mat)
//   attrs    dim, power_iterations, eps as SpectralNorm; axis, parts, index, groups
//   output   this rank's block of W = weight_orig / sigma
//
// u and v stay whole and replicated: every rank holds the same vectors, updated in place by the
// same sums, so the checkpoint saves them as the unsharded run has them. Each product over the
// matrix is this rank's part, written into a whole-length vector (zero where another rank's
// rows or columns go) and summed over tp: W_mat^T u and W_mat v whatever the split (for a row
// block W^T u is a sum over the blocks and W v a concatenation; for a column block the
// other way round). The backward (u, v constants, as in PyTorch):
//   dL/dweight_orig = (g - sum(g * W) * u v^T) / sigma, with sum(g * W) summed over tp.
// Every rank reaches the same collectives in the same order (1 + 2 * power_iterations in the
// forward, 2 in the backward).
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/ir/ops.h"
#include "engine/passes/passes.h"
#include "engine/math/spectral_norm_math.h"
#include "parallel/collective_ops.h"

namespace wxe {

namespace {

#define NCHECK(cond, ...) WXE_CHECK(cond, "node ", n.name, " (", n.op, "): ", __VA_ARGS__)

// The block's geometry (engine/math/spectral_norm_math.h), after checking the attributes.
sn::Geometry tp_sn_dims(const Node& n, const Shape& block) {
  const int64_t dim = n.i("dim", 0), axis = n.i("axis", 0), parts = n.i("parts", 1), index = n.i("index", 0),
                groups = n.i("groups", 1);
  NCHECK(dim == 0 || dim == 1, "dim must be 0 or 1, got ", dim);
  NCHECK(axis == 0 || axis == 1, "axis must be 0 or 1, got ", axis);
  NCHECK(parts >= 1 && index >= 0 && index < parts && groups >= 1, "bad block ", index, " of ", parts, " in ", groups,
         " groups");
  NCHECK((int64_t)block.size() > std::max(dim, axis), "weight_orig ", shape_str(block), " has no axis ",
         std::max(dim, axis));
  NCHECK(block[axis] % groups == 0, "block ", shape_str(block), " does not split in ", groups, " groups along axis ",
         axis);
  return sn::geometry((int)dim, block, (int)axis, parts, index, groups);
}

// In place over the tp group (none, or a group of one: nothing to add).
void sum_over_tp(std::vector<double>& x) {
  Communicator* tp = tp_communicator();
  if (!tp || tp->size() <= 1) return;
  Tensor t(DType::F64, {(int64_t)x.size()});
  std::memcpy(t.raw(), x.data(), x.size() * sizeof(double));
  tp->all_reduce_sum(t);
  std::memcpy(x.data(), t.raw(), x.size() * sizeof(double));
}

std::vector<TypeShape> shape_rule(const Node& n, const std::vector<const Value*>& in) {
  NCHECK(in.size() == 3 && in[0] && in[1] && in[2], "expects inputs weight_orig, u, v");
  for (const Value* t : in)
    NCHECK(t->dtype == DType::F32, "input '", t->name, "' must be float32, got ", dtype_name(t->dtype));
  const sn::Geometry d = tp_sn_dims(n, in[0]->shape);
  NCHECK(in[1]->shape == Shape{d.rows} && in[2]->shape == Shape{d.cols}, "u ", shape_str(in[1]->shape), " / v ",
         shape_str(in[2]->shape), " do not fit the whole weight_orig of block ", shape_str(in[0]->shape),
         ": expected (", d.rows, ") and (", d.cols, ")");
  return {{DType::F32, in[0]->shape}};
}

void forward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  // u and v are the op's buffers, updated in place (as SpectralNorm's)
  sn::forward(tp_sn_dims(n, in[0]->shape), n.i("power_iterations", 0), n.f("eps", 1e-12f), in[0]->data<float>(),
              const_cast<Tensor*>(in[1])->data<float>(), const_cast<Tensor*>(in[2])->data<float>(),
              out[0]->data<float>(), in[0]->numel(), sum_over_tp);
}

void backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& out,
              const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  for (size_t i = 1; i < 3 && i < gin.size(); ++i)
    if (gin[i]) std::fill(gin[i]->data<float>(), gin[i]->data<float>() + gin[i]->numel(), 0.f);
  // every rank takes part in the sums, whether or not it has a gradient to give
  const bool g = gout[0] != nullptr;
  sn::backward(tp_sn_dims(n, in[0]->shape), in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(),
               g ? out[0]->data<float>() : nullptr, g ? gout[0]->data<float>() : nullptr,
               gin[0] ? gin[0]->data<float>() : nullptr, in[0]->numel(), sum_over_tp);
}

#undef NCHECK

}  // namespace

void register_spectral_norm_tp() {
  register_op("SpectralNormTP", shape_rule, forward);
  register_backward("SpectralNormTP", backward);
  register_updates_inputs("SpectralNormTP");
}

}  // namespace wxe
