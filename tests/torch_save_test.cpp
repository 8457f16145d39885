// Writing CREDIT checkpoints: the torch.save writer against wxe's own reader, the inverse
// layout rules, and `export_credit_checkpoint` against the original CREDIT checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "engine/passes/layout_rules.h"
#include "engine/io/safetensors.h"
#include "importers/torch/pickle.h"
#include "importers/torch/torch_checkpoint.h"
#include "importers/torch/torch_save.h"
#include "importers/torch/zip.h"
#include "tests/test_util.h"
#include "train/credit_checkpoint.h"

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
  const std::string bad = tmp_path("credit_export_refused.pt");
  std::filesystem::remove(bad);
  std::string err = error_of([&] {
    export_credit_checkpoint(st, bad, data_path("tests/data/wxformer_tiny_checkpoint.pt"));
  });
  EXPECT_NE(err.find("mismatches"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(bad));
}

// ---- the written pickle read back object by object with wxe's restricted unpickler

using torch_pickle::Kind;

// A written checkpoint, unpickled: the archive, its data.pkl and the object table.
struct Loaded {
  torch_zip::Reader zip;
  std::string pkl;
  std::unique_ptr<torch_pickle::Unpickler> up;
  int32_t root = -1;
  explicit Loaded(const std::string& path) : zip(path) {
    const torch_zip::Entry* e = zip.find("archive/data.pkl");
    if (!e) throw Error(path + ": no archive/data.pkl");
    pkl = zip.read(*e);
    up = std::make_unique<torch_pickle::Unpickler>(
        path, (const uint8_t*)pkl.data(), pkl.size(), [this](const std::string& key, uint64_t* n) {
          const torch_zip::Entry* s = zip.find("archive/data/" + key);
          if (s) *n = s->usize;
          return s != nullptr;
        });
    root = up->load();
  }
  int32_t get(int32_t dict, const std::string& key) const {
    int32_t id = up->dict_get(dict, key);
    if (id < 0) throw Error("no key '" + key + "'");
    return id;
  }
  // dict with int keys: value of key k
  int32_t at(int32_t dict, int64_t k) const {
    const auto& s = up->seq(dict);
    for (size_t i = 0; i + 1 < s.size(); i += 2)
      if (up->kind(s[i]) == Kind::Int && up->obj(s[i]).i == k) return s[i + 1];
    throw Error("no key " + std::to_string(k));
  }
  std::vector<std::string> keys(int32_t dict) const {
    std::vector<std::string> r;
    const auto& s = up->seq(dict);
    for (size_t i = 0; i < s.size(); i += 2)
      r.push_back(up->kind(s[i]) == Kind::Str ? up->str(s[i]) : std::to_string(up->obj(s[i]).i));
    return r;
  }
  double real(int32_t id) const {
    EXPECT_EQ(up->kind(id), Kind::Float) << up->describe(id);
    double d;
    int64_t bits = up->obj(id).i;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  // a contiguous float32 tensor
  Tensor tensor(int32_t id) const {
    EXPECT_EQ(up->kind(id), Kind::Tensor) << up->describe(id);
    const torch_pickle::TensorInfo& ti = up->tensor(id);
    EXPECT_EQ(ti.type, torch_pickle::ScalarType::F32);
    std::vector<int64_t> size = up->ints(ti.size);
    Tensor t(DType::F32, Shape(size.begin(), size.end()));
    std::string data = zip.read(*zip.find("archive/data/" + up->storages()[ti.storage].key));
    EXPECT_GE((int64_t)data.size(), (ti.offset + t.numel()) * 4);
    std::memcpy(t.raw(), data.data() + ti.offset * 4, t.nbytes());
    return t;
  }
};

TEST(TorchSave, EveryValueKindReadsBack) {
  PyValue top = PyValue::dict();
  top.set(PyValue::str("none"), PyValue::none());
  top.set(PyValue::str("yes"), PyValue::boolean(true));
  top.set(PyValue::str("no"), PyValue::boolean(false));
  top.set(PyValue::str("small"), PyValue::integer(-5));
  top.set(PyValue::str("big"), PyValue::integer(-(1ll << 40) - 3));
  top.set(PyValue::str("real"), PyValue::real(-0.1));
  top.set(PyValue::str("text"), PyValue::str("caf\xc3\xa9 to_qkv"));
  top.set(PyValue::str("pair"), PyValue::tuple({PyValue::real(0.9), PyValue::real(0.95)}));
  top.set(PyValue::str("empty_tuple"), PyValue::tuple({}));
  top.set(PyValue::str("empty_list"), PyValue::list({}));
  top.set(PyValue::str("ints"), PyValue::list({PyValue::integer(0), PyValue::integer(1), PyValue::integer(2)}));
  top.set(PyValue::str("by_int"), PyValue::dict().set(PyValue::integer(3), PyValue::str("three")));
  Tensor a = randn({2, 3}, 4);
  top.set(PyValue::str("od"), PyValue::dict(true).set(PyValue::str("w"), PyValue::tensor(a)));
  top.set(PyValue::str("scalar"), PyValue::tensor(Tensor::scalar_f32(7).reshaped({})));
  const std::string path = tmp_path("kinds.pt");
  write_torch_checkpoint(path, top);
  Loaded l(path);
  // the archive torch.save writes: data.pkl first, storages, byteorder, version
  std::vector<std::string> names;
  for (auto& e : l.zip.entries()) {
    names.push_back(e.name);
    EXPECT_EQ(e.method, 0) << e.name;  // stored
  }
  EXPECT_EQ(names.front(), "archive/data.pkl");
  for (const char* n : {"archive/byteorder", "archive/version", "archive/data/0", "archive/data/1"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(l.zip.read(*l.zip.find("archive/byteorder")), "little");
  EXPECT_EQ(l.pkl.substr(0, 2), std::string("\x80\x02", 2));  // protocol 2

  EXPECT_EQ(l.keys(l.root), (std::vector<std::string>{"none", "yes", "no", "small", "big", "real", "text", "pair",
                                                      "empty_tuple", "empty_list", "ints", "by_int", "od", "scalar"}));
  EXPECT_EQ(l.up->kind(l.get(l.root, "none")), Kind::None);
  EXPECT_EQ(l.up->kind(l.get(l.root, "yes")), Kind::Bool);
  EXPECT_EQ(l.up->obj(l.get(l.root, "yes")).i, 1);
  EXPECT_EQ(l.up->obj(l.get(l.root, "no")).i, 0);
  EXPECT_EQ(l.up->obj(l.get(l.root, "small")).i, -5);
  EXPECT_EQ(l.up->obj(l.get(l.root, "big")).i, -(1ll << 40) - 3);
  EXPECT_EQ(l.real(l.get(l.root, "real")), -0.1);
  EXPECT_EQ(l.up->str(l.get(l.root, "text")), "caf\xc3\xa9 to_qkv");
  int32_t pair = l.get(l.root, "pair");
  ASSERT_EQ(l.up->kind(pair), Kind::Tuple);
  ASSERT_EQ(l.up->seq(pair).size(), 2u);
  EXPECT_EQ(l.real(l.up->seq(pair)[1]), 0.95);
  EXPECT_EQ(l.up->kind(l.get(l.root, "empty_tuple")), Kind::Tuple);
  EXPECT_TRUE(l.up->seq(l.get(l.root, "empty_list")).empty());
  EXPECT_EQ(l.up->ints(l.get(l.root, "ints")), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(l.up->str(l.at(l.get(l.root, "by_int"), 3)), "three");
  Tensor back = l.tensor(l.get(l.get(l.root, "od"), "w"));
  EXPECT_EQ(back.shape, a.shape);
  EXPECT_TRUE(same_bytes(back, a));
  Tensor s = l.tensor(l.get(l.root, "scalar"));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.data<float>()[0], 7.f);
}

Tensor concat0(const std::vector<Tensor>& parts, Shape shape) {
  Tensor r(DType::F32, shape);
  size_t at = 0;
  for (const Tensor& p : parts) {
    std::memcpy((uint8_t*)r.raw() + at, p.raw(), p.nbytes());
    at += p.nbytes();
  }
  EXPECT_EQ(at, r.nbytes());
  return r;
}

// A hand-made CREDIT model (legacy layout: 1x1 convs, fused to_qkv with bias, a spectral-norm
// conv, a tensor the graph never used) and a fine-tune checkpoint directory of it (Linear
// layout, AdamW moments): the export has the original's order, q/k/v weights and moments fused
// [q | k | v], CREDIT's parameter indices (model.parameters(): no weight_u/v) and the param_groups
// key list of torch.optim.AdamW.state_dict() (torch 2.x).
TEST(TorchSave, CreditExportMapsTheAdamState) {
  NamedTensors legacy = {{"enc.weight", randn({4, 2, 3, 3}, 1)},     {"enc.bias", randn({4}, 2)},
                         {"blk.to_qkv.weight", randn({12, 4, 1, 1}, 3)}, {"blk.to_qkv.bias", randn({12}, 4)},
                         {"blk.to_out.weight", randn({4, 4, 1, 1}, 5)},  {"blk.to_out.bias", randn({4}, 6)},
                         {"sn.bias", randn({3}, 7)},                     {"sn.weight_orig", randn({3, 4, 1, 1}, 8)},
                         {"sn.weight_u", randn({3}, 9)},                 {"sn.weight_v", randn({4}, 10)},
                         {"ff.layers.1.weight", randn({8, 4, 1, 1}, 11)}, {"unused.weight", randn({2}, 12)}};
  PyValue sd = PyValue::dict(true);
  for (auto& [n, t] : legacy) sd.set(PyValue::str(n), PyValue::tensor(t));
  const std::string like = tmp_path("like.pt");
  write_torch_checkpoint(like, PyValue::dict().set(PyValue::str("epoch"), PyValue::integer(4)).set(PyValue::str("model_state_dict"), sd));

  // trained: every tensor but unused.weight, in the Linear layout (sorted, as safetensors are)
  NamedTensors model = {{"blk.to_k.bias", randn({4}, 21)},        {"blk.to_k.weight", randn({4, 4}, 22)},
                        {"blk.to_out.bias", randn({4}, 23)},      {"blk.to_out.weight", randn({4, 4}, 24)},
                        {"blk.to_q.bias", randn({4}, 25)},        {"blk.to_q.weight", randn({4, 4}, 26)},
                        {"blk.to_v.bias", randn({4}, 27)},        {"blk.to_v.weight", randn({4, 4}, 28)},
                        {"enc.bias", randn({4}, 29)},             {"enc.weight", randn({4, 2, 3, 3}, 30)},
                        {"ff.layers.1.weight", randn({8, 4}, 31)}, {"sn.bias", randn({3}, 32)},
                        {"sn.weight_orig", randn({3, 4, 1, 1}, 33)}, {"sn.weight_u", randn({3}, 34)},
                        {"sn.weight_v", randn({4}, 35)}};
  NamedTensors opt;
  std::map<std::string, Tensor> m;  // by "exp_avg.NAME"
  int seed = 100;
  for (const char* k : {"exp_avg.", "exp_avg_sq."})
    for (auto& [n, t] : model)
      if (n.find("weight_u") == std::string::npos && n.find("weight_v") == std::string::npos) {
        opt.push_back({k + n, randn(t.shape, seed++)});
        m[k + n] = opt.back().second;
      }
  const std::string dir = tmp_path("ckdir");
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", model);
  write_safetensors(dir + "/optimizer.safetensors", opt,
                    {{"step", "7"}, {"adam_step", "7"}, {"lr", "0.0002"}, {"beta1", "0.9"}, {"beta2", "0.95"},
                     {"eps", "1e-08"}, {"weight_decay", "0.05"}});
  const std::string out = tmp_path("adam.pt");
  export_credit_checkpoint(dir, out, like);

  Loaded l(out);
  // CREDIT's trainer resuming reads all five (scheduler: None without schedule metadata; scaler: {})
  EXPECT_EQ(l.keys(l.root), (std::vector<std::string>{"epoch", "model_state_dict", "optimizer_state_dict",
                                                      "scheduler_state_dict", "scaler_state_dict"}));
  int32_t msd = l.get(l.root, "model_state_dict");
  std::vector<std::string> want_names;
  for (auto& [n, t] : legacy) want_names.push_back(n);
  EXPECT_EQ(l.keys(msd), want_names);
  auto find_in = [](const NamedTensors& v, const std::string& n) -> const Tensor& {
    for (auto& kv : v)
      if (kv.first == n) return kv.second;
    throw Error("no " + n);
  };
  auto mt = [&](const std::string& n) { return find_in(model, n); };
  Tensor qkv = l.tensor(l.get(msd, "blk.to_qkv.weight"));
  EXPECT_EQ(qkv.shape, (Shape{12, 4, 1, 1}));
  EXPECT_TRUE(same_bytes(qkv, concat0({mt("blk.to_q.weight"), mt("blk.to_k.weight"), mt("blk.to_v.weight")}, {12, 4, 1, 1})));
  EXPECT_TRUE(same_bytes(l.tensor(l.get(msd, "blk.to_qkv.bias")),
                         concat0({mt("blk.to_q.bias"), mt("blk.to_k.bias"), mt("blk.to_v.bias")}, {12})));
  EXPECT_EQ(l.tensor(l.get(msd, "ff.layers.1.weight")).shape, (Shape{8, 4, 1, 1}));
  EXPECT_TRUE(same_bytes(l.tensor(l.get(msd, "sn.weight_u")), mt("sn.weight_u")));
  EXPECT_TRUE(same_bytes(l.tensor(l.get(msd, "unused.weight")), legacy.back().second));  // untrained: copied

  int32_t osd = l.get(l.root, "optimizer_state_dict");
  EXPECT_EQ(l.keys(osd), (std::vector<std::string>{"state", "param_groups"}));
  // model.parameters() order: enc.weight 0, enc.bias 1, to_qkv.weight 2, to_qkv.bias 3, to_out.weight 4,
  // to_out.bias 5, sn.bias 6, sn.weight_orig 7, ff.layers.1.weight 8, unused.weight 9 (no state)
  int32_t state = l.get(osd, "state");
  EXPECT_EQ(l.keys(state), (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8"}));
  for (int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(l.keys(l.at(state, i)), (std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}));
    Tensor step = l.tensor(l.get(l.at(state, i), "step"));
    EXPECT_EQ(step.rank(), 0);
    EXPECT_EQ(step.data<float>()[0], 7.f);
  }
  EXPECT_TRUE(same_bytes(l.tensor(l.get(l.at(state, 0), "exp_avg")), m["exp_avg.enc.weight"]));
  Tensor qkv_m = l.tensor(l.get(l.at(state, 2), "exp_avg"));
  EXPECT_EQ(qkv_m.shape, (Shape{12, 4, 1, 1}));
  EXPECT_TRUE(same_bytes(qkv_m, concat0({m["exp_avg.blk.to_q.weight"], m["exp_avg.blk.to_k.weight"],
                                         m["exp_avg.blk.to_v.weight"]}, {12, 4, 1, 1})));
  EXPECT_TRUE(same_bytes(l.tensor(l.get(l.at(state, 3), "exp_avg_sq")),
                         concat0({m["exp_avg_sq.blk.to_q.bias"], m["exp_avg_sq.blk.to_k.bias"],
                                  m["exp_avg_sq.blk.to_v.bias"]}, {12})));
  Tensor out_v = l.tensor(l.get(l.at(state, 4), "exp_avg_sq"));
  EXPECT_EQ(out_v.shape, (Shape{4, 4, 1, 1}));
  EXPECT_TRUE(same_bytes(out_v.reshaped({4, 4}), m["exp_avg_sq.blk.to_out.weight"]));
  EXPECT_TRUE(same_bytes(l.tensor(l.get(l.at(state, 7), "exp_avg")), m["exp_avg.sn.weight_orig"]));
  EXPECT_EQ(l.tensor(l.get(l.at(state, 8), "exp_avg")).shape, (Shape{8, 4, 1, 1}));

  int32_t groups = l.get(osd, "param_groups");
  ASSERT_EQ(l.up->seq(groups).size(), 1u);
  int32_t g = l.up->seq(groups)[0];
  // torch.optim.AdamW(...).state_dict()["param_groups"][0] keys, in order (torch 2.x)
  EXPECT_EQ(l.keys(g), (std::vector<std::string>{"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                                                 "capturable", "differentiable", "fused", "decoupled_weight_decay",
                                                 "params"}));
  EXPECT_EQ(l.real(l.get(g, "lr")), 0.0002);
  EXPECT_EQ(l.real(l.up->seq(l.get(g, "betas"))[1]), 0.95);
  EXPECT_EQ(l.real(l.get(g, "eps")), 1e-8);
  EXPECT_EQ(l.real(l.get(g, "weight_decay")), 0.05);
  EXPECT_EQ(l.up->kind(l.get(g, "amsgrad")), Kind::Bool);
  EXPECT_EQ(l.up->kind(l.get(g, "foreach")), Kind::None);
  EXPECT_EQ(l.up->ints(l.get(g, "params")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));

  // a transposed tensor of the same size does not pass for the original's: nothing written
  NamedTensors swapped = model;
  for (auto& [n, t] : swapped)
    if (n == "ff.layers.1.weight") t = randn({4, 8}, 40);
  write_safetensors(dir + "/model.safetensors", swapped);
  const std::string bad = tmp_path("swapped.pt");
  std::string e = error_of([&] { export_credit_checkpoint(dir, bad, like); });
  EXPECT_NE(e.find("ff.layers.1.weight (4, 8, 1, 1)"), std::string::npos) << e;
  EXPECT_NE(e.find("nothing written"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(bad));

  // without --like: sorted names, legacy shapes, no optimizer state
  write_safetensors(dir + "/model.safetensors", model);
  const std::string plain = tmp_path("plain.pt");
  export_credit_checkpoint(dir, plain, "");
  Loaded p(plain);
  EXPECT_EQ(p.keys(p.root),
            (std::vector<std::string>{"epoch", "model_state_dict", "scheduler_state_dict", "scaler_state_dict"}));
  std::vector<std::string> sorted = p.keys(p.get(p.root, "model_state_dict"));
  EXPECT_TRUE(std::is_sorted(sorted.begin(), sorted.end()));
  EXPECT_EQ(sorted.size(), legacy.size() - 1);  // no unused.weight
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace wxe::test
