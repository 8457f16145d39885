// Writing CREDIT checkpoints: the torch.save writer against wxe's own reader, the inverse
// layout rules, and `export_credit_checkpoint` against the original CREDIT checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/layout_rules.h"
#include "engine/safetensors.h"
#include "importers/torch/torch_checkpoint.h"
#include "importers/torch/torch_save.h"
#include "tests/test_util.h"
#include "tools/credit_checkpoint.h"

namespace wxe::test {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(TorchSave, RoundTripThroughTheReader) {
  PyValue sd = PyValue::dict(true);
  Tensor a = randn({3, 4, 1, 1}, 1), b = randn({5}, 2), i = Tensor::from_i64({7, -3, 1ll << 40});
  sd.set(PyValue::str("layer.weight"), PyValue::tensor(a));
  sd.set(PyValue::str("layer.bias"), PyValue::tensor(b));
  sd.set(PyValue::str("index"), PyValue::tensor(i));
  PyValue top = PyValue::dict();
  top.set(PyValue::str("epoch"), PyValue::integer(3));
  top.set(PyValue::str("model_state_dict"), sd);
  PyValue opt = PyValue::dict();
  opt.set(PyValue::str("state"), PyValue::dict().set(PyValue::integer(0), PyValue::dict().set(PyValue::str("step"), PyValue::tensor(Tensor::scalar_f32(2).reshaped({})))));
  opt.set(PyValue::str("param_groups"),
          PyValue::list({PyValue::dict()
                             .set(PyValue::str("betas"), PyValue::tuple({PyValue::real(0.9), PyValue::real(0.95)}))
                             .set(PyValue::str("foreach"), PyValue::none())
                             .set(PyValue::str("amsgrad"), PyValue::boolean(false))
                             .set(PyValue::str("params"), PyValue::list({PyValue::integer(0), PyValue::integer(1)}))}));
  top.set(PyValue::str("optimizer_state_dict"), opt);
  const std::string path = tmp_path("written.pt");
  write_torch_checkpoint(path, top);
  std::vector<std::string> other;
  StateDict back = read_torch_state_dict(path, &other);
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.tensors[0].first, "layer.weight");
  EXPECT_EQ(back.tensors[0].second.shape, a.shape);
  EXPECT_TRUE(same_bytes(back.tensors[0].second, a));
  EXPECT_TRUE(same_bytes(back.tensors[1].second, b));
  EXPECT_TRUE(same_bytes(back.tensors[2].second, i));
  EXPECT_NE(std::find(other.begin(), other.end(), "optimizer_state_dict"), other.end());
  // storages are 64-byte aligned in the archive, as torch.save writes them
  std::string bytes = slurp(path);
  size_t at = bytes.find(std::string((const char*)a.raw(), 16));
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 64, 0u);
}

TEST(TorchSave, InverseLayoutRoundTrip) {
  NamedTensors linear = {{"m.to_q.weight", randn({4, 6}, 1)},        {"m.to_k.weight", randn({4, 6}, 2)},
                         {"m.to_v.weight", randn({4, 6}, 3)},        {"m.to_out.weight", randn({6, 4}, 4)},
                         {"m.to_out.bias", randn({6}, 5)},           {"f.layers.1.weight", randn({24, 6}, 6)},
                         {"f.layers.4.weight", randn({6, 24}, 7)},   {"n.g", randn({1, 6, 1, 1}, 8)},
                         {"s.weight_orig", randn({3, 2, 3, 3}, 9)}, {"s.weight_u", randn({3}, 10)},
                         {"s.weight_v", randn({18}, 11)}};
  NamedTensors legacy = layout::to_legacy_state_dict(linear);
  std::map<std::string, Tensor> l;
  for (auto& [n, t] : legacy) l[n] = t;
  ASSERT_TRUE(l.count("m.to_qkv.weight"));
  EXPECT_EQ(l["m.to_qkv.weight"].shape, (Shape{12, 6, 1, 1}));
  EXPECT_EQ(std::memcmp(l["m.to_qkv.weight"].data<float>() + 24, linear[1].second.raw(), 24 * sizeof(float)), 0);
  EXPECT_EQ(l["m.to_out.weight"].shape, (Shape{6, 4, 1, 1}));
  EXPECT_EQ(l["f.layers.1.weight"].shape, (Shape{24, 6, 1, 1}));
  EXPECT_FALSE(l.count("m.to_q.weight"));
  NamedTensors again = layout::convert_state_dict(legacy, nullptr, /*keep_spectral_norm=*/true);
  std::map<std::string, Tensor> a;
  for (auto& [n, t] : again) a[n] = t;
  for (auto& [n, t] : linear) {
    ASSERT_TRUE(a.count(n)) << n;
    EXPECT_TRUE(same_bytes(a[n], t)) << n;
  }
  NamedTensors partial = {{"m.to_q.weight", randn({4, 6}, 1)}, {"m.to_k.weight", randn({4, 6}, 2)}};
  EXPECT_NE(error_of([&] { layout::to_legacy_state_dict(partial); }).find("m.to_v.weight"), std::string::npos);
}

// The CREDIT checkpoint through the Linear layout and back: every tensor as it was; a
// checkpoint of another model is refused with the mismatches listed and nothing written.
TEST(TorchSave, CreditExportMatchesTheOriginal) {
  const std::string orig = data_path("tests/data/crossformer_tiny_checkpoint.pt");
  StateDict sd = read_torch_state_dict(orig);
  NamedTensors kept = layout::convert_state_dict(sd.tensors, nullptr, /*keep_spectral_norm=*/true);
  const std::string st = tmp_path("kept.safetensors");
  write_safetensors(st, kept);
  const std::string out = tmp_path("credit.pt");
  std::string summary = export_credit_checkpoint(st, out, orig);
  EXPECT_NE(summary.find("CREDIT"), std::string::npos);
  StateDict back = read_torch_state_dict(out);
  ASSERT_EQ(back.tensors.size(), sd.tensors.size());
  for (size_t k = 0; k < sd.tensors.size(); ++k) {
    EXPECT_EQ(back.tensors[k].first, sd.tensors[k].first);
    EXPECT_EQ(back.tensors[k].second.shape, sd.tensors[k].second.shape) << sd.tensors[k].first;
    EXPECT_TRUE(same_bytes(back.tensors[k].second, sd.tensors[k].second)) << sd.tensors[k].first;
  }
  const std::string bad = tmp_path("bad.pt");
  std::string err = error_of([&] {
    export_credit_checkpoint(st, bad, data_path("tests/data/wxformer_tiny_checkpoint.pt"));
  });
  EXPECT_NE(err.find("mismatches"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(bad));
}

}  // namespace
}  // namespace wxe::test
