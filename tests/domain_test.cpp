// Domain parallelism (parallel/bands.h domain_parallel) with the domain ranks inside this process
// (coroutines on one thread, tests/rank_group.h): CREDIT models at domain 2 and 4 against
// domain 1, inference on the fast path (the fusions run on the banded graph) and a training
// step's output and every parameter gradient; the collectives counted so that a missing
// exchange fails.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/exec/autograd.h"
#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "parallel/bands.h"
#include "parallel/collective_ops.h"
#include "tests/host_backend.h"
#include "tests/rank_group.h"
#include "tests/test_util.h"

namespace wxe::test {
namespace {

struct DomainRun {
  BandStats stats;
  Tensor y;
  std::map<std::string, Tensor> grads;  // training: trainable parameter -> gradient
  std::map<std::string, int> ops;       // collective nodes of the graph it ran, by op
  std::map<std::string, int> constant;  // of those, the ones whose input no parameter reaches (no backward)
  int entry_halos = 0;                  // ScatterTP nodes that take halo rows with the band
  int fused_attention = 0;              // inference: WindowAttention nodes of the fast path
  int calls = 0;                        // collectives this rank took part in
  int cropped_gathers = 0;              // AllGatherTP nodes that make only a crop of the whole
  size_t kept = 0;                      // training: bytes the forward kept for the backward
};

void count_collectives(const Graph& g, DomainRun& s) {
  std::vector<bool> reached(g.values.size(), false);  // a trainable parameter reaches the value
  for (int v : trainable_parameters(g)) reached[v] = true;
  for (const Node& n : g.nodes) {
    bool any = false;
    for (int i : n.inputs) any = any || (i >= 0 && reached[i]);
    for (int o : n.outputs) reached[o] = any;
    if (!ends_with(n.op, "TP")) continue;
    EXPECT_EQ(n.s("group", ""), "domain") << n.name;
    ++s.ops[n.op];
    if (!any) ++s.constant[n.op];
    if (n.op == "ScatterTP" && n.i("top", 0) + n.i("bottom", 0) > 0) ++s.entry_halos;
    if (n.op == "AllGatherTP" && n.has("crop")) ++s.cropped_gathers;
  }
}

// The model prepared for inference as `wxe infer` prepares it, run on `domain` ranks (on `device`).
std::vector<DomainRun> infer_on(const std::string& model, const Tensor& x, int domain, const std::string& device = "cpu") {
  register_cpu_kernels();
  register_collective_ops();
  Graph full = import_onnx(data_path("tests/data/" + model));
  const std::string in = full.values[full.inputs[0]].name;
  prepare_model(full, {{in, {x.dtype, x.shape}}}, {});
  std::vector<DomainRun> runs(domain);
  std::vector<std::string> errors = RankGroup::run(domain, [&](int r, RankComm& comm) {
    Graph g = full;
    DomainRun& s = runs[r];
    s.stats = domain_parallel(g, domain, false);
    count_collectives(g, s);
    Graph fast = g;  // what the executor runs
    optimize_for_cpu(fast);
    for (const Node& n : fast.nodes) s.fused_attention += n.op == "WindowAttention";
    ExecOptions opt;
    opt.device = device;
    Executor ex(g, opt);
    s.y = ex.run({{in, x}})[0];
    s.calls = comm.calls;
  });
  for (int r = 0; r < domain; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

// The device the band collectives' device kernels are tested on: the GPU where there is one,
// else the fake device above.
std::string band_test_device() {
  register_cpu_kernels();
  register_collective_ops();
  register_gpu_backends();
  Backend* cuda = find_backend("cuda");
  static const std::string name = [&]() -> std::string {
    if (cuda && cuda->available(nullptr)) return "cuda";
    auto b = std::make_unique<FakeDevice>("fakedevice");
    b->register_cpu_kernels_but_collectives();
    register_backend(std::move(b));
    return "fakedevice";
  }();
  register_collective_device_kernels();
  return name;
}

Tensor on_host(const Tensor& t) {
  return t.device() == DeviceKind::CPU ? t : find_backend(band_test_device())->download(t);
}

// One training step (output gradient gy) on `domain` ranks.
// fused: the band graph with the training fusions (fuse_for_training), as the trainer runs it.
// device: the GradExecutor's device (outputs and gradients copied back for the comparisons).
std::vector<DomainRun> train_on(const std::string& model, const Tensor& x, const Tensor& gy, int domain,
                                bool fused = false, const std::string& device = "cpu") {
  register_cpu_kernels();
  register_collective_ops();
  Graph full = import_onnx(data_path("tests/data/" + model));
  const std::string in = full.values[full.inputs[0]].name;
  prepare_training_graph(full, {{in, {x.dtype, x.shape}}});
  std::vector<DomainRun> runs(domain);
  std::vector<std::string> errors = RankGroup::run(domain, [&](int r, RankComm& comm) {
    Graph g = full;
    own_parameters(g);
    DomainRun& s = runs[r];
    s.stats = domain_parallel(g, domain, true);
    if (fused) fuse_for_training(g);
    count_collectives(g, s);
    ExecOptions opt{0, KernelKind::Fast};
    opt.device = device;
    GradExecutor ex(g, trainable_parameters(g), opt);
    s.y = on_host(ex.forward({{in, x}})[0]);
    s.kept = ex.kept_bytes();
    ex.backward({gy});
    for (size_t p = 0; p < ex.trainable().size(); ++p)
      s.grads[g.values[ex.trainable()[p]].name] = on_host(ex.grads()[p]);
    s.calls = comm.calls;
  });
  for (int r = 0; r < domain; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

// The collectives of the graph match the pass's counts, and the communicator was called once per
// exchange in the forward (a scatter takes the rank's rows without one), and in training once
// more per exchange in the backward (a gather before replicated ops slices without one; the
// input's scatter and halos have no gradient to send).
void expect_counts(const DomainRun& s, bool training) {
  std::map<std::string, int> ops = s.ops;
  EXPECT_EQ(ops["HaloTP"], s.stats.halos);
  EXPECT_EQ(ops["ScatterTP"], s.stats.scatters);
  EXPECT_EQ(ops["AllGatherTP"], s.stats.replicated_gathers);
  EXPECT_EQ(ops["AllReduceTP"], 2 * s.stats.group_norms);  // each group's mean and variance
  EXPECT_EQ(ops["CopyToTP"], s.stats.copies);
  EXPECT_EQ(ops["ReduceScatterTP"], 0);
  const int forward = ops["HaloTP"] + ops["AllGatherTP"] + ops["AllReduceTP"];
  std::map<std::string, int> none = s.constant;
  const int backward = ops["HaloTP"] - none["HaloTP"] + ops["ScatterTP"] - none["ScatterTP"] + ops["AllReduceTP"] +
                       ops["CopyToTP"];
  EXPECT_EQ(s.calls, forward + (training ? backward : 0));
  if (training) EXPECT_GT(s.stats.copies, 0);
  else EXPECT_EQ(s.stats.copies, 0);  // inference: nothing to sum
}

// entry: the stage-0 convolutions that take their halo with their band of the whole input;
// halos: the later convolutions' exchanges.
void expect_infer_matches_one(const std::string& model, const std::string& input, int domain, int entry, int halos,
                              int group_norms, int unfused = 0) {
  SCOPED_TRACE(model + " domain " + std::to_string(domain));
  Tensor x = read_npy(data_path("tests/data/" + input));
  static std::map<std::string, Tensor> one;
  static std::map<std::string, int> fused_one;
  if (!one.count(model)) {
    DomainRun r = infer_on(model, x, 1)[0];
    one[model] = r.y;
    fused_one[model] = r.fused_attention;
    // domain 1 is the PyTorch model (its stored output, made by the fixture's script)
    const std::string y = input.substr(0, input.size() - 6) + "_y.npy";
    ASSERT_TRUE(std::filesystem::exists(data_path("tests/data/" + y))) << y;
    EXPECT_LE(max_abs_diff(one[model], read_npy(data_path("tests/data/" + y))), 1e-4);
  }
  std::vector<DomainRun> runs = infer_on(model, x, domain);
  for (int r = 0; r < domain; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const DomainRun& s = runs[r];
    EXPECT_LE(max_abs_diff(s.y, one[model]), 1e-5);
    EXPECT_LE(rel_l2(s.y, one[model]), 1e-5);
    EXPECT_EQ(max_abs_diff(s.y, runs[0].y), 0) << "ranks disagree";
    // the fast path fuses every attention block as at domain 1 (the long-distance ones on the
    // rank's sub-image of windows), but for `unfused` blocks whose windows cannot be shared so
    EXPECT_EQ(s.fused_attention, fused_one[model] - unfused);
    EXPECT_EQ(s.entry_halos, entry);
    EXPECT_EQ(s.stats.halos, halos);
    EXPECT_EQ(s.stats.group_norms, group_norms);
    EXPECT_GE(s.stats.scatters, 1);  // the bands start somewhere
    expect_counts(s, false);
  }
}

double norm(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += (double)t.data<float>()[i] * t.data<float>()[i];
  return std::sqrt(s);
}

void expect_train_matches_one(const std::string& model, const std::string& input, int domain, bool fused = false) {
  SCOPED_TRACE(model + " training, domain " + std::to_string(domain) + (fused ? " fused" : ""));
  Tensor x = read_npy(data_path("tests/data/" + input));
  static std::map<std::string, Tensor> gys;
  static std::map<std::string, DomainRun> one;
  if (!one.count(model)) {
    Graph g = import_onnx(data_path("tests/data/" + model));
    prepare_graph(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
    gys[model] = randn(g.values[g.outputs[0]].shape, 11);
    one[model] = train_on(model, x, gys[model], 1)[0];
  }
  const DomainRun& ref = one.at(model);
  double scale = 0;
  for (auto& [name, g] : ref.grads) scale = std::max(scale, norm(g));
  std::vector<DomainRun> runs = train_on(model, x, gys[model], domain, fused);
  for (int r = 0; r < domain; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const DomainRun& s = runs[r];
    EXPECT_LE(max_abs_diff(s.y, ref.y), 1e-5);
    EXPECT_EQ(max_abs_diff(s.y, runs[0].y), 0) << "ranks disagree";
    ASSERT_EQ(s.grads.size(), ref.grads.size());
    for (auto& [name, want] : ref.grads) {  // every parameter whole on every rank: domain 1's gradient
      ASSERT_TRUE(s.grads.count(name)) << name;
      const Tensor& got = s.grads.at(name);
      ASSERT_EQ(got.shape, want.shape) << name;
      const double n = norm(want);
      // 2e-5: the GroupNorm statistics are summed in another order, and the biases of the
      // convolutions before a GroupNorm have gradients of rounding noise
      EXPECT_LE(rel_l2(got, want) * n / std::max(n, 1e-3 * scale), 2e-5) << name;
    }
    expect_counts(s, true);
    EXPECT_LT(s.kept, ref.kept) << "bands keep as much as the whole grid";
  }
}

}  // namespace

// The band collectives on a device (--domain with --device cuda): HaloTP, ScatterTP and
// AllGatherTP staged through host copies (parallel/collective_ops.cpp), the GroupNorm sums through
// AllReduceTP. Inference and a training step of the gen1 CrossFormer at domain 2 on the device
// equal domain 1 on the CPU: outputs and every parameter gradient.
TEST(DomainParallel, BandCollectivesOnADevice) {
  const std::string dev = band_test_device();
  SCOPED_TRACE("device " + dev);
  auto* fake = dynamic_cast<FakeDevice*>(find_backend(dev));
  const int downloads0 = fake ? fake->downloads : 0;
  const std::string model = "crossformer_tiny_opset17.onnx";
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  const Tensor one = infer_on(model, x, 1)[0].y;
  std::vector<DomainRun> runs = infer_on(model, x, 2, dev);
  int band_ops = 0;  // each staged collective downloads its input once
  for (const DomainRun& s : runs)
    for (const char* op : {"HaloTP", "ScatterTP", "AllGatherTP", "AllReduceTP"}) band_ops += s.ops.count(op) ? s.ops.at(op) : 0;
  if (fake) {  // and each rank's output once: nothing else leaves the device
    EXPECT_EQ(fake->downloads - downloads0, band_ops + 2) << "a band collective ran on device memory in place";
  }
  for (const DomainRun& s : runs) {
    EXPECT_LE(max_abs_diff(s.y, one), 1e-4);
    EXPECT_LE(rel_l2(s.y, one), 1e-5);
    EXPECT_GT(s.stats.halos, 0);
    expect_counts(s, false);
  }
  Graph g = import_onnx(data_path("tests/data/" + model));
  prepare_graph(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
  const Tensor gy = randn(g.values[g.outputs[0]].shape, 11);
  const DomainRun ref = train_on(model, x, gy, 1)[0];
  double scale = 0;
  for (auto& [name, t] : ref.grads) scale = std::max(scale, norm(t));
  for (const DomainRun& s : train_on(model, x, gy, 2, false, dev)) {
    EXPECT_LE(max_abs_diff(s.y, ref.y), 1e-4);
    ASSERT_EQ(s.grads.size(), ref.grads.size());
    for (auto& [name, want] : ref.grads) {
      ASSERT_TRUE(s.grads.count(name)) << name;
      const double n = norm(want);
      EXPECT_LE(rel_l2(s.grads.at(name), want) * n / std::max(n, 1e-3 * scale), 1e-4) << name;
    }
    expect_counts(s, true);
  }
}

// CREDIT's gen1 CrossFormer (ConvTranspose decoder, earth padding): bands from the stage-0
// cross-embedding (4 kernels taller than their stride: a halo each) through the later stages'
// cross-embeddings (the kernel of 4 of each: 3 halos) to the decoder's 3x3 convolutions (2 per
// up-block: 6) and GroupNorms (2 per up-block).
TEST(DomainParallel, CrossformerInferenceDomain2) {
  expect_infer_matches_one("crossformer_tiny_snbaked_opset17.onnx", "crossformer_tiny_x.npy", 2, 4, 3 + 6, 6);
}
// At domain 4 stage 3 has one row per band, fewer than its window, and 6 windows: it runs whole.
TEST(DomainParallel, CrossformerInferenceDomain4) {
  expect_infer_matches_one("crossformer_tiny_snbaked_opset17.onnx", "crossformer_tiny_x.npy", 4, 4, 3 + 6, 6);
}
// Mirror padding and an If-exported interpolation: 2 stage-0 kernels, 3 later, 6 in the decoder.
TEST(DomainParallel, CrossformerMirrorInferenceDomain2) {
  expect_infer_matches_one("crossformer_mirror_if.onnx", "crossformer_mirror_if_x.npy", 2, 2, 3 + 6, 6);
}
TEST(DomainParallel, CrossformerMirrorInferenceDomain4) {
  expect_infer_matches_one("crossformer_mirror_if.onnx", "crossformer_mirror_if_x.npy", 4, 2, 3 + 6, 6);
}
// WXFormer from PyTorch 2's dynamo exporter: PixelShuffle (DepthToSpace) decoder (3x3 convs: 4
// per up-block, 2 in the last), ZeroPad2d cross-embeddings (4 at stage 0), torch.var's ReduceMean
// without keepdims in the channel norms.
TEST(DomainParallel, WxformerInferenceDomain2) {
  expect_infer_matches_one("torch2_wxformer_tiny_dynamo.onnx", "torch2_wxformer_tiny_x.npy", 2, 4, 3 + 14, 6);
}
TEST(DomainParallel, WxformerInferenceDomain4) {
  expect_infer_matches_one("torch2_wxformer_tiny_dynamo.onnx", "torch2_wxformer_tiny_x.npy", 4, 4, 3 + 14, 6);
}
// CREDIT's next-generation model (column attention along latitudes: the columns shared out;
// stage 3's one row cannot be split: its cross-embedding gathered; Resize to the same size: the
// identity).
// At domain 4 stage 2 has 2 rows: it and the decoder block at its size (halos, 2 GroupNorms) gathered.
TEST(DomainParallel, NextgenInferenceDomain2) {
  expect_infer_matches_one("nextgen_model_ts.onnx", "nextgen_model_x.npy", 2, 2, 14, 6);
}
TEST(DomainParallel, NextgenInferenceDomain4) {
  expect_infer_matches_one("nextgen_model_ts.onnx", "nextgen_model_x.npy", 4, 2, 9, 4);
}

// A WXFormer with CREDIT's "mirror" padding (reflect in latitude) and spectral norm, 64x64
// (models/make_domain_fixture.py): halos for stage 0's 2 kernels, the later stages' kernel of 4,
// and every decoder convolution (3x3: 4 per up-block, 2 in the last). At domain 4 stage 3's 6
// rows and the first up-block's input do not split into 4 bands: they run whole, and the bands
// start again at the up-block's second convolution (its halo taken with its band); stage 2's 6
// rows of windows do not split into 4 either: its windows are shared out after the layout,
// unfused.
TEST(DomainParallel, WxformerMirrorInferenceDomain2) {
  expect_infer_matches_one("wxformer_mirror.onnx", "wxformer_mirror_x.npy", 2, 2, 3 + 14, 6);
}
TEST(DomainParallel, WxformerMirrorInferenceDomain4) {
  expect_infer_matches_one("wxformer_mirror.onnx", "wxformer_mirror_x.npy", 4, 2 + 1, 2 + 12, 6, 2);
}

// The crop of the padded grid after a WXFormer's decoder (its last convolution on bands): the
// gather makes only the cropped output, on every rank, in inference and training (the other
// tests check the numbers).
TEST(DomainParallel, TheGridsCropIsGatheredCropped) {
  const Tensor x = read_npy(data_path("tests/data/wxformer_mirror_x.npy"));
  for (const DomainRun& r : infer_on("wxformer_mirror.onnx", x, 2)) EXPECT_EQ(r.cropped_gathers, 1);
  Graph g = import_onnx(data_path("tests/data/wxformer_mirror.onnx"));
  prepare_graph(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}});
  for (const DomainRun& r : train_on("wxformer_mirror.onnx", x, randn(g.values[g.outputs[0]].shape, 3), 2))
    EXPECT_EQ(r.cropped_gathers, 1);
}

TEST(DomainParallel, CrossformerTrainingDomain2) {
  expect_train_matches_one("crossformer_tiny_snbaked_opset17.onnx", "crossformer_tiny_x.npy", 2);
}
TEST(DomainParallel, CrossformerTrainingDomain4) {
  expect_train_matches_one("crossformer_tiny_snbaked_opset17.onnx", "crossformer_tiny_x.npy", 4);
}

// as the trainer runs it: the training fusions on the bands (fused window attention on the
// rank's windows, channel LayerNorm, GELU)
TEST(DomainParallel, CrossformerFusedTrainingDomain2) {
  expect_train_matches_one("crossformer_tiny_snbaked_opset17.onnx", "crossformer_tiny_x.npy", 2, true);
}
// spectral norm's power iteration on every domain rank alike
TEST(DomainParallel, WxformerMirrorTrainingDomain2) {
  expect_train_matches_one("wxformer_mirror.onnx", "wxformer_mirror_x.npy", 2, true);
}
TEST(DomainParallel, NextgenTrainingDomain2) {
  expect_train_matches_one("nextgen_model_ts.onnx", "nextgen_model_x.npy", 2, true);
}

}  // namespace wxe::test
