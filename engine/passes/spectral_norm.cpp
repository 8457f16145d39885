// Spectral norm in the imported graph: folded into one weight (inference) or kept as a
// SpectralNorm op (training).
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

void fold_spectral_norm(Graph& g) {
  // Recognised by its result: a Div whose dividend is the `X.weight_orig` parameter; the Div
  // and everything it depends on is evaluated, its output named `X.weight`.
  std::vector<int> prod = g.producers();
  std::vector<bool> chain(g.nodes.size(), false);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (n.op != "Div" || n.inputs.size() != 2 || n.inputs[0] < 0) continue;
    const Value& w = g.values[n.inputs[0]];
    if (!w.is_param || !ends_with(w.name, kOrig)) continue;
    Value& out = g.values[n.outputs[0]];
    out.name = w.name.substr(0, w.name.size() - kOrig.size()) + ".weight";
    out.is_param = true;
    std::vector<int> stack{(int)k};
    while (!stack.empty()) {
      int m = stack.back();
      stack.pop_back();
      if (chain[m]) continue;
      chain[m] = true;
      for (int i : g.nodes[m].inputs)
        if (i >= 0 && prod[i] >= 0) stack.push_back(prod[i]);
    }
  }
  propagate(g, true, [&](size_t k, const Node&) { return (bool)chain[k]; }, true);
}

void spectral_norm_to_op(Graph& g, int power_iterations) {
  std::vector<int> uses = g.use_counts();
  // consumers, to find a ConvTranspose that reads the weight (through Identity nodes)
  std::vector<std::vector<const Node*>> readers(g.values.size());
  for (const Node& n : g.nodes)
    for (int i : n.inputs)
      if (i >= 0) readers[i].push_back(&n);
  std::function<bool(int)> feeds_conv_transpose = [&](int v) {
    for (const Node* r : readers[v]) {
      if (r->op == "ConvTranspose" && r->inputs.size() > 1 && r->inputs[1] == v) return true;
      if (r->op == "Identity" && feeds_conv_transpose(r->outputs[0])) return true;
    }
    return false;
  };
  for (Node& n : g.nodes) {
    if (n.op != "Div" || n.inputs.size() != 2 || n.inputs[0] < 0) continue;
    const Value& w = g.values[n.inputs[0]];
    if (!w.is_param || !ends_with(w.name, kOrig)) continue;
    const std::string prefix = w.name.substr(0, w.name.size() - kOrig.size());
    int u = g.find_value(prefix + ".weight_u"), v = g.find_value(prefix + ".weight_v");
    WXE_CHECK(u >= 0 && v >= 0 && g.values[u].is_const() && g.values[v].is_const(), g.source, ": node ", n.name,
              ": spectral norm of '", w.name, "' without its ", prefix, ".weight_u / .weight_v initializers");
    const int64_t rows = g.values[u].constant->numel();
    const Shape& ws = w.shape;
    int dim = ws.size() > 1 && ws[1] == rows && (ws[0] != rows || feeds_conv_transpose(n.outputs[0])) ? 1 : 0;
    n.op = "SpectralNorm";
    n.domain = "wxe";
    n.inputs = {n.inputs[0], u, v};
    n.attrs.clear();
    n.attrs["dim"] = attr_i(dim);
    n.attrs["power_iterations"] = attr_i(power_iterations);
    n.attrs["eps"] = attr_f(1e-12f);
  }
  eliminate_dead_nodes(g);  // the sigma subgraphs
}

}  // namespace wxe
