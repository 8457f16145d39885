// Layer: parallel/ (communicators, mesh, sharding, collectives), over engine/ only.
// Tensor-parallel plan and sharding pass (Megatron style), on a graph after simplify().
//
// Plan: in every attention block to_q, to_k, to_v are column-parallel and to_out row-parallel,
// each rank owning whole heads (heads / tp); in every feed-forward block the up projection
// (layers.1) is column-parallel and the down projection (layers.4) row-parallel; everything
// else is replicated. Found from the Linear nodes' parameter names through the module table
// (engine/ir/module_roles.h); a plan file can override it. In a training graph that keeps
// spectral norm, the 1x1 Convs whose weight is a SpectralNorm output are layers too, keyed by
// their `X.weight_orig`: the fused to_qkv column-parallel by heads (rank r keeps head block r
// of each of q, k and v: TensorSlice groups 3), to_out and layers.4 row-parallel, layers.1
// column-parallel; their SpectralNorm becomes SpectralNormTP (parallel/collective_ops.h) on
// the rank's block, and the Slices that take q, k and v from the sharded qkv output take the
// rank's part of each.
//
// Sharding for tp rank r of T: column-parallel weights keep rows [r N/T, (r+1) N/T) (and
// their bias), row-parallel weights keep the matching columns, and an all-reduce over tp
// (op "AllReduceTP") follows each row-parallel Linear, its bias added after the sum. Between
// the two, the sharded channel axis is followed through the graph: Reshape targets, Transpose
// permutations, Einsum letters and broadcast constants (the position bias, per head) are
// adjusted so each rank computes its own heads. Nothing else communicates in the forward pass.
//
// Training (shard_training_graph): the same, plus the conjugate collective on the way in: a
// "CopyToTP" node (forward identity, backward all-reduce) on every replicated float tensor that
// enters the sharded region (the input of the column-parallel layers, shared by to_q/to_k/to_v;
// the position bias added to every head), so replicated parameters get whole gradients on
// every rank and sharded ones the gradient of their slice.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/io/safetensors.h"

namespace wxe {

enum class TpSplit { Replicate, Column, Row };
const char* split_name(TpSplit s);

struct TpPlan {
  std::map<std::string, TpSplit> by_weight;  // Linear weight name -> split (absent: replicate)
};

// The discovered plan: Linear nodes (and, in a training graph, spectral-norm 1x1 Convs) whose
// weight's module has a projection role in the module table (engine/ir/module_roles.h; CREDIT's is
// models/credit_modules.h): q, k, v, fused qkv and ffn-up column-parallel, out and ffn-down
// row-parallel.
TpPlan discover_plan(const Graph& g);

// A JSON object {"pattern": "colwise" | "rowwise" | "replicate", ...}; patterns (engine/io/glob.h) match Linear
// weight names, '*' matching any run of characters; later entries win. Entries matching no
// Linear weight are an error naming them.
void apply_plan_file(TpPlan& plan, const Graph& g, const std::string& path);

struct ShardStats {
  int column = 0, row = 0, all_reduces = 0;
  size_t param_bytes_full = 0;  // every parameter, unsharded
  size_t param_bytes_rank = 0;  // what this rank holds
  int copies = 0;               // CopyToTP nodes (shard_training_graph)
  int spectral_norms = 0;       // SpectralNormTP nodes (sharded spectral-norm convs, training)
};

// Rewrites g for tp rank `tp_rank` of `tp`. Heads or widths that tp does not divide, or a
// node the sharded axis cannot pass through, are one error naming the block and node.
ShardStats shard_graph(Graph& g, const TpPlan& plan, int tp, int tp_rank);

// shard_graph for a training graph (engine/passes/passes.h prepare_training_graph: parameters are
// named leaves, the position-bias MLP is live), plus one CopyToTP per distinct replicated
// tensor entering the sharded region (stats.copies). Sharded parameters keep their names and
// are exactly those parameter_slices() lists (checked); parameters keep their shapes (a
// row-parallel bias is reshaped by a node, not in storage). No node output is left with a
// constant payload, so nothing a parameter feeds is frozen. Run the result with the thread's
// tp communicator set (collective_ops.h).
ShardStats shard_training_graph(Graph& g, const TpPlan& plan, int tp, int tp_rank);

// What tp rank `tp_rank` of `tp` keeps of each sharded parameter of `full` (a graph before
// sharding, with its Linear nodes): column-parallel weights and their biases block tp_rank of
// tp along axis 0, row-parallel weights along axis 1. A column-parallel layer's bias is its
// Linear's third input, or the parameter an Add puts on its output right after (exporters
// write MatMul + Add). Parameters not listed are replicated. Empty for tp 1. The slices the
// checkpoint reader (read_safetensors) and a sharded optimizer state use.
std::map<std::string, TensorSlice> parameter_slices(const TpPlan& plan, const Graph& full, int tp, int tp_rank);

// The plan, less the blocks that cannot be sharded over tp (fewer heads than tp, a width tp
// does not divide, a node the sharded axis cannot pass through): each such CREDIT block's
// layers are set to replicate and its name appended to `replicated`. Errors outside any
// block, or in a block with nothing left to replicate, are thrown as they are.
TpPlan fit_plan(const Graph& g, TpPlan plan, int tp, bool training, std::vector<std::string>* replicated = nullptr);
// Appends to `out` a CopyToTP node (forward identity, backward sum over tp) of value v, named
// after its reader; returns its output value ("<v>_copy_to_tp").
int add_copy_to_tp(Graph& g, std::vector<Node>& out, int v, const std::string& reader);
// Elementwise ops (with broadcasting) that a sharded axis passes through.
bool elementwise_op(const std::string& op);
// The letters of each Einsum operand and of the output (spaces dropped); an error without "->".
std::vector<std::string> einsum_terms(const Node& n);
// Parameter bytes of the graph (constants marked is_param that some node reads).
size_t param_bytes(const Graph& g);

}  // namespace wxe
