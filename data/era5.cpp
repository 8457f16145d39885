#include "data/era5.h"

#include <netcdf.h>
#include <sys/resource.h>

#include <algorithm>
#include <limits>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <tuple>

#include "engine/ir/error.h"
#include "engine/io/glob.h"
#include "data/quantile_scaler.h"
#include "data/scalers.h"
#include "data/zarr.h"
#include "engine/io/json.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

const char* kTypes[] = {"prognostic", "static", "dynamic_forcing", "diagnostic"};

bool is_lat(const std::string& d) { return d == "latitude" || d == "lat"; }
bool is_lon(const std::string& d) { return d == "longitude" || d == "lon"; }

// "hours since 2020-12-31 00:00:00" -> (seconds per unit, base time)
std::pair<double, int64_t> time_units(const std::string& units, const std::string& where) {
  const size_t p = units.find(" since ");
  if (p == std::string::npos) fail(where, ": time units '", units, "' are not '<unit> since <date>'");
  const std::string u = units.substr(0, p);
  double s = 0;
  if (u == "seconds" || u == "second" || u == "s") s = 1;
  else if (u == "minutes" || u == "minute") s = 60;
  else if (u == "hours" || u == "hour" || u == "h") s = 3600;
  else if (u == "days" || u == "day" || u == "d") s = 86400;
  else fail(where, ": time unit '", u, "' is not supported");
  std::string date = units.substr(p + 7);
  if (date.size() > 19) date = date.substr(0, 19);  // drop fractional seconds / time zone
  return {s, parse_datetime(date, where)};
}

// The files in `pattern`'s folder whose names its last part ('*', '?') matches, sorted.
std::vector<std::string> matching_files(const std::string& pattern) {
  const fs::path dir = fs::path(pattern).parent_path().empty() ? fs::path(".") : fs::path(pattern).parent_path();
  const std::string pat = fs::path(pattern).filename().string();
  std::vector<std::string> hits;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (glob_match(pat, e.path().filename().string())) hits.push_back(e.path().string());
  std::sort(hits.begin(), hits.end());
  return hits;
}

std::string strftime_utc(const std::string& tmpl, int64_t t) {
  time_t tt = (time_t)t;
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char b[4096];
  const size_t n = std::strftime(b, sizeof b, tmpl.c_str(), &tm);
  return n ? std::string(b, n) : tmpl;
}

}  // namespace

Era5Data::Era5Data(const CreditConfig& cfg) : cfg_(cfg) {
  WXE_CHECK(!cfg_.sources.empty(), cfg_.file, ": no data source");
  for (SourceConfig& sc : cfg_.sources) levels_from_files(sc);
  auto add = [&](std::vector<ChannelInfo>& v, int s, const char* type) {
    const VarGroup& g = group(s, type);
    auto channel = [&](const std::string& var, bool is3d, int level) {
      ChannelInfo c;
      c.var = var;
      c.field_type = type;
      c.is3d = is3d;
      c.level_index = level;
      c.src = s;
      v.push_back(c);
    };
    for (const std::string& var : g.vars_3D)
      for (size_t l = 0; l < cfg_.sources[s].levels.size(); ++l) channel(var, true, (int)l);
    for (const std::string& var : g.vars_2D) channel(var, false, 0);
  };
  // CREDIT's ChannelSchema: inputs source by source, each prognostic < static < dynamic_forcing;
  // targets source by source, prognostic then diagnostic
  for (int s = 0; s < (int)cfg_.sources.size(); ++s)
    for (const char* t : kTypes)
      if (std::string(t) != "diagnostic") add(in_, s, t);
  for (int s = 0; s < (int)cfg_.sources.size(); ++s) {
    add(out_, s, "prognostic");
    add(out_, s, "diagnostic");
  }
  // the prognostic target channels and the input channels they feed in rollouts
  for (size_t k = 0; k < out_.size(); ++k) {
    int64_t at = -1;
    if (out_[k].field_type == "prognostic")
      for (size_t i = 0; i < in_.size() && at < 0; ++i)
        if (in_[i].src == out_[k].src && in_[i].var == out_[k].var && in_[i].level_index == out_[k].level_index &&
            in_[i].field_type == "prognostic")
          at = (int64_t)i;
    feedback_.push_back(at);
    n_prog_ += at >= 0;
  }
  // tisr sources: the grid from lat_spec / lon_spec or latlon_grid_path, the options
  for (int si = 0; si < (int)cfg_.sources.size(); ++si) {
    const SourceConfig& sc = cfg_.sources[si];
    if (sc.dataset_type != "tisr") continue;
    const std::string p = cfg_.file + ": " + cfg_.source_key + "." + sc.name;
    auto arg = [&](const char* k) { return sc.args.count(k) ? sc.args.at(k) : std::string(); };
    auto spec = [&](const char* k) {
      // "[90, -90, 192]" as the config wrote it (checked by the reader)
      std::string v = arg(k);
      for (char& ch : v)
        if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
      std::istringstream in(v);
      TisrAxisSpec a;
      double n = 0;
      in >> a.start >> a.end >> n;
      a.num_points = (int64_t)n;
      return a;
    };
    Tisr tz;
    tz.grid = arg("latlon_grid_path").empty() ? tisr_grid_from_spec(spec("lat_spec"), spec("lon_spec"))
                                              : tisr_grid_from_file(arg("latlon_grid_path"));
    if (tz.grid.curvilinear) fail(p, ": a curvilinear tisr grid (2-D latitude and longitude) is not implemented");
    tz.opt.integration_period_s =
        arg("timestep").empty() ? cfg_.timestep : parse_timestep(arg("timestep"), p + ".timestep");
    if (!arg("num_integration_steps").empty())
      tz.opt.num_integration_steps = (int)parse_int64(arg("num_integration_steps"), p + ".num_integration_steps");
    tisr_[si] = std::move(tz);
  }
  load_scaler();
  bind_transforms();
  bind_computed();
  bind_physics();
}

void Era5Data::bind_computed() {
  for (size_t b = 0; b < cfg_.computed.size(); ++b) {
    const GeopotentialSpec& g = cfg_.computed[b];
    const std::string where = cfg_.file + ": " + g.block + ".args.";
    // the first channel of a variable key among chans (3D: its first level), or fail naming the argument
    auto find = [&](const std::vector<ChannelInfo>& chans, const std::string& key, const char* arg, bool is3d,
                    const char* what) {
      for (size_t k = 0; k < chans.size(); ++k)
        if (var_key(cfg_, chans[k]) == key && chans[k].is3d == is3d && chans[k].level_index == 0) return (int64_t)k;
      fail(where, arg, ": '", key, "' is not ", what, " of this config");
    };
    // the block's output channel (3D: at level l) in its variable key's field type and name
    auto output = [&](int src, bool is3d, int l) {
      ChannelInfo ch;
      const size_t a = g.output_name.find('/'), f = g.output_name.find('/', a + 1);
      ch.field_type = g.output_name.substr(a + 1, f - a - 1);
      ch.var = g.output_name.substr(g.output_name.rfind('/') + 1);
      ch.is3d = is3d;
      ch.level_index = l;
      ch.src = src;
      ch.computed = (int)b;
      computed_.push_back(ch);
    };
    Computed c;
    c.zs = find(in_, g.zs, "surface_geopotential_var", false, "a 2D input variable (the raw initial condition)");
    c.sp = find(out_, g.sp, "surface_pressure_var", false, "a 2D predicted variable");
    if (g.mslp) {  // one 2D channel
      c.mslp = true;
      c.t = find(out_, g.t, "temperature_var", false, "a 2D predicted variable");
      output(out_[c.sp].src, false, 0);
      comp_.push_back(std::move(c));
      continue;
    }
    c.t = find(out_, g.t, "temperature_var", true, "a 3D predicted variable");
    c.q = find(out_, g.q, "specific_humidity_var", true, "a 3D predicted variable");
    const SourceConfig& src = cfg_.sources[out_[c.t].src];
    if (out_[c.q].src != out_[c.t].src)
      fail(where, "specific_humidity_var: '", g.q, "' is in another source than temperature_var (their levels must be one)");
    c.levels = hybrid_levels(g, cfg_.dir);
    if (c.levels.a.size() != src.levels.size() + 1)
      fail(where, "level_info_file: ", c.levels.a.size(), " half levels for the ", src.levels.size(), " levels of '", g.t,
           "' (CREDIT needs one more: give args.levels, the model levels the data hold)");
    for (size_t l = 0; l < src.levels.size(); ++l) output(out_[c.t].src, true, (int)l);
    comp_.push_back(std::move(c));
  }
}

