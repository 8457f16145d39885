// The Linear layout: 1x1 convolutions of attention and feed-forward blocks as Linear nodes,
// the fused to_qkv split, exported MatMul(x, W^T) read as Linear, slices of concatenations read through.
#include "engine/passes/passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "engine/ir/module_roles.h"
#include "engine/ir/ops.h"
#include "engine/passes/layout_rules.h"
#include "engine/passes/pass_util.h"

namespace wxe {

using namespace pass_util;

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

std::string node_name_of(const std::string& module) { return "/" + module + "/Linear"; }

// The projections that are nn.Linear in the Linear layout (all but the legacy fused qkv).
bool is_linear_projection(Role r) { return r != Role::None && r != Role::Qkv; }

// nn.MultiheadAttention as the exporters write a self-attention call (query, key and value the
// same tensor): in the module's scope, MatMuls read anonymous constants, the packed in_proj
// (E, 3E) first and out_proj (E, E) last (TorchScript), or the in_proj alone, out_proj being a
// named `M.out_proj.weight` (dynamo). Where query, key and value differ, torch projects them
// apart: three (E, E) constants, the rows [0, E), [E, 2E), [2E, 3E) of in_proj_weight, then
// out_proj. `leaf`: MatMul node index -> the leaf of CREDIT's state dict (".in_proj_weight",
// ".out_proj.weight"); `part`: MatMul node index -> (q/k/v index, the three constants).
struct MultiheadAttentionWeights {
  std::map<size_t, std::string> leaf;
  std::map<size_t, std::pair<int, std::vector<int>>> part;
};

MultiheadAttentionWeights multihead_attention_weights(const Graph& g) {
  std::map<std::string, std::vector<size_t>> by_scope;
  std::set<std::string> named_out_proj;  // scopes reading their own M.out_proj.weight
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    const std::string scope = scope_module(n.name);
    for (int i : n.inputs)
      if (i >= 0 && !scope.empty() && g.values[i].name == scope + ".out_proj.weight") named_out_proj.insert(scope);
    if (n.op != "MatMul" || n.inputs.size() != 2 || n.inputs[0] < 0 || n.inputs[1] < 0) continue;
    const Value& c = g.values[n.inputs[1]];
    if (c.is_param && c.is_const() && c.shape.size() == 2 && pass_util::anonymous_name(c.name) &&
        !g.values[n.inputs[0]].is_const())
      by_scope[scope].push_back(k);
  }
  MultiheadAttentionWeights r;
  for (auto& [module, ks] : by_scope) {
    if (module.empty()) continue;
    std::vector<int> cs;  // the distinct constants, in order (a module called twice reads them twice)
    for (size_t k : ks)
      if (std::find(cs.begin(), cs.end(), g.nodes[k].inputs[1]) == cs.end()) cs.push_back(g.nodes[k].inputs[1]);
    const Shape& in = g.values[cs[0]].shape;
    const bool square = std::all_of(cs.begin(), cs.end(), [&](int c) { return g.values[c].shape == Shape{in[0], in[0]}; });
    std::map<int, std::string> leaf;
    std::map<int, int> part;
    if (in[1] == 3 * in[0] && cs.size() == 1 && named_out_proj.count(module)) {
      leaf[cs[0]] = ".in_proj_weight";
    } else if (in[1] == 3 * in[0] && cs.size() == 2 && g.values[cs[1]].shape == Shape{in[0], in[0]}) {
      leaf[cs[0]] = ".in_proj_weight";
      leaf[cs[1]] = ".out_proj.weight";
    } else if (square && (cs.size() == 4 || (cs.size() == 3 && named_out_proj.count(module)))) {
      for (int p = 0; p < 3; ++p) part[cs[p]] = p;
      if (cs.size() == 4) leaf[cs[3]] = ".out_proj.weight";
    }
    for (size_t k : ks) {
      const int c = g.nodes[k].inputs[1];
      if (leaf.count(c)) r.leaf[k] = leaf[c];
      if (part.count(c)) r.part[k] = {part[c], {cs[0], cs[1], cs[2]}};
    }
  }
  return r;
}

