// The one rule table from CREDIT's legacy layout (1x1 Conv2d projections, fused to_qkv,
// spectral norm weight_orig/u/v) to the Linear layout (CREDIT's nextgen_wxformer naming):
//   X.weight_orig, X.weight_u, X.weight_v -> X.weight = weight_orig / (u . (W_mat v))
//   M.to_qkv.weight (3I, D, 1, 1)         -> M.to_q.weight, M.to_k.weight, M.to_v.weight (I, D)
//   M.to_out.weight (D, I, 1, 1)          -> (D, I)
//   M.layers.1.weight (4D, D, 1, 1)       -> (4D, D)   (feed-forward up)
//   M.layers.4.weight (D, 4D, 1, 1)       -> (D, 4D)   (feed-forward down)
//   everything else unchanged.
// Spectral norm is folded on the fused qkv matrix first and split second. Checkpoint
// conversion (convert_state_dict) and the graph rewrite (passes: rewrite_linear_layout) both
// call these functions, so their names, shapes and values agree.
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

namespace layout {

// "a.b.to_qkv.weight" -> "a.b.to_qkv"; "x" -> ""
std::string module_of(const std::string& tensor_name);
bool is_qkv_module(const std::string& module);     // ends with ".to_qkv" (or is "to_qkv")
bool is_linear_module(const std::string& module);  // ".to_out", ".layers.1", ".layers.4"
// "M.to_qkv" -> {"M.to_q", "M.to_k", "M.to_v"}
std::array<std::string, 3> qkv_modules(const std::string& qkv_module);

// PyTorch eval-mode spectral norm: W = w_orig / (u . (W_mat v)), W_mat = w_orig reshaped to
// (rows, -1) after moving dim `dim` first (dim 0; ConvTranspose uses dim 1). `dim` < 0 picks
// it from the sizes of u and v, and where both fit, from which W_mat v is parallel to u (the
// power iteration leaves u = normalize(W_mat v)). `name` is for errors.
Tensor fold_spectral_norm(const Tensor& w_orig, const Tensor& u, const Tensor& v,
                          const std::string& name, int dim = -1);
// (3I, D[, 1, 1]) -> three (I, D) blocks [q | k | v]; a 1-D bias (3I) -> three (I).
std::array<Tensor, 3> split_qkv(const Tensor& w, const std::string& name);
// (O, I, 1, 1) -> (O, I); 2-D passes through.
Tensor conv1x1_to_linear(const Tensor& w, const std::string& name);

// CREDIT's DynamicPositionBias input: the relative positions of a window of w+1 tokens,
// [[i, j] for i in -w..w for j in -w..w] as float (rows, 2). Empty unless rows = (2w+1)^2.
Tensor position_bias_grid(int64_t rows);

struct ConvertReport {
  int tensors_in = 0, tensors_out = 0;
  int spectral_norm_folded = 0, qkv_split = 0, reshaped = 0;
  size_t bytes_out = 0;
};

// Applies the table to a state dict. Idempotent: a converted dict comes back unchanged.
// With keep_spectral_norm (training), modules with spectral norm keep their legacy tensors
// (weight_orig, weight_u, weight_v and their bias, unsplit and unreshaped): the training graph
// keeps them as SpectralNorm + Conv; the other modules take the Linear layout.
NamedTensors convert_state_dict(const NamedTensors& in, ConvertReport* report = nullptr,
                                bool keep_spectral_norm = false);

// The inverse, back to CREDIT's legacy layout: M.to_q/to_k/to_v (weights (I, D) and biases)
// concatenated into M.to_qkv ([q | k | v], weight (3I, D, 1, 1)); 2-D to_out and feed-forward
// weights to (O, I, 1, 1); spectral-norm tensors and everything else unchanged. The first
// occurrence of a group keeps its position. convert_state_dict(to_legacy_state_dict(x)) == x.
NamedTensors to_legacy_state_dict(const NamedTensors& linear_layout);

}  // namespace layout
}  // namespace wxe
