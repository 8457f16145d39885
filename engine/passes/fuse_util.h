// Helpers the fusion passes share (engine/passes/fuse*.cpp only; the passes' API is fuse.h).
#pragma once
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/ir/ops.h"

namespace wxe::fuse_util {

// Readers and producers of every value, rebuilt by each pass before it looks at the graph.
struct Uses {
  std::vector<int> producer;            // node index or -1
  std::vector<std::vector<int>> readers;  // node indices (a node reading a value twice is listed twice)
  std::vector<bool> is_output;
  explicit Uses(const Graph& g)
      : producer(g.producers()), readers(g.values.size()), is_output(g.values.size(), false) {
    for (size_t k = 0; k < g.nodes.size(); ++k)
      for (int i : g.nodes[k].inputs)
        if (i >= 0) readers[i].push_back((int)k);
    for (int o : g.outputs) is_output[o] = true;
  }
  // The node producing v, if v is an intermediate only that many reads use.
  int only_for(int v, size_t reads) const {
    if (v < 0 || is_output[v] || readers[v].size() != reads) return -1;
    return producer[v];
  }
};

inline bool const_f32_scalar(const Graph& g, int v, float* out) {
  if (v < 0 || !g.values[v].is_const()) return false;
  const Tensor& t = *g.values[v].constant;
  if (t.dtype != DType::F32 || t.numel() != 1) return false;
  *out = t.data<float>()[0];
  return true;
}

// A new intermediate value whose shape the shape rule of its producer sets (set_shapes).
inline int add_value(Graph& g, const std::string& name) {
  Value v;
  v.name = name;
  return g.add_value(std::move(v));
}

inline void set_shapes(Graph& g, const Node& n) {
  std::vector<const Value*> in;
  for (int i : n.inputs) in.push_back(i < 0 ? nullptr : &g.values[i]);
  std::vector<TypeShape> ts = shape_rule(n.op)(n, in);
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Value& v = g.values[n.outputs[k]];
    WXE_ASSERT(!v.shape_known || (v.shape == ts[k].shape && v.dtype == ts[k].dtype));
    v.dtype = ts[k].dtype;
    v.shape = ts[k].shape;
    v.shape_known = true;
  }
}

inline bool node_is(const Graph& g, int k, const char* op) { return k >= 0 && g.nodes[k].op == op; }

// Removes the nodes marked in `drop` (their order kept) and the values nothing uses any more.
inline void remove_nodes(Graph& g, const std::vector<bool>& drop) {
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
  compact_values(g);
}

}  // namespace wxe::fuse_util
