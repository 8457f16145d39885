// `wxe plan` (train/plan.h) against a real training step: the planned activations at the peak,
// the values kept for the backward and the state are compared with what the Trainer holds after
// its first step, measured as finetune's memory line measures them (host_bytes_peak/live).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/io/npy.h"
#include "engine/ir/tensor.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "tests/test_util.h"
#include "tests/train_util.h"
#include "train/plan.h"

namespace wxe::test {
namespace {

struct Measured {
  double params, adamw, kept, activations;
};

// One step on one process, as run_finetune measures it after step 1.
Measured measure(const FinetuneConfig& cfg) {
  Trainer t(cfg, open_npy_dir(cfg.data, 1));
  reset_host_peak();
  t.step();
  return {t.trainable_count() * 4.0, (double)t.optimizer_bytes(), (double)t.executor().kept_bytes(),
          (double)host_bytes_peak() - (double)host_bytes_live()};
}

PlanRow planned(const FinetuneConfig& cfg, const Shape& input) {
  PlanRequest r;
  r.model = cfg.model;
  r.input = input;
  r.cfg = cfg;
  r.only_tp = r.only_domain = 1;
  const Plan p = plan_run(r);
  EXPECT_EQ(p.rows.size(), 1u);
  return p.rows.at(0);
}

void expect_within(double predicted, double measured, double tolerance, const std::string& what) {
  EXPECT_LE(std::fabs(predicted - measured), tolerance * measured)
      << what << ": planned " << predicted / 1e6 << " MB, measured " << measured / 1e6 << " MB";
}

void check_model(const std::string& model, const std::string& x_path, const std::string& checkpoint) {
  const Tensor x = read_npy(data_path(x_path));
  Graph probe = import_onnx(data_path(model));
  prepare_graph(probe, {{probe.values[probe.inputs[0]].name, {x.dtype, x.shape}}});
  const Shape y = probe.values[probe.outputs[0]].shape;
  const std::string data = make_series("plan_" + checkpoint, 2, x.shape, y, 3);
  FinetuneConfig cfg = tiny_config(data, tmp_path("plan_save"));
  cfg.model = data_path(model);
  cfg.accum = 1;
  cfg.prefetch = 0;
  cfg.activation_checkpoint = checkpoint;
  const PlanRow row = planned(cfg, x.shape);
  const Measured m = measure(cfg);
  EXPECT_EQ(row.params, m.params);
  EXPECT_EQ(row.adamw, m.adamw);
  expect_within(row.kept, m.kept, 0.10, model + " " + checkpoint + ": kept for the backward");
  expect_within(row.activations, m.activations, 0.10, model + " " + checkpoint + ": activations at the peak");
}

TEST(Plan, CrossformerTinyStepAsPlanned) {
  check_model("tests/data/crossformer_tiny_snbaked_opset17.onnx", "tests/data/crossformer_tiny_x.npy", "none");
}

TEST(Plan, CrossformerTinyCheckpointedStepAsPlanned) {
  check_model("tests/data/crossformer_tiny_snbaked_opset17.onnx", "tests/data/crossformer_tiny_x.npy", "blocks");
}

TEST(Plan, WxformerTinyStepAsPlanned) {
  check_model("models/wxformer_tiny/model.onnx", "models/wxformer_tiny/x.npy", "none");
  check_model("models/wxformer_tiny/model.onnx", "models/wxformer_tiny/x.npy", "blocks");
}

// Every mesh of 4 ranks the sharding passes take is offered; one they refuse is not, and says why.
TEST(Plan, OffersOnlyTheMeshesTheModelTakes) {
  PlanRequest r;
  r.model = data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx");
  r.input = read_npy_header(data_path("tests/data/crossformer_tiny_x.npy")).shape;
  r.ranks = 3;
  const Plan p = plan_run(r);
  for (const PlanRow& row : p.rows) EXPECT_EQ(row.dp * row.tp * row.domain, 3);
  // tp 3 does not divide the tiny model's heads: the sharding pass refuses it
  for (const PlanRow& row : p.rows) EXPECT_NE(row.tp, 3);
  bool refused_tp3 = false;
  for (const std::string& why : p.refused) refused_tp3 = refused_tp3 || why.find("tp 3") != std::string::npos;
  EXPECT_TRUE(refused_tp3);
  ASSERT_GE(p.best, 0);
  // blocks keeps no more than none on the same mesh
  for (const PlanRow& a : p.rows)
    for (const PlanRow& b : p.rows)
      if (a.tp == b.tp && a.domain == b.domain && a.checkpoint == "blocks" && b.checkpoint == "none") {
        EXPECT_LE(a.kept, b.kept);
      }
}

TEST(Plan, RefusesBadRequests) {
  PlanRequest r;
  r.model = data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx");
  r.ranks = 0;
  EXPECT_THROW(plan_run(r), Error);
  r.ranks = 1;
  r.memory = -1;
  EXPECT_THROW(plan_run(r), Error);
  r.memory = 0;
  r.model = tmp_path("no_such_model.onnx");
  EXPECT_THROW(plan_run(r), Error);
}

}  // namespace
}  // namespace wxe::test
