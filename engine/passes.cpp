#include "engine/passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "engine/layout_rules.h"
#include "engine/module_roles.h"
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
    // every size computed from here on (numel, bytes, strides) fits: a hostile shape stops here
    for (int64_t d : ts[k].shape)
      WXE_CHECK(d >= 0, g.source, ": node ", n.name, " (", n.op, "): output shape ", shape_str(ts[k].shape),
                " has a negative dimension");
    size_t bytes = 0;
    try {
      bytes = tensor_bytes(ts[k].dtype, ts[k].shape);
    } catch (const Error& e) {
      fail(g.source, ": node ", n.name, " (", n.op, "): ", e.what());
    }
    WXE_CHECK(bytes <= max_alloc_bytes(), g.source, ": node ", n.name, " (", n.op, "): output shape ",
              shape_str(ts[k].shape), " needs ", bytes, " bytes, more than the ", max_alloc_bytes(),
              " bytes of memory this machine has");
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


namespace {

std::set<std::string>& updates_inputs_ops() {  // register_updates_inputs
  static std::set<std::string> s;
  return s;
}

// Infers shapes node by node and evaluates nodes whose inputs are known and that `may_fold`
// allows; with `drop` such nodes are removed (their outputs become constants), otherwise they
// stay in the graph and their outputs' values are merely known (shape inference with data
// propagation).
// With `only` set, nodes it rejects are neither folded nor shape-inferred. Ops that update
// their inputs in place are never evaluated.

template <class MayFold>
void propagate(Graph& g, bool drop, MayFold may_fold, bool only = false) {
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    bool allowed = may_fold(k, n) && !op_updates_inputs(n.op);
    if (only && !allowed) {
      kept.push_back(std::move(n));
      continue;
    }
    apply_shape_rule(g, n);
    bool all_const = std::all_of(n.inputs.begin(), n.inputs.end(),
                                 [&](int i) { return i < 0 || g.values[i].is_const(); });
    bool shape_only = n.op == "Shape" || n.op == "Size";
    if ((!all_const && !shape_only) || !allowed) {
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
    for (size_t k2 = 0; k2 < n.outputs.size(); ++k2)
      g.values[n.outputs[k2]].constant = std::make_shared<Tensor>(std::move(outs[k2]));
    if (!drop) kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
}

}  // namespace

void register_updates_inputs(const std::string& op) { updates_inputs_ops().insert(op); }
bool op_updates_inputs(const std::string& op) { return updates_inputs_ops().count(op) != 0; }

void infer_shapes(Graph& g) {
  propagate(g, false, [](size_t, const Node&) { return true; });
}

void fold_constants(Graph& g, bool keep_params) {
  // a value derived from a parameter (other than through its shape) is not folded when
  // keep_params is set, so loading other weights later still changes it
  std::vector<bool> derived(g.values.size(), false);
  for (size_t v = 0; v < g.values.size(); ++v) derived[v] = g.values[v].is_param;
  propagate(g, true, [&](size_t, const Node& n) {
    bool from_param = n.op != "Shape" && n.op != "Size" &&
                      std::any_of(n.inputs.begin(), n.inputs.end(), [&](int i) { return i >= 0 && derived[i]; });
    if (from_param)
      for (int o : n.outputs) derived[o] = true;
    return !(keep_params && from_param);
  });
}

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

namespace {

bool is_pointwise_conv(const Graph& g, const Node& n) {
  if (n.op != "Conv" || n.inputs.size() < 2 || !g.values[n.inputs[1]].is_const()) return false;
  const Shape& w = g.values[n.inputs[1]].shape;
  auto all = [](const std::vector<int64_t>& v, int64_t x) {
    return std::all_of(v.begin(), v.end(), [&](int64_t e) { return e == x; });
  };
  return w.size() == 4 && w[2] == 1 && w[3] == 1 && n.i("group", 1) == 1 && all(n.ints("strides"), 1) &&
         all(n.ints("pads"), 0) && all(n.ints("dilations"), 1) && n.s("auto_pad", "NOTSET") != "SAME_UPPER" &&
         n.s("auto_pad", "NOTSET") != "SAME_LOWER";
}

// An initializer whose name says nothing of the module it belongs to: the TorchScript
// exporter's "onnx::Mul_123", the dynamo exporter's folded constants ("div_12", "val_7",
// "linear_4"). Module parameters are named by their path ("layers.0.to_out.bias").
bool anonymous_name(const std::string& n) { return n.rfind("onnx::", 0) == 0 || n.find('.') == std::string::npos; }

// "col_attn_1.norm_1.weight" -> "col_attn.norm.weight": the TorchScript exporter scopes the
// second call of a module "<name>_1" (a frames-2 model calls its level embedding once a frame).
std::string collapse_repeated_calls(const std::string& name) {
  std::string r, c;
  auto flush = [&] {
    size_t u = c.rfind('_');
    bool digits = u != std::string::npos && u + 1 < c.size() && u > 0 &&
                  std::all_of(c.begin() + u + 1, c.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    r += (r.empty() ? "" : ".") + (digits ? c.substr(0, u) : c);
    c.clear();
  };
  for (char ch : name) {
    if (ch == '.') flush();
    else c += ch;
  }
  flush();
  return r;
}

std::string node_name_of(const std::string& module) { return "/" + module + "/Linear"; }

// The projections that are nn.Linear in the Linear layout (all but the legacy fused qkv).
bool is_linear_projection(Role r) { return r != Role::None && r != Role::Qkv; }

// t (R, C) -> t^T (C, R)
Tensor transpose_2d(const Tensor& t) {
  Tensor r(t.dtype, {t.shape[1], t.shape[0]});
  size_t es = dtype_size(t.dtype);
  for (int64_t k = 0; k < t.shape[0]; ++k)
    for (int64_t j = 0; j < t.shape[1]; ++j)
      std::memcpy((uint8_t*)r.raw() + (j * t.shape[0] + k) * es, (const uint8_t*)t.raw() + (k * t.shape[1] + j) * es, es);
  return r;
}

// nn.Linear as torch.onnx.export writes it: MatMul(x, W^T) with W^T an exporter-made
// constant, in the scope of a projection module M (nextgen_wxformer's to_q/k/v/out and
// feed-forward). It becomes Linear(x, M.weight) over the last axis. Returns false if n is not
// such a node.
bool matmul_to_linear(Graph& g, Node& n, std::vector<Node>& out) {
  if (n.op != "MatMul" || n.inputs.size() != 2 || n.inputs[1] < 0) return false;
  const Value& c = g.values[n.inputs[1]];
  const std::string module = scope_module(n.name);
  // a projection role, or any module whose weight the exporter transposed into an anonymous
  // constant (nn.Linear without bias, nn.MultiheadAttention's in_proj/out_proj)
  const bool anonymous = anonymous_name(c.name) && !module.empty();
  if (!c.is_param || !c.is_const() || c.shape.size() != 2 || g.values[n.inputs[0]].is_const() ||
      (!anonymous && !is_linear_projection(module_role(module))))
    return false;
  Tensor w = transpose_2d(*c.constant);  // (K, N) -> (N, K)
  Node l;
  l.op = "Linear";
  l.name = node_name_of(module);
  l.attrs["axis"] = attr_i(-1);
  const std::string export_name = anonymous_name(c.name) ? c.name : c.export_name;
  l.inputs = {n.inputs[0], g.add_constant(module + ".weight", std::move(w), true)};
  Value& wv = g.values[l.inputs[1]];
  wv.export_name = export_name;
  if (anonymous)  // nn.MultiheadAttention calls its projections functionally, in its own scope
    for (const std::string& m : {module, collapse_repeated_calls(module)})
      for (const char* leaf : {".weight", ".in_proj_weight", ".out_proj.weight"})
        if (m + leaf != wv.name && std::find(wv.alt_names.begin(), wv.alt_names.end(), m + leaf) == wv.alt_names.end())
          wv.alt_names.push_back(m + leaf);
  l.outputs = n.outputs;
  out.push_back(std::move(l));
  return true;
}

}  // namespace

void rewrite_linear_layout(Graph& g) {
  std::vector<Node> out;
  for (Node& n : g.nodes) {
    const std::string wname = is_pointwise_conv(g, n) ? g.values[n.inputs[1]].name : "";
    const std::string module = layout::module_of(wname);
    bool qkv = !wname.empty() && layout::is_qkv_module(module) && wname == module + ".weight";
    bool linear = !wname.empty() && layout::is_linear_module(module) && wname == module + ".weight";
    if (!qkv && !linear) {
      if (!matmul_to_linear(g, n, out)) out.push_back(std::move(n));
      continue;
    }
    const Tensor& w = *g.values[n.inputs[1]].constant;
    const std::string origin = g.values[n.inputs[1]].export_name;  // kept on the rewritten weights
    int bias = n.inputs.size() > 2 ? n.inputs[2] : -1;
    if (linear) {
      Node l;
      l.op = "Linear";
      l.name = node_name_of(module);
      l.attrs["axis"] = attr_i(1);
      l.inputs = {n.inputs[0], g.add_constant(wname, layout::conv1x1_to_linear(w, wname), true)};
      g.values[l.inputs[1]].export_name = origin;
      if (bias >= 0) l.inputs.push_back(bias);
      l.outputs = n.outputs;
      out.push_back(std::move(l));
      continue;
    }
    // fused qkv: three projections, concatenated where the fused output was read
    std::array<Tensor, 3> ws = layout::split_qkv(w, wname);
    std::array<Tensor, 3> bs;
    if (bias >= 0) bs = layout::split_qkv(*g.values[bias].constant, g.values[bias].name);
    std::array<std::string, 3> mods = layout::qkv_modules(module);
    Node cat;
    cat.op = "Concat";
    cat.name = node_name_of(module) + "/Concat";
    cat.attrs["axis"] = attr_i(1);
    cat.outputs = n.outputs;
    const Value fused = g.values[n.outputs[0]];  // a copy: adding values below may move g.values
    for (int k = 0; k < 3; ++k) {
      Node l;
      l.op = "Linear";
      l.name = node_name_of(mods[k]);
      l.attrs["axis"] = attr_i(1);
      l.inputs = {n.inputs[0], g.add_constant(mods[k] + ".weight", ws[k], true)};
      g.values[l.inputs[1]].export_name = origin;
      if (bias >= 0) l.inputs.push_back(g.add_constant(mods[k] + ".bias", bs[k], true));
      Value o;
      o.name = l.name + "_output_0";
      o.dtype = fused.dtype;
      o.shape = fused.shape;
      o.shape[1] /= 3;
      o.shape_known = fused.shape_known;
      l.outputs = {g.add_value(o)};
      cat.inputs.push_back(l.outputs[0]);
      out.push_back(std::move(l));
    }
    out.push_back(std::move(cat));
  }
  g.nodes = std::move(out);
  remove_slices_of_concat(g);
  eliminate_dead_nodes(g);
}

void remove_slices_of_concat(Graph& g) {
  std::vector<int> prod = g.producers();
  std::vector<int> alias(g.values.size());
  for (size_t i = 0; i < alias.size(); ++i) alias[i] = (int)i;
  for (const Node& n : g.nodes) {
    if (n.op == "Split" && !n.inputs.empty() && n.inputs[0] >= 0 && prod[n.inputs[0]] >= 0 &&
        g.nodes[prod[n.inputs[0]]].op == "Concat") {
      // torch 2 (dynamo) exports take q, k and v apart with a Split: output k is part k when
      // every output's extent along the concat axis is that part's
      const Node& cat = g.nodes[prod[n.inputs[0]]];
      const int64_t rank = (int64_t)g.values[n.inputs[0]].shape.size();
      int64_t axis = cat.i("axis", 0), split_axis = n.i("axis", 0);
      if (axis < 0) axis += rank;
      if (split_axis < 0) split_axis += rank;
      if (split_axis != axis || n.outputs.size() != cat.inputs.size()) continue;
      bool same = true;
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const Value &o = g.values[n.outputs[k]], &part = g.values[cat.inputs[k]];
        same = same && n.outputs[k] >= 0 && o.shape_known && part.shape_known && o.shape == part.shape;
      }
      if (same)
        for (size_t k = 0; k < n.outputs.size(); ++k) alias[n.outputs[k]] = cat.inputs[k];
      continue;
    }
    if (n.op != "Slice" || n.inputs.size() < 3 || n.inputs[0] < 0 || prod[n.inputs[0]] < 0) continue;
    const Node& cat = g.nodes[prod[n.inputs[0]]];
    if (cat.op != "Concat") continue;
    bool known = true;
    for (size_t i = 1; i < n.inputs.size(); ++i) known = known && (n.inputs[i] < 0 || g.values[n.inputs[i]].is_const());
    if (!known) continue;
    auto ints = [&](size_t i) { return g.values[n.inputs[i]].constant->to_i64(); };
    std::vector<int64_t> starts = ints(1), ends = ints(2);
    std::vector<int64_t> axes = n.inputs.size() > 3 && n.inputs[3] >= 0 ? ints(3) : std::vector<int64_t>{0};
    std::vector<int64_t> steps = n.inputs.size() > 4 && n.inputs[4] >= 0 ? ints(4) : std::vector<int64_t>{1};
    const Shape& cs = g.values[n.inputs[0]].shape;
    int64_t rank = (int64_t)cs.size();
    int64_t axis = cat.i("axis", 0);
    if (axis < 0) axis += rank;
    if (starts.size() != 1 || axes.size() != 1 || steps.size() != 1 || steps[0] != 1) continue;
    if ((axes[0] < 0 ? axes[0] + rank : axes[0]) != axis) continue;
    int64_t dim = cs[axis];
    int64_t st = starts[0] < 0 ? starts[0] + dim : std::min(starts[0], dim);
    int64_t en = ends[0] < 0 ? ends[0] + dim : std::min(ends[0], dim);
    int64_t off = 0;
    for (int in : cat.inputs) {
      int64_t len = g.values[in].shape[axis];
      if (st == off && en == off + len) alias[n.outputs[0]] = in;
      off += len;
    }
  }
  for (Node& n : g.nodes)
    for (int& i : n.inputs)
      if (i >= 0) i = alias[i];
  for (int& o : g.outputs)
    if (alias[o] != o) {  // a graph output stays a node output of its own name
      Node id;
      id.op = "Identity";
      id.name = "/output_identity";
      id.inputs = {alias[o]};
      id.outputs = {o};
      g.nodes.push_back(id);
    }
}

WeightMatch match_weights(const Graph& g, const NamedTensors& weights) {
  WeightMatch m;
  std::map<std::string, const Tensor*>& by_name = m.tensors;
  for (auto& kv : weights) by_name[kv.first] = &kv.second;
  std::vector<int> uses = g.use_counts();
  std::vector<int> reader(g.values.size(), -1);
  for (size_t k = g.nodes.size(); k-- > 0;)
    for (int i : g.nodes[k].inputs)
      if (i >= 0) reader[i] = (int)k;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    if (!x.is_param || !x.is_const() || !uses[v]) continue;
    // where a name came from the graph's structure, say which initializer and node it is
    std::string what = x.name;
    if (!x.export_name.empty() || anonymous_name(x.name)) {
      what += " (initializer '" + (x.export_name.empty() ? x.name : x.export_name) + "'";
      if (reader[v] >= 0) what += ", read by node " + g.nodes[reader[v]].name;
      what += ")";
    }
    std::string name = x.name;
    if (!by_name.count(name)) {
      std::vector<std::string> fit;
      for (const std::string& a : x.alt_names) {
        auto it = by_name.find(a);
        if (it != by_name.end() && shapes_fit(it->second->shape, x.shape) &&
            std::find(fit.begin(), fit.end(), a) == fit.end())
          fit.push_back(a);
      }
      if (fit.size() > 1) {
        m.ambiguous.push_back(what + " could be " + fit[0] + " or " + fit[1]);
        continue;
      }
      if (fit.empty()) {
        m.missing.push_back(what);
        continue;
      }
      name = fit[0];
    }
    m.used.insert(name);
    const Tensor* t = by_name[name];
    if (!shapes_fit(t->shape, x.shape)) {
      m.mismatched.push_back(what + " " + shape_str(t->shape) + " vs graph " + shape_str(x.shape));
      continue;
    }
    if (name != x.name || !x.export_name.empty()) ++m.by_structure;
    m.matched.push_back({(int)v, name});
  }
  for (auto& kv : weights)
    if (!m.used.count(kv.first)) m.unused.push_back(kv.first);
  return m;
}

