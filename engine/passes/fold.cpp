// Binding inputs, shape inference and constant folding, If inlining, identity and dead-node
// removal: the passes that make an exported graph static and small.
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

std::set<std::string>& updates_inputs_ops() {  // register_updates_inputs
  static std::set<std::string> s;
  return s;
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



namespace pass_util {

void propagate(Graph& g, bool drop, const std::function<bool(size_t, const Node&)>& may_fold, bool only) {
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& n = g.nodes[k];
    bool allowed = may_fold(k, n) && !op_updates_inputs(n.op) && !op_is_random(n.op);
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

}  // namespace pass_util

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

}  // namespace wxe
