// Layer: engine (the bottom). engine/ir is the IR; engine/io file formats, engine/passes graph
// rewrites, engine/exec execution and backends, engine/math math shared with device code.
// engine/ includes nothing outside engine/; kernels and collectives register into its tables.
// Graph IR: plain data. Values are edges (named tensors with static type and shape, and a
// constant payload when known); nodes are ONNX-style ops reading and writing values by index.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

struct Attr {
  enum Kind { Int, Float, String, Ints, Floats, Tensor_ } kind = Int;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::shared_ptr<Tensor> t;
};

// Attribute makers.
Attr attr_i(int64_t v);
Attr attr_f(float v);
Attr attr_s(const std::string& v);
Attr attr_ints(std::vector<int64_t> v);

struct Node {
  std::string op;      // ONNX op type, e.g. "Conv"; or a wxe op, e.g. "Linear"
  std::string name;    // debug name, e.g. "/layers.0.1/layers.0.0/to_qkv/Conv"
  std::string domain;  // "" for the ONNX default domain
  std::vector<int> inputs;   // value ids; -1 for an omitted optional input
  std::vector<int> outputs;  // value ids
  std::map<std::string, Attr> attrs;

  bool has(const std::string& a) const { return attrs.count(a) != 0; }
  int64_t i(const std::string& a, int64_t def) const;
  float f(const std::string& a, float def) const;
  std::string s(const std::string& a, const std::string& def) const;
  std::vector<int64_t> ints(const std::string& a, std::vector<int64_t> def = {}) const;
};

struct Value {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  bool shape_known = false;
  std::shared_ptr<Tensor> constant;  // set when the value is known without running the graph
  bool is_param = false;             // a trained parameter (initializer or folded weight)
  // Set where a pass named a parameter from the graph's structure (passes.h
  // name_params_by_scope): the initializer's name in the export ("div_12", "onnx::MatMul_7").
  std::string export_name;
  // Other checkpoint names this parameter may carry, tried in order when `name` is not in the
  // checkpoint; one that fits its shape is taken, two that fit are an ambiguity (load_weights).
  std::vector<std::string> alt_names;
  bool is_const() const { return constant != nullptr; }
};

struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;   // kept in topological order by every pass
  std::vector<int> inputs;   // runtime inputs (value ids)
  std::vector<int> outputs;  // graph outputs (value ids)
  int opset = 17;
  std::string source;        // file it came from, for error messages

  int add_value(Value v);
  // A value known at build time (a parameter when is_param).
  int add_constant(const std::string& name, Tensor t, bool is_param = false);
  int find_value(const std::string& name) const;  // -1 if absent
  // producer[v] = node index or -1; built on demand by passes
  std::vector<int> producers() const;
  std::vector<int> use_counts() const;  // node inputs + graph outputs
};

// Re-sorts nodes topologically; fails on a cycle or an input with no producer.
void topo_sort(Graph& g);
// Drops values no node or graph input/output references and renumbers.
void compact_values(Graph& g);
// Human-readable dump, one line per node: "%out (1,16,32,64) = Conv(%x, layers.0.weight)".
std::string dump(const Graph& g);
// op type -> count
std::map<std::string, int> op_counts(const Graph& g);
// "Conv  /layers.0/Conv  (1, 80, 256, 384) w(8, 80, 8, 8) -> (1, 8, 128, 192)": op, name, the
// shapes of its inputs (constant ones of rank 2 or more as w(...)) and of its first output.
std::string node_signature(const Graph& g, const Node& n);

}  // namespace wxe
