// Issue 23: CREDIT fidelity on a CREDIT 2026.2 nextgen_wxformer (spectral norm, column attention
// through nn.MultiheadAttention, frames 2, TorchScript exporter: tests/data/credit_nextgen, from
// models/make_credit_nextgen_fixture.py): CREDIT's parameter names and count in the training
// graph, the trainer's start checks, fine-tune -> save -> reload -> CREDIT checkpoint, the
// tensor-parallel plan of the traced spectral-norm layers, and the scheduler and EMA against
// CREDIT's own classes (reference.json, ema.safetensors).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "importers/onnx/onnx_import.h"
#include "importers/torch/torch_checkpoint.h"
#include "load/checkpoint.h"
#include "load/model.h"
#include "parallel/shard.h"
#include "tests/host_backend.h"
#include "tests/test_util.h"
#include "train/credit_checkpoint.h"
#include "train/finetune.h"

namespace wxe::test {
namespace {

const std::string kDir = "tests/data/credit_nextgen/";

Graph nextgen_graph(bool training, bool weights = true, const std::string& onnx = "model.onnx") {
  register_cpu_kernels();
  Graph g = import_onnx(data_path(kDir + onnx));
  LoadOptions opt;
  opt.weights = weights ? data_path(kDir + "checkpoint.pt") : "";
  opt.training = training;
  prepare_model(g, {}, opt);
  return g;
}

bool sn_buffer(const std::string& n) { return ends_with(n, ".weight_u") || ends_with(n, ".weight_v"); }

Json reference() {
  std::ifstream f(data_path(kDir + "reference.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_json(ss.str(), "reference.json");
}

// The training graph trains exactly CREDIT's parameters, under CREDIT's names: the
// MultiheadAttention projections as in_proj_weight (3E, E) and out_proj.weight (E, E), each
// module called once per frame as one leaf; the count is PyTorch's.
TEST(CreditNextgen, TrainingGraphHasCreditsParameters) {
  Graph g = nextgen_graph(true);
  std::map<std::string, Shape> graph;
  int64_t count = 0;
  for (int v : trainable_parameters(g)) {
    EXPECT_TRUE(graph.insert({g.values[v].name, g.values[v].shape}).second) << "twice: " << g.values[v].name;
    count += g.values[v].constant->numel();
  }
  StateDict ck = read_torch_state_dict(data_path(kDir + "checkpoint.pt"));
  std::map<std::string, Shape> credit;
  for (auto& [n, t] : ck.tensors)
    if (!sn_buffer(n)) credit[n] = t.shape;
  for (auto& [n, s] : credit) {
    auto it = graph.find(n);
    if (it == graph.end()) ADD_FAILURE() << "CREDIT's " << n << " is not a parameter of the training graph";
    else EXPECT_TRUE(shapes_fit(it->second, s)) << n << " " << shape_str(it->second) << " vs " << shape_str(s);
  }
  for (auto& [n, s] : graph) EXPECT_TRUE(credit.count(n)) << "the training graph's " << n << " is not CREDIT's";
  const Json ref = reference();
  EXPECT_EQ(count, std::stoll(ref.get("parameters")->s));
  EXPECT_EQ(graph["col_attn.attn.in_proj_weight"], (Shape{6, 2}));
  EXPECT_EQ(graph["dec_col_attn.attn.out_proj.weight"], (Shape{2, 2}));
  // and the inference graph names them so too
  Graph inf = nextgen_graph(false, false);
  std::set<std::string> names;
  for (auto& [n, t] : graph_parameters(inf)) names.insert(n);
  for (const char* n : {"col_attn.attn.in_proj_weight", "col_attn.attn.out_proj.weight",
                        "dec_col_attn.attn.in_proj_weight", "dec_col_attn.attn.out_proj.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("col_attn.attn.weight"));
}

// The dynamo export of the same model writes MultiheadAttention's in_proj as an anonymous MatMul
// constant next to a named out_proj Gemm: it is in_proj_weight too, one leaf for both frames.
TEST(CreditNextgen, DynamoExportNamesInProjLikeCredit) {
  Graph g = nextgen_graph(true, true, "model_dynamo.onnx");
  std::map<std::string, int> uses;
  for (int v : trainable_parameters(g)) ++uses[g.values[v].name];
  for (const char* n : {"col_attn.attn.in_proj_weight", "col_attn.attn.out_proj.weight",
                        "dec_col_attn.attn.in_proj_weight", "dec_col_attn.attn.out_proj.weight"})
    EXPECT_EQ(uses[n], 1) << n;
  EXPECT_FALSE(uses.count("col_attn.attn.weight"));
  EXPECT_FALSE(uses.count("dec_col_attn.attn.weight"));
}

// nn.MultiheadAttention called with query, key and value apart projects them with three
// (E, E) MatMuls: the training graph reads them as rows of one in_proj_weight (3E, E), the
// parameter CREDIT saves, and computes what the export does.
TEST(CreditNextgen, SplitInProjectionIsOneParameter) {
  register_cpu_kernels();
  GraphBuilder b;
  const int64_t E = 4;
  int x = b.input("x", {2, 5, E});
  std::vector<Tensor> w;  // the exporter's pre-transposed constants: W_q^T, W_k^T, W_v^T, W_out^T
  std::vector<int> proj;
  for (int j = 0; j < 4; ++j) w.push_back(randn({E, E}, 40 + j));
  auto matmul = [&](int in, int j, const std::string& name) {
    int c = b.constant("onnx::MatMul_" + std::to_string(90 + j), w[j], true);
    int y = b.node("MatMul", {in, c});
    b.g.nodes.back().name = name;
    return y;
  };
  for (int j = 0; j < 3; ++j) proj.push_back(matmul(x, j, "/col_attn/attn/MatMul" + (j ? "_" + std::to_string(j) : std::string())));
  int mixed = b.node("Add", {b.node("Mul", {proj[0], proj[1]}), proj[2]});
  b.g.outputs.push_back(matmul(mixed, 3, "/col_attn/attn/MatMul_3"));
  const Tensor in = randn({2, 5, E}, 7);
  auto run = [&](Graph g) {
    infer_shapes(g);
    Executor ex(g, {0, KernelKind::Reference});
    return ex.run({{"x", in}})[0];
  };
  Graph plain = b.g;
  bind_inputs(plain, {{"x", {DType::F32, {2, 5, E}}}});
  const Tensor want = run(plain);
  Graph t = b.g;
  prepare_training_graph(t, {{"x", {DType::F32, {2, 5, E}}}});
  std::map<std::string, Tensor> params;
  for (int v : trainable_parameters(t)) params[t.values[v].name] = *t.values[v].constant;
  ASSERT_EQ(params.size(), 2u);
  ASSERT_TRUE(params.count("col_attn.attn.in_proj_weight"));
  ASSERT_TRUE(params.count("col_attn.attn.out_proj.weight"));
  const Tensor& ip = params["col_attn.attn.in_proj_weight"];
  ASSERT_EQ(ip.shape, (Shape{3 * E, E}));
  for (int j = 0; j < 3; ++j)
    for (int64_t r = 0; r < E; ++r)
      for (int64_t c = 0; c < E; ++c)
        EXPECT_EQ(ip.data<float>()[(j * E + r) * E + c], w[j].data<float>()[c * E + r]) << j << " " << r << " " << c;
  EXPECT_LT(max_abs_diff(run(t), want), 1e-5);
  Graph inf = b.g;
  prepare_graph(inf, {{"x", {DType::F32, {2, 5, E}}}});
  finalize_graph(inf);
  EXPECT_LT(max_abs_diff(run(inf), want), 1e-5);
}

// Before step 1: two parameters under one name, or two parameters loading one checkpoint
// tensor, are one error naming them.
TEST(CreditNextgen, TrainerStartChecksOneToOne) {
  Graph g = nextgen_graph(true);
  const NamedTensors w = read_checkpoint(data_path(kDir + "checkpoint.pt"));
  EXPECT_NO_THROW(check_training_parameters(g, &w, "ck.pt"));
  std::vector<int> ps = trainable_parameters(g);
  int a = -1, b = -1;
  for (int v : ps) {
    if (g.values[v].name == "col_attn.proj.weight") a = v;
    if (g.values[v].name == "dec_col_attn.proj.weight") b = v;
  }
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  Graph dup = g;
  dup.values[b].name = "col_attn.proj.weight";
  std::string e = error_of([&] { check_training_parameters(dup, nullptr, "m.onnx"); });
  EXPECT_NE(e.find("m.onnx: the training graph has two parameters named 'col_attn.proj.weight'"), std::string::npos) << e;
  Graph twice = g;
  twice.values[b].name = "dec_col_attn.proj_copy";  // loads col_attn.proj.weight through its alternative name
  twice.values[b].alt_names = {"col_attn.proj.weight"};
  e = error_of([&] { check_training_parameters(twice, &w, "ck.pt"); });
  EXPECT_NE(e.find("ck.pt: checkpoint tensor 'col_attn.proj.weight' would train as two parameters"), std::string::npos)
      << e;
}

// Fine-tune from the CREDIT checkpoint, save, reload (resume), and back to CREDIT: the same
// tensors, order and shapes as the original, the scheduler's and scaler's states written.
TEST(CreditNextgen, FinetuneSaveReloadConvert) {
  FinetuneConfig c;
  c.model = data_path(kDir + "model.onnx");
  c.weights = data_path(kDir + "checkpoint.pt");
  c.data = data_path(kDir + "data");
  c.save = tmp_path("credit_nextgen_run");
  c.steps = 2;
  c.schedule.kind = ScheduleKind::LinearWarmupCosine;
  c.schedule.warmup_steps = 1;
  c.schedule.total_steps = 4;
  c.ema = true;
  c.progress = false;
  std::string dir;
  {
    Trainer t(c, open_npy_dir(c.data, 1));
    t.step();
    t.step();
    dir = t.save_checkpoint();
  }
  c.resume = true;
  c.steps = 3;
  Trainer again(c, open_npy_dir(c.data, 1));
  EXPECT_EQ(again.steps_done(), 2);
  again.step();
  const std::string out = tmp_path("credit_nextgen.pt");
  export_credit_checkpoint(dir, out, c.weights);
  StateDict got = read_torch_state_dict(out), orig = read_torch_state_dict(c.weights);
  ASSERT_EQ(got.tensors.size(), orig.tensors.size());
  for (size_t i = 0; i < orig.tensors.size(); ++i) {
    EXPECT_EQ(got.tensors[i].first, orig.tensors[i].first);
    EXPECT_EQ(got.tensors[i].second.shape, orig.tensors[i].second.shape) << orig.tensors[i].first;
  }
}

// The device path (a host-memory test backend with part of the CPU table: copies, views, host
// fallback) trains the spectral-norm Linear layers (Linear reading a SpectralNorm output) and
// the EMA as the CPU does.
TEST(CreditNextgen, DeviceTrainingMatchesCpu) {
  static bool once = [] {
    register_cpu_kernels();
    auto b = std::make_unique<HostMemoryBackend>("hostlinear");
    for (const char* op : {"Add", "Mul", "Linear", "MatMul", "Transpose", "Softmax", "Concat", "Sub"}) {
      b->register_kernel(op, kernel_for(op, KernelKind::Fast));
      b->register_backward(op, backward_kernel(op));
    }
    register_backend(std::move(b));
    return true;
  }();
  (void)once;
  FinetuneConfig c;
  c.model = data_path(kDir + "model.onnx");
  c.weights = data_path(kDir + "checkpoint.pt");
  c.data = data_path(kDir + "data");
  c.steps = 2;
  c.ema = true;
  c.progress = false;
  Trainer cpu(c, open_npy_dir(c.data, 1));
  c.device = "hostlinear";
  Trainer dev(c, open_npy_dir(c.data, 1));
  for (int i = 0; i < 2; ++i) {
    const double a = cpu.step().loss, b = dev.step().loss;
    EXPECT_NEAR(b, a, 1e-5 * std::fabs(a)) << "step " << i + 1;
  }
  std::map<std::string, Tensor> want;
  for (auto& [n, t] : cpu.parameters()) want[n] = t;
  for (auto& [n, t] : dev.parameters()) EXPECT_LT(max_abs_diff(t, want.at(n)), 1e-5) << n;
}

// The spectral-norm layers the TorchScript exporter traces (weight_orig / sigma, transposed,
// into MatMul) are Linear layers: --tp 2 shards attention and feed-forward, in inference (the
// folded weights) and in training (SpectralNorm -> Linear, weight_orig the plan's key).
TEST(CreditNextgen, TpPlanShardsTracedSpectralNorm) {
  Graph inf = nextgen_graph(false);
  TpPlan p = plan_for(inf, "", 2);
  EXPECT_EQ(p.by_weight["layers.0.1.layers.0.0.to_q.weight"], TpSplit::Column);
  EXPECT_EQ(p.by_weight["layers.0.1.layers.0.0.to_out.weight"], TpSplit::Row);
  EXPECT_EQ(p.by_weight["layers.3.1.layers.0.1.layers.1.weight"], TpSplit::Column);
  EXPECT_EQ(p.by_weight["layers.3.1.layers.0.1.layers.4.weight"], TpSplit::Row);
  int matmuls_with_weights = 0;
  for (const Node& n : inf.nodes)
    matmuls_with_weights += n.op == "MatMul" && n.inputs.size() == 2 && inf.values[n.inputs[1]].is_const();
  EXPECT_EQ(matmuls_with_weights, 0);
  Graph tr = nextgen_graph(true);
  TpPlan q = plan_for(tr, "", 2, true);
  EXPECT_EQ(q.by_weight["layers.0.1.layers.0.0.to_v.weight_orig"], TpSplit::Column);
  EXPECT_EQ(q.by_weight["layers.2.1.layers.0.3.layers.4.weight_orig"], TpSplit::Row);
  int column = 0, row = 0;
  for (auto& [w, s] : q.by_weight) (s == TpSplit::Column ? column : row) += s != TpSplit::Replicate;
  EXPECT_EQ(column, 32);
  EXPECT_EQ(row, 16);
}

// CREDIT's LinearWarmupCosineScheduler (reference.json: its lrs and state_dict after 5 steps,
// warm-up 2, total 8): wxe's schedule gives the same lrs and convert writes the same state.
TEST(CreditScheduler, MatchesPyTorch) {
  const Json ref = *reference().get("scheduler");
  auto num = [&](const Json& j, const char* k) { return std::stod(j.get(k)->s); };
  Schedule s;
  s.kind = ScheduleKind::LinearWarmupCosine;
  s.lr = num(ref, "lr");
  s.min_lr = num(ref, "min_lr");
  s.warmup_steps = (int64_t)num(ref, "warmup_steps");
  s.total_steps = (int64_t)num(ref, "total_steps");
  const Json& lrs = *ref.get("lrs");
  for (size_t k = 0; k < lrs.items.size(); ++k) EXPECT_NEAR(s.lr_at((int64_t)k), std::stod(lrs.items[k].s), 1e-15) << k;
  const int64_t steps = (int64_t)num(ref, "steps");
  std::map<std::string, std::string> meta = {{"schedule", "linear-warmup-cosine"}, {"lr", ref.get("lr")->s},
                                             {"min_lr", ref.get("min_lr")->s}, {"warmup_steps", ref.get("warmup_steps")->s},
                                             {"total_steps", ref.get("total_steps")->s}};
  PyValue got = credit_scheduler_state(meta, steps);
  const Json& want = *ref.get("state_dict");
  ASSERT_EQ(got.kind, PyValue::Dict);
  ASSERT_EQ(got.kv.size(), want.keys.size());
  for (size_t i = 0; i < want.keys.size(); ++i) {
    const PyValue& v = got.kv[i].second;
    const Json& w = want.items[i];
    EXPECT_EQ(got.kv[i].first.s, want.keys[i]);
    if (w.type == Json::Arr) {
      ASSERT_EQ(v.items.size(), 1u) << want.keys[i];
      EXPECT_NEAR(v.items[0].f, std::stod(w.items[0].s), 1e-15) << want.keys[i];
    } else if (w.type == Json::Lit) {
      EXPECT_EQ(v.b, w.s == "true") << want.keys[i];
    } else if (v.kind == PyValue::Int) {
      EXPECT_EQ(v.i, std::stoll(w.s)) << want.keys[i];
    } else {
      EXPECT_NEAR(v.f, std::stod(w.s), 1e-15) << want.keys[i];
    }
  }
  meta["schedule"] = "constant";
  EXPECT_EQ(credit_scheduler_state(meta, steps).kind, PyValue::None);  // CREDIT without a scheduler saves None
}

// CREDIT's EMATracker (decay 0.5, 12 updates of a module with a spectral-norm Linear; u and v
// moving and left out): wxe's Ema gives its shadow after every update.
TEST(CreditEma, MatchesEmaTracker) {
  std::map<std::string, Tensor> t;
  for (auto& [n, x] : read_safetensors(data_path(kDir + "ema.safetensors"))) t[n] = x;
  std::vector<std::string> names;
  for (auto& [n, x] : t)
    if (n.rfind("param.0.", 0) == 0) names.push_back(n.substr(8));
  ASSERT_EQ(names.size(), 3u);  // 0.weight_orig, 0.bias, 1.weight: no weight_u / weight_v
  auto at = [&](const char* what, int k) {
    std::vector<const Tensor*> r;
    for (auto& n : names) r.push_back(&t.at(str(what, ".", k, ".", n)));
    return r;
  };
  Ema ema(0.5, at("param", 0));
  for (int k = 1; k <= 12; ++k) {
    ema.update(at("param", k));
    std::vector<const Tensor*> want = at("shadow", k);
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_LT(max_abs_diff(ema.shadow()[i], *want[i]), 1e-6) << names[i] << " after update " << k;
  }
}

}  // namespace
}  // namespace wxe::test
