// The legacy -> Linear layout rules (engine/passes/layout_rules.h) on hand-made state dicts.
#include "engine/passes/layout_rules.h"

#include <cstring>
#include <map>

#include "engine/io/safetensors.h"
#include "importers/torch/torch_checkpoint.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

// sigma by an independent formula: u . (W_mat v), W_mat rows along dim
double sigma_of(const Tensor& w, const Tensor& u, const Tensor& v, int dim) {
  int64_t d0 = w.shape[0], d1 = w.shape[1], rest = w.numel() / (d0 * d1);
  double s = 0;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b)
      for (int64_t r = 0; r < rest; ++r) {
        double x = w.data<float>()[(a * d1 + b) * rest + r];
        if (dim == 0) s += u.data<float>()[a] * x * v.data<float>()[b * rest + r];
        else s += u.data<float>()[b] * x * v.data<float>()[a * rest + r];
      }
  return s;
}

const Tensor& find(const NamedTensors& t, const std::string& name) {
  for (auto& kv : t)
    if (kv.first == name) return kv.second;
  throw Error("no tensor " + name);
}

}  // namespace

TEST(LayoutRules, SpectralNormConvUsesDim0) {
  Tensor w = randn({4, 3, 2, 2}, 1), u = randn({4}, 2), v = randn({12}, 3);
  Tensor f = layout::fold_spectral_norm(w, u, v, "conv.weight_orig");
  double s = sigma_of(w, u, v, 0);
  for (int i = 0; i < w.numel(); ++i) EXPECT_NEAR(f.data<float>()[i], w.data<float>()[i] / s, 1e-6);
}

TEST(LayoutRules, SpectralNormConvTransposeUsesDim1) {
  Tensor w = randn({6, 3, 2, 2}, 4), u = randn({3}, 5), v = randn({24}, 6);
  Tensor f = layout::fold_spectral_norm(w, u, v, "up.conv.weight_orig");
  double s = sigma_of(w, u, v, 1);
  for (int i = 0; i < w.numel(); ++i) EXPECT_NEAR(f.data<float>()[i], w.data<float>()[i] / s, 1e-6);
}

TEST(LayoutRules, SquareConvTransposePicksDimWhereUIsParallelToWv) {
  // (C, C, k, k): both dims fit by size; the power iteration leaves u = normalize(W_mat v)
  Tensor w = randn({3, 3, 2, 2}, 7), v = randn({12}, 8);
  for (int dim : {0, 1}) {
    Tensor u(DType::F32, {3});
    double norm = 0;
    for (int r = 0; r < 3; ++r) {  // u = W_mat v for this dim
      Tensor e = Tensor::zeros(DType::F32, {3});
      e.data<float>()[r] = 1;
      u.data<float>()[r] = (float)sigma_of(w, e, v, dim);
      norm += u.data<float>()[r] * u.data<float>()[r];
    }
    for (int r = 0; r < 3; ++r) u.data<float>()[r] /= (float)std::sqrt(norm);
    Tensor f = layout::fold_spectral_norm(w, u, v, "w");
    double s = sigma_of(w, u, v, dim);
    EXPECT_NEAR(f.data<float>()[5], w.data<float>()[5] / s, 1e-6) << "dim " << dim;
  }
}

TEST(LayoutRules, SpectralNormShapeMismatchIsAnError) {
  Tensor w = randn({4, 3, 1, 1}, 1), u = randn({5}, 2), v = randn({3}, 3);
  EXPECT_THROW(layout::fold_spectral_norm(w, u, v, "x.weight_orig"), Error);
}

