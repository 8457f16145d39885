// Each pass alone: a small graph in, the expected graph out, the same numbers before and after.
#include "engine/exec/executor.h"
#include "engine/passes/passes.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

using Builder = GraphBuilder;

// Runs g (shapes inferred on a copy) with the reference kernels.
Tensor run_graph(Graph g, const Tensor& x) {
  register_cpu_kernels();
  bind_inputs(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
  infer_shapes(g);
  Executor ex(g, {0, KernelKind::Reference});
  return ex.run({{g.values[g.inputs[0]].name, x}})[0];
}

// x -> Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape(x) -> Identity -> Relu
// plus a dead Sqrt branch.
Builder shape_chain_graph() {
  Builder b;
  register_cpu_kernels();
  int x = b.input("x", {-1, 3, 4});
  int shp = b.node("Shape", {x});
  int zero = b.constant("zero", Tensor::from_i64({0}).reshaped({}));
  int batch = b.node("Gather", {shp, zero}, {{"axis", attr_i(0)}});
  int ax = b.constant("ax", Tensor::from_i64({0}));
  int b1 = b.node("Unsqueeze", {batch, ax});
  int m1 = b.constant("m1", Tensor::from_i64({-1}));
  int target = b.node("Concat", {b1, m1}, {{"axis", attr_i(0)}});
  int r = b.node("Reshape", {x, target});
  int id = b.node("Identity", {r});
  b.node("Sqrt", {id});  // dead
  int y = b.node("Relu", {id});
  b.g.outputs.push_back(y);
  return b;
}

}  // namespace

TEST(Passes, FoldConstantsResolvesShapeChains) {
  Builder b = shape_chain_graph();
  Tensor x = randn({2, 3, 4}, 7);
  Tensor before = run_graph(b.g, x);
  Graph g = b.g;
  bind_inputs(g, {{"x", {DType::F32, {2, 3, 4}}}});
  fold_constants(g);
  std::map<std::string, int> c = op_counts(g);
  EXPECT_EQ(c.count("Shape") + c.count("Gather") + c.count("Unsqueeze") + c.count("Concat"), 0u);
  EXPECT_EQ(c["Reshape"], 1);
  // the Reshape target is now the constant (2, -1)
  for (auto& n : g.nodes) {
    if (n.op == "Reshape") {
      EXPECT_EQ(g.values[n.inputs[1]].constant->to_i64(), (std::vector<int64_t>{2, -1}));
    }
  }
  expect_close(run_graph(g, x), before, 0, 0);
}

TEST(Passes, RemoveIdentitiesRewiresReaders) {
  Builder b = shape_chain_graph();
  Graph g = b.g;
  remove_identities(g);
  EXPECT_EQ(op_counts(g).count("Identity"), 0u);
  Tensor x = randn({2, 3, 4}, 8);
  expect_close(run_graph(g, x), run_graph(b.g, x), 0, 0);
}

TEST(Passes, IdentityFeedingGraphOutputKeepsOutputName) {
  Builder b;
  int x = b.input("x", {2});
  int r = b.node("Relu", {x});
  int y = b.node("Identity", {r});
  b.g.values[y].name = "y";
  b.g.outputs.push_back(y);
  remove_identities(b.g);
  EXPECT_EQ(b.g.nodes.size(), 1u);
  EXPECT_EQ(b.g.values[b.g.outputs[0]].name, "y");
}

TEST(Passes, DeadNodesAreDropped) {
  Builder b = shape_chain_graph();
  Graph g = b.g;
  eliminate_dead_nodes(g);
  EXPECT_EQ(op_counts(g).count("Sqrt"), 0u);
  EXPECT_EQ(g.nodes.size(), b.g.nodes.size() - 1);
}

TEST(Passes, SimplifyLeavesOnlyCompute) {
  Builder b = shape_chain_graph();
  Graph g = b.g;
  simplify(g, {{"x", {DType::F32, {2, 3, 4}}}});
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].op, "Reshape");
  EXPECT_EQ(g.nodes[1].op, "Relu");
}