Tensor Era5Data::compute_diagnostics(const Tensor& y, int64_t t, const Tensor* g, Tensor* gy) const {
  WXE_ASSERT(h_);
  const int64_t n = h_ * w_, C = (int64_t)out_.size(), C2 = (int64_t)computed_.size();
  WXE_CHECK(y.dtype == DType::F32 && y.rank() >= 2 && y.dim(1) == C && y.numel() == y.dim(0) * C * n,
            "computed diagnostics: y is ", shape_str(y.shape), ", expected (batch, ", C, ", 1, ", h_, ", ", w_, ")");
  Shape shape = y.shape;
  shape[1] = C2;
  Tensor out(DType::F32, shape);
  int64_t at = 0;  // the block's first output channel
  for (const Computed& c : comp_) {
    if (c.zs_time != t || c.zs_raw.empty()) {  // the static, read once per time (the loss calls this thrice a step)
      c.zs_raw.resize((size_t)n);
      read_var(in_[c.zs], t, c.zs_raw.data());
      c.zs_time = t;
    }
    const std::vector<float>& zs = c.zs_raw;
    if (c.mslp) {
      for (int64_t b = 0; b < y.dim(0); ++b) {
        const float* p = y.data<float>() + b * C * n;
        float* o = out.data<float>() + (b * C2 + at) * n;
        for (int64_t i = 0; i < n; ++i) {
          double dsp = 0, dt = 0;
          o[i] = (float)mslp_trenberth(p[c.sp * n + i], p[c.t * n + i], zs[i], g ? &dsp : nullptr, g ? &dt : nullptr);
          if (!g) continue;
          const double gi = g->data<float>()[(b * C2 + at) * n + i];
          float* d = gy->data<float>() + b * C * n;
          d[c.sp * n + i] += (float)(gi * dsp);
          d[c.t * n + i] += (float)(gi * dt);
        }
      }
      at += 1;
      continue;
    }
    const int64_t L = (int64_t)c.levels.a.size() - 1;
    const bool flip = cfg_.computed[computed_[at].computed].flip;
    for (int64_t b = 0; b < y.dim(0); ++b) {  // each sample (or ensemble member) of the batch
      const float* p = y.data<float>() + b * C * n;
      float* phi = out.data<float>() + (b * C2 + at) * n;
      for (int64_t i = 0; i < n; ++i) {
        if (!g) {
          geopotential_column(c.levels, flip, zs[i], p[c.sp * n + i], p + c.t * n + i, p + c.q * n + i, n, phi + i);
          continue;
        }
        float* d = gy->data<float>() + b * C * n;
        double gsp = 0;
        geopotential_column(c.levels, flip, zs[i], p[c.sp * n + i], p + c.t * n + i, p + c.q * n + i, n, phi + i,
                            g->data<float>() + (b * C2 + at) * n + i, d + c.t * n + i, d + c.q * n + i, &gsp);
        d[c.sp * n + i] += (float)gsp;
      }
    }
    at += L;
  }
  return out;
}

void Era5Data::levels_from_files(SourceConfig& sc) const {
  bool any3d = false;
  for (const VarGroup* g : {&sc.prognostic, &sc.diagnostic, &sc.dynamic_forcing, &sc.statics}) any3d |= !g->vars_3D.empty();
  if (!any3d || !sc.levels.empty()) return;
  // CREDIT (LocalDataset._find_grid): the first file, sorted, of the first field type with a path
  // (its strftime codes as '*'), its level coordinate's values
  const std::string where = cfg_.file + ": " + cfg_.source_key + "." + sc.name + ".levels";
  for (const VarGroup* g : {&sc.prognostic, &sc.dynamic_forcing, &sc.diagnostic, &sc.statics}) {
    if (g->path.empty()) continue;
    std::string pat = g->path;
    for (size_t i = pat.find('%'); i != std::string::npos && i + 1 < pat.size(); i = pat.find('%', i + 1)) pat.replace(i, 2, "*");
    const std::vector<std::string> hits = matching_files(pat);
    if (hits.empty()) continue;
    std::unique_ptr<DataFile> f = open_data_file(hits[0]);
    if (!f->has(sc.level_coord))
      fail(where, ": missing, and ", hits[0], " (whose levels CREDIT would take) has no coordinate '", sc.level_coord, "'");
    sc.levels = f->read(sc.level_coord);
    for (double l : sc.levels)
      if (!std::isfinite(l)) fail(hits[0], ": '", sc.level_coord, "' holds ", l, " (a missing level value)");
    if (sc.levels.empty()) fail(hits[0], ": '", sc.level_coord, "' is empty");
    return;
  }
  fail(where, ": missing, and no file matches the source's paths to take them from (CREDIT takes the first file's)");
}

void Era5Data::learn_grid(int64_t h, int64_t w, std::vector<double> lat, std::vector<double> lon,
                          const std::string& from) const {
  if (!h_) {
    h_ = h;
    w_ = w;
    lat_ = std::move(lat);
    lon_ = std::move(lon);
    for (double v : lat_)
      if (!(v >= -90 && v <= 90)) fail(from, ": latitude ", v, " is not in [-90, 90]");
    for (double v : lon_)
      if (!std::isfinite(v)) fail(from, ": longitude ", v, " is missing");
  }
  if (h != h_ || w != w_) fail(from, ": the grid is ", h, "x", w, ", the data's ", h_, "x", w_);
}

std::string var_key(const CreditConfig& cfg, const ChannelInfo& c) {
  if (c.computed >= 0) return cfg.computed.at(c.computed).output_name;
  return cfg.sources.at(c.src).name + "/" + c.field_type + (c.is3d ? "/3d/" : "/2d/") + c.var;
}

const VarGroup& Era5Data::group(int s, const std::string& t) const {
  const SourceConfig& sc = cfg_.sources.at(s);
  if (t == "prognostic") return sc.prognostic;
  if (t == "diagnostic") return sc.diagnostic;
  if (t == "static") return sc.statics;
  return sc.dynamic_forcing;
}