TEST(LayoutRules, ConvertFoldsSigmaOnFusedQkvThenSplits) {
  const int I = 4, D = 3;
  Tensor w = randn({3 * I, D, 1, 1}, 10), u = randn({3 * I}, 11), v = randn({D}, 12);
  NamedTensors in = {{"blk.to_qkv.weight_orig", w}, {"blk.to_qkv.weight_u", u}, {"blk.to_qkv.weight_v", v},
                     {"blk.to_out.weight", randn({D, I, 1, 1}, 13)}, {"blk.to_out.bias", randn({D}, 14)},
                     {"ff.layers.1.weight", randn({4 * D, D, 1, 1}, 15)}, {"norm.g", randn({1, D, 1, 1}, 16)}};
  layout::ConvertReport rep;
  NamedTensors out = layout::convert_state_dict(in, &rep);
  EXPECT_EQ(rep.spectral_norm_folded, 1);
  EXPECT_EQ(rep.qkv_split, 1);
  EXPECT_EQ(rep.reshaped, 2);
  double s = sigma_of(w, u, v, 0);  // one sigma for the fused matrix
  const char* names[3] = {"blk.to_q.weight", "blk.to_k.weight", "blk.to_v.weight"};
  for (int k = 0; k < 3; ++k) {
    const Tensor& part = find(out, names[k]);
    ASSERT_EQ(part.shape, (Shape{I, D}));
    for (int i = 0; i < I * D; ++i) EXPECT_NEAR(part.data<float>()[i], w.data<float>()[k * I * D + i] / s, 1e-6);
  }
  EXPECT_EQ(find(out, "blk.to_out.weight").shape, (Shape{D, I}));
  EXPECT_EQ(find(out, "ff.layers.1.weight").shape, (Shape{4 * D, D}));
  EXPECT_EQ(find(out, "norm.g").shape, (Shape{1, D, 1, 1}));  // unchanged
  for (auto& kv : out) EXPECT_EQ(kv.first.find("weight_"), std::string::npos) << kv.first;
}

TEST(LayoutRules, ConvertIsIdempotent) {
  NamedTensors in = {{"a.to_qkv.weight", randn({6, 2, 1, 1}, 1)}, {"a.to_out.weight", randn({2, 2, 1, 1}, 2)},
                     {"c.weight_orig", randn({3, 2, 3, 3}, 3)}, {"c.weight_u", randn({3}, 4)},
                     {"c.weight_v", randn({18}, 5)}};
  NamedTensors once = layout::convert_state_dict(in);
  layout::ConvertReport rep;
  NamedTensors twice = layout::convert_state_dict(once, &rep);
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_EQ(once[i].first, twice[i].first);
    expect_close(twice[i].second, once[i].second, 0, 0);
  }
  EXPECT_EQ(rep.spectral_norm_folded + rep.qkv_split + rep.reshaped, 0);
}

TEST(LayoutRules, OrphanSpectralNormVectorsAreAnError) {
  NamedTensors in = {{"c.weight_u", randn({3}, 1)}};
  EXPECT_THROW(layout::convert_state_dict(in), Error);
  NamedTensors in2 = {{"c.weight_orig", randn({3, 2}, 1)}, {"c.weight_u", randn({3}, 1)}};
  EXPECT_THROW(layout::convert_state_dict(in2), Error);
}

// ---- the inverse: to_legacy_state_dict (back to CREDIT's names and shapes)

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::map<std::string, Tensor> by_name(const NamedTensors& t) {
  std::map<std::string, Tensor> r;
  for (auto& [n, x] : t) {
    EXPECT_FALSE(r.count(n)) << n << " twice";
    r[n] = x;
  }
  return r;
}

}  // namespace

