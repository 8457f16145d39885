// CREDIT's model zoo beyond the tiny CrossFormer / WXFormer (models/EXPORTS.md, models/audit_zoo.py):
// ONNX If (a gen1 CrossFormer with mirror padding exports one; folded once input shapes are
// bound; a general If run as a Where over both branches) and a whole nextgen_wxformer with column
// attention on a pooled grid (AveragePool), each against PyTorch's output, and its
// tensor-parallel plan.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "parallel/shard.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

Tensor run_model(const std::string& model, const std::string& x, Graph* out_graph = nullptr) {
  Graph g = import_onnx(data_path(model));
  Tensor xin = read_npy(data_path(x));
  simplify(g, {{g.values[g.inputs[0]].name, {xin.dtype, xin.shape}}});
  Tensor y = Executor(g, {0, KernelKind::Fast}).run({{g.values[g.inputs[0]].name, xin}})[0];
  if (out_graph) *out_graph = std::move(g);
  return y;
}

// y = If(c, then: Neg(x), else: Relu(x)) + x; the cond is the bool input c or a constant.
// `else_op` replaces Relu (ReduceSum: a branch of another shape).
Graph if_graph(const Tensor* const_cond, const std::string& else_op = "Relu") {
  Graph g;
  g.source = "if_graph";
  Value x;
  x.name = "x";
  x.shape = {4};
  x.shape_known = true;
  int xi = g.add_value(x);
  g.inputs.push_back(xi);
  int ci;
  if (const_cond) {
    ci = g.add_constant("c", *const_cond);
  } else {
    Value c;
    c.name = "c";
    c.dtype = DType::Bool;
    c.shape_known = true;
    ci = g.add_value(c);
    g.inputs.push_back(ci);
  }
  // the importer's form: each branch's nodes tagged, then If(cond, then outputs, else outputs)
  auto branch = [&](const std::string& op, const std::string& tag) {
    Value o;
    o.name = op + "_out";
    int oi = g.add_value(o);
    Node n;
    n.op = op;
    n.name = "/" + op;
    n.inputs = {xi};
    n.outputs = {oi};
    n.attrs["if_branch"] = attr_s(tag);
    g.nodes.push_back(n);
    return oi;
  };
  int t = branch("Neg", "|if0.then"), e = branch(else_op, "|if0.else");
  Value r;
  r.name = "r";
  int ri = g.add_value(r);
  Node iff;
  iff.op = "If";
  iff.name = "/If";
  iff.inputs = {ci, t, e};
  iff.outputs = {ri};
  iff.attrs["if_id"] = attr_s("if0");
  g.nodes.push_back(iff);
  Value y;
  y.name = "y";
  int yi = g.add_value(y);
  Node add;
  add.op = "Add";
  add.name = "/Add";
  add.inputs = {ri, xi};
  add.outputs = {yi};
  g.nodes.push_back(add);
  g.outputs = {yi};
  return g;
}

}  // namespace

// torch.onnx.export writes If(Equal(Shape(x)[2], 1), Squeeze, Identity) for the gen1 CrossFormer's
// x.squeeze(2) after a run-time reflect Pad (models/make_if_fixture.py).
TEST(Zoo, CrossformerMirrorPaddingIfMatchesPyTorch) {
  Graph imported = import_onnx(data_path("tests/data/crossformer_mirror_if.onnx"));
  EXPECT_EQ(op_counts(imported)["If"], 1);
  Graph g;
  Tensor y = run_model("tests/data/crossformer_mirror_if.onnx", "tests/data/crossformer_mirror_if_x.npy", &g);
  Tensor ref = read_npy(data_path("tests/data/crossformer_mirror_if_y.npy"));
  ASSERT_EQ(shape_str(y.shape), shape_str(ref.shape));
  EXPECT_LE(max_abs_diff(y, ref), 1e-4);
  EXPECT_LE(rel_l2(y, ref), 1e-5);
  EXPECT_EQ(op_counts(g).count("If"), 0u);
}

// The condition picks the branch: both ways against the elementwise oracle.
TEST(Zoo, FoldIfInlinesTheTakenBranch) {
  register_cpu_kernels();
  Tensor x = Tensor::from_f32({4}, {-2, -1, 1, 3});
  for (bool c : {true, false}) {
    Tensor cond(DType::Bool, {});
    cond.data<uint8_t>()[0] = c;
    Graph g = if_graph(&cond);
    simplify(g, {});
    EXPECT_EQ(op_counts(g).count("If"), 0u);
    EXPECT_EQ(op_counts(g).count(c ? "Relu" : "Neg"), 0u);  // the branch not taken is gone
    Tensor y = Executor(g, {0, KernelKind::Reference}).run({{"x", x}})[0];
    Tensor ref = c ? Tensor::from_f32({4}, {0, 0, 0, 0}) : Tensor::from_f32({4}, {-2, -1, 2, 6});
    expect_close(y, ref, 0);
  }
}

