// Layer: importers/ (ONNX and PyTorch files in), over engine/ only.
// ONNX ModelProto -> wxe Graph.
#pragma once
#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace wxe {

// Reads an .onnx file (external data resolved relative to the file). Constant nodes and
// initializers become constant values; initializers become parameters (is_param).
// Fails with one line naming the file for malformed or truncated files, and, before any
// other work, with one line listing every unsupported op type (one node name each).
// External data is read only from regular files inside the model's directory (symlinks
// resolved). Every node's inputs and outputs are checked against its op (count, required ones
// non-empty); wxe's own ops (Linear, WindowAttention, ...) are not accepted from a file.
Graph import_onnx(const std::string& path);

// The ONNX op types import_onnx accepts (those with an arity rule).
std::vector<std::string> onnx_importable_ops();

}  // namespace wxe