// A Linear-layout dict without spectral norm (the nextgen block fixture, written by PyTorch):
// to the legacy layout and back through the forward table gives every tensor back bit for bit.
TEST(LayoutRules, ToLegacyInvertsConvert) {
  NamedTensors linear = read_safetensors(data_path("tests/data/nextgen_block.safetensors"));
  NamedTensors legacy = layout::to_legacy_state_dict(linear);
  std::map<std::string, Tensor> l = by_name(legacy);
  ASSERT_TRUE(l.count("layers.0.0.to_qkv.weight"));
  EXPECT_EQ(l["layers.0.0.to_qkv.weight"].shape, (Shape{96, 32, 1, 1}));
  // [q | k | v]: the k block is the second third
  const Tensor& fused = l["layers.0.0.to_qkv.weight"];
  const Tensor& k = find(linear, "layers.0.0.to_k.weight");
  EXPECT_EQ(std::memcmp((const uint8_t*)fused.raw() + k.nbytes(), k.raw(), k.nbytes()), 0);
  EXPECT_EQ(l["layers.0.0.to_out.weight"].shape, (Shape{32, 32, 1, 1}));
  EXPECT_EQ(l["layers.0.1.layers.1.weight"].shape, (Shape{128, 32, 1, 1}));
  EXPECT_EQ(l["layers.0.1.layers.4.weight"].shape, (Shape{32, 128, 1, 1}));
  EXPECT_EQ(l["layers.0.0.dpb.layers.4.weight"].shape, (Shape{8}));  // a LayerNorm weight: 1-D stays
  EXPECT_EQ(l["layers.0.0.dpb.layers.3.weight"].shape, (Shape{8, 8}));
  EXPECT_FALSE(l.count("layers.0.0.to_q.weight"));
  size_t groups = 0;
  for (auto& [n, t] : linear) groups += n.size() > 12 && n.compare(n.size() - 12, 12, ".to_q.weight") == 0;
  EXPECT_GT(groups, 1u);
  EXPECT_EQ(legacy.size(), linear.size() - 2 * groups);

  std::map<std::string, Tensor> back = by_name(layout::convert_state_dict(legacy));
  ASSERT_EQ(back.size(), linear.size());
  for (auto& [n, t] : linear) {
    ASSERT_TRUE(back.count(n)) << n;
    EXPECT_EQ(back[n].shape, t.shape) << n;
    EXPECT_TRUE(same_bytes(back[n], t)) << n;
  }
}

// The CREDIT fixture checkpoints (PyTorch-written, spectral norm everywhere) through
// convert_state_dict and back: every tensor outside a spectral-norm module is the original bit
// for bit; a spectral-norm module comes back as one folded weight in weight_orig's legacy shape
// (fused to_qkv, 1x1 conv), equal to the fold of the original fused matrix.
TEST(LayoutRules, ToLegacyOfAConvertedCheckpointGivesTheLegacyTensors) {
  for (const char* f : {"tests/data/crossformer_tiny_checkpoint.pt", "tests/data/wxformer_tiny_checkpoint.pt"}) {
    SCOPED_TRACE(f);
    NamedTensors orig = read_torch_state_dict(data_path(f)).tensors;
    std::map<std::string, Tensor> o = by_name(orig);
    std::map<std::string, Tensor> l = by_name(layout::to_legacy_state_dict(layout::convert_state_dict(orig)));
    size_t expected = 0, folded = 0;
    for (auto& [n, t] : orig) {
      const std::string m = layout::module_of(n), pre = m.empty() ? "" : m + ".";
      if (n == pre + "weight_u" || n == pre + "weight_v") continue;  // folded away
      if (n == pre + "weight_orig") {
        ++expected;
        ++folded;
        ASSERT_TRUE(l.count(pre + "weight")) << n;
        EXPECT_EQ(l[pre + "weight"].shape, t.shape) << n;
        Tensor want = layout::fold_spectral_norm(t, o[pre + "weight_u"], o[pre + "weight_v"], n);
        EXPECT_TRUE(same_bytes(l[pre + "weight"], want)) << n;
        continue;
      }
      ++expected;
      ASSERT_TRUE(l.count(n)) << n;
      EXPECT_EQ(l[n].shape, t.shape) << n;
      EXPECT_TRUE(same_bytes(l[n], t)) << n;
    }
    EXPECT_GT(folded, 50u);
    EXPECT_EQ(l.size(), expected);
  }
}

TEST(LayoutRules, ToLegacyErrorsNameTheModule) {
  NamedTensors no_k = {{"blk.to_q.weight", randn({4, 6}, 1)}, {"blk.to_v.weight", randn({4, 6}, 2)}};
  std::string e = error_of([&] { layout::to_legacy_state_dict(no_k); });
  EXPECT_NE(e.find("blk.to_k.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("to_qkv"), std::string::npos) << e;
  NamedTensors uneven = {{"blk.to_q.bias", randn({4}, 1)}, {"blk.to_k.bias", randn({4}, 2)},
                         {"blk.to_v.bias", randn({5}, 3)}};
  e = error_of([&] { layout::to_legacy_state_dict(uneven); });
  EXPECT_NE(e.find("blk.to_v.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("(5)"), std::string::npos) << e;
}