int restore_dropped_biases(Graph& g, WeightMatch& m) {
  // a bias the export dropped: the exporter's optimizer removes the Add of a bias that was zero
  // when it ran, so the checkpoint's M.bias has no parameter; it goes back on M's only
  // convolution or linear node that lacks one, where its size is that node's output channels
  std::vector<std::string> unused;
  for (const std::string& name : m.unused) {
    const std::string module = ends_with(name, ".bias") ? name.substr(0, name.size() - 5) : "";
    int at = -1, count = 0;
    for (size_t k = 0; !module.empty() && k < g.nodes.size(); ++k) {
      const Node& n = g.nodes[k];
      if (scope_module(n.name) != module) continue;
      if (n.op != "Conv" && n.op != "ConvTranspose" && n.op != "Linear" && n.op != "Gemm") continue;
      ++count;
      if (n.inputs.size() == 2 && n.inputs[1] >= 0) at = (int)k;
    }
    const Tensor& b = *m.tensors.at(name);
    int64_t channels = -1;
    if (at >= 0 && count == 1) {
      const Node& n = g.nodes[at];
      const Shape& w = g.values[n.inputs[1]].shape;
      if (n.op == "ConvTranspose" && w.size() >= 2) channels = w[1] * n.i("group", 1);
      else if (n.op == "Gemm" && w.size() == 2) channels = n.i("transB", 0) ? w[0] : w[1];
      else if (!w.empty()) channels = w[0];
    }
    if (channels < 0 || b.rank() != 1 || b.shape[0] != channels) {
      unused.push_back(name);
      continue;
    }
    Tensor t(g.values[g.nodes[at].inputs[1]].dtype, b.shape);
    convert(b, t);
    int bi = g.add_constant(name, std::move(t), true);
    g.values[bi].export_name = "(none: dropped by the exporter)";
    g.nodes[at].inputs.push_back(bi);
    ++m.by_structure;
  }
  const int restored = (int)(m.unused.size() - unused.size());
  m.unused = unused;
  return restored;
}

