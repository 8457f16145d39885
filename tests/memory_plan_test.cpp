// The training step's memory plan (engine/exec/autograd.h): forward values no backward kernel
// reads (engine/ir/ops.h BackwardReads) are freed after their last forward use, kept ones after
// their last backward reader. Its oracle: a run that keeps every value (ExecOptions::keep_forward)
// gives the same outputs and gradients, bit for bit, on whole CREDIT models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "engine/exec/autograd.h"
#include "engine/io/npy.h"
#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "tests/host_backend.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

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
  std::vector<std::string> names;  // of the trainable parameters, as grads
  size_t kept = 0;
  size_t held = 0, kept0 = 0;  // host tensor bytes the first forward left allocated (engine/ir/tensor.h), kept
  int modules = 0, whole_max = 0, whole_after = 0;  // `resident`: modules, whole at once at most, after the step
};

// GeluRecompute: each Gelu's output made again in the backward (add_recompute_segments), as the
// trainer runs the fused graph on the CPU.
enum class Plan { KeepAll, FreeUnread, Checkpoint, GeluRecompute };

// A backend on host memory with a kernel for each op of the graph but two: Softmax's forward and
// Erf's backward run on the host (the device path's host fallback), so values move both ways.
const char* plan_backend(const Graph& g) {
  static HostMemoryBackend* b = [] {
    register_cpu_kernels();
    auto owned = std::make_unique<HostMemoryBackend>("hostplan");
    HostMemoryBackend* raw = owned.get();
    register_backend(std::move(owned));
    return raw;
  }();
  for (const auto& [op, count] : op_counts(g)) {
    if (b->kernel(op) || is_view_op(op)) continue;
    if (op != "Softmax") b->register_kernel(op, kernel_for(op, KernelKind::Fast));
    if (op != "Erf" && backward_kernel(op)) b->register_backward(op, backward_kernel(op));
  }
  return "hostplan";
}

