#include "engine/passes/layout_rules.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "engine/ir/module_roles.h"
#include "engine/math/spectral_norm_math.h"

namespace wxe::layout {

namespace {

// W_mat v with W_mat = w moved so `dim` is first, reshaped (rows, -1); in double
// (engine/math/spectral_norm_math.h, the math of the SpectralNorm op).
std::vector<double> wmat_times(const Tensor& w, const Tensor& v, int dim) {
  return sn::wmat_v(sn::geometry(dim, w.shape), w.data<float>(), v.data<float>(), sn::NoSum{});
}

std::vector<double> as_double(const Tensor& t) {
  Tensor f = t.to_f32();
  return std::vector<double>(f.data<float>(), f.data<float>() + f.numel());
}

}  // namespace

std::string module_of(const std::string& name) {
  size_t p = name.rfind('.');
  return p == std::string::npos ? "" : name.substr(0, p);
}

bool is_qkv_module(const std::string& module) { return module_role(module) == Role::Qkv; }

bool is_linear_module(const std::string& module) {
  const Role r = module_role(module);
  return r == Role::Out || r == Role::FfnUp || r == Role::FfnDown;
}

std::array<std::string, 3> qkv_modules(const std::string& m) {
  return {sibling_module(m, Role::Q), sibling_module(m, Role::K), sibling_module(m, Role::V)};
}

Tensor fold_spectral_norm(const Tensor& w_orig, const Tensor& u, const Tensor& v,
                          const std::string& name, int dim) {
  WXE_CHECK(w_orig.dtype == DType::F32 || w_orig.dtype == DType::F16 || w_orig.dtype == DType::BF16,
            name, ": spectral norm weight must be floating point, is ", dtype_name(w_orig.dtype));
  Tensor w = w_orig.to_f32();
  WXE_CHECK(w.rank() >= 1 && u.rank() == 1 && v.rank() == 1, name, ": spectral norm u ",
            shape_str(u.shape), " / v ", shape_str(v.shape), " do not fit weight ", shape_str(w.shape));
  int64_t d0 = w.shape[0], d1 = w.rank() > 1 ? w.shape[1] : 1, n = w.numel();
  auto fits = [&](int d) {
    int64_t rows = d == 0 ? d0 : d1;
    return u.numel() == rows && rows > 0 && v.numel() == n / rows;
  };
  std::vector<double> uu = as_double(u);
  const Tensor vf = v.to_f32();
  if (dim < 0) {
    bool f0 = fits(0), f1 = w.rank() > 1 && fits(1);
    WXE_CHECK(f0 || f1, name, ": spectral norm u ", shape_str(u.shape), " / v ", shape_str(v.shape),
              " do not fit weight ", shape_str(w.shape));
    if (f0 && f1) {  // square in dims 0/1: take the dim where W_mat v is parallel to u
      auto cosine = [&](int d) {
        std::vector<double> wv = wmat_times(w, vf, d);
        double dot = 0, a = 0, b = 0;
        for (size_t i = 0; i < wv.size(); ++i) {
          dot += wv[i] * uu[i];
          a += wv[i] * wv[i];
          b += uu[i] * uu[i];
        }
        return std::fabs(dot) / std::sqrt(std::max(a * b, 1e-300));
      };
      dim = cosine(1) > cosine(0) ? 1 : 0;
    } else {
      dim = f0 ? 0 : 1;
    }
  }
  WXE_CHECK(fits(dim), name, ": spectral norm u/v do not fit weight ", shape_str(w.shape), " at dim ", dim);
  std::vector<double> wv = wmat_times(w, vf, dim);
  double sigma = 0;
  for (size_t i = 0; i < wv.size(); ++i) sigma += uu[i] * wv[i];
  WXE_CHECK(std::isfinite(sigma) && sigma != 0, name, ": spectral norm sigma is ", sigma);
  Tensor out(DType::F32, w.shape);
  // PyTorch divides in float32 by a float32 sigma
  float s = (float)sigma;
  for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = w.data<float>()[i] / s;
  if (w_orig.dtype != DType::F32) {
    Tensor back(w_orig.dtype, w.shape);
    convert(out, back);
    return back;
  }
  return out;
}

std::array<Tensor, 3> split_qkv(const Tensor& w, const std::string& name) {
  WXE_CHECK(w.rank() >= 1 && w.shape[0] > 0 && w.shape[0] % 3 == 0, name, ": fused qkv ", shape_str(w.shape),
            " needs a first dimension that is a positive multiple of 3");
  bool is_bias = w.rank() == 1;
  if (!is_bias)
    for (int d = 2; d < w.rank(); ++d)
      WXE_CHECK(w.shape[d] == 1, name, ": fused qkv ", shape_str(w.shape), " is not a 1x1 projection");
  int64_t rows = w.shape[0] / 3, cols = is_bias ? 1 : w.numel() / w.shape[0];
  std::array<Tensor, 3> r;
  size_t block = (size_t)(rows * cols) * dtype_size(w.dtype);
  for (int k = 0; k < 3; ++k) {
    r[k] = is_bias ? Tensor(w.dtype, {rows}) : Tensor(w.dtype, {rows, cols});
    std::memcpy(r[k].raw(), (const uint8_t*)w.raw() + k * block, block);
  }
  return r;
}

Tensor position_bias_grid(int64_t rows) {
  int64_t side = 1;
  while (side * side < rows) side += 2;
  if (rows < 1 || side * side != rows) return Tensor(DType::F32, {0, 2});
  const int64_t w = side / 2;
  Tensor t(DType::F32, {rows, 2});
  float* p = t.data<float>();
  for (int64_t i = -w; i <= w; ++i)
    for (int64_t j = -w; j <= w; ++j) {
      *p++ = (float)i;
      *p++ = (float)j;
    }
  return t;
}

Tensor conv1x1_to_linear(const Tensor& w, const std::string& name) {
  if (w.rank() == 2) return w;
  WXE_CHECK(w.rank() == 4 && w.shape[2] == 1 && w.shape[3] == 1, name, ": ", shape_str(w.shape),
            " is not a 1x1 convolution weight");
  return w.reshaped({w.shape[0], w.shape[1]});
}

NamedTensors convert_state_dict(const NamedTensors& in, ConvertReport* report, bool keep_spectral_norm) {
  ConvertReport rep;
  rep.tensors_in = (int)in.size();
  std::map<std::string, const Tensor*> by_name;
  for (auto& kv : in) {
    WXE_CHECK(!by_name.count(kv.first), "state dict has tensor '", kv.first, "' twice");
    by_name[kv.first] = &kv.second;
  }
  auto get = [&](const std::string& n) -> const Tensor* {
    auto it = by_name.find(n);
    return it == by_name.end() ? nullptr : it->second;
  };
  NamedTensors out;
  auto emit = [&](const std::string& name, const Tensor& t) {
    out.push_back({name, t});
    rep.bytes_out += t.nbytes();
  };
  for (auto& [name, t] : in) {
    std::string module = module_of(name), leaf = name.substr(module.empty() ? 0 : module.size() + 1);
    std::string pre = module.empty() ? "" : module + ".";
    if (keep_spectral_norm && get(pre + "weight_orig")) {
      emit(name, t);
      continue;
    }
    if (leaf == "weight_u" || leaf == "weight_v") {
      WXE_CHECK(get(pre + "weight_orig"), "'", name, "' without '", pre, "weight_orig'");
      continue;  // consumed by the fold
    }
    Tensor w = t;
    std::string wname = name;
    if (leaf == "weight_orig") {
      const Tensor *u = get(pre + "weight_u"), *v = get(pre + "weight_v");
      WXE_CHECK(u && v, "'", name, "' without its '", pre, "weight_u' and '", pre, "weight_v'");
      WXE_CHECK(!get(pre + "weight"), "'", name, "' and '", pre, "weight' both present");
      w = fold_spectral_norm(t, *u, *v, name);
      wname = pre + "weight";
      leaf = "weight";
      ++rep.spectral_norm_folded;
    }
    if (is_qkv_module(module) && (leaf == "weight" || leaf == "bias")) {
      std::array<Tensor, 3> parts = split_qkv(w, wname);
      std::array<std::string, 3> mods = qkv_modules(module);
      for (int k = 0; k < 3; ++k) emit(mods[k] + "." + leaf, parts[k]);
      ++rep.qkv_split;
      continue;
    }
    if (is_linear_module(module) && leaf == "weight" && w.rank() == 4 && w.shape[2] == 1 && w.shape[3] == 1) {
      w = conv1x1_to_linear(w, wname);
      ++rep.reshaped;
    }
    emit(wname, w);
  }
  rep.tensors_out = (int)out.size();
  if (report) *report = rep;
  return out;
}

NamedTensors to_legacy_state_dict(const NamedTensors& in) {
  std::map<std::string, const Tensor*> by_name;
  for (auto& kv : in) by_name[kv.first] = &kv.second;
  NamedTensors out;
  std::set<std::string> done;
  for (auto& [name, t] : in) {
    const std::string module = module_of(name), leaf = name.substr(module.empty() ? 0 : module.size() + 1);
    const Role role = module_role(module);
    if ((role == Role::Q || role == Role::K || role == Role::V) && (leaf == "weight" || leaf == "bias")) {
      const std::string fused_module = sibling_module(module, Role::Qkv), fused = fused_module + "." + leaf;
      if (done.count(fused)) continue;
      std::array<const Tensor*, 3> parts{};
      const std::string names[3] = {sibling_module(module, Role::Q) + "." + leaf,
                                    sibling_module(module, Role::K) + "." + leaf,
                                    sibling_module(module, Role::V) + "." + leaf};
      for (int k = 0; k < 3; ++k) {
        auto it = by_name.find(names[k]);
        WXE_CHECK(it != by_name.end(), "'", name, "' without '", names[k], "': cannot fuse ", fused_module);
        parts[k] = it->second;
        WXE_CHECK(parts[k]->shape == parts[0]->shape && parts[k]->dtype == parts[0]->dtype, "'", names[k], "' is ",
                  shape_str(parts[k]->shape), ", '", names[0], "' ", shape_str(parts[0]->shape), ": cannot fuse ",
                  fused_module);
      }
      Shape s = parts[0]->shape;
      s[0] *= 3;
      if (leaf == "weight" && s.size() == 2) s = {s[0], s[1], 1, 1};
      Tensor fusedt(parts[0]->dtype, s);
      for (int k = 0; k < 3; ++k)
        std::memcpy((uint8_t*)fusedt.raw() + k * parts[0]->nbytes(), parts[k]->raw(), parts[0]->nbytes());
      out.push_back({fused, fusedt});
      done.insert(fused);
      continue;
    }
    if (is_linear_module(module) && leaf == "weight" && t.rank() == 2) {
      out.push_back({name, t.reshaped({t.shape[0], t.shape[1], 1, 1})});
      continue;
    }
    out.push_back({name, t});
  }
  return out;
}

}  // namespace wxe::layout