// MatMul(x, Transpose(W)), W (N, K) the weight of the MatMul's own module M, computed in the
// graph: a spectral-norm nn.Linear as the TorchScript exporter traces it. W is the folded
// `M.weight` (inference, after fold_spectral_norm) or the output of the SpectralNorm op of
// `M.weight_orig` (training). MatMul node index -> W, for every such node.
std::map<size_t, int> transposed_weights(const Graph& g) {
  const std::vector<int> prod = g.producers();
  std::map<size_t, int> r;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (n.op != "MatMul" || n.inputs.size() != 2 || n.inputs[0] < 0 || n.inputs[1] < 0 || prod[n.inputs[1]] < 0 ||
        g.values[n.inputs[0]].is_const())
      continue;
    const Node& t = g.nodes[prod[n.inputs[1]]];
    if (t.op != "Transpose" || t.inputs.empty() || t.inputs[0] < 0) continue;
    const int wi = t.inputs[0];
    const Value& w = g.values[wi];
    const std::vector<int64_t> perm = t.ints("perm");
    const std::string module = scope_module(n.name);
    if (module.empty() || w.shape.size() != 2 || !(perm.empty() || perm == std::vector<int64_t>{1, 0})) continue;
    bool folded = w.is_param && w.is_const() && w.name == module + ".weight";
    bool sn = prod[wi] >= 0 && g.nodes[prod[wi]].op == "SpectralNorm" && !g.nodes[prod[wi]].inputs.empty() &&
              g.nodes[prod[wi]].inputs[0] >= 0 && g.values[g.nodes[prod[wi]].inputs[0]].name == module + pass_util::kOrig;
    if (folded || sn) r[k] = wi;
  }
  return r;
}

}  // namespace

namespace pass_util {

bool anonymous_name(const std::string& n) { return n.rfind("onnx::", 0) == 0 || n.find('.') == std::string::npos; }

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

Tensor transpose_2d(const Tensor& t) {
  Tensor r(t.dtype, {t.shape[1], t.shape[0]});
  size_t es = dtype_size(t.dtype);
  for (int64_t k = 0; k < t.shape[0]; ++k)
    for (int64_t j = 0; j < t.shape[1]; ++j)
      std::memcpy((uint8_t*)r.raw() + (j * t.shape[0] + k) * es, (const uint8_t*)t.raw() + (k * t.shape[1] + j) * es, es);
  return r;
}

bool matmul_to_linear(Graph& g, Node& n, std::vector<Node>& out, const std::string& leaf, std::map<int, int>* converted) {
  if (n.op != "MatMul" || n.inputs.size() != 2 || n.inputs[1] < 0) return false;
  const Value& c = g.values[n.inputs[1]];
  const std::string module = scope_module(n.name);
  // a projection role, or any module whose weight the exporter transposed into an anonymous
  // constant (nn.Linear without bias, nn.MultiheadAttention's in_proj/out_proj)
  const bool anonymous = anonymous_name(c.name) && !module.empty();
  if (!c.is_param || !c.is_const() || c.shape.size() != 2 || g.values[n.inputs[0]].is_const() ||
      (!anonymous && !is_linear_projection(module_role(module))))
    return false;
  Node l;
  l.op = "Linear";
  l.name = node_name_of(module);
  l.attrs["axis"] = attr_i(-1);
  auto seen = converted ? converted->find(n.inputs[1]) : std::map<int, int>::iterator();
  if (converted && seen != converted->end()) {
    // the same constant read again (a module called once per frame): the same parameter
    l.inputs = {n.inputs[0], seen->second};
  } else {
    Tensor w = transpose_2d(*c.constant);  // (K, N) -> (N, K)
    const std::string export_name = anonymous_name(c.name) ? c.name : c.export_name;
    const int src = n.inputs[1];
    l.inputs = {n.inputs[0], g.add_constant(module + leaf, std::move(w), true)};
    if (converted) (*converted)[src] = l.inputs[1];
    Value& wv = g.values[l.inputs[1]];
    wv.export_name = export_name;
    if (anonymous)  // the name in the module's other calls (frames), and the leaf's alternatives
      for (const std::string& m : {module, collapse_repeated_calls(module)})
        for (const std::string& alt : {leaf, std::string(".weight"), std::string(".in_proj_weight"),
                                       std::string(".out_proj.weight")})
          if (m + alt != wv.name && std::find(wv.alt_names.begin(), wv.alt_names.end(), m + alt) == wv.alt_names.end())
            wv.alt_names.push_back(m + alt);
  }
  l.outputs = n.outputs;
  out.push_back(std::move(l));
  return true;
}

}  // namespace pass_util

