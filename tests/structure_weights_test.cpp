// A legacy CREDIT checkpoint loaded into exports that lost its parameter names (issue 10 item 6;
// passes.h name_params_by_scope, match_weights): the dynamo exporter's folded spectral norm,
// GroupNorm and position-bias constants, and a frames-2 TorchScript export's renamed second
// calls and pre-transposed MultiheadAttention weights. Fixtures: models/make_structw_fixtures.py
// (each export made from weights A, the checkpoint and y from weights B: a parameter left at
// the export's value, or put in the wrong place, changes y).
#include <gtest/gtest.h>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "importers/torch/torch_checkpoint.h"
#include "tests/test_util.h"
#include "load/model.h"

using namespace wxe;
using namespace wxe::test;

namespace {

// The model with `weights` loaded as `wxe infer --weights` does ("" keeps the export's own).
Tensor run_with(const std::string& stem, const std::string& weights) {
  Graph g = import_onnx(data_path("tests/data/" + stem + ".onnx"));
  Tensor x = read_npy(data_path("tests/data/" + stem + "_x.npy"));
  LoadOptions opt;
  opt.weights = weights.empty() ? "" : data_path("tests/data/" + weights);
  prepare_model(g, {{"x", {x.dtype, x.shape}}}, opt);
  return Executor(g, {0, KernelKind::Fast}).run({{"x", x}})[0];
}

// match_weights and restore_dropped_biases on the prepared export, as `wxe convert --onnx`
// runs them.
WeightMatch match(const std::string& model, const std::string& x_npy, const NamedTensors& w) {
  Graph g = import_onnx(data_path("tests/data/" + model));
  Tensor x = read_npy(data_path("tests/data/" + x_npy));
  prepare_graph(g, {{"x", {x.dtype, x.shape}}});
  WeightMatch m = match_weights(g, w);
  restore_dropped_biases(g, m);
  return m;
}

}  // namespace

// The checkpoint's outputs, not the export's: every parameter of B found its place.
TEST(StructureWeights, CheckpointLoadsIntoExportsThatLostItsNames) {
  register_cpu_kernels();
  for (const char* stem : {"structw_crossformer_dynamo", "structw_nextgen_f2_ts"}) {
    SCOPED_TRACE(stem);
    Tensor ref = read_npy(data_path(std::string("tests/data/") + stem + "_y.npy"));
    Tensor own = run_with(stem, "");
    EXPECT_GT(max_abs_diff(own, ref), 0.1);  // the export's weights A give another y
    Tensor y = run_with(stem, std::string(stem) + "_checkpoint.pt");
    ASSERT_EQ(shape_str(y.shape), shape_str(ref.shape));
    EXPECT_LE(max_abs_diff(y, ref), 1e-4);
    EXPECT_LE(rel_l2(y, ref), 1e-5);
  }
}

// `convert --onnx` finds every parameter, most of the dynamo export's by structure; the
// torch 2 dynamo exports of the tiny models (shipped before, not loadable before) too.
TEST(StructureWeights, ConvertCheckFindsEveryParameter) {
  register_cpu_kernels();
  struct Case {
    const char *model, *x, *ckpt;
    int min_structural;
  } cases[] = {
      {"structw_crossformer_dynamo.onnx", "structw_crossformer_dynamo_x.npy", "structw_crossformer_dynamo_checkpoint.pt", 60},
      {"structw_nextgen_f2_ts.onnx", "structw_nextgen_f2_ts_x.npy", "structw_nextgen_f2_ts_checkpoint.pt", 10},
      {"torch2_crossformer_tiny_dynamo.onnx", "torch2_crossformer_tiny_x.npy", "crossformer_tiny_checkpoint.pt", 100},
      {"torch2_wxformer_tiny_dynamo.onnx", "torch2_wxformer_tiny_x.npy", "wxformer_tiny_checkpoint.pt", 100},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    NamedTensors w = read_weights(data_path(std::string("tests/data/") + c.ckpt));
    WeightMatch m = match(c.model, c.x, w);
    EXPECT_TRUE(m.missing.empty()) << m.missing[0];
    EXPECT_TRUE(m.mismatched.empty()) << m.mismatched[0];
    EXPECT_TRUE(m.ambiguous.empty()) << m.ambiguous[0];
    EXPECT_GE(m.by_structure, c.min_structural);
    for (const std::string& u : m.unused)  // CREDIT's cube_embedding is not in these graphs (dropped biases are back)
      EXPECT_EQ(u.rfind("cube_embedding.", 0), 0u) << u;
  }
}