void Era5Data::load_scaler() {
  // per side (0 input, 1 target) and variable: mean and std per configured level (3D) or one value
  std::map<std::string, Stats> side[2], post[2];
  Quantiles qside[2], qpost[2];
  if (!cfg_.scaler_json.empty()) {
    read_bridgescaler(cfg_.scaler_json, cfg_.scaler_vars, side, qside);
    // args.data_types: the sides the preblock scales (the other passes through)
    for (int k = 0; k < 2; ++k)
      if (!cfg_.scaler_data_types.empty() &&
          std::find(cfg_.scaler_data_types.begin(), cfg_.scaler_data_types.end(), k ? "target" : "input") ==
              cfg_.scaler_data_types.end())
        side[k].clear(), qside[k].clear();
  } else if (!cfg_.mean_nc.empty() || !cfg_.std_nc.empty()) {
    if (cfg_.mean_nc.empty() || cfg_.std_nc.empty()) fail(cfg_.file, ": the scaler needs both mean_path and std_path");
    std::unique_ptr<DataFile> mfp = open_data_file(cfg_.mean_nc), sfp = open_data_file(cfg_.std_nc);
    DataFile &mf = *mfp, &sf = *sfp;
    auto levels_of = [&](DataFile& f, const SourceConfig& sc) {
      return f.has(sc.level_coord) ? f.read(sc.level_coord) : std::vector<double>{};
    };
    auto pick = [&](DataFile& f, const SourceConfig& sc, const std::string& var) {
      const std::vector<double> flev = levels_of(f, sc);
      const size_t nl = sc.levels.size();
      std::vector<double> v = f.read(var);
      for (double x : v)
        if (!std::isfinite(x)) fail(f.path(), ": variable '", var, "' holds ", x, " (statistics must be finite)");
      if (v.size() <= 1 || v.size() == nl) return v;
      if (flev.size() != v.size()) fail(f.path(), ": variable '", var, "' has ", v.size(), " values for ", nl, " levels");
      std::vector<double> out;
      for (double l : sc.levels) {
        auto it = std::find_if(flev.begin(), flev.end(), [&](double x) { return std::fabs(x - l) < 1e-6; });
        if (it == flev.end()) fail(f.path(), ": variable '", var, "' has no level ", l);
        out.push_back(v[it - flev.begin()]);
      }
      return out;
    };
    for (const auto* chans : {&in_, &out_})
      for (const ChannelInfo& c : *chans)
        if (mf.has(c.var) && sf.has(c.var) && !side[0].count(var_key(cfg_, c)))
          side[0][var_key(cfg_, c)] = side[1][var_key(cfg_, c)] = {pick(mf, cfg_.sources[c.src], c.var),
                                                                   pick(sf, cfg_.sources[c.src], c.var)};
  }
  // the postblock's inverse scaler: its file's target side (CREDIT's postblock reads only that)
  const bool has_post = !cfg_.post_scaler_json.empty();
  if (has_post) read_bridgescaler(cfg_.post_scaler_json, cfg_.post_scaler_vars, post, qpost);
  const std::string src = cfg_.scaler_json.empty() ? cfg_.mean_nc : cfg_.scaler_json;
  // channel c's (mean, std) from stats, or (0, 1) (passed through) when it has none
  // a quantile scaler of channel c's variable: the channel's digest (one per level, or one)
  auto quantile = [&](const ChannelInfo& c, const Quantiles& q, const std::string& file)
      -> std::pair<std::shared_ptr<const QuantileScaler>, int> {
    const std::shared_ptr<const QuantileScaler>* it = find_scaler(q, var_key(cfg_, c), file);
    if (!it) return {nullptr, 0};
    const int n = c.is3d ? (int)cfg_.sources[c.src].levels.size() : 1;
    if ((*it)->channels() != n && (*it)->channels() != 1)
      fail(file, ": the quantile scaler of variable '", c.var, "' has ", (*it)->channels(), " channels, expected ", n,
           " or 1");
    return {*it, (*it)->channels() == 1 ? 0 : c.level_index};
  };
  // a grid-wise scaler (the variable in the block's spatial_variables): per-point statistics
  auto grid = [&](ChannelInfo& c, const std::map<std::string, Stats>& stats, const std::vector<std::string>& spatial,
                  const std::string& file, bool post) {
    if (!selected_any(spatial, var_key(cfg_, c))) return false;
    if (c.is3d) fail(file, ": variable '", c.var, "': a grid-wise scaler (spatial_variables) of a 3D variable");
    const Stats* it = find_scaler(stats, var_key(cfg_, c), file);
    if (!it) return false;
    auto m = std::make_shared<std::vector<float>>(), s = std::make_shared<std::vector<float>>();
    for (double v : it->first) m->push_back((float)v);
    for (double v : it->second) {
      if (!std::isnormal((float)v)) fail(file, ": variable '", c.var, "': a grid-wise standard deviation of ", v);
      s->push_back((float)v);
    }
    (post ? c.post_grid_mean : c.grid_mean) = m;
    (post ? c.post_grid_std : c.grid_std) = s;
    return true;
  };
  auto pick = [&](const ChannelInfo& c, const std::map<std::string, Stats>& stats, const std::string& file,
                  double& mean, double& sd) {
    mean = 0;
    sd = 1;
    const Stats* it = find_scaler(stats, var_key(cfg_, c), file);
    if (!it) return false;
    const auto& [m, s] = *it;
    const size_t n = c.is3d ? cfg_.sources[c.src].levels.size() : 1;
    if (m.size() != n && m.size() != 1)
      fail(file, ": variable '", c.var, "' has ", m.size(), " scaler values, expected ", n, " or 1");
    const size_t k = m.size() == 1 ? 0 : (size_t)c.level_index;
    mean = m[k];
    sd = s[k];
    // normalising divides by the float32 std: it must be a positive normal float32
    if (!std::isnormal((float)sd) || (float)sd < 0 || !std::isfinite((float)mean))
      fail(file, ": variable '", c.var, "' has a mean of ", mean, " and a standard deviation of ", sd,
           " (not usable in float32)");
    return true;
  };
  auto warn = [&](const std::string& w) {
    if (std::find(warnings.begin(), warnings.end(), w) == warnings.end()) warnings.push_back(w);
  };
  for (int k = 0; k < 2; ++k)
    for (ChannelInfo& c : k ? out_ : in_) {
      std::tie(c.quant, c.quant_channel) = quantile(c, qside[k], src);
      if (c.quant) {
        c.post_quant = c.quant;
        c.post_quant_channel = c.quant_channel;
      }
      if (grid(c, side[k], cfg_.scaler_spatial, src, false)) {
        c.post_grid_mean = c.grid_mean;
        c.post_grid_std = c.grid_std;
      } else if (!c.quant && !pick(c, side[k], src, c.mean, c.std) && !src.empty())
        warn(str("no ", k ? "target" : "input", " scaler for variable '", c.var, "': passed through unnormalised"));
      // the postblock's statistics where it selects the variable, else the preblock's target side
      // (CREDIT's postblock leaves such a variable normalised; its netCDF writer de-normalises all)
      if (k && has_post) {
        auto [pq, pc] = quantile(c, qpost[1], cfg_.post_scaler_json);
        if (pq) {
          c.post_quant = pq;
          c.post_quant_channel = pc;
          continue;
        }
        if (grid(c, post[1], cfg_.post_scaler_spatial, cfg_.post_scaler_json, true)) {
          c.post_quant = nullptr;
          continue;
        }
        if (pick(c, post[1], cfg_.post_scaler_json, c.post_mean, c.post_std)) {
          c.post_quant = nullptr;
          c.post_grid_mean = c.post_grid_std = nullptr;
          continue;
        }
      }
      c.post_mean = c.mean;
      c.post_std = c.std;
    }
}

void Era5Data::bind_transforms() {
  auto bind = [&](const std::vector<PointTransform>& ts, bool post) {
    for (const PointTransform& t : ts) {
      bool any = false;
      for (int side = 0; side < 2; ++side) {
        if (post && side == 0) continue;  // postblocks act on predictions (targets)
        const char* dt = side ? "target" : "input";
        if (!post && std::find(t.data_types.begin(), t.data_types.end(), dt) == t.data_types.end()) continue;
        for (ChannelInfo& c : side ? out_ : in_)
          if (selected(t.vars, var_key(cfg_, c))) {
            (post ? c.post : c.pre).push_back(&t);
            any = true;
          }
      }
      if (!any && !(t.vars.size() == 1 && t.vars[0].empty()))
        warnings.push_back(t.block + ": selects no variable of the data, changes nothing");
    }
  };
  bind(cfg_.pre_transforms, false);
  bind(cfg_.post_transforms, true);
}

// A channel's n physical values normalised: its quantile scaler's transform, or (x - m) / s.
static void normalise_channel(const ChannelInfo& c, float* p, int64_t n, float m, float s) {
  if (c.grid_std) {
    WXE_CHECK((int64_t)c.grid_std->size() == n, "variable '", c.var, "': its grid-wise scaler has ", c.grid_std->size(),
              " points, the grid ", n);
    const float *gm = c.grid_mean->data(), *gs = c.grid_std->data();
    for (int64_t i = 0; i < n; ++i) p[i] = (p[i] - gm[i]) / gs[i];
    return;
  }
  if (c.quant) {
    c.quant->transform(p, n, c.quant_channel);
    return;
  }
  for (int64_t i = 0; i < n; ++i) p[i] = (p[i] - m) / s;
}

// A target channel's n normalised values to physical units: x * post_std + post_mean, then its
// postblocks, in float32 as CREDIT's inverse scaler computes with bridgescaler's float32
// statistics (two roundings: this file is compiled without FMA contraction).
static void denormalise_channel(const ChannelInfo& c, float* p, int64_t n, float* d = nullptr) {
  if (c.post_grid_std) {
    WXE_CHECK((int64_t)c.post_grid_std->size() == n, "variable '", c.var, "': its grid-wise scaler has ",
              c.post_grid_std->size(), " points, the grid ", n);
    const float *gm = c.post_grid_mean->data(), *gs = c.post_grid_std->data();
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * gs[i] + gm[i];
    if (d) std::copy(gs, gs + n, d);
  } else if (c.post_quant) {
    WXE_CHECK(!d, "variable '", c.var, "': the quantile scaler's inverse is not differentiated (loss.type base with a "
              "quantile scaler is not implemented)");
    c.post_quant->inverse_transform(p, n, c.post_quant_channel);
  } else {
    const float s = (float)c.post_std, m = (float)c.post_mean;
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * s + m;
    if (d) std::fill(d, d + n, s);
  }
  for (const PointTransform* t : c.post) t->apply(p, n, d);
}

