// Helpers the pass files share (engine/passes/*.cpp only; the passes' API is passes.h).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace wxe::pass_util {

const std::string kOrig = ".weight_orig";

// Infers shapes node by node and evaluates nodes whose inputs are known and that `may_fold`
// (node index, node) allows; with `drop` such nodes are removed (their outputs become
// constants), otherwise they stay in the graph and their outputs' values are merely known
// (shape inference with data propagation). With `only` set, nodes it rejects are neither
// folded nor shape-inferred. Ops that update their inputs in place are never evaluated.
void propagate(Graph& g, bool drop, const std::function<bool(size_t, const Node&)>& may_fold, bool only = false);

// An initializer whose name says nothing of the module it belongs to: the TorchScript
// exporter's "onnx::Mul_123", the dynamo exporter's folded constants ("div_12", "val_7",
// "linear_4"). Module parameters are named by their path ("layers.0.to_out.bias").
bool anonymous_name(const std::string& n);

// "col_attn_1.norm_1.weight" -> "col_attn.norm.weight": the TorchScript exporter scopes the
// second call of a module "<name>_1" (a frames-2 model calls its level embedding once a frame).
std::string collapse_repeated_calls(const std::string& name);

// t (R, C) -> t^T (C, R)
Tensor transpose_2d(const Tensor& t);

// nn.Linear as torch.onnx.export writes it: MatMul(x, W^T) with W^T an exporter-made
// constant, in the scope of a projection module M (nextgen_wxformer's to_q/k/v/out and
// feed-forward). It becomes Linear(x, M<leaf>) over the last axis, appended to `out` (leaf:
// ".weight", or nn.MultiheadAttention's ".in_proj_weight" / ".out_proj.weight"). With
// `converted` (exported constant -> its parameter), a constant read by several MatMuls (a
// module called once per frame) becomes one parameter. Returns false if n is not such a node.
bool matmul_to_linear(Graph& g, Node& n, std::vector<Node>& out, const std::string& leaf = ".weight",
                      std::map<int, int>* converted = nullptr);

}  // namespace wxe::pass_util
