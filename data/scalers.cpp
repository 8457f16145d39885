// bridgescaler files and CREDIT's elementwise blocks (data/scalers.h).
#include "data/scalers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "data/zarr.h"
#include "engine/ir/error.h"
#include "engine/io/json.h"

namespace wxe {

// Does a scaler block's `variables` select this scaler key? Full keys ("era5/prognostic/3d/T"),
// partial paths ("era5/prognostic") and, for a flat scaler file's bare names, the name; none
// listed: all (CREDIT's _parse_variable_selection).
bool selected(const std::vector<std::string>& sel, const std::string& key) {
  if (sel.empty()) return true;
  for (const std::string& s : sel) {
    if (key == s || (key.size() > s.size() && key.compare(0, s.size(), s) == 0 && key[s.size()] == '/')) return true;
    if (key.find('/') == std::string::npos && s.substr(s.rfind('/') + 1) == key) return true;
  }
  return false;
}

// Does a spatial_variables list select this key? (empty: none, unlike a scaler's variables)
bool selected_any(const std::vector<std::string>& sel, const std::string& key) {
  return !sel.empty() && selected(sel, key);
}

// A bridgescaler JSON (save_scaler_dict: {data_type: {source: {"source/field_type/3d/VAR": "<the
// scaler's own JSON text>"}}}, or a flat {VAR: {mean_x_, var_x_}}) into per-variable statistics
// of each side: side[0] input, side[1] target. A flat file gives both sides. Within one side a
// variable must have one scaler.
void read_bridgescaler(const std::string& file, const std::vector<std::string>& sel, std::map<std::string, Stats> side[2],
                       Quantiles* quant) {
  Json j = parse_json(read_regular_file(file, (size_t)1 << 30), file, "scaler JSON");
  if (j.type != Json::Obj) fail(file, ": not a JSON object of scalers");
  // mean_x_ / var_x_: a list of numbers, or numpy's {"__numpy__": base64, "dtype", "shape"}
  auto nums = [&](const Json& e, const std::string& key, const char* k) {
    const Json* a = e.get(k);
    std::vector<double> v;
    const std::string what = str(file, ": scaler '", key, "': ", k);
    if (a && a->type == Json::Arr) {
      for (const Json& x : a->items) {
        if (x.type != Json::Num) fail(what, " is not numbers");
        v.push_back(parse_double(x.s, what));
      }
    } else {
      const Json* b64 = a && a->type == Json::Obj ? a->get("__numpy__") : nullptr;
      const Json* dt = a && a->type == Json::Obj ? a->get("dtype") : nullptr;
      if (!b64 || b64->type != Json::Str || !dt || dt->type != Json::Str)
        fail(file, ": scaler '", key, "' has no ", k, " (a list of numbers or a numpy array)");
      if (dt->s != "<f4" && dt->s != "<f8") fail(what, " has dtype ", dt->s, " (float32 or float64 expected)");
      const std::string bytes = base64_decode(b64->s, what);
      const size_t esz = dt->s == "<f4" ? 4 : 8;
      if (bytes.size() % esz) fail(what, " is ", bytes.size(), " bytes");
      for (size_t i = 0; i < bytes.size(); i += esz) {
        if (esz == 4) {
          float f;
          std::memcpy(&f, bytes.data() + i, 4);
          v.push_back(f);
        } else {
          double d;
          std::memcpy(&d, bytes.data() + i, 8);
          v.push_back(d);
        }
      }
    }
    for (double x : v)
      if (!std::isfinite(x)) fail(what, " holds ", x, " (statistics must be finite)");
    return v;
  };
  std::function<void(const Json&, int, int)> walk = [&](const Json& obj, int depth, int sides) {
    for (size_t i = 0; i < obj.keys.size(); ++i) {
      const std::string& key = obj.keys[i];
      const Json* e = &obj.items[i];
      Json text;
      if (e->type == Json::Str) {
        text = parse_json(e->s, file, "scaler '" + key + "'");
        e = &text;
      }
      if (e->type != Json::Obj) fail(file, ": scaler '", key, "' is not a JSON object");
      const ScalerKind kind = scaler_kind(*e, str(file, ": scaler '", key, "'"));
      if (kind == ScalerKind::MinMax) fail(file, ": scaler '", key, "': a min-max scaler is not implemented");
      if (kind == ScalerKind::Quantile) {  // bridgescaler's DQuantileScalerTensor (scaler_type: quantile)
        if (!selected(sel, key)) continue;
        if (!quant) fail(file, ": scaler '", key, "' is a quantile scaler (not read here)");
        auto q = std::make_shared<const QuantileScaler>(QuantileScaler::from_json(*e, str(file, ": scaler '", key, "'")));
        for (int k = 0; k < 2; ++k)
          if (sides & (1 << k)) quant[k][key] = q;
        continue;
      }
      if (kind == ScalerKind::None) {
        if (depth >= 3) fail(file, ": scaler '", key, "' has no mean_x_");
        const int s = depth == 0 && key == "input" ? 1 : depth == 0 && key == "target" ? 2 : sides;
        walk(*e, depth + 1, s);
        continue;
      }
      if (!selected(sel, key)) continue;
      std::vector<double> mean = nums(*e, key, "mean_x_"), sd = nums(*e, key, "var_x_");
      if (mean.size() != sd.size()) fail(file, ": scaler '", key, "': mean_x_ and var_x_ differ in length");
      for (double& v : sd) v = std::sqrt(v);
      for (int k = 0; k < 2; ++k)
        if (sides & (1 << k)) side[k][key] = {mean, sd};
    }
  };
  walk(j, 0, 3);
}

template <class V>
const V* find_scaler(const std::map<std::string, V>& m, const std::string& var_key, const std::string& file) {
  auto it = m.find(var_key);
  if (it != m.end()) return &it->second;
  const std::string name = var_key.substr(var_key.rfind('/') + 1);
  const V* hit = nullptr;
  std::string first;
  for (const auto& [key, v] : m)
    if (key == name || (key.size() > name.size() && key.compare(key.size() - name.size() - 1, std::string::npos, "/" + name) == 0)) {
      if (hit && !(*hit == v))
        fail(file, ": scalers '", first, "' and '", key, "' both fit variable '", var_key, "' (name it in full)");
      if (!hit) first = key;
      hit = &v;
    }
  return hit;
}
template const Stats* find_scaler(const std::map<std::string, Stats>&, const std::string&, const std::string&);
template const double* find_scaler(const std::map<std::string, double>&, const std::string&, const std::string&);
template const std::shared_ptr<const QuantileScaler>* find_scaler(const Quantiles&, const std::string&, const std::string&);

std::map<std::string, double> scaler_target_variances(const std::string& file) {
  std::map<std::string, Stats> side[2];
  read_bridgescaler(file, {}, side);
  std::map<std::string, double> out;
  for (const auto& [key, st] : side[1]) {
    double v = 0;
    for (double sd : st.second) v += sd * sd;
    out[key] = v / (double)std::max<size_t>(st.second.size(), 1);
  }
  return out;
}


namespace {
// float32 element math as torch computes it on CREDIT's float32 tensors (Python floats rounded
// to float32 where they meet a tensor)
template <class T>
void apply_transform(const PointTransform& p, T* x, int64_t n, T* d) {
  const T e = (T)p.eps;
  const T le = (T)(p.base == 0 ? std::log(p.eps) : p.base == 2 ? std::log2(p.eps) : std::log10(p.eps));
  const T ln_b = p.base == 0 ? (T)1 : (T)std::log((double)p.base);
  switch (p.kind) {
    case PointTransform::Fill:
      for (int64_t i = 0; i < n; ++i) {
        const T v = x[i];
        T out = v;
        bool hit = false;
        for (const PointTransform::Rule& r : p.rules) {  // every rule matched on the original value, the last wins
          bool m;
          if (r.nan) {
            m = std::isnan(v);
          } else {
            const T s = (T)r.search;
            m = !std::isnan(v) && (r.op == "==" ? v == s : r.op == "!=" ? v != s : r.op == "<" ? v < s
                                  : r.op == "<=" ? v <= s : r.op == ">" ? v > s : v >= s);
          }
          if (m) {
            out = (T)r.fill;
            hit = true;
          }
        }
        x[i] = out;
        if (d && hit) d[i] = 0;  // a constant where a rule replaced the value
      }
      break;
    case PointTransform::Log:
      for (int64_t i = 0; i < n; ++i) {
        const T v = x[i] + e;
        if (d) d[i] *= (T)1 / (v * ln_b);
        x[i] = (p.base == 0 ? std::log(v) : p.base == 2 ? std::log2(v) : std::log10(v)) - le;
      }
      break;
    case PointTransform::Sqrt:
      for (int64_t i = 0; i < n; ++i) {
        x[i] = std::sqrt(x[i]);
        if (d) d[i] *= (T)0.5 / x[i];
      }
      break;
    case PointTransform::Exp:
      for (int64_t i = 0; i < n; ++i) {
        const T v = x[i] + le;
        const T y = p.base == 0 ? std::exp(v) : p.base == 2 ? std::exp2(v) : std::pow((T)10, v);
        if (d) d[i] *= y * ln_b;
        x[i] = y - e;
      }
      break;
    case PointTransform::Square:
      for (int64_t i = 0; i < n; ++i) {
        if (d) d[i] *= 2 * x[i];
        x[i] = x[i] * x[i];
      }
      break;
  }
}
}  // namespace

void PointTransform::apply(float* x, int64_t n, float* d) const { apply_transform(*this, x, n, d); }

}  // namespace wxe
