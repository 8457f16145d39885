// Weights into the graph: matching checkpoint tensors to parameters by name or by the graph's
// structure (names the export lost), restoring what the exporter dropped or folded, loading.
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

bool shapes_fit(const Shape& a, const Shape& b) {
  Shape x, y;
  for (int64_t d : a) if (d != 1) x.push_back(d);
  for (int64_t d : b) if (d != 1) y.push_back(d);
  return x == y;
}

}  // namespace wxe
