// The module table (engine/ir/module_roles.h, CREDIT's in models/credit_modules.h) is the one place
// the passes, the checkpoint layout rules and the tensor-parallel plan learn module names from:
// a model whose projections are named otherwise is rewritten and sharded once its names are
// added to the table, and every CREDIT family fixture shards its attention and feed-forward.
#include <filesystem>

#include "engine/passes/layout_rules.h"
#include "engine/ir/module_roles.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "models/credit_modules.h"
#include "parallel/collective_ops.h"
#include "parallel/shard.h"
#include "tests/test_util.h"
#include "load/model.h"

using namespace wxe;
using namespace wxe::test;

namespace {

// Every test in wxe_tests sees CREDIT's table, as the wxe command does (tools/wxe.cpp main):
// registered here, once, before main.
const bool credit_modules_registered = (register_credit_modules(), true);

// Puts CREDIT's table back when a test that extended it ends.
struct CreditTableAfter {
  ~CreditTableAfter() { register_credit_modules(); }
};

// x (2, 8, 3, 3) -> 1x1 Conv `up` (8 -> 16) -> Relu -> 1x1 Conv `down` (16 -> 8): a feed-forward
// block whose modules are named blk.mlp.<up> and blk.mlp.<down>.
Graph feed_forward(const std::string& up, const std::string& down) {
  register_cpu_kernels();
  GraphBuilder b;
  int x = b.input("x", {2, 8, 3, 3});
  int h = b.node("Conv", {x, b.constant("blk.mlp." + up + ".weight", randn({16, 8, 1, 1}, 1), true),
                          b.constant("blk.mlp." + up + ".bias", randn({16}, 2), true)});
  int y = b.node("Conv", {b.node("Relu", {h}), b.constant("blk.mlp." + down + ".weight", randn({8, 16, 1, 1}, 3), true),
                          b.constant("blk.mlp." + down + ".bias", randn({8}, 4), true)});
  b.g.outputs.push_back(y);
  simplify(b.g, {{"x", {DType::F32, {2, 8, 3, 3}}}});
  return b.g;
}

}  // namespace

TEST(ModuleTable, CreditRolesByNameTail) {
  ASSERT_TRUE(credit_modules_registered);
  EXPECT_EQ(module_role("layers.0.1.layers.0.0.to_q"), Role::Q);
  EXPECT_EQ(module_role("to_k"), Role::K);
  EXPECT_EQ(module_role("a.to_v"), Role::V);
  EXPECT_EQ(module_role("a.to_qkv"), Role::Qkv);
  EXPECT_EQ(module_role("a.to_out"), Role::Out);
  EXPECT_EQ(module_role("layers.0.1.layers.0.1.layers.1"), Role::FfnUp);
  EXPECT_EQ(module_role("layers.0.1.layers.0.1.layers.4"), Role::FfnDown);
  EXPECT_EQ(module_role("a.xto_q"), Role::None);  // a tail starts after a '.'
  EXPECT_EQ(module_role("a.to_q.b"), Role::None);
  EXPECT_EQ(module_role("a.layers.2"), Role::None);
  EXPECT_EQ(sibling_module("blk.to_qkv", Role::K), "blk.to_k");
  EXPECT_TRUE(is_param_leaf("g"));
  EXPECT_TRUE(is_param_leaf("weight"));
  EXPECT_FALSE(is_param_leaf("weight_orig"));
}

// The layout rules read the table: a fused projection named otherwise splits once named in it.
TEST(ModuleTable, LayoutRulesReadTheTable) {
  CreditTableAfter restore;
  NamedTensors legacy = {{"blk.attn_qkv.weight", randn({12, 4, 1, 1}, 5)}};
  EXPECT_EQ(layout::convert_state_dict(legacy).size(), 1u);  // not a projection: unchanged
  add_module_role("attn_qkv", Role::Qkv);
  EXPECT_TRUE(layout::is_qkv_module("blk.attn_qkv"));
  NamedTensors lin = layout::convert_state_dict(legacy);
  ASSERT_EQ(lin.size(), 3u);
  EXPECT_EQ(lin[0].first, "blk.to_q.weight");  // the first name the table has for q
  EXPECT_EQ(shape_str(lin[2].second.shape), "(4, 4)");
}