TEST(Passes, SpectralNormFoldsIntoNamedWeight) {
  // W = w_orig / (u . (W_mat v)) as torch.onnx traces it, consumed by a Mul.
  Builder b;
  Tensor w = randn({4, 3}, 11), u = randn({4}, 12), v = randn({3}, 13);
  int x = b.input("x", {4, 3});
  int wo = b.constant("lin.weight_orig", w, true);
  int wu = b.constant("lin.weight_u", u, true);
  int wv = b.constant("lin.weight_v", v, true);
  int wv_ = b.node("MatMul", {wo, wv});
  int sigma = b.node("MatMul", {wu, wv_});
  int wn = b.node("Div", {wo, sigma});
  b.g.outputs.push_back(b.node("Mul", {x, wn}));
  Tensor xin = randn({4, 3}, 14);
  Tensor before = run_graph(b.g, xin);

  Graph g = b.g;
  simplify(g, {{"x", {DType::F32, {4, 3}}}});
  ASSERT_EQ(g.nodes.size(), 1u);
  const Value& weight = g.values[g.nodes[0].inputs[1]];
  EXPECT_EQ(weight.name, "lin.weight");
  EXPECT_TRUE(weight.is_param);
  double sig = 0;
  for (int r = 0; r < 4; ++r) {
    double wvr = 0;
    for (int c = 0; c < 3; ++c) wvr += w.data<float>()[r * 3 + c] * v.data<float>()[c];
    sig += u.data<float>()[r] * wvr;
  }
  for (int i = 0; i < 12; ++i)
    EXPECT_NEAR(weight.constant->data<float>()[i], w.data<float>()[i] / sig, 1e-6);
  for (auto& val : g.values) EXPECT_EQ(val.name.find("weight_orig"), std::string::npos);
  expect_close(run_graph(g, xin), before, 1e-6, 1e-6);
}

TEST(Passes, BindInputsNamesExpectedShape) {
  Builder b = shape_chain_graph();
  try {
    bind_inputs(b.g, {{"x", {DType::F32, {2, 5, 4}}}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects shape (?, 3, 4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bind_inputs(b.g, {{"nope", {DType::F32, {2, 3, 4}}}}), Error);
}

// torch 2 (dynamo) takes q, k and v apart with a Split of their Concat: the readers read the
// parts, and the Concat and Split go.
TEST(Passes, SplitOfConcatReadsTheParts) {
  Builder b;
  register_cpu_kernels();
  int x = b.input("x", {2, 4});
  int p[3];
  for (int k = 0; k < 3; ++k) p[k] = b.node("Mul", {x, b.scalar(1.f + k)});
  int cat = b.node("Concat", {p[0], p[1], p[2]}, {{"axis", attr_i(1)}});
  Node split;
  split.op = "Split";
  split.name = "/Split";
  split.inputs = {cat, b.constant("sizes", Tensor::from_i64({4, 4, 4}))};
  split.attrs["axis"] = attr_i(-1);
  int out[3];
  for (int k = 0; k < 3; ++k) {
    Value v;
    v.name = "part" + std::to_string(k);
    out[k] = b.g.add_value(v);
    split.outputs.push_back(out[k]);
  }
  b.g.nodes.push_back(split);
  b.g.outputs.push_back(b.node("Sub", {b.node("Add", {out[0], out[2]}), out[1]}));
  Tensor xin = randn({2, 4}, 7);
  Tensor before = run_graph(b.g, xin);
  Graph g = b.g;
  simplify(g, {{"x", {DType::F32, {2, 4}}}});
  EXPECT_EQ(op_counts(g)["Split"], 0);
  EXPECT_EQ(op_counts(g)["Concat"], 0);
  expect_close(run_graph(g, xin), before, 0, 0);
}
