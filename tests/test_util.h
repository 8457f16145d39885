// Helpers for op and pass tests: build a node, run it through its shape rule and kernel,
// compare tensors.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "engine/ir/ops.h"

namespace wxe::test {

inline std::string data_path(const std::string& rel) {
  return std::string(WXE_SOURCE_DIR) + "/" + rel;
}

// A path in the test temp folder, removed when the test program exits.
inline std::string tmp_path(const std::string& name) {
  struct Files {
    std::vector<std::string> paths;
    ~Files() {
      for (auto& p : paths) std::remove(p.c_str());
    }
  };
  static Files files;
  std::string p = testing::TempDir() + "wxe_" + std::to_string(getpid()) + "_" + name;
  if (std::find(files.paths.begin(), files.paths.end(), p) == files.paths.end()) files.paths.push_back(p);
  return p;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

// tests/data/era5_tiny/config.yml with absolute data paths and save_loc in the temp folder
// (NAME_save), each (from, to) replaced (a `from`
// that is not there fails the test), `extra` appended; written to the temp folder as NAME.yml.
inline std::string era5_tiny_config(const std::string& name,
                                    const std::vector<std::pair<std::string, std::string>>& repl = {},
                                    const std::string& extra = "") {
  const std::string dir = data_path("tests/data/era5_tiny");
  std::string text = slurp(dir + "/config.yml");
  for (const char* f : {"\"era5_%Y.*\"", "\"forcing_%Y.nc\"", "\"static.nc\"", "\"scaler.json\""})
    for (size_t p = text.find(f); p != std::string::npos; p = text.find(f, p + 1)) text.insert(p + 1, dir + "/");
  const size_t save = text.find("save_loc: \"save\"");
  if (save != std::string::npos) text.replace(save, 16, "save_loc: \"" + tmp_path(name + "_save") + "\"");
  for (auto& [a, b] : repl) {
    const size_t p = text.find(a);
    EXPECT_NE(p, std::string::npos) << a;
    if (p != std::string::npos) text.replace(p, a.size(), b);
  }
  const std::string path = tmp_path(name + ".yml");
  spit(path, text + extra);
  return path;
}

// The message of the wxe::Error f() throws, or "<no error>".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}


// Builds small graphs for pass tests: inputs, constants, single-output nodes.
struct GraphBuilder {
  Graph g;
  int input(const std::string& name, Shape s) {
    Value v;
    v.name = name;
    v.shape = s;
    int id = g.add_value(v);
    g.inputs.push_back(id);
    return id;
  }
  int constant(const std::string& name, Tensor t, bool param = false) { return g.add_constant(name, std::move(t), param); }
  int scalar(float f) { return constant("c" + std::to_string(g.values.size()), Tensor::scalar_f32(f)); }
  int node(const std::string& op, std::vector<int> in, std::map<std::string, Attr> attrs = {}) {
    Node n;
    n.op = op;
    n.name = "/" + op + "_" + std::to_string(g.nodes.size());
    n.inputs = std::move(in);
    n.attrs = std::move(attrs);
    Value v;
    v.name = n.name + "_output_0";
    n.outputs.push_back(g.add_value(v));
    g.nodes.push_back(n);
    return n.outputs[0];
  }
};

// A node with inputs 0..nin-1 and outputs nin..nin+nout-1 (indices are unused by kernels).
inline Node make_node(const std::string& op, int nin, int nout = 1,
                      std::map<std::string, Attr> attrs = {}) {
  Node n;
  n.op = op;
  n.name = "test_" + op;
  for (int i = 0; i < nin; ++i) n.inputs.push_back(i);
  for (int i = 0; i < nout; ++i) n.outputs.push_back(nin + i);
  n.attrs = std::move(attrs);
  return n;
}

// Runs node n on inputs (nullptr = omitted optional input) with the shape rule and the
// chosen kernel. All inputs are visible to the shape rule as constants.
inline std::vector<Tensor> run_node(const Node& n, const std::vector<const Tensor*>& inputs,
                                    KernelKind kind = KernelKind::Reference) {
  register_cpu_kernels();
  std::vector<Value> vals(inputs.size());
  std::vector<const Value*> vin(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    vals[i].name = "in" + std::to_string(i);
    vals[i].dtype = inputs[i]->dtype;
    vals[i].shape = inputs[i]->shape;
    vals[i].shape_known = true;
    vals[i].constant = std::make_shared<Tensor>(*inputs[i]);
    vin[i] = &vals[i];
  }
  std::vector<TypeShape> ts = shape_rule(n.op)(n, vin);
  std::vector<Tensor> outs;
  for (auto& t : ts) outs.emplace_back(t.dtype, t.shape);
  std::vector<Tensor*> po;
  for (auto& o : outs) po.push_back(&o);
  kernel_for(n.op, kind)(n, inputs, po);
  return outs;
}

inline Tensor randn(Shape s, unsigned seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  Tensor t(DType::F32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  Tensor fa = a.to_f32(), fb = b.to_f32();
  double m = 0;
  for (int64_t i = 0; i < fa.numel(); ++i)
    m = std::max(m, (double)std::fabs(fa.data<float>()[i] - fb.data<float>()[i]));
  return m;
}

inline double rel_l2(const Tensor& a, const Tensor& ref) {
  Tensor fa = a.to_f32(), fb = ref.to_f32();
  double num = 0, den = 0;
  for (int64_t i = 0; i < fa.numel(); ++i) {
    double d = (double)fa.data<float>()[i] - fb.data<float>()[i];
    num += d * d;
    den += (double)fb.data<float>()[i] * fb.data<float>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Same shape and every element within atol + rtol*|ref|.
inline void expect_close(const Tensor& got, const Tensor& ref, double atol = 1e-5,
                         double rtol = 1e-5) {
  ASSERT_EQ(shape_str(got.shape), shape_str(ref.shape));
  Tensor fa = got.to_f32(), fb = ref.to_f32();
  int bad = 0;
  for (int64_t i = 0; i < fa.numel() && bad < 5; ++i) {
    float g = fa.data<float>()[i], r = fb.data<float>()[i];
    if (!(std::fabs(g - r) <= atol + rtol * std::fabs(r))) {
      ADD_FAILURE() << "element " << i << ": got " << g << ", expected " << r;
      ++bad;
    }
  }
}

}  // namespace wxe::test