std::vector<std::string> load_weights(Graph& g, const NamedTensors& weights, const std::string& source,
                                      int* by_structure) {
  WeightMatch m = match_weights(g, weights);
  const std::map<std::string, const Tensor*>& by_name = m.tensors;
  std::vector<std::string>& missing = m.missing;
  std::vector<std::string>& mismatched = m.mismatched;
  for (auto& [v, name] : m.matched) {
    Value& x = g.values[v];
    Tensor t(x.dtype, x.shape);  // a (C,) checkpoint tensor may feed a (C, 1, 1) graph one
    convert(*by_name.at(name), t);
    x.constant = std::make_shared<Tensor>(std::move(t));
  }
  restore_dropped_biases(g, m);
  if (by_structure) *by_structure = m.by_structure;
  WXE_CHECK(m.ambiguous.empty(), source, ": weights do not fit the model: ", m.ambiguous.size(),
            " parameters match more than one checkpoint tensor: ", m.ambiguous[0]);
  if (!missing.empty() || !mismatched.empty()) {
    // the first few names of each list, not thousands: the error stays one readable line
    auto some = [](const std::vector<std::string>& v) {
      std::string r;
      for (size_t i = 0; i < v.size() && i < 4; ++i) r += (i ? ", " : "") + v[i];
      return v.size() > 4 ? r + ", ... and " + std::to_string(v.size() - 4) + " more" : r;
    };
    std::string msg = source + ": weights do not fit the model:";
    if (!missing.empty()) msg += " missing " + std::to_string(missing.size()) + " (" + some(missing) + ")";
    if (!mismatched.empty())
      msg += std::string(missing.empty() ? "" : ";") + " shape mismatch " + std::to_string(mismatched.size()) + " (" +
             some(mismatched) + ")";
    // names that differ by a common prefix (DDP's "module.", a wrapper's "model."): say which
    if (!missing.empty()) {
      const std::string& m = missing[0];
      for (auto& kv : weights) {
        const std::string& c = kv.first;
        bool extra = c.size() > m.size() && c.compare(c.size() - m.size(), m.size(), m) == 0;
        bool lacks = m.size() > c.size() && m.compare(m.size() - c.size(), c.size(), c) == 0;
        if (!extra && !lacks) continue;
        std::string prefix = extra ? c.substr(0, c.size() - m.size()) : m.substr(0, m.size() - c.size());
        size_t hits = 0;
        for (const std::string& x : missing)
          hits += extra ? by_name.count(prefix + x) : (x.rfind(prefix, 0) == 0 && by_name.count(x.substr(prefix.size())));
        if (2 * hits < missing.size()) continue;
        msg += extra ? "; the checkpoint's names carry the prefix '" + prefix + "': strip it"
                     : "; the checkpoint's names lack the model's prefix '" + prefix + "': add it";
        break;
      }
    }
    fail(msg);
  }
  return m.unused;
}