// With `fused`, the training graph's norms and GELU fused as the trainer does (fuse_for_training).
// With `device`, on plan_backend()'s device path (the held figure then also has the outputs'
// host copies and is read on the second run, after the constants' one upload).
// With `resident`, the trainable parameters live elsewhere between uses (ZeRO-3's
// GradExecutor::set_param_residency): modules of three parameters in trainable order (so their
// readers interleave), fetched as copies, evicted to shapes, gradients summed as handed over.
Step run_step(const std::string& model, Plan plan, bool fused = false, bool device = false, bool resident = false) {
  const Tensor x = read_npy(data_path(model == "wxformer_tiny" ? "models/wxformer_tiny/x.npy" : "tests/data/" + model + "_x.npy"));
  Graph g = training_graph_of(model, x);
  if (fused) {
    fuse_for_training(g);
    const std::map<std::string, int> ops = op_counts(g);
    EXPECT_GT(ops.count("ChannelLayerNorm") ? ops.at("ChannelLayerNorm") : 0, 0) << model;
    EXPECT_EQ(ops.count("Erf"), 0u) << model << ": a GELU left unfused";
    EXPECT_EQ(ops.count("Softmax"), 0u) << model << ": a window attention left unfused";
  }
  ExecOptions opt;
  opt.keep_forward = plan == Plan::KeepAll;
  if (device) opt.device = plan_backend(g);
  if (plan == Plan::Checkpoint) {
    opt.segments = checkpoint_segments(g);
    int n = 0;
    for (int s : opt.segments) n = std::max(n, s + 1);
    EXPECT_GE(n, 8) << model << ": attention and feed-forward blocks";
    int stacked = 0;  // and the decoder's convolution stacks (UpBlock.b: models/credit_modules.cpp)
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      const std::string m = scope_module(g.nodes[k].name);
      if (g.nodes[k].op != "Conv" || m.rfind("up_block", 0) != 0 || m.find(".b.") == std::string::npos) continue;
      ++stacked;
      EXPECT_GE(opt.segments[k], 0) << model << ": " << g.nodes[k].name << " is kept, not made again";
    }
    EXPECT_GE(stacked, 2) << model;
  }
  if (plan == Plan::GeluRecompute) {
    add_recompute_segments(g, opt.segments, [](const Node& n) { return n.op == "Gelu"; });
    int gelus = 0;
    for (size_t k = 0; k < g.nodes.size(); ++k)
      if (g.nodes[k].op == "Gelu") {
        ++gelus;
        EXPECT_GE(opt.segments[k], 0) << model << ": " << g.nodes[k].name << " not made again";
      }
    EXPECT_GE(gelus, 2) << model;
  }
  GradExecutor ex(g, trainable_parameters(g), opt);
  Step s;
  const std::vector<int> tr = trainable_parameters(g);
  std::vector<Tensor> stored, sums;  // resident: the parameters between uses; the gradients handed over
  int whole = 0;
  if (resident) {
    ParamResidency r;
    for (size_t p = 0; p < tr.size(); p += 3) {
      r.modules.emplace_back();
      for (size_t q = p; q < std::min(p + 3, tr.size()); ++q) r.modules.back().push_back(q);
    }
    for (int v : tr) {
      stored.push_back(*g.values[v].constant);
      sums.push_back(Tensor::zeros(DType::F32, g.values[v].shape));
      *g.values[v].constant = g.values[v].constant->shape_only();
    }
    const std::vector<std::vector<size_t>> modules = r.modules;
    r.fetch = [&, modules](int m) {
      for (size_t p : modules[m]) *g.values[tr[p]].constant = stored[p].clone();
      s.whole_max = std::max(s.whole_max, ++whole);
    };
    r.evict = [&, modules](int m) {
      for (size_t p : modules[m]) *g.values[tr[p]].constant = g.values[tr[p]].constant->shape_only();
      --whole;
    };
    r.grad_done = [&](size_t p, Tensor t) {
      if (!t.defined()) return;
      float* d = sums[p].data<float>();
      const float* a = t.data<float>();
      for (int64_t i = 0; i < t.numel(); ++i) d[i] += a[i];
    };
    s.modules = (int)modules.size();
    ex.set_param_residency(std::move(r));
  }
  for (int rep = 0; rep < 2; ++rep) {  // twice: the plan holds across runs (and the power iteration moves)
    const size_t live = host_bytes_live();
    std::vector<Tensor> out = ex.forward({{g.values[g.inputs[0]].name, x}});
    const size_t held = host_bytes_live() - live;
    s.outputs = out;
    s.kept = ex.kept_bytes();
    if (rep == (device ? 1 : 0)) {
      s.held = held, s.kept0 = s.kept;
      if (device)
        for (const Tensor& t : out) s.held -= t.nbytes();
    }
    ex.backward({s.outputs[0]});  // dL/dy = y: the gradient of sum(y^2) / 2
  }
  for (const Tensor& t : resident ? sums : ex.grads()) s.grads.push_back(t.clone());
  for (int v : ex.trainable()) s.names.push_back(g.values[v].name);
  s.whole_after = whole;
  return s;
}

TEST(MemoryPlan, FreedValuesGiveTheSameGradientsAndLessIsKept) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    const Step all = run_step(model, Plan::KeepAll), plan = run_step(model, Plan::FreeUnread);
    ASSERT_EQ(all.outputs.size(), plan.outputs.size());
    for (size_t i = 0; i < all.outputs.size(); ++i)
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), plan.outputs[i].raw(), all.outputs[i].nbytes()), 0) << model;
    ASSERT_EQ(all.grads.size(), plan.grads.size());
    for (size_t i = 0; i < all.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), plan.grads[i].raw(), all.grads[i].nbytes()), 0) << model << " grad " << i;
    // what the executor says it keeps is what the process holds after the forward (the figure
    // `bench --train` and `finetune` report)
    EXPECT_EQ(plan.held, plan.kept0) << model;
    EXPECT_EQ(all.held, all.kept0) << model;
    std::printf("%s: forward values kept for the backward %.1f MB (all: %.1f MB, %.0f%%)\n", model.c_str(),
                plan.kept / 1e6, all.kept / 1e6, 100.0 * plan.kept / all.kept);
    EXPECT_LT(plan.kept, all.kept * 0.9) << model;
  }
}

