#include "engine/ir/graph.h"

#include <algorithm>
#include <sstream>

namespace wxe {

int64_t Node::i(const std::string& a, int64_t def) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? def : it->second.i;
}
float Node::f(const std::string& a, float def) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? def : it->second.f;
}
std::string Node::s(const std::string& a, const std::string& def) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? def : it->second.s;
}
std::vector<int64_t> Node::ints(const std::string& a, std::vector<int64_t> def) const {
  auto it = attrs.find(a);
  return it == attrs.end() ? def : it->second.ints;
}

Attr attr_i(int64_t v) {
  Attr a;
  a.kind = Attr::Int;
  a.i = v;
  return a;
}
Attr attr_f(float v) {
  Attr a;
  a.kind = Attr::Float;
  a.f = v;
  return a;
}
Attr attr_s(const std::string& v) {
  Attr a;
  a.kind = Attr::String;
  a.s = v;
  return a;
}
Attr attr_ints(std::vector<int64_t> v) {
  Attr a;
  a.kind = Attr::Ints;
  a.ints = std::move(v);
  return a;
}

int Graph::add_constant(const std::string& name, Tensor t, bool is_param) {
  Value v;
  v.name = name;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.shape_known = true;
  v.is_param = is_param;
  v.constant = std::make_shared<Tensor>(std::move(t));
  return add_value(std::move(v));
}

int Graph::add_value(Value v) {
  values.push_back(std::move(v));
  return (int)values.size() - 1;
}

int Graph::find_value(const std::string& name) const {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].name == name) return (int)i;
  return -1;
}

std::vector<int> Graph::producers() const {
  std::vector<int> p(values.size(), -1);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (int o : nodes[n].outputs) p[o] = (int)n;
  return p;
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> c(values.size(), 0);
  for (auto& n : nodes)
    for (int i : n.inputs)
      if (i >= 0) ++c[i];
  for (int o : outputs) ++c[o];
  return c;
}

void topo_sort(Graph& g) {
  std::vector<int> prod = g.producers();
  std::vector<int> state(g.nodes.size(), 0);  // 0 new, 1 visiting, 2 done
  std::vector<Node> order;
  order.reserve(g.nodes.size());
  // iterative DFS so deep graphs do not overflow the stack
  for (size_t root = 0; root < g.nodes.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<int, size_t>> stack{{(int)root, 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const Node& node = g.nodes[n];
      if (next < node.inputs.size()) {
        int v = node.inputs[next++];
        if (v < 0) continue;
        int p = prod[v];
        if (p < 0) {
          WXE_CHECK(g.values[v].is_const() ||
                        std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end(),
                    g.source, ": node ", node.name, " reads '", g.values[v].name,
                    "', which nothing produces");
          continue;
        }
        WXE_CHECK(state[p] != 1, g.source, ": the graph has a cycle through node ", node.name);
        if (state[p] == 0) {
          state[p] = 1;
          stack.push_back({p, 0});
        }
      } else {
        state[n] = 2;
        order.push_back(std::move(g.nodes[n]));
        stack.pop_back();
      }
    }
  }
  g.nodes = std::move(order);
}

void compact_values(Graph& g) {
  std::vector<int> keep(g.values.size(), 0);
  for (auto& n : g.nodes) {
    for (int i : n.inputs)
      if (i >= 0) keep[i] = 1;
    for (int o : n.outputs) keep[o] = 1;
  }
  for (int v : g.inputs) keep[v] = 1;
  for (int v : g.outputs) keep[v] = 1;
  std::vector<int> remap(g.values.size(), -1);
  std::vector<Value> vals;
  for (size_t i = 0; i < g.values.size(); ++i)
    if (keep[i]) {
      remap[i] = (int)vals.size();
      vals.push_back(std::move(g.values[i]));
    }
  g.values = std::move(vals);
  for (auto& n : g.nodes) {
    for (int& i : n.inputs)
      if (i >= 0) i = remap[i];
    for (int& o : n.outputs) o = remap[o];
  }
  for (int& v : g.inputs) v = remap[v];
  for (int& v : g.outputs) v = remap[v];
}

std::string node_signature(const Graph& g, const Node& n) {
  std::string s = n.op + "  " + n.name + " ";
  for (int v : n.inputs)
    if (v >= 0 && !g.values[v].is_const()) s += " " + shape_str(g.values[v].shape);
  for (int v : n.inputs)
    if (v >= 0 && g.values[v].is_const() && g.values[v].shape.size() > 1) s += " w" + shape_str(g.values[v].shape);
  if (!n.outputs.empty()) s += " -> " + shape_str(g.values[n.outputs[0]].shape);
  return s;
}

std::string dump(const Graph& g) {
  std::ostringstream os;
  auto vname = [&](int v) {
    if (v < 0) return std::string("_");
    const Value& x = g.values[v];
    return (x.is_const() ? "" : "%") + x.name;
  };
  for (int v : g.inputs)
    os << "input %" << g.values[v].name << " " << dtype_name(g.values[v].dtype) << " "
       << shape_str(g.values[v].shape) << "\n";
  for (auto& n : g.nodes) {
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const Value& o = g.values[n.outputs[k]];
      os << (k ? ", " : "") << "%" << o.name << " " << shape_str(o.shape);
    }
    os << " = " << n.op << "(";
    for (size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << vname(n.inputs[k]);
    os << ")";
    if (!n.name.empty()) os << "  # " << n.name;
    os << "\n";
  }
  for (int v : g.outputs) os << "output %" << g.values[v].name << "\n";
  return os.str();
}

std::map<std::string, int> op_counts(const Graph& g) {
  std::map<std::string, int> c;
  for (auto& n : g.nodes) ++c[n.op];
  return c;
}

}  // namespace wxe
