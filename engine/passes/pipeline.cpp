// The pass pipelines: prepare_graph / finalize_graph / simplify for inference, the training
// graph, and the parameters a prepared graph reads.
#include "engine/passes/passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "engine/ir/module_roles.h"
#include "engine/ir/ops.h"
#include "engine/passes/layout_rules.h"
#include "engine/passes/pass_util.h"

namespace wxe {

using namespace pass_util;

void prepare_graph(Graph& g, const std::map<std::string, InputSpec>& given) {
  bind_inputs(g, given);
  fold_if(g);
  fold_spectral_norm(g);
  name_params_by_scope(g);
  fold_constants(g, /*keep_params=*/true);
  remove_identities(g);
  eliminate_dead_nodes(g);
  rewrite_linear_layout(g);
}

void prepare_training_graph(Graph& g, const std::map<std::string, InputSpec>& given) {
  bind_inputs(g, given);
  fold_if(g);
  spectral_norm_to_op(g);
  name_params_by_scope(g);
  fold_constants(g, /*keep_params=*/true);
  remove_identities(g);
  eliminate_dead_nodes(g);
  rewrite_linear_layout(g);
  // name_params_by_scope's copies share their source's storage; a trained leaf needs its own
  std::set<const Storage*> seen;
  for (Value& v : g.values)
    if (v.is_param && v.is_const() && !seen.insert(v.constant->storage.get()).second)
      v.constant = std::make_shared<Tensor>(v.constant->clone());
}

std::vector<int> trainable_parameters(const Graph& g) {
  std::vector<int> uses = g.use_counts(), r;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    if (x.is_param && x.is_const() && uses[v] && x.dtype == DType::F32 && !ends_with(x.name, ".weight_u") &&
        !ends_with(x.name, ".weight_v"))
      r.push_back((int)v);
  }
  return r;
}

void finalize_graph(Graph& g) {
  fold_constants(g);
  remove_identities(g);
  eliminate_dead_nodes(g);
}

void simplify(Graph& g, const std::map<std::string, InputSpec>& given, const NamedTensors* weights,
              std::vector<std::string>* unused_weights) {
  prepare_graph(g, given);
  if (weights) {
    std::vector<std::string> unused = load_weights(g, *weights, g.source);
    if (unused_weights) *unused_weights = unused;
  }
  finalize_graph(g);
}

NamedTensors graph_parameters(const Graph& g) {
  NamedTensors r;
  std::vector<int> uses = g.use_counts();
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_param && g.values[v].is_const() && uses[v]) r.push_back({g.values[v].name, *g.values[v].constant});
  return r;
}

}  // namespace wxe