// Activation checkpointing: each attention and feed-forward block's inner values are dropped
// after its forward and recomputed in the backward; spectral norm's power iteration is not run
// again (two steps: a second update would change the second step), so outputs and gradients
// equal keeping everything bit for bit, and less is kept.
TEST(MemoryPlan, CheckpointedBlocksGiveTheSameGradients) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    const Step all = run_step(model, Plan::KeepAll), plan = run_step(model, Plan::FreeUnread),
               ck = run_step(model, Plan::Checkpoint);
    for (size_t i = 0; i < all.outputs.size(); ++i)
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), ck.outputs[i].raw(), all.outputs[i].nbytes()), 0) << model;
    ASSERT_EQ(all.grads.size(), ck.grads.size());
    for (size_t i = 0; i < all.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), ck.grads[i].raw(), all.grads[i].nbytes()), 0) << model << " grad " << i;
    EXPECT_EQ(ck.held, ck.kept0) << model;
    std::printf("%s: kept with checkpointing %.1f MB (without %.1f MB, all %.1f MB)\n", model.c_str(), ck.kept / 1e6,
                plan.kept / 1e6, all.kept / 1e6);
    EXPECT_LT(ck.kept, plan.kept * 0.8) << model;
  }
}

// ZeRO-3's residency: parameters whole only from the first node reading them to the last (forward,
// recompute, backward kernels reading their elements), gradients handed over when complete: the
// same outputs and gradients bit for bit, with and without checkpointing, nothing whole after
// the step and never every module at once.
TEST(MemoryPlan, ParametersFetchedPerModuleGiveTheSameGradients) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"})
    for (Plan plan : {Plan::FreeUnread, Plan::Checkpoint}) {
      const Step ref = run_step(model, plan), res = run_step(model, plan, false, false, true);
      for (size_t i = 0; i < ref.outputs.size(); ++i)
        EXPECT_EQ(std::memcmp(ref.outputs[i].raw(), res.outputs[i].raw(), ref.outputs[i].nbytes()), 0) << model;
      ASSERT_EQ(ref.grads.size(), res.grads.size());
      for (size_t i = 0; i < ref.grads.size(); ++i)
        EXPECT_EQ(std::memcmp(ref.grads[i].raw(), res.grads[i].raw(), ref.grads[i].nbytes()), 0)
            << model << " grad " << ref.names[i];
      EXPECT_EQ(res.whole_after, 0) << model;
      EXPECT_LT(res.whole_max, res.modules) << model;
      std::printf("%s%s: %d modules, at most %d whole at once\n", model.c_str(),
                  plan == Plan::Checkpoint ? " (checkpointing)" : "", res.modules, res.whole_max);
    }
}

// On a device (here a backend on host memory, with a host fallback both ways) the same plan and
// the same recompute: the CPU's bits when it keeps everything, less kept, and what the executor
// says it keeps is what it holds.
TEST(MemoryPlan, TheDevicePathFreesAndRecomputesAsTheCpu) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(model + (fused ? " fused" : ""));
      const Step all = run_step(model, Plan::KeepAll, fused), dall = run_step(model, Plan::KeepAll, fused, true);
      const Step plan = run_step(model, Plan::FreeUnread, fused, true), ck = run_step(model, Plan::Checkpoint, fused, true);
      for (const Step* s : {&dall, &plan, &ck}) {
        ASSERT_EQ(all.grads.size(), s->grads.size());
        for (size_t i = 0; i < all.outputs.size(); ++i)
          EXPECT_EQ(std::memcmp(all.outputs[i].raw(), s->outputs[i].raw(), all.outputs[i].nbytes()), 0);
        for (size_t i = 0; i < all.grads.size(); ++i)
          EXPECT_EQ(std::memcmp(all.grads[i].raw(), s->grads[i].raw(), all.grads[i].nbytes()), 0) << all.names[i];
        EXPECT_EQ(s->held, s->kept0);
      }
      std::printf("%s%s on a device: kept %.1f MB, with checkpointing %.1f MB (all %.1f MB)\n", model.c_str(),
                  fused ? " fused" : "", plan.kept / 1e6, ck.kept / 1e6, dall.kept / 1e6);
      EXPECT_LT(plan.kept, dall.kept * 0.9);
      EXPECT_LT(ck.kept, plan.kept * 0.8);
    }
  }
}

