// ONNX ModelProto -> wxe Graph.
#pragma once
#include <string>

#include "engine/graph.h"

namespace wxe {

// Reads an .onnx file (external data resolved relative to the file). Constant nodes and
// initializers become constant values; initializers become parameters (is_param).
// Fails with one line naming the file for malformed or truncated files, and, before any
// other work, with one line listing every unsupported op type (one node name each).
Graph import_onnx(const std::string& path);

}  // namespace wxe