std::string scope_module(const std::string& node_name) {
  if (node_name.empty() || node_name[0] != '/') return "";
  std::vector<std::string> parts;
  size_t p = 1;
  while (true) {
    size_t q = node_name.find('/', p);
    if (q == std::string::npos) break;  // the last component is the op's own name
    std::string c = node_name.substr(p, q - p);
    // a child of a Sequential/ModuleList appears as "<list>" then "<list>.<i>"
    if (!parts.empty() && c.rfind(parts.back() + ".", 0) == 0) parts.back() = c;
    else parts.push_back(c);
    p = q + 1;
  }
  std::string m;
  for (auto& c : parts) m += (m.empty() ? "" : ".") + c;
  return m;
}

namespace {

int producer_op(const Graph& g, const std::vector<int>& prod, int v, const char* op) {
  return v >= 0 && prod[v] >= 0 && g.nodes[prod[v]].op == op ? prod[v] : -1;
}

// GroupNorm as both exporters write it: Reshape -> InstanceNormalization (unit scale, zero bias,
// one per group) -> Reshape -> Mul(weight) -> Add(bias).
bool in_of_group_norm(const Graph& g, const std::vector<int>& prod, const Node& n) {
  return n.op == "InstanceNormalization" && producer_op(g, prod, n.inputs[0], "Reshape") >= 0;
}

// What a constant read at input `slot` of `n` is: a parameter ("weight"/"bias" of the node's
// module, "?" for one whose name the structure does not give) or a literal ("").
std::string param_slot(const Graph& g, const std::vector<int>& prod, const Node& n, size_t slot) {
  const Value& c = g.values[n.inputs[slot]];
  auto runtime = [&](size_t k) { return k < n.inputs.size() && n.inputs[k] >= 0 && !g.values[n.inputs[k]].is_const(); };
  if (n.op == "Conv" || n.op == "ConvTranspose") return slot == 1 ? "weight" : slot == 2 ? "bias" : "?";
  if (n.op == "Gemm") {
    if (slot == 2) return "bias";
    if (slot == 1) return n.i("transB", 0) == 1 && n.i("transA", 0) == 0 ? "weight" : "?";
    return "?";  // a folded computation (a Linear run on a constant)
  }
  if (n.op == "LayerNormalization" || (n.op == "InstanceNormalization" && !in_of_group_norm(g, prod, n)))
    return slot == 1 ? "weight" : slot == 2 ? "bias" : "?";
  if (n.op == "MatMul") return slot == 1 && c.shape.size() == 2 && runtime(0) ? "?" : "";  // matmul_to_linear
  if ((n.op == "Mul" || n.op == "Add") && n.inputs.size() == 2 && runtime(1 - slot) &&
      (c.constant->numel() > 1 || c.name.rfind("onnx::", 0) == 0))
    return n.op == "Mul" ? "weight" : "bias";  // GroupNorm's affine, a level embedding's bias
  return "";
}

// CREDIT's DynamicPositionBias runs an MLP (`<P>`, a position-bias module of the module table)
// on the relative-position grid of a window (layout::position_bias_grid). The dynamo exporter
// folds its first Linear `<P>.<L>` (L: the table's position_bias_linear, CREDIT's "layers.0"),
// run on that constant grid, into one constant `(n, D)` read by the LayerNorm `<P>.<N>` (the
// table's position_bias_norm, "layers.1"): the Linear is put back (Gemm(grid, P.L.weight,
// P.L.bias)), its parameters fitted to the constant so that the graph computes the same without
// a checkpoint and a checkpoint's P.L takes effect. A constant that is not an affine function of
// the grid stays as it is: the graph runs, and loading a checkpoint names it as a parameter it
// cannot find.
void restore_position_bias_linear(Graph& g) {
  const ModuleTable& table = module_table();
  if (table.position_bias_linear.empty() || table.position_bias_norm.empty()) return;
  const std::string tail = "." + table.position_bias_norm;
  std::vector<Node> out;
  for (Node& n : g.nodes) {
    const std::string module = scope_module(n.name);
    int xi = n.inputs.empty() ? -1 : n.inputs[0];
    if (n.op != "LayerNormalization" || xi < 0 || !ends_with(module, tail) || !g.values[xi].is_param ||
        !g.values[xi].is_const() || !anonymous_name(g.values[xi].name) || g.values[xi].shape.size() != 2 ||
        g.values[xi].dtype != DType::F32) {
      out.push_back(std::move(n));
      continue;
    }
    const std::string p = module.substr(0, module.size() - tail.size());
    if (!is_position_bias_mlp(p)) {
      out.push_back(std::move(n));
      continue;
    }
    const Value x = g.values[xi];  // a copy: adding values below may move g.values
    Tensor grid = layout::position_bias_grid(x.shape[0]);
    if (grid.numel() == 0) {  // not the grid: left as it is (loading a checkpoint names it)
      out.push_back(std::move(n));
      continue;
    }
    const int64_t rows = x.shape[0], d = x.shape[1];
    const float* y = x.constant->data<float>();
    const float* gr = grid.data<float>();
    // least squares y[:, j] = w_j0 * gi + w_j1 * gj + b_j; the grid is centred and its two
    // columns orthogonal with equal norms, so the normal equations are diagonal
    double ss = 0;
    for (int64_t r = 0; r < rows; ++r) ss += (double)gr[2 * r] * gr[2 * r];
    Tensor w(DType::F32, {d, 2}), b(DType::F32, {d});
    double worst = 0, scale = 0;
    for (int64_t j = 0; j < d; ++j) {
      double s0 = 0, s1 = 0, sb = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double v = y[r * d + j];
        s0 += gr[2 * r] * v;
        s1 += gr[2 * r + 1] * v;
        sb += v;
        scale = std::max(scale, std::fabs(v));
      }
      w.data<float>()[2 * j] = (float)(ss > 0 ? s0 / ss : 0.0);
      w.data<float>()[2 * j + 1] = (float)(ss > 0 ? s1 / ss : 0.0);
      b.data<float>()[j] = (float)(sb / rows);
      for (int64_t r = 0; r < rows; ++r) {
        double fit = w.data<float>()[2 * j] * gr[2 * r] + w.data<float>()[2 * j + 1] * gr[2 * r + 1] + b.data<float>()[j];
        worst = std::max(worst, std::fabs(fit - y[r * d + j]));
      }
    }
    if (!(worst <= 1e-4 * (1 + scale))) {  // not a Linear of the grid: left as it is, as above
      out.push_back(std::move(n));
      continue;
    }
    const std::string linear = p + "." + table.position_bias_linear;
    Node gemm;
    gemm.op = "Gemm";
    gemm.name = "/" + linear + "/Gemm";
    gemm.attrs["transB"] = attr_i(1);
    int wi = g.add_constant(linear + ".weight", std::move(w), true);
    int bi = g.add_constant(linear + ".bias", std::move(b), true);
    g.values[wi].export_name = g.values[bi].export_name = x.name;
    gemm.inputs = {g.add_constant(p + ".grid", std::move(grid)), wi, bi};
    Value o;
    o.name = gemm.name + "_output_0";
    gemm.outputs = {g.add_value(o)};
    n.inputs[0] = gemm.outputs[0];
    out.push_back(std::move(gemm));
    out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
}

// nn.Linear written as Gemm(x, W^T, b) with transB=0, W^T an exporter-made constant (K, N):
// the constant is put back as W (N, K), as the checkpoint holds it, read with transB=1, so that
// it is named and loaded as the module's weight. A constant read by other nodes too stays.
void gemm_weight_to_trans_b(Graph& g) {
  std::vector<int> uses = g.use_counts();
  for (Node& n : g.nodes) {
    if (n.op != "Gemm" || n.inputs.size() < 2 || n.inputs[1] < 0 || n.i("transA", 0) != 0 || n.i("transB", 0) != 0)
      continue;
    Value& w = g.values[n.inputs[1]];
    if (!w.is_param || !w.is_const() || w.shape.size() != 2 || !anonymous_name(w.name) || uses[n.inputs[1]] != 1)
      continue;
    w.constant = std::make_shared<Tensor>(transpose_2d(*w.constant));
    w.shape = w.constant->shape;
    n.attrs["transB"] = attr_i(1);
  }
}

}  // namespace