// Gradients passed through unchanged (engine/ir/ops.h gradient_passthrough: Add, Sub) share
// storage; a sum into a shared gradient must not change the others. y = a + a, p = y * b,
// z = y + b, w = z * p: the backward reaches z's Add before p's Mul, so y's and b's gradients
// share z's when the Mul adds to both. w = y^2 b + y b^2: dw/da = 8ab + 2b^2, dw/db = 4a^2 + 4ab.
TEST(MemoryPlan, PassedThroughGradientsAreNotSummedInPlace) {
  register_cpu_kernels();
  Graph g;
  g.source = "passthrough";
  const Tensor av = randn({64}, 3), bv = randn({64}, 4);
  const int a = g.add_constant("a", av.clone(), true), b = g.add_constant("b", bv.clone(), true);
  auto node = [&](const char* op, int x, int y, const char* out) {
    Value v;
    v.name = out;
    v.dtype = DType::F32;
    v.shape = {64};
    v.shape_known = true;
    Node n;
    n.op = op;
    n.name = out;
    n.inputs = {x, y};
    n.outputs = {g.add_value(v)};
    g.nodes.push_back(n);
    return n.outputs[0];
  };
  const int y = node("Add", a, a, "y"), p = node("Mul", y, b, "p"), z = node("Add", y, b, "z");
  g.outputs = {node("Mul", z, p, "w")};
  for (bool keep : {false, true}) {
    ExecOptions opt;
    opt.keep_forward = keep;
    GradExecutor ex(g, trainable_parameters(g), opt);
    std::vector<Tensor> out = ex.forward({});
    Tensor ones(DType::F32, {64});
    std::fill(ones.data<float>(), ones.data<float>() + 64, 1.f);
    ex.backward({ones});
    ASSERT_EQ(ex.trainable().size(), 2u);
    const Tensor& ga = ex.grads()[ex.trainable()[0] == a ? 0 : 1];
    const Tensor& gb = ex.grads()[ex.trainable()[0] == a ? 1 : 0];
    for (int64_t i = 0; i < 64; ++i) {
      const float ai = av.data<float>()[i], bi = bv.data<float>()[i];
      EXPECT_NEAR(ga.data<float>()[i], 8 * ai * bi + 2 * bi * bi, 1e-5 * (1 + std::fabs(8 * ai * bi))) << i;
      EXPECT_NEAR(gb.data<float>()[i], 4 * ai * ai + 4 * ai * bi, 1e-5 * (1 + std::fabs(4 * ai * ai))) << i;
    }
  }
}

// Through the trainer, as `finetune --activation-checkpoint blocks` runs: a 2-step rollout of the
// spectral-norm model, three optimizer steps, the same losses and parameters bit for bit.
TEST(MemoryPlan, CheckpointedFinetuneEqualsTheRunWithout) {
  const std::string data = make_series("ckpt_series", 4, {1, 7, 1, 32, 64}, {1, 6, 1, 32, 64}, 21);
  std::vector<std::vector<double>> losses;
  std::vector<NamedTensors> params;
  for (const char* mode : {"none", "blocks"}) {
    FinetuneConfig c = tiny_config(data, tmp_path(std::string("ckpt_run_") + mode));
    c.model = data_path("tests/data/crossformer_tiny_opset17.onnx");  // spectral norm traced
    c.forecast_len = 2;
    c.accum = 1;
    c.activation_checkpoint = mode;
    Trainer t(c, open_npy_dir(data, 2));
    losses.push_back(run_steps(t, 3));
    params.push_back(t.parameters());
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i)
    EXPECT_EQ(std::memcmp(params[0][i].second.raw(), params[1][i].second.raw(), params[0][i].second.nbytes()), 0)
        << params[0][i].first;
}