void rewrite_linear_layout(Graph& g) {
  std::vector<Node> out;
  const MultiheadAttentionWeights mha = multihead_attention_weights(g);
  const std::map<size_t, int> computed = transposed_weights(g);
  std::map<int, int> converted;  // exported MatMul constant -> its Linear weight
  std::map<int, int> in_proj;    // q's constant of a split in_proj -> the one in_proj_weight
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    auto split = mha.part.find(k);
    if (split != mha.part.end()) {  // Linear(x, rows of M.in_proj_weight): one parameter, as CREDIT saves it
      const auto& [p, cs] = split->second;
      const std::string module = scope_module(n.name);
      const int64_t e = g.values[cs[0]].shape[0];
      auto it = in_proj.find(cs[0]);
      if (it == in_proj.end()) {
        Tensor w(g.values[cs[0]].dtype, {3 * e, e});
        for (int j = 0; j < 3; ++j) {
          Tensor t = transpose_2d(*g.values[cs[j]].constant);
          std::memcpy((uint8_t*)w.raw() + j * t.nbytes(), t.raw(), t.nbytes());
        }
        const std::string export_name = g.values[cs[0]].name;
        int wi = g.add_constant(module + ".in_proj_weight", std::move(w), true);
        g.values[wi].export_name = export_name;
        const std::string c = collapse_repeated_calls(module) + ".in_proj_weight";
        if (c != g.values[wi].name) g.values[wi].alt_names.push_back(c);
        it = in_proj.insert({cs[0], wi}).first;
      }
      Node sl;
      sl.op = "Slice";
      sl.name = node_name_of(module) + "/in_proj_" + std::to_string(p);
      sl.inputs = {it->second, g.add_constant(sl.name + "_starts", Tensor::from_i64({p * e})),
                   g.add_constant(sl.name + "_ends", Tensor::from_i64({(p + 1) * e})),
                   g.add_constant(sl.name + "_axes", Tensor::from_i64({0}))};
      Value o;
      o.name = sl.name + "_output_0";
      o.dtype = g.values[it->second].dtype;
      o.shape = {e, e};
      o.shape_known = true;
      sl.outputs = {g.add_value(o)};
      Node l;
      l.op = "Linear";
      l.name = node_name_of(module);
      l.attrs["axis"] = attr_i(-1);
      l.inputs = {n.inputs[0], sl.outputs[0]};
      l.outputs = n.outputs;
      out.push_back(std::move(sl));
      out.push_back(std::move(l));
      continue;
    }
    auto sn = computed.find(k);
    if (sn != computed.end()) {  // Linear(x, W) reads W itself; the Transpose is left dead
      Node l;
      l.op = "Linear";
      l.name = node_name_of(scope_module(n.name));
      l.attrs["axis"] = attr_i(-1);
      l.inputs = {n.inputs[0], sn->second};
      l.outputs = n.outputs;
      out.push_back(std::move(l));
      continue;
    }
    const std::string wname = is_pointwise_conv(g, n) ? g.values[n.inputs[1]].name : "";
    const std::string module = layout::module_of(wname);
    bool qkv = !wname.empty() && layout::is_qkv_module(module) && wname == module + ".weight";
    bool linear = !wname.empty() && layout::is_linear_module(module) && wname == module + ".weight";
    if (!qkv && !linear) {
      auto leaf = mha.leaf.find(k);
      if (!matmul_to_linear(g, n, out, leaf == mha.leaf.end() ? ".weight" : leaf->second, &converted))
        out.push_back(std::move(n));
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

}  // namespace wxe