void name_params_by_scope(Graph& g) {
  gemm_weight_to_trans_b(g);
  restore_position_bias_linear(g);
  std::vector<int> prod = g.producers();
  size_t nvalues = g.values.size();
  std::map<std::string, int> by_name;
  for (size_t v = 0; v < nvalues; ++v) by_name[g.values[v].name] = (int)v;
  std::vector<bool> param_use(nvalues, false);  // read where a parameter goes
  // per parameter: the consumers' modules
  std::map<int, std::map<std::string, std::vector<std::pair<int, int>>>> uses;  // value -> name -> (node, slot)
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    std::string module = scope_module(n.name);
    for (size_t s2 = 0; s2 < n.inputs.size(); ++s2) {
      int v = n.inputs[s2];
      if (v < 0 || !g.values[v].is_param || !g.values[v].is_const()) continue;
      const std::string& name = g.values[v].name;
      if (in_of_group_norm(g, prod, n) && s2 > 0) {
        // its unit scale and zero bias are constants; the exporter may have shared them with a
        // parameter of equal value (a LayerNorm's gain): loading that parameter must not move them
        if (!anonymous_name(name)) {
          Value copy = g.values[v];
          copy.name = n.name + "/group_constant" + std::to_string(s2);
          copy.is_param = false;
          n.inputs[s2] = g.add_value(copy);
        }
        continue;
      }
      std::string want;
      if (anonymous_name(name)) {
        std::string leaf = param_slot(g, prod, n, s2);
        if (!leaf.empty()) param_use[v] = true;
        if (!module.empty() && leaf != "?" && !leaf.empty()) want = module + "." + leaf;
      } else if (!module.empty()) {
        std::string leaf = name.substr(name.rfind('.') + 1);
        // a submodule's parameter read in its parent's scope (nn.MultiheadAttention calls
        // out_proj functionally) keeps its name
        bool descendant = name.rfind(module + ".", 0) == 0;
        if (!descendant && is_param_leaf(leaf)) want = module + "." + leaf;
      }
      if (want.empty() || want == name) want = name;
      uses[v][want].push_back({(int)k, (int)s2});
    }
  }
  for (auto& [v, names] : uses) {
    for (auto& [want, slots] : names) {
      if (want == g.values[v].name) continue;
      auto it = by_name.find(want);
      if (it != by_name.end() && it->second != v) continue;  // taken by another value: leave as is
      int target = v;
      if (names.size() > 1 || (names.size() == 1 && g.values[v].name.rfind("onnx::", 0) != 0 &&
                               std::any_of(g.outputs.begin(), g.outputs.end(), [&](int o) { return o == v; }))) {
        Value copy = g.values[v];  // shares the tensor; loading weights replaces it per copy
        copy.name = want;
        copy.export_name = g.values[v].name;
        target = g.add_value(copy);
      } else {
        g.values[v].export_name = g.values[v].name;
        g.values[v].name = want;
      }
      by_name[want] = target;
      for (auto [k, slot] : slots) g.nodes[k].inputs[slot] = target;
    }
  }
  // anonymous initializers read only where literals go (eps, scales, shapes, index tensors) are
  // constants, not parameters a checkpoint sets: integer ones, scalars, and the exporters' own
  // names ("val_7", "onnx::Sqrt_12"). Others (a top-level parameter "pos_embed" has no '.'
  // either) stay parameters: loading a checkpoint names one it does not find, and its node.
  for (size_t v = 0; v < nvalues; ++v) {
    Value& x = g.values[v];
    if (!x.is_param || !x.is_const() || !anonymous_name(x.name) || param_use[v]) continue;
    bool literal = x.dtype != DType::F32 && x.dtype != DType::F16 && x.dtype != DType::BF16 && x.dtype != DType::F64;
    literal = literal || x.constant->numel() <= 1 || x.name.rfind("val_", 0) == 0 || x.name.rfind("onnx::", 0) == 0;
    if (literal) x.is_param = false;
  }
  for (Value& x : g.values) {
    std::string c = collapse_repeated_calls(x.name);
    if (x.is_param && c != x.name && std::find(x.alt_names.begin(), x.alt_names.end(), c) == x.alt_names.end())
      x.alt_names.push_back(c);
  }
}