// The training graph with its channel LayerNorms and GELUs fused (fuse_for_training) against the graph as exported: the same
// outputs and parameter gradients up to float rounding (the fused kernels sum in another
// order), and less kept for the backward. Gradients are compared per parameter in relative L2,
// with a floor at the tensor's share of the global gradient norm (a bias that a norm cancels has
// a zero gradient, rounding noise in both).
TEST(FusedTraining, SameGradientsAsTheExportedGraph) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    SCOPED_TRACE(model);
    const Step plain = run_step(model, Plan::FreeUnread), fused = run_step(model, Plan::FreeUnread, true);
    ASSERT_EQ(plain.outputs.size(), fused.outputs.size());
    for (size_t i = 0; i < plain.outputs.size(); ++i) EXPECT_LE(rel_l2(fused.outputs[i], plain.outputs[i]), 1e-6);
    ASSERT_EQ(plain.names, fused.names);
    double total2 = 0;
    int64_t total_n = 0;
    for (const Tensor& t : plain.grads) {
      for (int64_t i = 0; i < t.numel(); ++i) total2 += (double)t.data<float>()[i] * t.data<float>()[i];
      total_n += t.numel();
    }
    const double rms = std::sqrt(total2 / total_n);
    double worst = 0;
    for (size_t p = 0; p < plain.grads.size(); ++p) {
      const Tensor &a = fused.grads[p], &b = plain.grads[p];
      ASSERT_EQ(a.shape, b.shape) << plain.names[p];
      double d2 = 0, r2 = 0;
      for (int64_t i = 0; i < b.numel(); ++i) {
        const double u = a.data<float>()[i], w = b.data<float>()[i];
        d2 += (u - w) * (u - w);
        r2 += w * w;
      }
      const double e = std::sqrt(d2) / std::max(std::sqrt(r2), rms * std::sqrt((double)b.numel()));
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << plain.names[p];
    }
    std::printf("%s: fused training graph: %zu gradients, worst relative L2 %.2e; kept for the backward %.1f MB "
                "(exported graph %.1f MB, %.0f%%)\n",
                model.c_str(), plain.grads.size(), worst, fused.kept / 1e6, plain.kept / 1e6,
                100.0 * fused.kept / plain.kept);
    EXPECT_LT(fused.kept, plain.kept * 0.9);
  }
}

// The memory plan and activation checkpointing on the fused graph: the fused ops' BackwardReads
// and their scopes (each fused node in its block's segment) give the same bits as keeping every
// forward value.
TEST(FusedTraining, MemoryPlanAndCheckpointingGiveTheSameBits) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    const Step all = run_step(model, Plan::KeepAll, true), plan = run_step(model, Plan::FreeUnread, true),
               ck = run_step(model, Plan::Checkpoint, true);
    ASSERT_EQ(all.grads.size(), plan.grads.size());
    ASSERT_EQ(all.grads.size(), ck.grads.size());
    for (size_t i = 0; i < all.outputs.size(); ++i) {
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), plan.outputs[i].raw(), all.outputs[i].nbytes()), 0) << model;
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), ck.outputs[i].raw(), all.outputs[i].nbytes()), 0) << model;
    }
    for (size_t i = 0; i < all.grads.size(); ++i) {
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), plan.grads[i].raw(), all.grads[i].nbytes()), 0) << model << " " << all.names[i];
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), ck.grads[i].raw(), all.grads[i].nbytes()), 0) << model << " " << all.names[i];
    }
    EXPECT_LT(ck.kept, plan.kept) << model;
  }
}

