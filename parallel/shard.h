// Tensor-parallel plan and sharding pass (Megatron style), on a graph after simplify().
//
// Plan: in every attention block to_q, to_k, to_v are column-parallel and to_out row-parallel,
// each rank owning whole heads (heads / tp); in every feed-forward block the up projection
// (layers.1) is column-parallel and the down projection (layers.4) row-parallel; everything
// else is replicated. Found from the Linear nodes' parameter names (engine/layout_rules.h);
// a plan file can override it.
//
// Sharding for tp rank r of T: column-parallel weights keep rows [r N/T, (r+1) N/T) (and
// their bias), row-parallel weights keep the matching columns, and an all-reduce over tp
// (op "AllReduceTP") follows each row-parallel Linear, its bias added after the sum. Between
// the two, the sharded channel axis is followed through the graph: Reshape targets, Transpose
// permutations, Einsum letters and broadcast constants (the position bias, per head) are
// adjusted so each rank computes its own heads. Nothing else communicates in the forward pass.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/graph.h"

namespace wxe {

enum class TpSplit { Replicate, Column, Row };
const char* split_name(TpSplit s);

struct TpPlan {
  std::map<std::string, TpSplit> by_weight;  // Linear weight name -> split (absent: replicate)
};

// The discovered plan: Linear nodes whose weights are named <block>.to_q/to_k/to_v/to_out
// .weight or <block>.layers.1/layers.4.weight (feed-forward).
TpPlan discover_plan(const Graph& g);

// A JSON object {"pattern": "colwise" | "rowwise" | "replicate", ...}; patterns match Linear
// weight names, '*' matching any run of characters; later entries win. Entries matching no
// Linear weight are an error naming them.
void apply_plan_file(TpPlan& plan, const Graph& g, const std::string& path);

struct ShardStats {
  int column = 0, row = 0, all_reduces = 0;
  size_t param_bytes_full = 0;  // every parameter, unsharded
  size_t param_bytes_rank = 0;  // what this rank holds
};

// Rewrites g for tp rank `tp_rank` of `tp`. Heads or widths that tp does not divide, or a
// node the sharded axis cannot pass through, are one error naming the block and node.
ShardStats shard_graph(Graph& g, const TpPlan& plan, int tp, int tp_rank);

// Parameter bytes of the graph (constants marked is_param that some node reads).
size_t param_bytes(const Graph& g);

}  // namespace wxe