void Era5Data::bind_physics() {
  for (const PhysicsBlockSpec& s : cfg_.physics) {
    const std::string where = cfg_.file + ": " + s.block + ".args.";
    Physics ph;
    // a key's first channel among chans and its channel count (3D: one per level), or fail
    auto find = [&](const std::vector<ChannelInfo>& chans, const std::pair<std::string, std::string>& arg,
                    const char* what, int64_t* count) {
      int64_t first = -1, n = 0;
      for (size_t k = 0; k < chans.size(); ++k)
        if (chans[k].computed < 0 && var_key(cfg_, chans[k]) == arg.second) {
          if (first < 0) first = (int64_t)k;
          ++n;
        }
      if (first < 0) fail(where, arg.first, ": '", arg.second, "' is not ", what, " of this config");
      *count = n;
      return first;
    };
    for (const auto& a : s.pred) {
      int64_t n = 0;
      ph.pred.push_back(find(out_, a, "a predicted (target) variable", &n));
      ph.pred_levels.push_back(n);
    }
    for (size_t i = 0; i < s.input.size(); ++i) {
      const auto& a = s.input[i];
      int64_t n = 0;
      const int64_t c = find(in_, a, "an input variable (the fixer reads the step's input x_physical)", &n);
      ph.input.push_back(c);
      // x_physical: the input de-normalised, which wxe does for a mean and std (per point) scaler only
      for (int64_t l = c; l < c + n; ++l) {
        const ChannelInfo& ch = in_[l];
        if (ch.quant)
          fail(where, a.first, ": input '", a.second, "' is normalised by a quantile scaler, whose inverse the "
               "physics blocks' x_physical does not implement");
        for (const PointTransform* t : ch.pre)
          if (t->kind == PointTransform::Log || t->kind == PointTransform::Sqrt)
            fail(where, a.first, ": input '", a.second, "' goes through ", t->block, ", whose inverse the physics "
                 "blocks' x_physical does not implement");
      }
      // the input's levels must be the prediction's (the same key)
      for (size_t j = 0; j < s.pred.size(); ++j)
        if (s.pred[j] == a && ph.pred_levels[j] != n)
          fail(where, a.first, ": '", a.second, "' has ", ph.pred_levels[j], " predicted levels and ", n, " input levels");
    }
    auto levels_of = [&](const char* arg) {
      for (size_t j = 0; j < s.pred.size(); ++j)
        if (s.pred[j].first == arg) return ph.pred_levels[j];
      return (int64_t)0;
    };
    if (s.kind == PhysicsBlockSpec::Wind) {
      for (const char* uv : {"u_var", "v_var"})
        if (s.mask_level >= levels_of(uv))
          fail(where, "mask_level: ", s.mask_level, " is not a level index of ", uv, " (", levels_of(uv), " levels)");
    } else if (s.kind != PhysicsBlockSpec::Tracer) {
      auto g = std::make_shared<SigmaGrid>(read_sigma_grid(s, cfg_.file));
      for (size_t j = 0; j < s.pred.size(); ++j) {
        const bool is3d = s.pred[j].second.find("/3d/") != std::string::npos;
        const int64_t want = is3d ? g->levels() : 1;
        if (ph.pred_levels[j] != want)
          fail(where, s.pred[j].first, ": '", s.pred[j].second, "' has ", ph.pred_levels[j], " levels; ",
               is3d ? str("the statics' ", s.a_name, " has ", g->a.size(), " values, so ", want, " levels with midpoint ",
                          s.midpoint ? "true" : "false")
                    : std::string("a 2D variable has 1"));
      }
      ph.grid = g;
    }
    phys_.push_back(std::move(ph));
  }
}

void Era5Data::apply_physics(size_t b, float* y, const float* x0) const {
  const PhysicsBlockSpec& s = cfg_.physics[b];
  const Physics& ph = phys_[b];
  const int64_t n = h_ * w_;
  auto P = [&](const char* arg) {
    for (size_t j = 0; j < s.pred.size(); ++j)
      if (s.pred[j].first == arg) return y + ph.pred[j] * n;
    fail(s.block, ": no argument ", arg);
  };
  auto X = [&](const char* arg) -> const float* {
    for (size_t j = 0; j < s.input.size(); ++j)
      if (s.input[j].first == arg) return x0 + ph.input[j] * n;
    fail(s.block, ": no input argument ", arg);
  };
  if (ph.grid && (ph.grid->h != h_ || ph.grid->w != w_))
    fail(cfg_.file, ": ", s.block, ".args.save_loc_physics: ", s.statics, ": the grid is ", ph.grid->h, "x", ph.grid->w,
         ", the data's ", h_, "x", w_);
  switch (s.kind) {
    case PhysicsBlockSpec::Tracer:
      for (size_t j = 0; j < s.pred.size(); ++j) tracer_fix(y + ph.pred[j] * n, ph.pred_levels[j] * n, s.lo[j], s.hi[j]);
      break;
    case PhysicsBlockSpec::Mass:
      mass_fix(*ph.grid, P("q_var"), P("sp_var"), X("q_var"), X("sp_var"));
      break;
    case PhysicsBlockSpec::Water:
      water_fix(*ph.grid, s.seconds, P("q_var"), P("sp_var"), P("precip_var"), P("evapor_var"), X("q_var"), X("sp_var"));
      break;
    case PhysicsBlockSpec::Energy: {
      EnergyFields f;
      f.T = P("T_var"), f.q = P("q_var"), f.u = P("U_var"), f.v = P("V_var"), f.sp = P("sp_var");
      f.T0 = X("T_var"), f.q0 = X("q_var"), f.u0 = X("U_var"), f.v0 = X("V_var"), f.sp0 = X("sp_var");
      f.solin0 = X("toa_down_solar_input_var");
      f.toa_up_solar = P("toa_up_solar_var"), f.olr = P("toa_up_olr_var"), f.sfc_down_solar = P("surf_down_solar_var");
      f.sfc_up_solar = P("surf_up_solar_var"), f.sfc_down_lw = P("surf_down_lw_var"), f.sfc_up_lw = P("surf_up_lw_var");
      f.sh = P("surf_sh_var"), f.lh = P("surf_lh_var");
      energy_fix(*ph.grid, s.seconds, f);
      break;
    }
    case PhysicsBlockSpec::Wind: {
      const WindMask m = wind_mask(s, P("u_var") + s.mask_level * n, P("v_var") + s.mask_level * n, h_, w_);
      std::set<int64_t> levels(s.target_levels.begin(), s.target_levels.end());
      for (size_t j = 0; j < s.pred.size(); ++j)
        if (s.pred[j].first == "target_vars")
          for (int64_t l : levels)
            if (l < ph.pred_levels[j]) wind_blend(m, s.preserve_amplitude, y + (ph.pred[j] + l) * n);
      break;
    }
  }
}

Tensor Era5Data::physical_to_input(const Tensor& phys) const {
  Tensor x = phys.clone();
  const int64_t C = (int64_t)out_.size(), n = h_ * w_;
  WXE_CHECK(x.dtype == DType::F32 && x.rank() >= 2 && x.dim(1) == C && x.numel() == x.dim(0) * C * n,
            "physical_to_input: ", shape_str(x.shape), " is not (batch, ", C, ", 1, ", h_, ", ", w_, ")");
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int64_t k = 0; k < C; ++k) {
      if (feedback_[k] < 0) continue;
      const ChannelInfo& in = in_[feedback_[k]];
      float* q = x.data<float>() + (b * C + k) * n;
      for (const PointTransform* t : in.pre) t->apply(q, n);
      normalise_channel(in, q, n, (float)in.mean, (float)in.std);
    }
  return x;
}