// The fused graph's Gelus made again in the backward (the trainer's segments on the CPU): the bits
// of keeping every forward value, and less kept than keeping each Gelu's output for the Linear
// after it.
TEST(FusedTraining, GeluRemadeInTheBackwardGivesTheSameBits) {
  for (const std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    SCOPED_TRACE(model);
    const Step all = run_step(model, Plan::KeepAll, true), plan = run_step(model, Plan::FreeUnread, true),
               remade = run_step(model, Plan::GeluRecompute, true);
    ASSERT_EQ(all.grads.size(), remade.grads.size());
    for (size_t i = 0; i < all.outputs.size(); ++i)
      EXPECT_EQ(std::memcmp(all.outputs[i].raw(), remade.outputs[i].raw(), all.outputs[i].nbytes()), 0);
    for (size_t i = 0; i < all.grads.size(); ++i)
      EXPECT_EQ(std::memcmp(all.grads[i].raw(), remade.grads[i].raw(), all.grads[i].nbytes()), 0) << all.names[i];
    EXPECT_EQ(remade.held, remade.kept0);
    std::printf("%s: kept with the Gelus made again %.1f MB (kept %.1f MB)\n", model.c_str(), remade.kept / 1e6,
                plan.kept / 1e6);
    EXPECT_LT(remade.kept, plan.kept);
  }
}

// Through the trainer: the fused run (the default) and FinetuneConfig::fuse = false give the same
// losses over 3 steps of a 2-step rollout of the spectral-norm model.
TEST(FusedTraining, FinetuneLossesMatchTheExportedGraph) {
  const std::string data = make_series("fused_series", 3, {1, 7, 1, 32, 64}, {1, 6, 1, 32, 64}, 23);
  std::vector<std::vector<double>> losses;
  for (bool fuse : {false, true}) {
    FinetuneConfig c = tiny_config(data, "");
    c.model = data_path("tests/data/crossformer_tiny_opset17.onnx");
    c.forecast_len = 2;
    c.accum = 1;
    c.fuse = fuse;
    Trainer t(c, open_npy_dir(data, 2));
    const std::map<std::string, int> ops = op_counts(t.graph());
    EXPECT_EQ(ops.count("ChannelLayerNorm") != 0, fuse);
    losses.push_back(run_steps(t, 3));
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * std::fabs(losses[0][i])) << "step " << i + 1;
}

// y = op(x, w): x a 1 MiB input, w a trainable scalar.
Graph one_op_graph(const char* op, const Shape& xs) {
  GraphBuilder b;
  int x = b.input("x", xs);
  int w = b.constant("w", randn({1}, 2), true);
  b.g.outputs = {b.node(op, {x, w})};
  bind_inputs(b.g, {{"x", {DType::F32, xs}}});
  infer_shapes(b.g);
  return b.g;
}

// An input the caller hands over (forward(std::map&&)) is freed after its last use in the
// forward when no backward kernel reads it (Add's does not), as the trainer hands over the
// model's input; the const& form leaves the caller's tensor alone. The gradient is the same.
TEST(MemoryPlan, AnInputHandedOverIsFreedAfterItsLastUse) {
  register_cpu_kernels();
  const Shape xs{1, 256, 1024};  // 1 MiB
  const Graph g = one_op_graph("Add", xs);
  GradExecutor ex(g, trainable_parameters(g));
  const size_t bytes = (size_t)numel(xs) * 4;
  for (bool hand_over : {false, true}) {
    SCOPED_TRACE(hand_over ? "handed over" : "const&");
    Tensor xin = randn(xs, 1);
    const size_t before = host_bytes_live();  // xin included
    std::vector<Tensor> out;
    if (hand_over) {
      std::map<std::string, Tensor> in{{"x", std::move(xin)}};
      out = ex.forward(std::move(in));
    } else {
      out = ex.forward({{"x", xin}});
    }
    const double grown = (double)host_bytes_live() - (double)before;  // y, and x where still held
    if (hand_over)
      EXPECT_LT(grown, 0.1 * bytes);
    else
      EXPECT_GE(grown, 0.9 * bytes);
    ex.zero_grad();
    ex.backward({Tensor::from_f32(xs, std::vector<float>(numel(xs), 1.f))});
    EXPECT_EQ(ex.grads()[0].data<float>()[0], (float)numel(xs));  // dL/dw = sum(g)
  }
}