// The passes and the plan read the table: a feed-forward block whose projections are named
// fc1/fc2 stays two Convs and replicated under CREDIT's table, and becomes a column- and a
// row-parallel Linear once fc1 and fc2 are registered as ffn-up and ffn-down.
TEST(ModuleTable, RenamedModulesShardAfterRegisteringTheirNames) {
  CreditTableAfter restore;
  Graph g = feed_forward("fc1", "fc2");
  EXPECT_EQ(op_counts(g)["Conv"], 2);
  EXPECT_TRUE(discover_plan(g).by_weight.empty());
  add_module_role("fc1", Role::FfnUp);
  add_module_role("fc2", Role::FfnDown);
  g = feed_forward("fc1", "fc2");
  EXPECT_EQ(op_counts(g)["Conv"], 0);
  EXPECT_EQ(op_counts(g)["Linear"], 2);
  TpPlan plan = discover_plan(g);
  EXPECT_EQ(plan.by_weight["blk.mlp.fc1.weight"], TpSplit::Column);
  EXPECT_EQ(plan.by_weight["blk.mlp.fc2.weight"], TpSplit::Row);
  ShardStats st = shard_graph(g, plan, 2, 1);
  EXPECT_EQ(st.column, 1);
  EXPECT_EQ(st.row, 1);
  EXPECT_EQ(st.all_reduces, 1);
  for (auto& [name, t] : graph_parameters(g)) {
    if (name == "blk.mlp.fc1.weight" || name == "blk.mlp.fc2.weight") {
      EXPECT_EQ(shape_str(t.shape), "(8, 8)") << name;
    }
    if (name == "blk.mlp.fc1.bias") {
      EXPECT_EQ(shape_str(t.shape), "(8)") << name;
    }
  }
}

// The pass that puts back a position-bias MLP's folded first Linear (name_params_by_scope) reads
// the MLP's names from the table: an MLP "blk.rel_pos" whose Linear is "proj" and whose norm is
// "norm" is left alone under CREDIT's table (dpb, layers.0, layers.1) and restored once the
// table names it, its Linear's parameters those the folded constant was computed with.
TEST(ModuleTable, PositionBiasLinearNamesComeFromTheTable) {
  CreditTableAfter restore;
  register_cpu_kernels();
  Tensor grid = layout::position_bias_grid(25), w = randn({4, 2}, 5), bias = randn({4}, 6);
  Tensor folded(DType::F32, {25, 4});  // grid @ w^T + bias, as the exporter folds it
  for (int i = 0; i < 25; ++i)
    for (int j = 0; j < 4; ++j)
      folded.data<float>()[i * 4 + j] = grid.data<float>()[2 * i] * w.data<float>()[2 * j] +
                                        grid.data<float>()[2 * i + 1] * w.data<float>()[2 * j + 1] +
                                        bias.data<float>()[j];
  auto prepared = [&] {  // LayerNormalization(folded) + x, the norm in the scope of blk.rel_pos.norm
    GraphBuilder b;
    int x = b.input("x", {25, 4});
    int ln = b.node("LayerNormalization", {b.constant("linear_3", folded, true),
                                           b.constant("blk.rel_pos.norm.weight", Tensor::from_f32({4}, {1, 1, 1, 1}), true),
                                           b.constant("blk.rel_pos.norm.bias", Tensor::from_f32({4}, {0, 0, 0, 0}), true)});
    b.g.nodes.back().name = "/blk.rel_pos.norm/node_layer_norm";
    b.g.outputs = {b.node("Add", {ln, x})};
    prepare_graph(b.g, {{"x", {DType::F32, {25, 4}}}});
    return b.g;
  };
  EXPECT_EQ(op_counts(prepared()).count("Gemm"), 0u);
  ModuleTable t = credit_module_table();
  t.position_bias_mlps = {"rel_pos"};
  t.position_bias_linear = "proj";
  t.position_bias_norm = "norm";
  set_module_table(t);
  Graph g = prepared();
  EXPECT_EQ(op_counts(g)["Gemm"], 1);
  const int wi = g.find_value("blk.rel_pos.proj.weight"), bi = g.find_value("blk.rel_pos.proj.bias");
  ASSERT_GE(wi, 0);
  ASSERT_GE(bi, 0);
  expect_close(*g.values[wi].constant, w, 1e-5);
  expect_close(*g.values[bi].constant, bias, 1e-5);
}