Tensor Era5Data::postprocess(const Tensor& y, const Tensor& x) const {
  WXE_ASSERT(h_);
  const int64_t C = (int64_t)out_.size(), Ci = (int64_t)in_.size(), n = h_ * w_;
  WXE_CHECK(y.dtype == DType::F32 && y.rank() >= 2 && y.dim(1) == C && y.numel() == y.dim(0) * C * n,
            "postprocess: y is ", shape_str(y.shape), ", expected (batch, ", C, ", 1, ", h_, ", ", w_, ")");
  Tensor p = y.clone();
  const int64_t B = y.dim(0);
  for (size_t b = 0; b < phys_.size(); ++b)
    if (cfg_.physics[b].normalised)
      for (int64_t i = 0; i < B; ++i) apply_physics(b, p.data<float>() + i * C * n, nullptr);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t k = 0; k < C; ++k) denormalise_channel(out_[k], p.data<float>() + (i * C + k) * n, n);
  bool fixers = false;
  for (const PhysicsBlockSpec& s : cfg_.physics) fixers |= !s.normalised;
  if (!fixers) return p;
  // x_physical: the input's last step, its channels the fixers read de-normalised
  WXE_CHECK(x.dim(0) == B && x.dim(1) == Ci, "postprocess: x is ", shape_str(x.shape), " for y ", shape_str(y.shape));
  Tensor x0 = last_step(x);
  std::vector<bool> done(in_.size());
  for (size_t b = 0; b < phys_.size(); ++b)
    for (size_t j = 0; j < phys_[b].input.size(); ++j) {
      const std::string key = cfg_.physics[b].input[j].second;
      for (int64_t c = phys_[b].input[j]; c < Ci && var_key(cfg_, in_[c]) == key; ++c) {
        if (done[c]) continue;
        done[c] = true;
        const ChannelInfo& ch = in_[c];
        for (int64_t i = 0; i < B; ++i) {
          float* q = x0.data<float>() + (i * Ci + c) * n;
          if (ch.grid_std) {
            WXE_CHECK((int64_t)ch.grid_std->size() == n, "variable '", ch.var, "': its grid-wise scaler has ",
                      ch.grid_std->size(), " points, the grid ", n);
            for (int64_t e = 0; e < n; ++e) q[e] = q[e] * (*ch.grid_std)[e] + (*ch.grid_mean)[e];
          } else {
            const float s = (float)ch.std, m = (float)ch.mean;
            for (int64_t e = 0; e < n; ++e) q[e] = q[e] * s + m;
          }
        }
      }
    }
  for (size_t b = 0; b < phys_.size(); ++b)
    if (!cfg_.physics[b].normalised)
      for (int64_t i = 0; i < B; ++i) apply_physics(b, p.data<float>() + i * C * n, x0.data<float>() + i * Ci * n);
  return p;
}

Tensor Era5Data::prediction_to_input(const Tensor& y) const {
  bool same = true;
  for (size_t k = 0; k < out_.size(); ++k) {
    if (feedback_[k] < 0) continue;
    const ChannelInfo &o = out_[k], &i = in_[feedback_[k]];
    same = same && o.post_mean == i.mean && o.post_std == i.std && o.post.empty() && i.pre.empty() && !o.post_quant &&
           !i.quant && !o.post_grid_std && !i.grid_std;
  }
  if (same) return y;
  // CREDIT's rollout: the prediction de-normalised by the postblock, then normalised by the
  // input-side preblock scaler, in float32
  Tensor x = y.clone();
  const int64_t hw = y.numel() / y.shape[0] / y.shape[1];
  float* p = x.data<float>();
  for (int64_t b = 0; b < y.shape[0]; ++b)
    for (size_t k = 0; k < out_.size(); ++k) {
      if (feedback_[k] < 0) continue;
      const ChannelInfo &o = out_[k], &in = in_[feedback_[k]];
      const float pm = (float)o.post_mean, ps = (float)o.post_std, m = (float)in.mean, s = (float)in.std;
      float* q = p + (b * y.shape[1] + (int64_t)k) * hw;
      if (o.post.empty() && in.pre.empty() && !o.post_quant && !in.quant && !o.post_grid_std && !in.grid_std) {
        for (int64_t i = 0; i < hw; ++i) q[i] = (q[i] * ps + pm - m) / s;
        continue;
      }
      denormalise_channel(o, q, hw);
      for (const PointTransform* t : in.pre) t->apply(q, hw);
      normalise_channel(in, q, hw, m, s);
    }
  return x;
}

DataFile& Era5Data::file_for(const ChannelInfo& c, int64_t t) const {
  const VarGroup& g = group(c.src, c.field_type);
  const std::string &type = c.field_type, &var = c.var, &source = cfg_.sources[c.src].name;
  const std::string& tpl = c.is3d && !g.path_3d.empty() ? g.path_3d : g.path;
  std::string p = strftime_utc(tpl, t);
  if (p.find('*') != std::string::npos || p.find('?') != std::string::npos) {
    const std::vector<std::string> hits = matching_files(p);
    if (hits.size() != 1)
      fail(cfg_.file, ": ", cfg_.source_key, ".", source, ".variables.", type, ".path '", tpl, "': ",
           hits.empty() ? "no file" : "several files", " match ", p, " (variable '", var, "' at ", format_datetime(t),
           ")");
    p = hits[0];
  } else if (!fs::exists(p)) {
    fail(cfg_.file, ": ", cfg_.source_key, ".", source, ".variables.", type, ".path '", tpl, "': no file ", p,
         " (variable '", var, "' at ", format_datetime(t), ")");
  }
  auto it = files_.find(p);
  if (it == files_.end()) it = files_.emplace(p, open_data_file(p)).first;
  return *it->second;
}

size_t Era5Data::time_index(DataFile& f, const std::string& var, int64_t t) const {
  auto it = times_.find(f.path());
  if (it == times_.end()) {
    if (!f.has("time")) fail(f.path(), ": variable '", var, "': the file has no time coordinate");
    auto [unit, base] = time_units(f.attr("time", "units"), f.path() + ": time");
    std::vector<int64_t> ts;
    for (double v : f.read("time")) {
      if (!std::isfinite(v) || std::fabs(v * unit) > 1e15)  // a fill value, or beyond any calendar
        fail(f.path(), ": time value ", v, " is missing or out of range");
      ts.push_back(base + (int64_t)std::llround(v * unit));
    }
    it = times_.emplace(f.path(), ts).first;
  }
  const std::vector<int64_t>& ts = it->second;
  auto p = std::find(ts.begin(), ts.end(), t);
  if (p == ts.end())
    fail(f.path(), ": variable '", var, "' has no time ", format_datetime(t), " (a gap in time, or the wrong file for it)");
  return (size_t)(p - ts.begin());
}