void fold_if(Graph& g) {
  for (;;) {
    auto it = std::find_if(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return n.op == "If"; });
    if (it == g.nodes.end()) return;
    const size_t k = it - g.nodes.begin();
    const Node n = *it;
    const size_t nout = n.outputs.size();
    WXE_CHECK(n.has("if_id") && n.inputs.size() == 1 + 2 * nout && n.inputs[0] >= 0, g.source, ": node ", n.name,
              " (If): not as the importer writes it (cond, then outputs, else outputs; if_id)");
    // the condition's value, from the nodes before the If that it depends on (on a copy: the
    // passes that follow do the real folding)
    Graph pre = g;
    pre.nodes.resize(k);
    std::vector<int> prod = pre.producers();
    std::vector<bool> needed(k, false);
    std::vector<int> stack;
    if (prod[n.inputs[0]] >= 0) stack.push_back(prod[n.inputs[0]]);
    while (!stack.empty()) {
      int m = stack.back();
      stack.pop_back();
      if (needed[m]) continue;
      needed[m] = true;
      for (int i : pre.nodes[m].inputs)
        if (i >= 0 && prod[i] >= 0) stack.push_back(prod[i]);
    }
    propagate(pre, false, [&](size_t m, const Node&) { return (bool)needed[m]; }, true);
    const Value c = pre.values[n.inputs[0]];  // a copy: the propagation below may add values
    WXE_CHECK(c.dtype == DType::Bool && numel(c.shape) == 1, g.source, ": node ", n.name, " (If): condition '", c.name,
              "' is ", dtype_name(c.dtype), " ", shape_str(c.shape), ", not one bool");
    const std::string id = n.s("if_id", "");
    // the branches' nodes lose this If's tag: "|<id>.then" / "|<id>.else" (`drop`: removed)
    auto retag = [&](std::vector<Node>& out, Node& x, const std::string& drop) {
      if (x.has("if_branch")) {
        std::string tag = x.s("if_branch", "");
        if (!drop.empty() && tag.find(drop) != std::string::npos) return;
        for (const char* b : {".then", ".else"}) {
          size_t at = tag.find("|" + id + b);
          if (at != std::string::npos) tag.erase(at, id.size() + 1 + std::strlen(b));
        }
        if (tag.empty())
          x.attrs.erase("if_branch");
        else
          x.attrs["if_branch"] = attr_s(tag);
      }
      out.push_back(std::move(x));
    };
    std::vector<Node> nodes;
    if (!c.is_const()) {
      // known only at run time: both branches run and Where picks, output by output, which
      // needs branches of the same type and shape (the memory plan is static)
      propagate(pre, false, [](size_t, const Node&) { return true; });  // the rest of the prefix: the branches
      for (size_t o = 0; o < nout; ++o) {
        const Value &t = pre.values[n.inputs[1 + o]], &e = pre.values[n.inputs[1 + nout + o]];
        WXE_CHECK(t.dtype == e.dtype && t.shape_known && e.shape_known && t.shape == e.shape, g.source, ": node ",
                  n.name, " (If): its condition '", c.name, "' is known only at run time and its branches give ",
                  dtype_name(t.dtype), " ", shape_str(t.shape), " and ", dtype_name(e.dtype), " ", shape_str(e.shape),
                  " for output ", o, "; wxe runs such an If as a Where over both branches, which needs one type and shape");
      }
      for (size_t m = 0; m < g.nodes.size(); ++m) {
        if (m != k) {
          retag(nodes, g.nodes[m], "");
          continue;
        }
        int cond = n.inputs[0];
        if (!c.shape.empty()) {  // a scalar condition keeps Where's output at the branches' shape
          Node r;
          r.op = "Reshape";
          r.name = n.name + "/cond";
          Value cv;
          cv.name = r.name + ":0";
          cv.dtype = DType::Bool;
          r.inputs = {cond, g.add_constant(r.name + "/shape", Tensor(DType::I64, {0}))};
          cond = g.add_value(cv);
          r.outputs = {cond};
          nodes.push_back(std::move(r));
        }
        for (size_t o = 0; o < nout; ++o) {
          Node w;
          w.op = "Where";
          w.name = n.name + "/out" + std::to_string(o);
          w.inputs = {cond, n.inputs[1 + o], n.inputs[1 + nout + o]};
          w.outputs = {n.outputs[o]};
          if (n.has("if_branch")) w.attrs["if_branch"] = n.attrs.at("if_branch");
          nodes.push_back(std::move(w));
        }
      }
      g.nodes = std::move(nodes);
      continue;
    }
    const bool taken = c.constant->data<uint8_t>()[0] != 0;
    for (size_t m = 0; m < g.nodes.size(); ++m) {
      Node& x = g.nodes[m];
      if (m == k) {  // the If's outputs keep their names, read from the taken branch
        for (size_t o = 0; o < nout; ++o) {
          Node idn;
          idn.op = "Identity";
          idn.name = n.name + (taken ? "/then" : "/else") + "/out" + std::to_string(o);
          idn.inputs = {n.inputs[1 + (taken ? 0 : nout) + o]};
          idn.outputs = {n.outputs[o]};
          if (n.has("if_branch")) idn.attrs["if_branch"] = n.attrs.at("if_branch");
          nodes.push_back(std::move(idn));
        }
        continue;
      }
      retag(nodes, x, "|" + id + (taken ? ".else" : ".then"));
    }
    g.nodes = std::move(nodes);
  }
}

bool shapes_fit(const Shape& a, const Shape& b) {
  Shape x, y;
  for (int64_t d : a) if (d != 1) x.push_back(d);
  for (int64_t d : b) if (d != 1) y.push_back(d);
  return x == y;
}

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
