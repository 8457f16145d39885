// SpectralNorm (wxe op): PyTorch's torch.nn.utils.spectral_norm in train mode, as one node.
//
//   inputs   weight_orig (rank >= 1, float32), u (rows), v (cols)
//   attrs    dim (0 or 1, default 0; ConvTranspose weights use 1), power_iterations (default 0),
//            eps (default 1e-12)
//   output   W, shaped like weight_orig
//
// W_mat is weight_orig with dimension `dim` moved first, reshaped to (rows, cols). The forward
// runs `power_iterations` steps of { v = normalize(W_mat^T u); u = normalize(W_mat v) } with
// normalize(x) = x / max(||x||_2, eps), writing u and v back into their input tensors, then
// sigma = u . (W_mat v) (double accumulation, rounded to float) and W = weight_orig / sigma.
// With power_iterations 0 this is the eval-mode fold (engine/passes/layout_rules.h fold_spectral_norm).
// The backward treats u and v as constants (PyTorch detaches them):
//   dL/dweight_orig = (g - sum(g * W) * u v^T) / sigma, u v^T laid out like weight_orig.
// The math is engine/math/spectral_norm_math.h, shared with SpectralNormTP.
#include <algorithm>

#include "engine/ir/ops.h"
#include "engine/passes/passes.h"
#include "engine/math/spectral_norm_math.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

namespace {

// The geometry of weight_orig (engine/math/spectral_norm_math.h), after checking dim.
sn::Geometry sn_dims(const Node& n, const Shape& w) {
  const int64_t dim = n.i("dim", 0);
  NCHECK(dim == 0 || dim == 1, "dim must be 0 or 1, got ", dim);
  NCHECK(!w.empty(), "weight_orig must have rank >= 1");
  NCHECK(dim < (int64_t)w.size(), "dim ", dim, " out of range for weight_orig ", shape_str(w));
  return sn::geometry((int)dim, w);
}

std::vector<TypeShape> spectral_norm_shape(const Node& n, const Values& in) {
  NCHECK(in.size() == 3 && in[0] && in[1] && in[2], "expects inputs weight_orig, u, v");
  const Value &w = *in[0], &u = *in[1], &v = *in[2];
  for (const Value* t : {&w, &u, &v})
    NCHECK(t->dtype == DType::F32, "input '", t->name, "' must be float32, got ", dtype_name(t->dtype));
  const sn::Geometry d = sn_dims(n, w.shape);
  NCHECK(n.i("power_iterations", 0) >= 0, "power_iterations must be >= 0, got ",
         n.i("power_iterations", 0));
  NCHECK(n.f("eps", 1e-12f) > 0, "eps must be > 0, got ", n.f("eps", 1e-12f));
  NCHECK(u.shape == Shape{d.rows} && v.shape == Shape{d.cols}, "u ", shape_str(u.shape), " / v ",
         shape_str(v.shape), " do not fit weight_orig ", shape_str(w.shape), " at dim ", d.dim,
         ": expected (", d.rows, ") and (", d.cols, ")");
  return {{DType::F32, w.shape}};
}

void spectral_norm_kernel(const Node& n, const Ins& in, const Outs& out) {
  // u and v are buffers this op owns (PyTorch's weight_u / weight_v): the power iteration
  // updates them in place, and the training executor shares their storage with the graph so
  // the next forward starts from the updated vectors. Hence the const_cast.
  sn::forward(sn_dims(n, in[0]->shape), n.i("power_iterations", 0), n.f("eps", 1e-12f), in[0]->data<float>(),
              const_cast<Tensor*>(in[1])->data<float>(), const_cast<Tensor*>(in[2])->data<float>(),
              out[0]->data<float>(), in[0]->numel(), sn::NoSum());
}

// gin[0] with the u, v the forward left in its inputs; u and v get no gradient (zero when asked).
void spectral_norm_backward(const Node& n, const Ins& in, const Ins& out, const Ins& gout,
                            const Outs& gin) {
  for (size_t i = 1; i < 3 && i < gin.size(); ++i)
    if (gin[i]) std::fill(gin[i]->data<float>(), gin[i]->data<float>() + gin[i]->numel(), 0.f);
  if (!gin[0]) return;
  const bool g = gout[0] != nullptr;
  sn::backward(sn_dims(n, in[0]->shape), in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(),
               g ? out[0]->data<float>() : nullptr, g ? gout[0]->data<float>() : nullptr, gin[0]->data<float>(),
               in[0]->numel(), sn::NoSum());
}

}  // namespace

// Called from register_layer_backward() (backward_layers.cpp).
void register_spectral_norm() {
  register_op("SpectralNorm", spectral_norm_shape, spectral_norm_kernel);
  register_backward("SpectralNorm", spectral_norm_backward);
  register_updates_inputs("SpectralNorm");
}

}  // namespace wxe::cpu