void Era5Data::read_var(const ChannelInfo& c, int64_t t, float* out) const {
  // the files and caches are the data's, shared by every sample source over it (training's read
  // ahead on its thread, validation's on the caller's): one read at a time
  std::lock_guard<std::recursive_mutex> lock(io_);
  const SourceConfig& sc = cfg_.sources[c.src];
  auto tz = tisr_.find(c.src);
  if (tz != tisr_.end()) {  // computed: CREDIT's TISRDataset at t
    const TisrGrid& g = tz->second.grid;
    learn_grid(g.ny, g.nx, g.lat, g.lon, cfg_.file + ": " + cfg_.source_key + "." + sc.name + " (tisr grid)");
    const std::vector<float> v = credit_tisr(t, g, tz->second.opt);
    std::copy(v.begin(), v.end(), out);
    return;
  }
  DataFile& f = file_for(c, t);
  if (!f.has(c.var)) fail(f.path(), ": no variable '", c.var, "' (", c.field_type, ")");
  const std::vector<std::string> d = f.dims(c.var);
  const std::vector<int64_t> s = f.shape(c.var);
  const bool stat = c.field_type == "static";
  const bool has_time = !d.empty() && d[0] == "time";
  const size_t want = (c.is3d ? 3 : 2) + (has_time ? 1 : 0);
  std::string order = c.is3d ? "(time, " + sc.level_coord + ", latitude, longitude)" : "(time, latitude, longitude)";
  if (stat) order += " or without time";
  const size_t o = has_time ? 1 : 0;
  // WeatherBench2's stores hold (..., longitude, latitude): read so and transposed, as CREDIT does
  const bool lonlat = d.size() >= 2 && is_lon(d[d.size() - 2]) && is_lat(d.back());
  if ((!has_time && !stat) || d.size() != want || (c.is3d && d[o] != sc.level_coord) ||
      !(lonlat || (is_lat(d[d.size() - 2]) && is_lon(d.back())))) {
    std::string got;
    for (auto& x : d) got += (got.empty() ? "" : ", ") + x;
    fail(f.path(), ": variable '", c.var, "' has dimensions (", got, "), expected ", order);
  }
  const size_t ilat = lonlat ? d.size() - 1 : d.size() - 2, ilon = lonlat ? d.size() - 2 : d.size() - 1;
  const int64_t h = s[ilat], w = s[ilon];
  if (!grid_checked_.count(f.path())) check_coordinates(f, c.var, d[ilat], d[ilon], h, w);
  if (h != h_ || w != w_)
    fail(f.path(), ": variable '", c.var, "' is ", h, "x", w, ", the grid is ", h_, "x", w_);
  if (!meta_.count(c.var)) meta_[c.var] = {f.attr(c.var, "units"), f.attr(c.var, "long_name")};
  size_t ti = 0;
  // a static variable with a time axis: its first time in files per year; in a store of every
  // time (weatherbench2_era5, arco_era5: sea ice as a "static") the sample's, as CREDIT selects
  if (has_time) ti = stat && sc.dataset_type == "local" ? 0 : time_index(f, c.var, t);
  std::vector<size_t> start, count;
  if (has_time) {
    start.push_back(ti);
    count.push_back(1);
  }
  size_t lev = 0;
  if (c.is3d) {
    if (!f.has(sc.level_coord)) fail(f.path(), ": variable '", c.var, "': no coordinate '", sc.level_coord, "'");
    std::vector<double> ls = f.read(sc.level_coord);
    const double want_l = sc.levels[c.level_index];
    auto it = std::find_if(ls.begin(), ls.end(), [&](double x) { return std::fabs(x - want_l) < 1e-6; });
    if (it == ls.end()) fail(f.path(), ": variable '", c.var, "' has no level ", want_l, " in '", sc.level_coord, "'");
    lev = (size_t)(it - ls.begin());
    if (level_units_.empty()) level_units_ = f.attr(sc.level_coord, "units");
    start.push_back(lev);
    count.push_back(1);
  }
  start.push_back(0);
  start.push_back(0);
  count.push_back((size_t)s[s.size() - 2]);
  count.push_back((size_t)s.back());
  std::vector<float> v = f.read_f32(c.var, start, count);
  if (!lonlat) {
    std::copy(v.begin(), v.end(), out);
    return;
  }
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = 0; j < w; ++j) out[i * w + j] = v[(size_t)(j * h + i)];
}

// Each file's coordinates against its data and against the grid: as long as the variable's
// rows and columns (a longer or shorter coordinate is another grid), latitudes in [-90, 90] and
// strictly monotonic, longitudes finite; and the same latitudes as the file the grid came from
// (in the same order: rows of files whose latitudes run the other way must not be combined).
void Era5Data::check_coordinates(const DataFile& f, const std::string& var, const std::string& lat_name,
                                 const std::string& lon_name, int64_t h, int64_t w) const {
  if (h_ && (!f.has(lat_name) || !f.has(lon_name))) {  // dimensions without coordinates: nothing to compare
    grid_checked_.insert(f.path());
    return;
  }
  std::vector<double> lat = f.read(lat_name), lon = f.read(lon_name);
  if (h < 1 || w < 1) fail(f.path(), ": variable '", var, "' is ", h, "x", w, ": an empty grid");
  if ((int64_t)lat.size() != h || (int64_t)lon.size() != w)
    fail(f.path(), ": coordinates '", lat_name, "' (", lat.size(), ") and '", lon_name, "' (", lon.size(),
         ") do not fit variable '", var, "' (", h, "x", w, ")");
  for (double v : lat)
    if (!(v >= -90 && v <= 90)) fail(f.path(), ": latitude ", v, " in '", lat_name, "' is not in [-90, 90]");
  for (double v : lon)
    if (!std::isfinite(v)) fail(f.path(), ": longitude ", v, " in '", lon_name, "' is missing");
  for (size_t i = 1; i < lat.size(); ++i)
    if (!((lat[i] - lat[i - 1]) * (lat.back() - lat.front()) > 0))
      fail(f.path(), ": latitudes in '", lat_name, "' are not strictly monotonic (rows ", i - 1, " and ", i, ": ",
           lat[i - 1], ", ", lat[i], ")");
  if (!h_) {
    learn_grid(h, w, lat, lon, f.path());
    grid_file_ = f.path();
  } else if ((int64_t)lat.size() == h_) {
    // against another data file: the same latitudes; against a tisr grid: the same direction
    const bool flipped = (lat.back() - lat.front()) * (lat_.back() - lat_.front()) < 0;
    for (size_t i = 0; i < lat.size(); ++i)
      if (grid_file_.empty() ? flipped : std::fabs(lat[i] - lat_[i]) > 1e-3)
        fail(f.path(), ": latitudes run ", lat.front(), " to ", lat.back(), ", those of ",
             grid_file_.empty() ? cfg_.file + "'s tisr grid" : grid_file_, " ", lat_.front(), " to ", lat_.back(),
             " (row ", i, ": ", lat[i], " vs ", lat_[i], "): flip or regrid one file so both hold the same latitudes in the same order");
  }
  grid_checked_.insert(f.path());
}

void Era5Data::check_finite(const ChannelInfo& c, const std::vector<const PointTransform*>& ts, int64_t t,
                            const float* p) const {
  const size_t n = (size_t)(h_ * w_);
  const size_t bad = (size_t)std::count_if(p, p + n, [](float x) { return !std::isfinite(x); });
  if (!bad) return;
  // NaN (a zarr fill_value, a gap) or inf would make the loss or the forecast NaN
  const std::string where = str("variable '", c.var, "'", c.is3d ? str(" level ", cfg_.sources[c.src].levels[c.level_index]) : "",
                                " at ", format_datetime(t));
  if (ts.empty()) {
    std::lock_guard<std::recursive_mutex> lock(io_);
    fail(file_for(c, t).path(), ": ", where, ": ", bad, " of ", n, " values are missing (NaN, inf or the fill value)");
  }
  fail(cfg_.file, ": ", where, ": ", bad, " of ", n, " values are NaN or inf after ", ts.back()->block,
       " (missing values, or a log or sqrt of a negative value: a fill_values block before it replaces them)");
}

void Era5Data::read_channels(const std::vector<ChannelInfo>& chans, int64_t t, float* out, const char* only) const {
  for (size_t k = 0; k < chans.size(); ++k) {
    const ChannelInfo& c = chans[k];
    if (only && c.field_type != only) continue;
    WXE_ASSERT(h_);  // input() learns the grid first
    read_var(c, t, out + k * h_ * w_);
    const float m = (float)c.mean, s = (float)c.std;
    float* p = out + k * h_ * w_;
    for (const PointTransform* tr : c.pre) tr->apply(p, h_ * w_);
    check_finite(c, c.pre, t, p);
    normalise_channel(c, p, h_ * w_, m, s);
  }
}

Tensor Era5Data::input_window(int64_t t) const {
  const int64_t n = cfg_.history_len;
  if (n == 1) return input(t);
  std::vector<Tensor> steps;
  for (int64_t k = n - 1; k >= 0; --k) steps.push_back(input(t - k * cfg_.timestep));
  Tensor x(DType::F32, {1, (int64_t)in_.size(), n, h_, w_});
  const int64_t hw = h_ * w_;
  for (int64_t c = 0; c < (int64_t)in_.size(); ++c)
    for (int64_t k = 0; k < n; ++k)
      std::copy_n(steps[k].data<float>() + c * hw, hw, x.data<float>() + (c * n + k) * hw);
  return x;
}

