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
#include "engine/io/glob.h"
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

namespace {

// A module called once per frame (frames 2: the level embedding, the column attention) is
// exported once per call, its parameters renamed by call ("col_attn.attn_1.in_proj_weight") and
// read from copies of one initializer. For training they must be one leaf, as in PyTorch: the
// parameters whose names collapse to one name (collapse_repeated_calls) and whose values are
// equal become the one named so; a checkpoint then names each once.
void tie_repeated_calls(Graph& g) {
  std::vector<int> uses = g.use_counts();
  std::map<std::string, std::vector<int>> by_name;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    if (x.is_param && x.is_const() && uses[v]) by_name[collapse_repeated_calls(x.name)].push_back((int)v);
  }
  std::vector<int> alias(g.values.size(), -1);
  for (auto& [name, vs] : by_name) {
    if (vs.size() < 2) continue;
    const Tensor& t0 = *g.values[vs[0]].constant;
    bool same = std::all_of(vs.begin(), vs.end(), [&](int v) {
      const Tensor& t = *g.values[v].constant;
      return t.dtype == t0.dtype && t.shape == t0.shape && std::memcmp(t.raw(), t0.raw(), t.nbytes()) == 0;
    });
    int keep = -1;  // the first call's, under the uncollapsed name (CREDIT's names have no "_N" parts)
    for (int v : vs)
      if (g.values[v].name == name) keep = v;
    if (!same || keep < 0) continue;
    for (int v : vs)
      if (v != keep) alias[v] = keep;
  }
  for (Node& n : g.nodes)
    for (int& i : n.inputs)
      if (i >= 0 && alias[i] >= 0) i = alias[i];
}

}  // namespace

void prepare_training_graph(Graph& g, const std::map<std::string, InputSpec>& given) {
  bind_inputs(g, given);
  fold_if(g);
  spectral_norm_to_op(g);
  name_params_by_scope(g);
  fold_constants(g, /*keep_params=*/true);
  remove_identities(g);
  eliminate_dead_nodes(g);
  rewrite_linear_layout(g);
  tie_repeated_calls(g);
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
    // not trained: spectral norm's u and v (buffers), and CREDIT's StochasticDecompositionLayer
    // noise_factor (crossformer-ensemble's noise scale: a Parameter with requires_grad=False)
    if (x.is_param && x.is_const() && uses[v] && x.dtype == DType::F32 && !ends_with(x.name, ".weight_u") &&
        !ends_with(x.name, ".weight_v") && !ends_with(x.name, ".noise_factor"))
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

std::vector<int> checkpoint_segments(const Graph& g, const std::function<bool(const Node&)>& exclude) {
  std::vector<std::string> blocks;
  for (const Node& n : g.nodes) {
    if (n.op == "WindowAttention") {  // a fused attention block (fuse_window_attention_training), named in its scope
      const std::string b = scope_module(n.name);
      if (!b.empty() && std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
      continue;
    }
    if (n.op != "Conv" && n.op != "Linear" && n.op != "MatMul" && n.op != "Gemm") continue;
    const std::string m = scope_module(n.name);
    if (m.empty() || module_role(m) == Role::None) continue;
    for (const auto& [tail, role] : module_table().roles)
      if (m.size() > tail.size() + 1 && ends_with(m, "." + tail)) {
        const std::string b = m.substr(0, m.size() - tail.size() - 1);
        if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
        break;
      }
  }
  for (const Node& n : g.nodes) {  // modules the table names (the node's scope or one around it)
    std::string m = scope_module(n.name);
    while (!m.empty()) {
      for (const std::string& pattern : module_table().recomputed_modules)
        if (glob_match(pattern, m) && std::find(blocks.begin(), blocks.end(), m) == blocks.end()) blocks.push_back(m);
      const size_t dot = m.rfind('.');
      m = dot == std::string::npos ? "" : m.substr(0, dot);
    }
  }
  std::vector<int> seg(g.nodes.size(), -1);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (op_updates_inputs(n.op) || (exclude && exclude(n))) continue;
    const std::string m = scope_module(n.name);
    size_t best = 0;
    for (size_t b = 0; b < blocks.size(); ++b)
      if ((m == blocks[b] || m.rfind(blocks[b] + ".", 0) == 0) && blocks[b].size() > best) {
        best = blocks[b].size();
        seg[k] = (int)b;
      }
  }
  return seg;
}

void add_recompute_segments(const Graph& g, std::vector<int>& seg, const std::function<bool(const Node&)>& seed) {
  if (seg.empty()) seg.assign(g.nodes.size(), -1);
  int next = 0;
  for (int s : seg) next = std::max(next, s + 1);
  std::vector<std::vector<int>> readers(g.values.size());
  for (size_t k = 0; k < g.nodes.size(); ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0) readers[i].push_back((int)k);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (seg[k] >= 0 || !seed(n)) continue;
    std::vector<int> members = {(int)k}, values = {n.outputs[0]};
    bool ok = true;
    while (!values.empty() && ok) {
      const int v = values.back();
      values.pop_back();
      for (int r : readers[v]) {
        const Node& m = g.nodes[r];
        if (seg[r] >= 0 || op_updates_inputs(m.op)) ok = false;
        if (std::find(members.begin(), members.end(), r) != members.end()) continue;
        members.push_back(r);
        if (m.op == "Reshape" || m.op == "Transpose") values.push_back(m.outputs[0]);
      }
    }
    if (!ok) continue;
    for (int m : members) seg[m] = next;
    ++next;
  }
}

NamedTensors graph_parameters(const Graph& g) {
  NamedTensors r;
  std::vector<int> uses = g.use_counts();
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_param && g.values[v].is_const() && uses[v]) r.push_back({g.values[v].name, *g.values[v].constant});
  return r;
}

}  // namespace wxe

