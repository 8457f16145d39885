// The training step's memory plan (engine/exec/autograd.h): forward values no backward kernel
// reads (engine/ir/ops.h BackwardReads) are freed after their last forward use, kept ones after
// their last backward reader. Its oracle: a run that keeps every value (ExecOptions::keep_forward)
// gives the same outputs and gradients, bit for bit, on whole CREDIT models.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "engine/exec/autograd.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "tests/test_util.h"

namespace wxe::test {
namespace {

// The model's training graph (spectral norm traced: SpectralNorm ops), with its own copies of
// every constant (the power iteration updates u and v in place).
Graph training_graph_of(const std::string& model, const Tensor& x) {
  Graph g = import_onnx(data_path("tests/data/" + model + "_opset17.onnx"));
  LoadOptions lo;
  lo.weights = data_path("tests/data/" + model + "_checkpoint.pt");
  lo.training = true;
  prepare_model(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}}, lo);
  for (Value& v : g.values)
    if (v.constant) v.constant = std::make_shared<Tensor>(v.constant->clone());
  return g;
}

struct Step {
  std::vector<Tensor> outputs, grads;
  size_t kept = 0;
};

Step run_step(const std::string& model, bool keep_forward) {
  const Tensor x = read_npy(data_path(model == "wxformer_tiny" ? "models/wxformer_tiny/x.npy" : "tests/data/" + model + "_x.npy"));
  Graph g = training_graph_of(model, x);
  ExecOptions opt;
  opt.keep_forward = keep_forward;
  GradExecutor ex(g, trainable_parameters(g), opt);
  Step s;
  for (int rep = 0; rep < 2; ++rep) {  // twice: the plan holds across runs (and the power iteration moves)
    s.outputs = ex.forward({{g.values[g.inputs[0]].name, x}});
    s.kept = ex.kept_bytes();
    ex.backward({s.outputs[0]});  // dL/dy = y: the gradient of sum(y^2) / 2
  }
  for (const Tensor& t : ex.grads()) s.grads.push_back(t.clone());
  return s;
}

TEST(MemoryPlan, FreedValuesGiveTheSameGradientsAndLessIsKept) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    const Step all = run_step(model, true), plan = run_step(model, false);
    ASSERT_EQ(all.outputs.size(), plan.outputs.size());
    for (size_t i = 0; i < all.outputs.size(); ++i)
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), plan.outputs[i].raw(), all.outputs[i].nbytes()), 0) << model;
    ASSERT_EQ(all.grads.size(), plan.grads.size());
    for (size_t i = 0; i < all.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), plan.grads[i].raw(), all.grads[i].nbytes()), 0) << model << " grad " << i;
    std::printf("%s: forward values kept for the backward %.1f MB (all: %.1f MB, %.0f%%)\n", model.c_str(),
                plan.kept / 1e6, all.kept / 1e6, 100.0 * plan.kept / all.kept);
    EXPECT_LT(plan.kept, all.kept * 0.9) << model;
  }
}

}  // namespace
}  // namespace wxe::test