// The trainer hands its loss gradient to the backward (backward(std::vector<Tensor>&&)): no copy
// of a tensor as large as the model's output, where the const& form copies it; one still
// shared is copied (the caller's tensor is not written). The output itself, which no backward
// kernel reads, is released when the backward starts.
TEST(MemoryPlan, BackwardTakesTheLossGradientWithoutACopy) {
  register_cpu_kernels();
  const Shape xs{1, 256, 1024};  // 1 MiB
  const Graph g = one_op_graph("Mul", xs);
  GradExecutor ex(g, trainable_parameters(g));
  const Tensor xin = randn(xs, 1);
  const size_t bytes = (size_t)numel(xs) * 4;
  // keep: the caller's gradient, which it still holds (it then holds the output too, which the
  // backward's release of unread outputs would otherwise free before the copy)
  auto peak_of_backward = [&](bool take, Tensor* keep) {
    std::vector<Tensor> out = ex.forward({{"x", xin}});
    std::vector<Tensor> g{keep ? *keep : Tensor::from_f32(xs, std::vector<float>(numel(xs), 1.f))};
    if (!keep) out.clear();
    const size_t before = host_bytes_live();
    reset_host_peak();
    if (take)
      ex.backward(std::move(g));
    else
      ex.backward(g);
    return (double)host_bytes_peak() - (double)before;
  };
  const double copied = peak_of_backward(false, nullptr), taken = peak_of_backward(true, nullptr);
  EXPECT_GE(copied - taken, 0.9 * bytes);
  EXPECT_LT(taken, 0.1 * bytes);
  // a gradient the caller still holds is copied, and left as it was
  Tensor mine = Tensor::from_f32(xs, std::vector<float>(numel(xs), 2.f));
  const double shared = peak_of_backward(true, &mine);
  EXPECT_GE(shared, 0.9 * bytes);
  EXPECT_EQ(mine.data<float>()[0], 2.f);
  // dL/dw = sum(x * g): every path gives it
  double want = 0;
  for (int64_t i = 0; i < numel(xs); ++i) want += xin.data<float>()[i];
  EXPECT_NEAR(ex.grads()[0].data<float>()[0], 4 * want, 1e-3 * std::fabs(want) + 1e-1);  // g = 1, 1, 2
}

}  // namespace
}  // namespace wxe::test

