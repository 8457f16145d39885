// Private helpers shared by linalg.cpp, conv.cpp and dnnl.cpp (not part of the engine API):
// the Einsum equation parser and the Conv / ConvTranspose geometry (ONNX attribute rules),
// so the reference kernels, the shape rules and the oneDNN fast path read attributes the
// same way.
#pragma once
#include <string>
#include <vector>

#include "engine/ops.h"

namespace wxe::cpu {

// Fails naming the node unless every present input is float32.
inline void require_f32(const Node& n, const std::vector<const Tensor*>& in) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i])
      WXE_CHECK(in[i]->dtype == DType::F32, "node ", n.name, " (", n.op, "): input ", i,
                " is ", dtype_name(in[i]->dtype), ", only float32 is supported");
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

}  // namespace wxe::cpu