// `wxe inspect --tp 2` on every CREDIT family fixture: the plan (plan_for, as inspect prints it)
// shards attention (q column-, out row-parallel) and feed-forward (up column-, down
// row-parallel) layers, and the sharded graph has both kinds of layer.
TEST(ModuleTable, EveryCreditFixtureShardsAttentionAndFeedForwardAtTp2) {
  const std::vector<std::pair<std::string, std::string>> fixtures = {
      {"crossformer_tiny_opset17", "crossformer_tiny_x"},
      {"crossformer_tiny_snbaked_opset17", "crossformer_tiny_x"},
      {"crossformer_tiny_seed1_snbaked", "crossformer_tiny_x"},
      {"crossformer_tp_snbaked", "crossformer_tp_x"},
      {"crossformer_mirror_if", "crossformer_mirror_if_x"},
      {"wxformer_tiny_opset17", "../../models/wxformer_tiny/x"},
      {"wxformer_tiny_snbaked_opset17", "../../models/wxformer_tiny/x"},
      {"torch2_crossformer_tiny_dynamo", "torch2_crossformer_tiny_x"},
      {"torch2_crossformer_tiny_ts", "torch2_crossformer_tiny_x"},
      {"torch2_wxformer_tiny_dynamo", "torch2_wxformer_tiny_x"},
      {"nextgen_model_ts", "nextgen_model_x"},
      {"nextgen_block", "nextgen_block_x"},
      {"wxformer_mirror", "wxformer_mirror_x"},
      {"crossformer_noise_tiny", "crossformer_noise_tiny_x"},  // crossformer-ensemble (CrossFormerWithNoise)
  };
  // every CREDIT model fixture in tests/data is listed above (hand-made graphs are not CREDIT's)
  size_t credit_files = 0;
  for (auto& e : std::filesystem::directory_iterator(data_path("tests/data"))) {
    const std::string f = e.path().filename().string();
    if (e.path().extension() != ".onnx") continue;
    for (const char* family : {"crossformer", "wxformer", "torch2_", "nextgen"})
      if (f.rfind(family, 0) == 0) {
        ++credit_files;
        break;
      }
  }
  EXPECT_EQ(credit_files, fixtures.size());
  register_cpu_kernels();
  register_collective_ops();
  for (auto& [model, input] : fixtures) {
    SCOPED_TRACE(model);
    Graph g = import_onnx(data_path("tests/data/" + model + ".onnx"));
    Tensor x = read_npy(data_path("tests/data/" + input + ".npy"));
    simplify(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
    TpPlan plan;
    const std::string e = error_of([&] { plan = plan_for(g, "", 2); });
    EXPECT_EQ(e, "<no error>");
    if (e != "<no error>") continue;
    std::map<Role, int> split;  // role -> layers split as the role says
    for (auto& [w, s] : plan.by_weight) {
      const Role r = module_role(layout::module_of(w));
      const bool column = r == Role::Q || r == Role::K || r == Role::V || r == Role::FfnUp;
      if ((column && s == TpSplit::Column) || ((r == Role::Out || r == Role::FfnDown) && s == TpSplit::Row)) ++split[r];
    }
    EXPECT_GT(split[Role::Q], 0);
    EXPECT_GT(split[Role::Out], 0);
    EXPECT_GT(split[Role::FfnUp], 0);
    EXPECT_GT(split[Role::FfnDown], 0);
    ShardStats st;
    EXPECT_EQ(error_of([&] { st = shard_graph(g, plan, 2, 0); }), "<no error>");
    EXPECT_GT(st.column, 0);
    EXPECT_GT(st.row, 0);
    EXPECT_GT(st.all_reduces, 0);
  }
}

// torch 2 (dynamo) exports: nodes take their module from the export's metadata, and the
// spectral-norm weights the exporter folded into initializers named after the division
// ("div_54") take their module's name, so the table sees every projection.
TEST(ModuleTable, DynamoExportsNameFoldedWeightsByModule) {
  register_cpu_kernels();
  for (const char* m : {"crossformer", "wxformer"}) {
    SCOPED_TRACE(m);
    const std::string stem = std::string("tests/data/torch2_") + m + "_tiny";
    Graph g = import_onnx(data_path(stem + "_dynamo.onnx"));
    Tensor x = read_npy(data_path(stem + "_x.npy"));
    simplify(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
    for (const Node& n : g.nodes)
      if (n.op == "Conv" || n.op == "Linear") {
        const std::string& w = g.values[n.inputs[1]].name;
        EXPECT_NE(w.find('.'), std::string::npos) << n.name << " reads " << w;
      }
    std::map<std::string, Shape> params;
    for (auto& [name, t] : graph_parameters(g)) params[name] = t.shape;
    EXPECT_EQ(shape_str(params["layers.2.1.layers.0.0.to_out.weight"]), "(64, 64)");
  }
}