namespace wxe::test {
namespace {

// Whether two live tensors share bytes.
bool overlap(const Tensor& a, const Tensor& b) {
  const uint8_t *a0 = a.storage->data, *b0 = b.storage->data;
  return a0 < b0 + b.storage->nbytes && b0 < a0 + a.storage->nbytes;
}

}  // namespace

// The step's block (engine/ir/host_arena.h) on a made-up step: a kept tensor made before the
// steps, transients of several sizes and lifetimes, one that outlives each step. The replayed
// steps take the transients from the block (no two live ones sharing bytes: each is filled and
// checked), the outliving one from malloc; a tensor held past its recorded lifetime keeps its
// bytes (its successor at that place comes from malloc); a step of other sizes falls back and
// the next one records again; another thread's tensors are not the step's.
TEST(HostArena, ReplayedStepsShareOneBlockSafely) {
  HostArena arena;
  std::vector<Tensor> outlived;
  Tensor held;  // kept past its step in the third step
  int tag = 0;   // the step's number, in every value it writes
  auto step = [&](int64_t scale, bool hold) {
    ++tag;
    HostArena::Step s(&arena);
    std::vector<Tensor> live;
    Tensor a(DType::F32, {1000 * scale}), b(DType::F32, {50000}), c(DType::F32, {300});
    live = {a, b, c};
    {
      Tensor d(DType::F32, {70000});  // gone before e is made: may share bytes with it
      live.push_back(d);
      for (size_t i = 0; i < live.size(); ++i)
        for (size_t j = 0; j < i; ++j) EXPECT_FALSE(overlap(live[i], live[j])) << i << " " << j;
      live.pop_back();
    }
    Tensor e(DType::F32, {60000});
    live.push_back(e);
    for (size_t i = 0; i < live.size(); ++i) {  // each filled with its own number, then checked
      float* p = live[i].data<float>();
      std::fill(p, p + live[i].numel(), (float)(i + 10 * tag));
    }
    for (size_t i = 0; i < live.size(); ++i) {
      const float* p = live[i].data<float>();
      EXPECT_TRUE(std::all_of(p, p + live[i].numel(), [&](float v) { return v == (float)(i + 10 * tag); })) << i;
    }
    if (hold) held = b;
    outlived.emplace_back(DType::F32, Shape{128});  // outlives the step
  };
  auto in_block = [&](const Tensor& t) { return t.storage->lease && arena_owns(*t.storage->lease); };
  step(1, false);  // recorded
  EXPECT_GT(arena.block_bytes(), 0u);
  EXPECT_LE(arena.block_bytes(), (size_t)4 * (1000 + 50000 + 300 + 70000) + 4 * 64);
  step(1, false);  // replayed
  EXPECT_EQ(arena.served(), 5);  // a, b, c, d, e: not the outliving one
  EXPECT_FALSE(in_block(outlived.back()));
  step(1, true);   // b held past the step
  EXPECT_TRUE(in_block(held));
  step(1, false);  // b's bytes are still held: the b of this step comes from malloc
  EXPECT_EQ(arena.served(), 4);
  EXPECT_EQ(held.data<float>()[0], 31.f);  // as step 3 left it
  held = Tensor();
  step(2, false);  // another size: the rest of the step from malloc
  EXPECT_EQ(arena.served(), 0);
  step(2, false);  // recorded again
  step(2, false);
  EXPECT_EQ(arena.served(), 5);
  {
    HostArena::Step s(&arena);
    Tensor other;
    std::thread([&] { other = Tensor(DType::F32, {1000 * 2}); }).join();
    EXPECT_FALSE(in_block(other));
  }
}

// Through the trainer: the same losses and parameters bit for bit with the step's block and
// without (FinetuneConfig::step_arena), and the later steps' tensors from the block.
TEST(HostArena, TrainerStepsEqualTheRunWithout) {
  const std::string data = make_series("arena_series", 4, {1, 7, 1, 32, 64}, {1, 6, 1, 32, 64}, 23);
  std::vector<std::vector<double>> losses;
  std::vector<NamedTensors> params;
  for (bool arena : {false, true}) {
    FinetuneConfig c = tiny_config(data, tmp_path(std::string("arena_run_") + (arena ? "on" : "off")));
    c.model = data_path("tests/data/crossformer_tiny_opset17.onnx");
    c.forecast_len = 2;
    c.step_arena = arena;
    Trainer t(c, open_npy_dir(data, 2));
    losses.push_back(run_steps(t, 3));
    params.push_back(t.parameters());
    if (arena) {
      EXPECT_GT(t.arena().block_bytes(), 0u);
      EXPECT_GT(t.arena().served(), 100);
    } else {
      EXPECT_EQ(t.arena().block_bytes(), 0u);
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i)
    EXPECT_EQ(std::memcmp(params[0][i].second.raw(), params[1][i].second.raw(), params[0][i].second.nbytes()), 0)
        << params[0][i].first;
}

}  // namespace wxe::test