Tensor Era5Data::input(int64_t t) const {
  if (!h_ && tisr_.count(in_[0].src)) {  // a computed first channel: its grid
    const TisrGrid& g = tisr_.at(in_[0].src).grid;
    learn_grid(g.ny, g.nx, g.lat, g.lon, cfg_.file + ": " + cfg_.source_key + "." + cfg_.sources[in_[0].src].name + " (tisr grid)");
  }
  if (!h_) {  // read one channel to learn the grid
    std::vector<float> tmp(1);
    const ChannelInfo& c = in_[0];
    DataFile& f = file_for(c, t);
    if (!f.has(c.var)) fail(f.path(), ": no variable '", c.var, "' (", c.field_type, ")");
    const std::vector<int64_t> s = f.shape(c.var);
    tmp.resize((size_t)(s.size() >= 2 ? s[s.size() - 2] * s.back() : 1));
    read_var(c, t, tmp.data());
  }
  Tensor x = Tensor::zeros(DType::F32, {1, (int64_t)in_.size(), 1, h_, w_});
  read_channels(in_, t, x.data<float>());
  return x;
}

Tensor Era5Data::target(int64_t t) const {
  if (!h_) input(t);
  Tensor y = Tensor::zeros(DType::F32, {1, (int64_t)out_.size(), 1, h_, w_});
  read_channels(out_, t, y.data<float>());
  return y;
}

Tensor Era5Data::target_raw(int64_t t) const {
  if (!h_) input(t);
  Tensor y = Tensor::zeros(DType::F32, {1, (int64_t)out_.size(), 1, h_, w_});
  for (size_t k = 0; k < out_.size(); ++k) read_var(out_[k], t, y.data<float>() + k * h_ * w_);
  return y;
}

void Era5Data::set_forcing(Tensor& x, int64_t t) const {
  WXE_ASSERT(h_ && x.numel() == (int64_t)in_.size() * h_ * w_);
  read_channels(in_, t, x.data<float>(), "dynamic_forcing");
}

void Era5Data::denormalise_target(Tensor& y, Tensor* dy) const {
  WXE_ASSERT(h_ && y.numel() == (int64_t)out_.size() * h_ * w_);
  float* p = y.data<float>();
  if (dy && !(dy->defined() && dy->shape == y.shape && dy->dtype == DType::F32)) *dy = Tensor(DType::F32, y.shape);
  for (size_t k = 0; k < out_.size(); ++k)
    denormalise_channel(out_[k], p + k * h_ * w_, h_ * w_, dy ? dy->data<float>() + k * h_ * w_ : nullptr);
}

void Era5Data::read_metadata(int64_t t) const {
  for (const ChannelInfo& c : out_) {
    if (meta_.count(c.var)) continue;
    try {
      DataFile& f = file_for(c, t);
      if (f.has(c.var)) meta_[c.var] = {f.attr(c.var, "units"), f.attr(c.var, "long_name")};
    } catch (const Error&) {
    }
  }
}

std::string Era5Data::units(const std::string& var) const {
  auto it = meta_.find(var);
  return it == meta_.end() ? "" : it->second.first;
}
std::string Era5Data::long_name(const std::string& var) const {
  auto it = meta_.find(var);
  return it == meta_.end() ? "" : it->second.second;
}

std::string Era5Data::channel_schema_yaml() const {
  auto layout = [&](const std::vector<ChannelInfo>& chans) {
    std::string s;
    for (size_t k = 0; k < chans.size(); ++k) {
      const ChannelInfo& c = chans[k];
      if (c.is3d && c.level_index) continue;  // one entry per variable
      s += "- var_key: " + var_key(cfg_, c) + "\n";
      s += "  n_levels: " + std::to_string(c.is3d ? cfg_.sources[c.src].levels.size() : 1) + "\n  n_time: 1\n";
    }
    return s;
  };
  return "schema_version: 1\ninput:\n" + layout(in_) + "target:\n" + layout(out_);
}

namespace {

class Era5Samples : public SampleSource {
 public:
  // each block's samples: windows from its start (the first ends history_len - 1 steps in) to
  // the last whose L target steps end by its end, the blocks' samples one after the other
  Era5Samples(std::shared_ptr<const Era5Data> d, const std::vector<std::pair<int64_t, int64_t>>& blocks, int L)
      : d_(d), L_(L) {
    const int64_t dt = d_->config().timestep, margin = (d_->config().history_len - 1) * dt;
    for (const auto& [t0, t1] : blocks) {
      const int64_t first = t0 + margin, times = t1 >= first ? (t1 - first) / dt + 1 : 0;
      if (blocks.size() > 1 && times <= L)  // CREDIT's build_time_index_multi refuses a block without samples
        fail(d_->config().file, ": date_ranges block ", format_datetime(t0), " .. ", format_datetime(t1),
             " is too short for history_len ", d_->config().history_len, " and ", L, " forecast steps of ", dt / 3600.0,
             " h (it needs at least ", (margin + L * dt) / 3600.0, " h)");
      const int64_t n = std::max<int64_t>(0, times - L);
      if (n) firsts_.push_back({n_, first});
      n_ += n;
    }
  }
  int64_t size() const override { return n_; }
  Sample get(int64_t i) const override {
    WXE_ASSERT(i >= 0 && i < n_);
    auto b = std::upper_bound(firsts_.begin(), firsts_.end(), std::make_pair(i, INT64_MAX)) - 1;
    const int64_t dt = d_->config().timestep, t = b->second + (i - b->first) * dt;
    Sample s;
    s.input = d_->input_window(t);
    s.forcing.push_back(s.input);
    for (int k = 0; k < L_; ++k) {
      s.targets.push_back(d_->target(t + (k + 1) * dt));
      if (k + 1 < L_) s.forcing.push_back(d_->input(t + (k + 1) * dt));
    }
    return s;
  }
  std::string describe() const override {
    return str(d_->config().file, ": ", n_, " samples from ", firsts_.empty() ? std::string("-") : format_datetime(firsts_[0].second),
               firsts_.size() > 1 ? str(" in ", firsts_.size(), " date ranges") : std::string(), " every ",
               d_->config().timestep / 3600.0, " h, ", d_->input_channels().size(), " input and ",
               d_->target_channels().size(), " target channels");
  }

 private:
  std::shared_ptr<const Era5Data> d_;
  std::vector<std::pair<int64_t, int64_t>> firsts_;  // per block with samples: its first index, its first window's time
  int64_t n_ = 0;
  int L_;
};

void nc_check(int rc, const std::string& path) {
  if (rc == NC_NOERR) return;
  // libnetcdf says "HDF error" for a full disk: the write's errno says what happened
  const int e = errno;
  const bool disk = e == ENOSPC || e == EDQUOT || e == EFBIG || e == EIO;
  fail(path, ": cannot write netCDF: ", nc_strerror(rc), disk ? str(" (", std::strerror(e), ")") : std::string());
}

void put_text(int id, int var, const char* name, const std::string& v, const std::string& path) {
  if (!v.empty()) nc_check(nc_put_att_text(id, var, name, v.size(), v.c_str()), path);
}

}  // namespace

std::unique_ptr<SampleSource> open_era5_samples(std::shared_ptr<const Era5Data> data, int64_t t0, int64_t t1,
                                                int forecast_len) {
  return std::make_unique<Era5Samples>(data, std::vector<std::pair<int64_t, int64_t>>{{t0, t1}}, forecast_len);
}

std::unique_ptr<SampleSource> open_era5_samples(std::shared_ptr<const Era5Data> data,
                                                const std::vector<std::pair<int64_t, int64_t>>& blocks, int forecast_len) {
  return std::make_unique<Era5Samples>(data, blocks, forecast_len);
}