// A parameter whose tensor is not in the checkpoint: one error naming the export's initializer
// and the node that reads it. Two tensors that both fit: refused, not guessed.
TEST(StructureWeights, UnmatchedOrAmbiguousParameterIsNamed) {
  register_cpu_kernels();
  NamedTensors w = read_weights(data_path("tests/data/structw_nextgen_f2_ts_checkpoint.pt"));
  NamedTensors lacking, twice;
  for (auto& [n, t] : w) {
    if (n != "col_attn.attn.in_proj_weight") lacking.push_back({n, t});
    // out_proj shaped like in_proj: both fit the (6, 2) projection
    twice.push_back({n, n == "col_attn.attn.out_proj.weight" ? randn({6, 2}, 3) : t});
  }
  Graph g = import_onnx(data_path("tests/data/structw_nextgen_f2_ts.onnx"));
  Tensor x = read_npy(data_path("tests/data/structw_nextgen_f2_ts_x.npy"));
  prepare_graph(g, {{"x", {x.dtype, x.shape}}});
  Graph g2 = g;
  std::string e = error_of([&] { load_weights(g, lacking, "ckpt.pt"); });
  EXPECT_NE(e.find("ckpt.pt: weights do not fit the model: missing 2"), std::string::npos) << e;
  EXPECT_NE(e.find("initializer 'onnx::MatMul_4681', read by node /col_attn.attn/Linear"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  e = error_of([&] { load_weights(g2, twice, "ckpt.pt"); });
  EXPECT_NE(e.find("match more than one checkpoint tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("col_attn.attn.in_proj_weight or col_attn.attn.out_proj.weight"), std::string::npos) << e;
}

// The position-bias grid of CREDIT's DynamicPositionBias: (2w+1)^2 rows of (i, j), i major.
TEST(StructureWeights, PositionBiasGrid) {
  Tensor t = layout::position_bias_grid(9);
  ASSERT_EQ(shape_str(t.shape), "(9, 2)");
  expect_close(t, Tensor::from_f32({9, 2}, {-1, -1, -1, 0, -1, 1, 0, -1, 0, 0, 0, 1, 1, -1, 1, 0, 1, 1}), 0);
  EXPECT_EQ(layout::position_bias_grid(8).numel(), 0);
}

// Fine-tuning a dynamo export that baked the spectral norm of its small layers and traced the
// others: the traced ones stay SpectralNorm ops reading weight_orig/u/v, the baked ones read
// the checkpoint's folded weight (and train as plain weights).
TEST(StructureWeights, TrainingGraphOfAMixedSpectralNormExport) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path("tests/data/torch2_crossformer_tiny_dynamo.onnx"));
  Tensor x = read_npy(data_path("tests/data/torch2_crossformer_tiny_x.npy"));
  LoadOptions opt;
  opt.training = true;
  opt.weights = data_path("tests/data/crossformer_tiny_checkpoint.pt");
  prepare_model(g, {{"x", {x.dtype, x.shape}}}, opt);
  EXPECT_EQ(op_counts(g)["SpectralNorm"], 30);
  NamedTensors folded = read_weights(opt.weights);
  int checked = 0;
  for (auto& [name, t] : folded)
    if (name == "layers.0.0.convs.0.weight" || name == "layers.0.1.layers.0.0.to_q.weight") {
      int v = g.find_value(name);
      ASSERT_GE(v, 0) << name;
      EXPECT_FALSE(g.values[v].export_name.empty()) << name;  // an anonymous constant in the export
      expect_close(*g.values[v].constant, t, 0);
      ++checked;
    }
  EXPECT_EQ(checked, 2);
  EXPECT_GE(g.find_value("layers.3.1.layers.0.0.to_qkv.weight_orig"), 0);  // traced: kept
}

namespace {

// y = LayerNormalization(c) + x, as a dynamo export writes a position-bias MLP whose first
// Linear ran on the constant grid: c is the anonymous constant "linear_3" (rows, 4), read in the
// scope of "blk.dpb.layers.1".
Graph folded_position_bias(const Tensor& c) {
  Graph g;
  g.source = "pb.onnx";
  Value x;
  x.name = "x";
  x.shape = c.shape;
  x.shape_known = true;
  int xi = g.add_value(x);
  g.inputs = {xi};
  int ci = g.add_constant("linear_3", c, true);
  int si = g.add_constant("blk.dpb.layers.1.weight", Tensor::from_f32({4}, {1, 1, 1, 1}), true);
  int bi = g.add_constant("blk.dpb.layers.1.bias", Tensor::from_f32({4}, {0, 0, 0, 0}), true);
  Value ln, y;
  ln.name = "ln";
  y.name = "y";
  int li = g.add_value(ln), yi = g.add_value(y);
  Node n = make_node("LayerNormalization", 0);
  n.name = "/blk.dpb.layers.1/node_layer_norm";
  n.inputs = {ci, si, bi};
  n.outputs = {li};
  g.nodes.push_back(n);
  Node add = make_node("Add", 0);
  add.name = "/add";
  add.inputs = {li, xi};
  add.outputs = {yi};
  g.nodes.push_back(add);
  g.outputs = {yi};
  return g;
}

}  // namespace

// The folded first Linear of a position-bias MLP is put back on the grid: without weights the
// graph computes what it did, with a checkpoint its blk.dpb.layers.0 takes effect. A constant
// that is no Linear of the grid is left alone: the graph runs, and loading names it.
TEST(StructureWeights, PositionBiasLinearPutBack) {
  register_cpu_kernels();
  Tensor grid = layout::position_bias_grid(25), w = randn({4, 2}, 5), b = randn({4}, 6);
  auto linear = [&](const Tensor& wt, const Tensor& bt) {  // grid @ W^T + b
    Tensor r(DType::F32, {25, 4});
    for (int i = 0; i < 25; ++i)
      for (int j = 0; j < 4; ++j)
        r.data<float>()[i * 4 + j] = grid.data<float>()[i * 2] * wt.data<float>()[j * 2] +
                                     grid.data<float>()[i * 2 + 1] * wt.data<float>()[j * 2 + 1] + bt.data<float>()[j];
    return r;
  };
  Tensor x = randn({25, 4}, 7);
  auto run = [&](Graph g, const NamedTensors* weights) {
    simplify(g, {{"x", {DType::F32, {25, 4}}}}, weights);
    return Executor(g, {0, KernelKind::Reference}).run({{"x", x}})[0];
  };
  Graph plain = folded_position_bias(linear(w, b));
  Tensor y0 = run(plain, nullptr);
  Graph restored = folded_position_bias(linear(w, b));
  prepare_graph(restored, {{"x", {DType::F32, {25, 4}}}});
  EXPECT_EQ(op_counts(restored)["Gemm"], 1);
  EXPECT_GE(restored.find_value("blk.dpb.layers.0.weight"), 0);
  // another checkpoint: its Linear, not the export's
  Tensor w2 = randn({4, 2}, 8), b2 = randn({4}, 9);
  NamedTensors ck = {{"blk.dpb.layers.0.weight", w2}, {"blk.dpb.layers.0.bias", b2},
                     {"blk.dpb.layers.1.weight", Tensor::from_f32({4}, {1, 1, 1, 1})},
                     {"blk.dpb.layers.1.bias", Tensor::from_f32({4}, {0, 0, 0, 0})}};
  Tensor y2 = run(folded_position_bias(linear(w, b)), &ck);
  Tensor ref2 = run(folded_position_bias(linear(w2, b2)), nullptr);
  expect_close(y2, ref2, 1e-5);
  EXPECT_GT(max_abs_diff(y2, y0), 0.01);
  // not a Linear of the grid: runs as exported; a checkpoint cannot say what it is
  Tensor odd = randn({25, 4}, 10);
  Graph g = folded_position_bias(odd);
  prepare_graph(g, {{"x", {DType::F32, {25, 4}}}});
  EXPECT_EQ(op_counts(g).count("Gemm"), 0u);
  std::string e = error_of([&] { load_weights(g, ck, "ckpt.pt"); });
  EXPECT_NE(e.find("linear_3 (initializer 'linear_3', read by node /blk.dpb.layers.1/node_layer_norm)"),
            std::string::npos) << e;
}

// nn.Linear exported as Gemm(x, W^T, b) with transB=0, W^T an exporter-made constant (K, N):
// its parameter is the module's weight, (N, K) as the checkpoint holds it. Without weights the
// graph computes what the export did; with a checkpoint, its blk.fc.weight takes effect.
TEST(StructureWeights, GemmWithTransposedWeightTakesTheModulesWeight) {
  register_cpu_kernels();
  Tensor x = randn({2, 3}, 11), wt = randn({3, 4}, 12), b = randn({4}, 13);  // wt: W^T (K, N)
  auto prepared = [&](const NamedTensors* weights) {
    GraphBuilder gb;
    int xi = gb.input("x", {2, 3});
    gb.g.outputs = {gb.node("Gemm", {xi, gb.constant("onnx::Gemm_5", wt, true), gb.constant("onnx::Gemm_6", b, true)})};
    gb.g.nodes.back().name = "/blk.fc/Gemm";
    simplify(gb.g, {{"x", {DType::F32, {2, 3}}}}, weights);
    return gb.g;
  };
  auto run = [&](const Graph& g) { return Executor(g, {0, KernelKind::Reference}).run({{"x", x}})[0]; };
  Graph g = prepared(nullptr);
  const int wi = g.find_value("blk.fc.weight");
  ASSERT_GE(wi, 0);
  EXPECT_EQ(shape_str(g.values[wi].shape), "(4, 3)");
  expect_close(run(g), run_node(make_node("Gemm", 3), {&x, &wt, &b})[0], 1e-5);
  Tensor w2 = randn({4, 3}, 14), b2 = randn({4}, 15);  // another checkpoint's Linear (N, K)
  NamedTensors ck = {{"blk.fc.weight", w2}, {"blk.fc.bias", b2}};
  expect_close(run(prepared(&ck)), run_node(make_node("Gemm", 3, 1, {{"transB", attr_i(1)}}), {&x, &w2, &b2})[0],
               1e-5);
}