// A condition that depends on input values: both branches run and Where picks, each way
// against the elementwise oracle; branches of different shapes are refused, naming the node.
TEST(Zoo, GeneralIfRunsBothBranchesAndPicks) {
  register_cpu_kernels();
  Tensor x = Tensor::from_f32({4}, {-2, -1, 1, 3});
  for (bool c : {true, false}) {
    Graph g = if_graph(nullptr);
    simplify(g, {});
    EXPECT_EQ(op_counts(g).count("If"), 0u);
    EXPECT_EQ(op_counts(g)["Where"], 1);
    Tensor cond(DType::Bool, {});
    cond.data<uint8_t>()[0] = c;
    Tensor y = Executor(g, {0, KernelKind::Reference}).run({{"x", x}, {"c", cond}})[0];
    Tensor ref = c ? Tensor::from_f32({4}, {0, 0, 0, 0}) : Tensor::from_f32({4}, {-2, -1, 2, 6});
    expect_close(y, ref, 0);
  }
  Graph g = if_graph(nullptr, "ReduceSum");
  std::string e = error_of([&] { simplify(g, {}); });
  EXPECT_NE(e.find("/If"), std::string::npos) << e;
  EXPECT_NE(e.find("known only at run time"), std::string::npos) << e;
}

// The same from an ONNX file (models/make_if_fixture.py): y = If(sum(x) > 0, then: x * 2 + b
// with b an initializer of the branch, else: x - 1), one input of each sign.
TEST(Zoo, GeneralIfFromOnnx) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path("tests/data/if_runtime.onnx"));
  simplify(g, {});
  Executor ex(g, {0, KernelKind::Fast});
  const float b[3] = {0.5f, -0.25f, 1.0f};
  for (float sign : {1.0f, -1.0f}) {
    Tensor x(DType::F32, {2, 3});
    for (int i = 0; i < 6; ++i) x.data<float>()[i] = sign * (float)i;
    Tensor want(DType::F32, {2, 3});
    for (int i = 0; i < 6; ++i) want.data<float>()[i] = sign > 0 ? x.data<float>()[i] * 2 + b[i % 3] : x.data<float>()[i] - 1;
    expect_close(ex.run({{"x", x}})[0], want, 0);
  }
}

// A whole nextgen_wxformer (models/make_nextgen_model_fixture.py): level embedding, column
// attention on a grid pooled by 2 (AveragePool, MultiheadAttention, bilinear Resize back), the
// CrossFormer U-Net with Linear q/k/v, the spectral GNN bottleneck; both exporters.
TEST(Zoo, NextgenWholeModelMatchesPyTorch) {
  Tensor ref = read_npy(data_path("tests/data/nextgen_model_y.npy"));
  int n = 0;
  for (const char* f : {"tests/data/nextgen_model_ts.onnx", "tests/data/nextgen_model_dynamo.onnx"}) {
    if (!std::ifstream(data_path(f)).good()) continue;
    SCOPED_TRACE(f);
    EXPECT_EQ(op_counts(import_onnx(data_path(f)))["AveragePool"], 1);
    Tensor y = run_model(f, "tests/data/nextgen_model_x.npy");
    ASSERT_EQ(shape_str(y.shape), shape_str(ref.shape));
    EXPECT_LE(max_abs_diff(y, ref), 1e-4);
    EXPECT_LE(rel_l2(y, ref), 1e-5);
    ++n;
  }
  EXPECT_GE(n, 1);
}

// Its tensor-parallel plan: every encoder attention block with at least 2 heads (stage 0 has one)
// and every feed-forward block is split.
TEST(Zoo, NextgenWholeModelPlanShardsAttentionAndFeedForward) {
  Tensor x = read_npy(data_path("tests/data/nextgen_model_x.npy"));
  Graph g = import_onnx(data_path("tests/data/nextgen_model_ts.onnx"));
  simplify(g, {{"x", {x.dtype, x.shape}}});
  TpPlan plan = discover_plan(g);
  int q = 0, out = 0, up = 0, down = 0;
  for (auto& [w, s] : plan.by_weight) {
    if (w.find("to_q.weight") != std::string::npos && s == TpSplit::Column) ++q;
    if (w.find("to_out.weight") != std::string::npos && s == TpSplit::Row) ++out;
    if (w.find("layers.1.weight") != std::string::npos && s == TpSplit::Column) ++up;
    if (w.find("layers.4.weight") != std::string::npos && s == TpSplit::Row) ++down;
  }
  // 4 stages x depth 1 x (short, long) attention and 2 feed-forwards each
  EXPECT_EQ(q, 8);
  EXPECT_EQ(out, 8);
  EXPECT_EQ(up, 8);
  EXPECT_EQ(down, 8);
}

// RandomNormalLike (CrossFormerWithNoise's noise): the input's shape, mean and scale as asked
// (checked on 200k draws), the same draws for the same seed, others for another.
TEST(Zoo, RandomNormalLikeDrawsTheAskedDistribution) {
  register_cpu_kernels();
  Tensor x(DType::F32, {200, 1000});
  auto draw = [&](float seed) {
    return run_node(make_node("RandomNormalLike", 1, 1, {{"mean", attr_f(2.f)}, {"scale", attr_f(0.5f)},
                                                         {"seed", attr_f(seed)}}),
                    {&x})[0];
  };
  Tensor a = draw(1), b = draw(1), c = draw(2);
  ASSERT_EQ(a.shape, x.shape);
  double sum = 0, sq = 0;
  for (int64_t e = 0; e < a.numel(); ++e) {
    sum += a.data<float>()[e];
    sq += (double)a.data<float>()[e] * a.data<float>()[e];
  }
  const double mean = sum / a.numel(), sd = std::sqrt(sq / a.numel() - mean * mean);
  EXPECT_NEAR(mean, 2.0, 0.005);  // 4 standard errors (0.5 / sqrt(200k) = 0.0011)
  EXPECT_NEAR(sd, 0.5, 0.005);
  EXPECT_EQ(max_abs_diff(a, b), 0);
  EXPECT_GT(max_abs_diff(a, c), 0.1);
}
