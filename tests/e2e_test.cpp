// End to end: real CREDIT exports reproduce the stored PyTorch outputs.
#include <filesystem>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "tests/fixtures.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

struct Case {
  std::string model, x, y;
};

// Imports, simplifies and runs `model` on `x`; returns the output and the simplified graph.
Tensor run_model(const std::string& model, const std::string& x, KernelKind kind, Graph* out_graph = nullptr) {
  Graph g = import_onnx(model);
  Tensor xin = read_npy(x);
  simplify(g, {{g.values[g.inputs[0]].name, {xin.dtype, xin.shape}}});
  Executor ex(g, {0, kind});
  Tensor y = ex.run({{g.values[g.inputs[0]].name, xin}})[0];
  if (out_graph) *out_graph = std::move(g);
  return y;
}

void check_matches_pytorch(const Case& c, double max_abs = 1e-4, double max_rel = 1e-5) {
  Tensor y = run_model(data_path(c.model), data_path(c.x), KernelKind::Fast);
  Tensor ref = read_npy(data_path(c.y));
  ASSERT_EQ(shape_str(y.shape), shape_str(ref.shape));
  EXPECT_LE(max_abs_diff(y, ref), max_abs) << c.model;
  EXPECT_LE(rel_l2(y, ref), max_rel) << c.model;
}

}  // namespace

TEST(EndToEnd, CrossformerTinySpectralNormTraced) {
  check_matches_pytorch({"tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_x.npy",
                         "tests/data/crossformer_tiny_y.npy"});
}

TEST(EndToEnd, CrossformerTinySpectralNormBaked) {
  check_matches_pytorch({"tests/data/crossformer_tiny_snbaked_opset17.onnx", "tests/data/crossformer_tiny_x.npy",
                         "tests/data/crossformer_tiny_y.npy"});
}

TEST(EndToEnd, WxformerTinySpectralNormTraced) {
  check_matches_pytorch({"models/wxformer_tiny/model.onnx", "models/wxformer_tiny/x.npy",
                         "models/wxformer_tiny/y.npy"});
}

TEST(EndToEnd, WxformerTinySpectralNormBaked) {
  check_matches_pytorch({"tests/data/wxformer_tiny_snbaked_opset17.onnx", "models/wxformer_tiny/x.npy",
                         "models/wxformer_tiny/y.npy"});
}

// The passes leave the model's real compute: spectral norm, shape chains and the position
// bias MLP folded; folded weights named after their module.
TEST(EndToEnd, PassesReduceToRealCompute) {
  Graph g;
  run_model(data_path("tests/data/crossformer_tiny_opset17.onnx"), data_path("tests/data/crossformer_tiny_x.npy"),
            KernelKind::Fast, &g);
  std::map<std::string, int> c = op_counts(g);
  EXPECT_LT(g.nodes.size(), 700u);
  for (const char* op : {"Shape", "Gather", "Unsqueeze", "Constant", "Identity", "Cast", "ConstantOfShape"})
    EXPECT_EQ(c.count(op), 0u) << op;
  EXPECT_EQ(c["Gemm"], 0) << "the position-bias MLP should fold into a constant";
  EXPECT_EQ(c["Conv"], 16);    // 56 in the export; the 40 pointwise ones became Linear
  EXPECT_EQ(c["Linear"], 60);  // 10 blocks x (q, k, v, to_out) + 10 x (ff up, ff down)
  bool found = false;
  for (auto& v : g.values) {
    EXPECT_EQ(v.name.find("weight_orig"), std::string::npos) << v.name;
    EXPECT_EQ(v.name.find("weight_u"), std::string::npos) << v.name;
    EXPECT_EQ(v.name.find("to_qkv"), std::string::npos) << v.name;
    if (v.name == "layers.0.1.layers.0.0.to_k.weight") {
      found = true;
      EXPECT_TRUE(v.is_param);
      EXPECT_EQ(v.shape, (Shape{16, 16}));
    }
  }
  EXPECT_TRUE(found) << "folded, split spectral-norm weight not named after its module";
}

// The fast path (oneDNN) against the reference kernels on a whole model.
TEST(EndToEnd, FastPathMatchesReferenceKernels) {
  Tensor fast = run_model(data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx"),
                          data_path("tests/data/crossformer_tiny_x.npy"), KernelKind::Fast);
  Tensor ref = run_model(data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx"),
                         data_path("tests/data/crossformer_tiny_x.npy"), KernelKind::Reference);
  EXPECT_LE(max_abs_diff(fast, ref), 1e-4);
  EXPECT_LE(rel_l2(fast, ref), 1e-5);
}

// Exports made by models/export_credit.py with PyTorch 2.x (both exporters).
TEST(EndToEnd, PyTorch2Exports) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(data_path("tests/data"))) {
    std::string f = e.path().filename().string();
    if (f.rfind("torch2_", 0) != 0 || e.path().extension() != ".onnx") continue;
    // torch2_<model>_<exporter>.onnx with torch2_<model>_x.npy / _y.npy beside it
    std::string stem = f.substr(0, f.size() - 5);
    std::string base = stem.substr(0, stem.rfind('_'));
    SCOPED_TRACE(f);
    check_matches_pytorch({"tests/data/" + f, "tests/data/" + base + "_x.npy", "tests/data/" + base + "_y.npy"});
    ++n;
  }
  EXPECT_GE(n, 1) << "no PyTorch 2.x exports in tests/data";
}

// The benchmark-size model, from the CREDIT fixtures outside the repository when present
// ($WXE_FIXTURES, tests/fixtures.h; a user's clone has none: skipped, naming the variable).
TEST(EndToEnd, WxformerV2026) {
  const std::string onnx = "wxformer_v2026_snbaked_opset17.onnx";
  if (!credit_fixtures_present({onnx, "wxformer_v2026_x.npy", "wxformer_v2026_y.npy"}))
    GTEST_SKIP() << credit_fixture_skip(onnx);
  const std::string dir = credit_fixtures_dir();
  Tensor y = run_model(dir + "wxformer_v2026_snbaked_opset17.onnx", dir + "wxformer_v2026_x.npy", KernelKind::Fast);
  Tensor ref = read_npy(dir + "wxformer_v2026_y.npy");
  EXPECT_LE(rel_l2(y, ref), 1e-5);
}