ForecastWriter::ForecastWriter(const std::string& path, const Era5Data& data, int64_t init, int steps)
    : path_(path), file_(std::make_unique<TempFile>(path, ".nc")), tmp_(file_->name()), data_(data), init_(init) {
  WXE_ASSERT(!data.lat().empty());
  // HDF5 keeps a file whose header write fails open and crashes on it at exit: first the file's
  // size (its float32 values and 1 MiB for the rest) against the disk's free space and the
  // process's file size limit (a later failure is still named by nc_check)
  const double need = (double)steps * (double)(data.target_channels().size() + data.computed_channels().size()) *
                          (double)data.lat().size() * (double)data.lon().size() * 4.0 + 1048576.0;
  const fs::path dir = fs::path(tmp_).parent_path();
  std::error_code ec;
  const fs::space_info sp = fs::space(dir.empty() ? fs::path(".") : dir, ec);
  if (!ec && (double)sp.available < need)
    fail(tmp_, ": cannot write netCDF: the forecast needs about ", (int64_t)(need / 1048576) + 1, " MiB and ",
         dir.empty() ? "." : dir.string(), " has ", (int64_t)(sp.available / 1048576), " MiB free (No space left on device)");
  struct rlimit lim;
  if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && (double)lim.rlim_cur < need)
    fail(tmp_, ": cannot write netCDF: the forecast needs about ", (int64_t)(need / 1048576) + 1, " MiB and the file size "
         "limit (ulimit -f) is ", (int64_t)lim.rlim_cur, " bytes (File too large)");
  nc_check(nc_create(tmp_.c_str(), NC_NETCDF4 | NC_CLOBBER, &id_), tmp_);
  // an error below leaves no open file behind (no destructor runs for a constructor that throws)
  struct CloseOnError {
    int& id;
    bool done = false;
    ~CloseOnError() {
      if (!done && id >= 0) nc_abort(id);
    }
  } guard{id_};
  const CreditConfig& c = data.config();
  int dt, dl = -1, dy, dx;
  nc_check(nc_def_dim(id_, "time", (size_t)steps, &dt), tmp_);
  // the forecast's variables: the targets, then what the postblocks compute
  chans_ = data.target_channels();
  chans_.insert(chans_.end(), data.computed_channels().begin(), data.computed_channels().end());
  // one level axis: the levels of the 3D variables' sources, their union where sources differ
  // (CREDIT's output aligns them so: ascending, a variable's missing levels NaN)
  const SourceConfig* lev = nullptr;
  std::vector<double> levels;
  bool mixed = false;
  for (auto& ch : chans_)
    if (ch.is3d) {
      const SourceConfig& sc = c.sources[ch.src];
      if (lev && sc.levels != lev->levels) mixed = true;
      if (!lev) lev = &sc;
      levels.insert(levels.end(), sc.levels.begin(), sc.levels.end());
    }
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  if (!mixed && lev) levels = lev->levels;  // one source's levels, in its order
  for (auto& ch : chans_) {
    int at = 0;
    if (ch.is3d) {
      const double l = c.sources[ch.src].levels[ch.level_index];
      at = (int)(std::find(levels.begin(), levels.end(), l) - levels.begin());
    }
    level_at_.push_back(at);
  }
  const bool any3d = lev != nullptr;
  if (any3d) nc_check(nc_def_dim(id_, "level", levels.size(), &dl), tmp_);
  nc_check(nc_def_dim(id_, "latitude", data.lat().size(), &dy), tmp_);
  nc_check(nc_def_dim(id_, "longitude", data.lon().size(), &dx), tmp_);
  int vt, vl = -1, vy, vx;
  nc_check(nc_def_var(id_, "time", NC_DOUBLE, 1, &dt, &vt), tmp_);
  put_text(id_, vt, "units", "hours since " + format_datetime(init).replace(10, 1, " "), tmp_);
  put_text(id_, vt, "calendar", "standard", tmp_);
  put_text(id_, vt, "standard_name", "time", tmp_);
  if (any3d) {
    nc_check(nc_def_var(id_, "level", NC_DOUBLE, 1, &dl, &vl), tmp_);
    put_text(id_, vl, "units", data.level_units(), tmp_);
    put_text(id_, vl, "long_name", lev->level_coord, tmp_);
  }
  nc_check(nc_def_var(id_, "latitude", NC_DOUBLE, 1, &dy, &vy), tmp_);
  put_text(id_, vy, "units", "degrees_north", tmp_);
  put_text(id_, vy, "standard_name", "latitude", tmp_);
  nc_check(nc_def_var(id_, "longitude", NC_DOUBLE, 1, &dx, &vx), tmp_);
  put_text(id_, vx, "units", "degrees_east", tmp_);
  put_text(id_, vx, "standard_name", "longitude", tmp_);
  for (auto& ch : chans_) {
    if (var_ids_.count(nc_name(ch))) continue;
    int dims3[4] = {dt, dl, dy, dx}, dims2[3] = {dt, dy, dx};
    int v;
    nc_check(nc_def_var(id_, nc_name(ch).c_str(), NC_FLOAT, ch.is3d ? 4 : 3, ch.is3d ? dims3 : dims2, &v), tmp_);
    if (ch.computed >= 0) {
      put_text(id_, v, "units", "m**2 s**-2", tmp_);
      put_text(id_, v, "long_name", "Geopotential (" + c.computed[ch.computed].block + ")", tmp_);
    } else {
      put_text(id_, v, "units", data.units(ch.var), tmp_);
      put_text(id_, v, "long_name", data.long_name(ch.var), tmp_);
    }
    if (ch.is3d && c.sources[ch.src].levels.size() != levels.size()) {  // the levels it lacks: NaN
      const float nan = std::numeric_limits<float>::quiet_NaN();
      nc_check(nc_def_var_fill(id_, v, 0, &nan), tmp_);
    }
    var_ids_[nc_name(ch)] = v;
  }
  for (auto& ch : chans_) chan_ids_.push_back(var_ids_.at(nc_name(ch)));
  put_text(id_, NC_GLOBAL, "Conventions", "CF-1.8", tmp_);
  put_text(id_, NC_GLOBAL, "source", "wxe forecast", tmp_);
  put_text(id_, NC_GLOBAL, "init_time", format_datetime(init), tmp_);
  put_text(id_, NC_GLOBAL, "config", c.file, tmp_);
  nc_check(nc_enddef(id_), tmp_);
  std::vector<double> hours;
  for (int k = 0; k < steps; ++k) hours.push_back((k + 1) * c.timestep / 3600.0);
  nc_check(nc_put_var_double(id_, vt, hours.data()), tmp_);
  if (any3d) nc_check(nc_put_var_double(id_, vl, levels.data()), tmp_);
  nc_check(nc_put_var_double(id_, vy, data.lat().data()), tmp_);
  nc_check(nc_put_var_double(id_, vx, data.lon().data()), tmp_);
  guard.done = true;
}

std::string ForecastWriter::nc_name(const ChannelInfo& c) const {
  // a name several sources predict is SOURCE_NAME in the file (a computed one keeps its name)
  if (c.computed >= 0) return c.var;
  for (const ChannelInfo& o : data_.target_channels())
    if (o.var == c.var && o.src != c.src) return data_.config().sources[c.src].name + "_" + c.var;
  return c.var;
}

void ForecastWriter::write(int k, const Tensor& y) {
  const size_t h = data_.lat().size(), w = data_.lon().size();
  const auto& chans = chans_;
  Tensor all = y;
  if (chans.size() > data_.target_channels().size()) {  // the targets, then what the postblocks compute
    const Tensor extra = data_.compute_diagnostics(y, init_);
    Shape s = y.shape;
    s[1] = (int64_t)chans.size();
    all = Tensor(DType::F32, s);
    std::copy(y.data<float>(), y.data<float>() + y.numel(), all.data<float>());
    std::copy(extra.data<float>(), extra.data<float>() + extra.numel(), all.data<float>() + y.numel());
  }
  const float* p = all.data<float>();
  for (size_t c = 0; c < chans.size(); ++c) {
    const int v = chan_ids_[c];
    if (chans[c].is3d) {
      size_t start[4] = {(size_t)k, (size_t)level_at_[c], 0, 0}, count[4] = {1, 1, h, w};
      nc_check(nc_put_vara_float(id_, v, start, count, p + c * h * w), tmp_);
    } else {
      size_t start[3] = {(size_t)k, 0, 0}, count[3] = {1, h, w};
      nc_check(nc_put_vara_float(id_, v, start, count, p + c * h * w), tmp_);
    }
  }
}

void ForecastWriter::close() {
  if (id_ < 0) return;
  const int rc = nc_close(id_);  // closed even when it fails: never closed twice
  id_ = -1;
  nc_check(rc, tmp_);
  file_->commit();  // fsync, the replaced file's mode, rename over path_
}

ForecastWriter::~ForecastWriter() {
  if (id_ >= 0) nc_abort(id_);  // not closed: an error; file_ removes the partial file
}

}  // namespace wxe
