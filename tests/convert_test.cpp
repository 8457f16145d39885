// Checkpoint conversion and --weights against ground truth made by PyTorch
// (models/make_convert_reference.py): CREDIT model + remove_spectral_norm + reshape/split.
#include <filesystem>

#include "engine/exec/executor.h"
#include "engine/passes/layout_rules.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "engine/io/safetensors.h"
#include "importers/onnx/onnx_import.h"
#include "importers/torch/torch_checkpoint.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

NamedTensors converted(const std::string& model) {
  return layout::convert_state_dict(read_torch_state_dict(data_path("tests/data/" + model + "_checkpoint.pt")).tensors);
}

Tensor run_with(const std::string& onnx, const NamedTensors* weights, const std::string& x = "tests/data/crossformer_tiny_x.npy") {
  Graph g = import_onnx(data_path(onnx));
  Tensor xin = read_npy(data_path(x));
  simplify(g, {{"x", {xin.dtype, xin.shape}}}, weights);
  return Executor(g).run({{"x", xin}})[0];
}

}  // namespace

TEST(Convert, MatchesPyTorchRemoveSpectralNormAndSplit) {
  for (std::string model : {"crossformer_tiny", "wxformer_tiny"}) {
    SCOPED_TRACE(model);
    NamedTensors ours = converted(model);
    NamedTensors ref = read_safetensors(data_path("tests/data/" + model + "_converted_ref.safetensors"));
    std::map<std::string, const Tensor*> by_name;
    for (auto& kv : ours) by_name[kv.first] = &kv.second;
    ASSERT_EQ(ours.size(), ref.size());
    double worst = 0;
    for (auto& [name, t] : ref) {
      ASSERT_TRUE(by_name.count(name)) << name;
      ASSERT_EQ(shape_str(by_name[name]->shape), shape_str(t.shape)) << name;
      if (t.dtype == DType::F32) worst = std::max(worst, max_abs_diff(*by_name[name], t));
    }
    EXPECT_LE(worst, 1e-6);
  }
}

TEST(Convert, ConvertingTwiceChangesNothing) {
  NamedTensors once = converted("crossformer_tiny");
  layout::ConvertReport rep;
  NamedTensors twice = layout::convert_state_dict(once, &rep);
  ASSERT_EQ(once.size(), twice.size());
  EXPECT_EQ(rep.spectral_norm_folded + rep.qkv_split + rep.reshaped, 0);
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_EQ(once[i].first, twice[i].first);
    EXPECT_EQ(max_abs_diff(once[i].second, twice[i].second), 0);
  }
}

// CREDIT's remap_conv_state_dict splits weight_orig and u before folding, so q, k and v get
// their own sigma. That changes the model's outputs; folding the fused matrix does not.
TEST(Convert, FusedSigmaMatchesAndPerProjectionSigmaDiffers) {
  NamedTensors legacy = read_torch_state_dict(data_path("tests/data/crossformer_tiny_checkpoint.pt")).tensors;
  std::map<std::string, Tensor> by_name(legacy.begin(), legacy.end());
  NamedTensors per_projection;
  for (auto& [name, t] : legacy) {
    std::string module = layout::module_of(name);
    if (!layout::is_qkv_module(module)) {
      per_projection.push_back({name, t});
      continue;
    }
    if (name != module + ".weight_orig") continue;
    std::array<Tensor, 3> w = layout::split_qkv(t.reshaped({t.shape[0], t.shape[1]}), name);
    std::array<Tensor, 3> u = layout::split_qkv(by_name[module + ".weight_u"], name);
    std::array<std::string, 3> mods = layout::qkv_modules(module);
    for (int k = 0; k < 3; ++k)
      per_projection.push_back({mods[k] + ".weight", layout::fold_spectral_norm(w[k], u[k], by_name[module + ".weight_v"], name)});
  }
  NamedTensors per_proj_converted = layout::convert_state_dict(per_projection);
  NamedTensors fused = converted("crossformer_tiny");
  Tensor ref = read_npy(data_path("tests/data/crossformer_tiny_y.npy"));
  const std::string graph = "tests/data/crossformer_tiny_snbaked_opset17.onnx";
  Tensor good = run_with(graph, &fused), bad = run_with(graph, &per_proj_converted);
  EXPECT_LE(max_abs_diff(good, ref), 1e-4);
  EXPECT_LE(rel_l2(good, ref), 1e-5);
  EXPECT_GT(rel_l2(bad, ref), 1e-3) << "per-projection sigma should change the outputs";
}

TEST(Convert, SafetensorsRoundTripThenWeights) {
  NamedTensors w = converted("wxformer_tiny");
  std::string path = (std::filesystem::temp_directory_path() / ("wxe_rt_" + std::to_string(getpid()) + ".safetensors")).string();
  write_safetensors(path, w);
  NamedTensors back = read_safetensors(path);
  std::filesystem::remove(path);
  Tensor y = run_with("tests/data/wxformer_tiny_snbaked_opset17.onnx", &back, "models/wxformer_tiny/x.npy");
  Tensor ref = read_npy(data_path("models/wxformer_tiny/y.npy"));
  EXPECT_LE(max_abs_diff(y, ref), 1e-4);
  EXPECT_LE(rel_l2(y, ref), 1e-5);
}

// A graph exported from another initialization gives the checkpoint's outputs once the
// checkpoint is loaded (spectral norm, qkv, position-bias MLP and shared initializers included).
TEST(Convert, RefitDifferentlyInitializedGraph) {
  Tensor ref = read_npy(data_path("tests/data/crossformer_tiny_y.npy"));
  const std::string graph = "tests/data/crossformer_tiny_seed1_snbaked.onnx";
  Tensor own = run_with(graph, nullptr);
  EXPECT_GT(rel_l2(own, ref), 1e-2) << "the seed-1 graph should not already match";
  NamedTensors w = converted("crossformer_tiny");
  Tensor refit = run_with(graph, &w);
  EXPECT_LE(max_abs_diff(refit, ref), 1e-4);
  EXPECT_LE(rel_l2(refit, ref), 1e-5);
}

TEST(Convert, WrongCheckpointListsEveryMismatch) {
  NamedTensors w = converted("wxformer_tiny");
  try {
    run_with("tests/data/crossformer_tiny_snbaked_opset17.onnx", &w);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("weights do not fit the model"), std::string::npos) << m;
    EXPECT_NE(m.find("up_block1.conv.weight"), std::string::npos) << m;  // ConvTranspose vs Conv shapes
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
}
