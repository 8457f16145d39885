#include "engine/passes.h"

#include <algorithm>
#include <set>

#include "engine/ops.h"

namespace wxe {

namespace {

std::vector<const Value*> input_values(const Graph& g, const Node& n) {
  std::vector<const Value*> in;
  for (int i : n.inputs) in.push_back(i < 0 ? nullptr : &g.values[i]);
  return in;
}

void apply_shape_rule(Graph& g, const Node& n) {
  for (int i : n.inputs)
    WXE_CHECK(i < 0 || g.values[i].shape_known, g.source, ": node ", n.name, " (", n.op,
              "): shape of input '", g.values[i].name, "' is unknown");
  std::vector<TypeShape> ts;
  try {
    ts = shape_rule(n.op)(n, input_values(g, n));
  } catch (const Error& e) {
    throw Error(g.source + ": " + e.what());
  }
  WXE_CHECK(ts.size() >= n.outputs.size(), g.source, ": node ", n.name, " (", n.op, "): has ",
            n.outputs.size(), " outputs, shape rule gives ", ts.size());
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Value& v = g.values[n.outputs[k]];
    v.dtype = ts[k].dtype;
    v.shape = ts[k].shape;
    v.shape_known = true;
  }
}

const std::string kOrig = ".weight_orig";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void bind_inputs(Graph& g, const std::map<std::string, InputSpec>& given) {
  for (auto& kv : given)
    WXE_CHECK(std::any_of(g.inputs.begin(), g.inputs.end(),
                          [&](int v) { return g.values[v].name == kv.first; }),
              g.source, ": the graph has no input named '", kv.first, "'");
  for (int id : g.inputs) {
    Value& v = g.values[id];
    auto it = given.find(v.name);
    if (it == given.end()) {
      for (int64_t d : v.shape)
        WXE_CHECK(d >= 0, g.source, ": input '", v.name, "' has dynamic shape ",
                  shape_str(v.shape), "; give a tensor for it");
      v.shape_known = true;
      continue;
    }
    const InputSpec& s = it->second;
    std::string expected = "(";  // dynamic dims print as ?
    for (size_t d = 0; d < v.shape.size(); ++d)
      expected += (d ? ", " : "") + (v.shape[d] < 0 ? std::string("?") : std::to_string(v.shape[d]));
    expected += ")";
    WXE_CHECK(s.dtype == v.dtype, g.source, ": input '", v.name, "' expects ",
              dtype_name(v.dtype), ", got ", dtype_name(s.dtype));
    bool fits = s.shape.size() == v.shape.size();
    for (size_t d = 0; fits && d < s.shape.size(); ++d)
      fits = v.shape[d] < 0 || v.shape[d] == s.shape[d];
    WXE_CHECK(fits, g.source, ": input '", v.name, "' expects shape ", expected, ", got ",
              shape_str(s.shape));
    v.shape = s.shape;
    v.shape_known = true;
  }
}


void mark_spectral_norm(Graph& g) {
  // Recognised by its result: a Div whose dividend is the `X.weight_orig` parameter.
  for (const Node& n : g.nodes) {
    if (n.op != "Div" || n.inputs.size() != 2 || n.inputs[0] < 0) continue;
    const Value& w = g.values[n.inputs[0]];
    if (!w.is_param || !ends_with(w.name, kOrig)) continue;
    Value& out = g.values[n.outputs[0]];
    out.name = w.name.substr(0, w.name.size() - kOrig.size()) + ".weight";
    out.is_param = true;
  }
}

namespace {

// Infers shapes node by node and evaluates every node whose inputs are known; with `drop`
// such nodes are removed (their outputs become constants), otherwise they stay in the graph
// and their outputs' values are merely known (as shape inference with data propagation).
void propagate(Graph& g, bool drop) {
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    apply_shape_rule(g, n);
    bool all_const = std::all_of(n.inputs.begin(), n.inputs.end(),
                                 [&](int i) { return i < 0 || g.values[i].is_const(); });
    bool shape_only = n.op == "Shape" || n.op == "Size";
    if (!all_const && !shape_only) {
      kept.push_back(std::move(n));
      continue;
    }
    std::vector<const Tensor*> in;
    Tensor placeholder;
    for (int i : n.inputs) {
      if (i < 0) {
        in.push_back(nullptr);
      } else if (g.values[i].is_const()) {
        in.push_back(g.values[i].constant.get());
      } else {  // Shape/Size read only the shape
        placeholder.dtype = g.values[i].dtype;
        placeholder.shape = g.values[i].shape;
        in.push_back(&placeholder);
      }
    }
    std::vector<Tensor> outs;
    std::vector<Tensor*> po;
    for (int o : n.outputs) outs.emplace_back(g.values[o].dtype, g.values[o].shape);
    for (auto& t : outs) po.push_back(&t);
    try {
      kernel_for(n.op, KernelKind::Reference)(n, in, po);
    } catch (const Error& e) {
      throw Error(g.source + ": node " + n.name + ": " + e.what());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k)
      g.values[n.outputs[k]].constant = std::make_shared<Tensor>(std::move(outs[k]));
    if (!drop) kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

}  // namespace

void infer_shapes(Graph& g) { propagate(g, false); }

void fold_constants(Graph& g) { propagate(g, true); }

void remove_identities(Graph& g) {
  std::vector<int> alias(g.values.size());
  for (size_t i = 0; i < alias.size(); ++i) alias[i] = (int)i;
  std::vector<Node> kept;
  for (Node& n : g.nodes) {
    for (int& i : n.inputs)
      if (i >= 0) i = alias[i];
    bool is_identity = n.op == "Identity" || (n.op == "Dropout" && n.outputs.size() == 1);
    if (is_identity && n.inputs.size() >= 1 && n.inputs[0] >= 0) {
      alias[n.outputs[0]] = n.inputs[0];
      continue;
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  for (int& o : g.outputs) {
    int src = alias[o];
    if (src == o) continue;
    // keep the graph output's name on the value that now carries it
    bool src_is_io = std::count(g.inputs.begin(), g.inputs.end(), src) ||
                     std::count(g.outputs.begin(), g.outputs.end(), src) ||
                     g.values[src].is_param;
    if (!src_is_io) g.values[src].name = g.values[o].name;
    o = src;
  }
  compact_values(g);
}

void eliminate_dead_nodes(Graph& g) {
  std::vector<bool> live(g.values.size(), false);
  for (int o : g.outputs) live[o] = true;
  std::vector<bool> keep(g.nodes.size(), false);
  for (size_t k = g.nodes.size(); k-- > 0;) {
    const Node& n = g.nodes[k];
    keep[k] = std::any_of(n.outputs.begin(), n.outputs.end(), [&](int o) { return live[o]; });
    if (keep[k])
      for (int i : n.inputs)
        if (i >= 0) live[i] = true;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (keep[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
  compact_values(g);
}

void simplify(Graph& g, const std::map<std::string, InputSpec>& given) {
  bind_inputs(g, given);
  mark_spectral_norm(g);
  fold_constants(g);
  remove_identities(g);
  eliminate_dead_nodes(g);
}

}  // namespace wxe
