#include "data/credit_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <set>

#include "engine/ir/error.h"
#include "data/credit_gen1.h"
#include "engine/io/json.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {
constexpr int64_t kMaxTimestep = 366 * 86400;
// CREDIT's elementwise registry losses wxe computes (train/loss.h LossKind)
// CREDIT 2026's physics postblocks (data/physics_blocks.h)
const std::set<std::string> kPhysicsBlocks = {"tracer_fixer", "global_mass_fixer", "global_water_fixer",
                                              "global_energy_fixer", "global_energy_fixer_updown",
                                              "wind_artifact_filter"};
const std::set<std::string> kElementwiseLosses = {"mse", "mae", "msle", "huber", "logcosh", "xtanh", "xsigmoid"};
const std::set<std::string> kCrpsLosses = {"KCRPS", "almost-fair-crps", "ring-crps"};
const std::set<std::string> kTensorLosses = {"spectral", "power", "covmse"};
}

int64_t parse_datetime(const std::string& s, const std::string& what) {
  int Y = 0, M = 0, D = 0, h = 0, m = 0, sec = 0;
  char sep = 0;
  int used = 0;
  const int n = std::sscanf(s.c_str(), "%4d-%2d-%2d%n%c%2d%n:%2d%n:%2d%n", &Y, &M, &D, &used, &sep, &h, &used, &m, &used,
                            &sec, &used);
  // the whole string (no trailing characters), digits only where numbers go
  bool digits = s.size() >= 10;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != 4 && i != 7 && i != 10 && i != 13 && i != 16 && !std::isdigit((unsigned char)s[i])) digits = false;
  const bool ok = digits && (size_t)used == s.size() && Y >= 1 &&
                  ((n == 3 && s.size() == 10) || (n >= 5 && (sep == 'T' || sep == ' ') && s.size() >= 13));
  if (!ok || M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 59)
    fail(what, ": '", s, "' is not a date-time (YYYY-MM-DD[THH[:MM[:SS]]])");
  std::tm tm{};
  tm.tm_year = Y - 1900;
  tm.tm_mon = M - 1;
  tm.tm_mday = D;
  tm.tm_hour = h;
  tm.tm_min = m;
  tm.tm_sec = sec;
  return (int64_t)timegm(&tm);
}

CreditConfig validation_config(const CreditConfig& c) {
  CreditConfig v = c;
  if (!c.valid_sources.empty()) {
    v.sources = c.valid_sources;
    v.source_key = "validation_data.source";
  }
  return v;
}

std::string format_datetime(int64_t t) {
  time_t tt = (time_t)t;
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &tm);
  return b;
}

int64_t parse_timestep(const std::string& s, const std::string& what) {
  size_t i = 0;
  while (i < s.size() && std::isdigit((unsigned char)s[i])) ++i;
  std::string unit = s.substr(i);
  for (char& c : unit) c = (char)std::tolower((unsigned char)c);
  int64_t mult = 0;
  if (unit == "h" || unit == "hour" || unit == "hours") mult = 3600;
  else if (unit == "d" || unit == "day" || unit == "days") mult = 86400;
  else if (unit == "min" || unit == "t") mult = 60;
  else if (unit == "s") mult = 1;
  if (!i || !mult) fail(what, ": '", printable(s), "' is not a timestep (such as 6h, 1d, 30min)");
  const int64_t n = parse_int64(s.substr(0, i), str(what, ": '", printable(s), "'"));
  // at most a year: times are seconds since 1970 plus steps of it, far from int64's end
  if (n < 1 || n > kMaxTimestep / mult) fail(what, ": '", printable(s), "' is not between 1 s and 366 days");
  return n * mult;
}

namespace {

struct Reader {
  std::string file;
  CreditConfig* c;
  bool training = true;  // false: the keys only training reads are not read (forecast)
  bool pre_scaler_ = false, post_scaler_ = false;

  std::string where(const std::string& key) const { return file + ": " + key; }

  // A section that is given must be a mapping (`preblocks: "x"` is an error, not "no scaler").
  bool is_map(const YAML::Node& n, const std::string& key) {
    if (!n || n.IsNull()) return false;
    if (!n.IsMap()) fail(where(key), ": expected a mapping of keys, found '", printable(YAML::Dump(n)), "'");
    return true;
  }
  // Unknown keys of a mapping are warnings naming them.
  void known(const YAML::Node& n, const std::string& prefix, const std::set<std::string>& keys) {
    if (!n || !n.IsMap()) return;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string k = it->first.as<std::string>();
      if (!keys.count(k)) c->warnings.push_back(where(prefix + k) + ": unknown key, ignored");
    }
  }
  template <class T>
  T get(const YAML::Node& n, const std::string& key, const T& dflt) {
    if (!n || n.IsNull()) return dflt;
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      fail(where(key), ": bad value '", printable(YAML::Dump(n)), "'");
    }
  }
  // A number in [lo, hi] (finite), else an error naming the key and the value.
  template <class T>
  T ranged(const YAML::Node& n, const std::string& key, const T& dflt, T lo, T hi) {
    const T v = get<T>(n, key, dflt);
    if (!(v >= lo && v <= hi)) fail(where(key), ": ", v, " is not in [", lo, ", ", hi, "]");
    return v;
  }
  std::vector<std::string> strings(const YAML::Node& n, const std::string& key) {
    if (!n || n.IsNull()) return {};
    if (!n.IsSequence()) fail(where(key), ": expected a list");
    return get<std::vector<std::string>>(n, key, {});
  }
  std::string path(const YAML::Node& n, const std::string& key) {
    std::string p = get<std::string>(n, key, "");
    if (p.empty()) return p;
    if (p.find('\0') != std::string::npos) fail(where(key), ": the path holds a NUL byte");
    return fs::path(p).is_absolute() ? p : (fs::path(c->dir) / p).lexically_normal().string();
  }

  void group(const YAML::Node& n, const std::string& key, VarGroup& g, bool files = true) {
    if (!is_map(n, key)) return;
    known(n, key + ".", {"vars_3D", "vars_2D", "path", "filename_time_format"});
    g.vars_3D = strings(n["vars_3D"], key + ".vars_3D");
    g.vars_2D = strings(n["vars_2D"], key + ".vars_2D");
    g.path = path(n["path"], key + ".path");
    const std::string tf = get<std::string>(n["filename_time_format"], key + ".filename_time_format", "");
    // CREDIT's form: the '*' of the path starts with the time in this format; a path that already
    // holds strftime codes (as `credit convert` writes it: era5_%Y_*) has the time in place, and
    // a single file (no '*') serves every time (CREDIT ignores the format then)
    if (!tf.empty() && g.path.find('%') == std::string::npos && g.path.find('*') != std::string::npos) {
      const size_t star = g.path.find('*');
      // era5_* -> era5_*%Y*: era5_2020.nc, and as CREDIT finds the time anywhere in the name, ERA5_6h_2020.nc
      g.path.replace(star, 1, "*" + tf + "*");
    }
    if (files && !g.empty() && g.path.empty()) fail(where(key + ".path"), ": missing");
  }

  // data.source (validation_data.source: at): each source's dataset type, variables, levels and
  // paths, in the config's order; history: the first source's own history_len, if any.
  void sources(const YAML::Node& src, const std::string& at, std::vector<SourceConfig>& out, int& history) {
    if (!src || !src.IsMap() || src.size() == 0) fail(where(at), ": missing");
    for (auto it = src.begin(); it != src.end(); ++it) {
      SourceConfig sc;
      std::string store;        // a store holding every field type (weatherbench2_era5, arco_era5)
      std::string model_store;  // arco_era5 hybrid: the store of the 3D variables
      sc.name = it->first.as<std::string>();
      const std::string p = at + "." + sc.name;
      const YAML::Node s = it->second;
      is_map(s, p);
      sc.dataset_type = get<std::string>(s["dataset_type"], p + ".dataset_type", "local");
      if (sc.dataset_type == "tisr") {
        known(s, p + ".", {"dataset_type", "variables", "num_integration_steps", "lat_spec", "lon_spec",
                           "latlon_grid_path", "timestep", "history_len", "device", "start_datetime", "end_datetime",
                           "forecast_len", "temporal_mode", "calendar"});
        const std::string mode = get<std::string>(s["temporal_mode"], p + ".temporal_mode", "exact");
        if (mode != "exact")
          fail(where(p + ".temporal_mode"), ": '", mode, "' is not implemented (exact: the radiation at each sample's time)");
        const bool spec = s["lat_spec"] || s["lon_spec"], file = (bool)s["latlon_grid_path"];
        if (spec == file || (spec && !(s["lat_spec"] && s["lon_spec"])))
          fail(where(p), ": a tisr source needs its grid: lat_spec and lon_spec ([start, end, num_points]) or "
               "latlon_grid_path (exactly one of them)");
        for (const char* k : {"lat_spec", "lon_spec"})
          if (s[k]) {
            const std::vector<double> v = get<std::vector<double>>(s[k], p + "." + k, {});
            if (v.size() != 3 || !std::isfinite(v[0]) || !std::isfinite(v[1]) || !(v[2] >= 1 && v[2] <= 1e7) ||
                v[2] != std::floor(v[2]))
              fail(where(p + "." + k), ": expected [start, end, num_points] with num_points a whole number >= 1");
          }
        if (s["num_integration_steps"]) ranged<int>(s["num_integration_steps"], p + ".num_integration_steps", 360, 1, 1 << 20);
        if (s["timestep"]) parse_timestep(get<std::string>(s["timestep"], p + ".timestep", ""), where(p + ".timestep"));
        for (auto jt = s.begin(); jt != s.end(); ++jt) {
          const std::string k = jt->first.as<std::string>();
          if (k == "variables" || k == "dataset_type" || k == "device" || k == "temporal_mode") continue;
          if (k == "latlon_grid_path") {
            sc.args[k] = path(jt->second, p + "." + k);
          } else if (k == "lat_spec" || k == "lon_spec") {  // the numbers, whichever YAML style wrote them
            std::string v;
            for (double x : get<std::vector<double>>(jt->second, p + "." + k, {})) v += str(std::setprecision(17), x, " ");
            sc.args[k] = v;
          } else {
            sc.args[k] = YAML::Dump(jt->second);
          }
        }
      } else if (sc.dataset_type == "local") {
        known(s, p + ".", {"dataset_type", "level_coord", "levels", "variables", "history_len", "grid_type"});
      } else if (sc.dataset_type == "weatherbench2_era5") {
        // CREDIT reads gs://weatherbench2/datasets/era5/<the resolution's store>; wxe a local copy
        // of it (`path`, wxe's key): one zarr store for every field type and time
        known(s, p + ".", {"dataset_type", "level_coord", "levels", "variables", "history_len", "resolution", "path"});
        const std::string res = get<std::string>(s["resolution"], p + ".resolution", "1440x721");
        static const std::map<std::string, std::string> stores = {
            {"1440x721", "1959-2023_01_10-wb13-6h-1440x721_with_derived_variables.zarr"},
            {"240x121", "1959-2023_01_10-6h-240x121_equiangular_with_poles_conservative.zarr"},
            {"64x32", "1959-2023_01_10-6h-64x32_equiangular_conservative.zarr"},
            {"full", "1959-2023_01_10-full_37-1h-0p25deg-chunk-1.zarr"}};
        if (!stores.count(res)) fail(where(p + ".resolution"), ": '", res, "' is not one of 1440x721, 240x121, 64x32, full");
        store = path(s["path"], p + ".path");
        if (store.empty())
          fail(where(p + ".path"), ": missing: wxe reads no network; copy gs://weatherbench2/datasets/era5/", stores.at(res),
               " (e.g. with gsutil -m cp -r) and give its folder here");
        if (!s["levels"]) {  // the store's levels, CREDIT's default
          sc.levels = res == "full" ? std::vector<double>{1,   2,   3,   5,   7,   10,  20,  30,  50,  70,  100, 125, 150,
                                                          175, 200, 225, 250, 300, 350, 400, 450, 500, 550, 600, 650, 700,
                                                          750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000}
                                    : std::vector<double>{50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000};
        }
      } else if (sc.dataset_type == "arco_era5") {
        // CREDIT reads Google's ARCO-ERA5 stores: gs://gcp-public-data-arco-era5/ar/
        // full_37-1h-0p25deg-chunk-1.zarr-v3 (pressure levels, every 2D variable) and, for
        // level_coord hybrid, model-level-1h-0p25deg.zarr-v1 (3D variables on model levels);
        // wxe local copies of them (`path`, `model_level_path`: wxe's keys)
        known(s, p + ".", {"dataset_type", "level_coord", "levels", "variables", "history_len", "path",
                           "model_level_path"});
        const std::string lc = get<std::string>(s["level_coord"], p + ".level_coord", "level");
        if (lc != "level" && lc != "hybrid")
          fail(where(p + ".level_coord"), ": '", lc, "': arco_era5 has 'level' (pressure levels) or 'hybrid' (model levels)");
        const char* remote = "gs://gcp-public-data-arco-era5/ar/";
        store = path(s["path"], p + ".path");
        if (store.empty())
          fail(where(p + ".path"), ": missing: wxe reads no network; copy the variables and times you need of ", remote,
               "full_37-1h-0p25deg-chunk-1.zarr-v3 into a local zarr store (e.g. xarray's to_zarr) and give its folder here");
        if (lc == "hybrid") {
          model_store = path(s["model_level_path"], p + ".model_level_path");
          if (model_store.empty())
            fail(where(p + ".model_level_path"), ": missing: level_coord hybrid reads the 3D variables from ", remote,
                 "model-level-1h-0p25deg.zarr-v1; copy what you need of it into a local zarr store and give its folder here");
        } else if (s["model_level_path"]) {
          fail(where(p + ".model_level_path"), ": only read with level_coord: hybrid (this source has 'level')");
        }
        if (!s["levels"]) {  // CREDIT's default: every level of the store
          if (lc == "hybrid") {
            for (int l = 1; l <= 137; ++l) sc.levels.push_back(l);
          } else {
            sc.levels = {1, 2, 3, 5, 7, 10, 20, 30, 50, 70};
            for (int l = 100; l <= 1000; l += 25) sc.levels.push_back(l);
          }
        }
      } else {
        fail(where(p + ".dataset_type"), ": '", sc.dataset_type, "' is not implemented (local netCDF/zarr files, "
             "weatherbench2_era5 and arco_era5 from local copies, tisr; for ", sc.dataset_type,
             " data, write files per year and use 'local')");
      }
      sc.level_coord = get<std::string>(s["level_coord"], p + ".level_coord", "level");
      if (s["levels"]) sc.levels = get<std::vector<double>>(s["levels"], p + ".levels", {});
      for (double l : sc.levels)
        if (!std::isfinite(l)) fail(where(p + ".levels"), ": ", l, " is not a level");
      const YAML::Node v = s["variables"];
      if (!is_map(v, p + ".variables")) fail(where(p + ".variables"), ": missing (the source's variables by field type)");
      known(v, p + ".variables.", {"prognostic", "diagnostic", "dynamic_forcing", "static"});
      const bool files = sc.dataset_type == "local";  // the others know their store
      group(v["prognostic"], p + ".variables.prognostic", sc.prognostic, files);
      group(v["diagnostic"], p + ".variables.diagnostic", sc.diagnostic, files);
      group(v["dynamic_forcing"], p + ".variables.dynamic_forcing", sc.dynamic_forcing, files);
      group(v["static"], p + ".variables.static", sc.statics, files);
      if (sc.dataset_type == "tisr" &&
          (!sc.prognostic.empty() || !sc.diagnostic.empty() || !sc.statics.empty() || !sc.dynamic_forcing.vars_3D.empty() ||
           sc.dynamic_forcing.vars_2D.size() != 1))
        fail(where(p + ".variables"), ": a tisr source has one 2D dynamic_forcing variable and nothing else");
      if (sc.dataset_type == "tisr" && sc.dynamic_forcing.vars_2D[0] != "tisr")
        fail(where(p + ".variables.dynamic_forcing.vars_2D"), ": '", sc.dynamic_forcing.vars_2D[0],
             "': a tisr source's variable is named tisr (as CREDIT requires)");
      if (!store.empty())  // every field type from the one store
        for (VarGroup* g : {&sc.prognostic, &sc.diagnostic, &sc.dynamic_forcing, &sc.statics})
          if (!g->empty()) {
            g->path = store;
            if (!g->vars_3D.empty()) g->path_3d = model_store;
          }
      const bool any3d = !sc.prognostic.vars_3D.empty() || !sc.diagnostic.vars_3D.empty() ||
                         !sc.dynamic_forcing.vars_3D.empty() || !sc.statics.vars_3D.empty();
      // a local source without levels: every level of its files' level coordinate (data/era5.h)
      if (any3d && sc.levels.empty() && sc.dataset_type != "local")
        fail(where(p + ".levels"), ": missing (a ", sc.dataset_type, " source lists its levels)");
      if (s["history_len"] && !history) history = get<int>(s["history_len"], p + ".history_len", 1);
      out.push_back(std::move(sc));
    }
  }

  void data(const YAML::Node& d) {
    if (!is_map(d, "data")) fail(where("data"), ": missing");
    known(d, "data.", {"source", "start_datetime", "end_datetime", "valid_start_datetime", "valid_end_datetime",
                       "timestep", "history_len", "forecast_len", "valid_history_len", "valid_forecast_len",
                       "mean_path", "std_path", "scaler_path", "date_ranges"});
    int history = 0;  // a source's own history_len (CREDIT reads the first's)
    sources(d["source"], "data.source", c->sources, history);
    bool prognostic = false;
    for (const SourceConfig& sc : c->sources) prognostic = prognostic || !sc.prognostic.empty();
    if (!prognostic) fail(where("data.source"), ": no source has prognostic variables");
    c->history_len = history ? history : get<int>(d["history_len"], "data.history_len", 1);
    if (c->history_len < 1 || c->history_len > 1000)
      fail(where("data.history_len"), ": ", c->history_len, " is not in [1, 1000]");
    if (d["valid_history_len"] && get<int>(d["valid_history_len"], "data.valid_history_len", 1) != c->history_len)
      fail(where("data.valid_history_len"), ": differs from history_len ", c->history_len,
           " (the model takes one window length)");
    c->forecast_len = get<int>(d["forecast_len"], "data.forecast_len", 1);
    if (c->forecast_len < 1 || c->forecast_len > 100000)
      fail(where("data.forecast_len"), ": ", c->forecast_len, " is not in [1, 100000]");
    if (d["valid_forecast_len"])
      c->valid_forecast_len = ranged<int>(d["valid_forecast_len"], "data.valid_forecast_len", 1, 1, 100000);
    c->timestep = parse_timestep(get<std::string>(d["timestep"], "data.timestep", "6h"), where("data.timestep"));
    auto dt = [&](const char* k) {
      const std::string s = get<std::string>(d[k], std::string("data.") + k, "");
      return s.empty() ? (int64_t)0 : parse_datetime(s, where(std::string("data.") + k));
    };
    c->start = dt("start_datetime");
    c->end = dt("end_datetime");
    c->valid_start = dt("valid_start_datetime");
    c->valid_end = dt("valid_end_datetime");
    if (c->start && c->end && c->end < c->start) fail(where("data.end_datetime"), ": before start_datetime");
    date_ranges(d, "data.", c->date_ranges, c->start, c->end);
    c->mean_nc = path(d["mean_path"], "data.mean_path");
    c->std_nc = path(d["std_path"], "data.std_path");
    c->scaler_json = path(d["scaler_path"], "data.scaler_path");
  }

  // A bridgescaler_transform block: its scaler file and the variables it scales (full keys
  // "era5/prognostic/3d/T" or partial paths "era5/prognostic"; none listed: all).
  void scaler_block(const YAML::Node& a, const std::string& p, const char* method, std::string& file,
                    std::vector<std::string>& vars, std::vector<std::string>* data_types) {
    is_map(a, p + ".args");
    known(a, p + ".args.", {"scaler_path", "variables", "method", "scaler_type", "scaler_params", "data_types",
                            "spatial_variables", "key"});
    const std::string m = get<std::string>(a["method"], p + ".args.method", method);
    if (m != method) fail(where(p + ".args.method"), ": '", m, "' is not implemented here (", method, ")");
    // the file says which scaler each variable has (standard or quantile): this key only names it
    const std::string st = get<std::string>(a["scaler_type"], p + ".args.scaler_type", "standard");
    if (st != "standard" && st != "quantile")
      fail(where(p + ".args.scaler_type"), ": '", st, "' is not implemented (standard, quantile)");
    (data_types ? c->scaler_spatial : c->post_scaler_spatial) = strings(a["spatial_variables"], p + ".args.spatial_variables");
    if (data_types ? pre_scaler_ : post_scaler_) fail(where(p), ": a second scaler block (wxe applies one)");
    (data_types ? pre_scaler_ : post_scaler_) = true;
    file = path(a["scaler_path"], p + ".args.scaler_path");
    if (file.empty()) fail(where(p + ".args.scaler_path"), ": missing");
    vars = strings(a["variables"], p + ".args.variables");
    if (data_types) {
      *data_types = strings(a["data_types"], p + ".args.data_types");
      for (const std::string& d : *data_types)
        if (d != "input" && d != "target") fail(where(p + ".args.data_types"), ": '", d, "' is not input or target");
    }
  }

  void preblock(const std::string& p, const YAML::Node& b) {
    is_map(b, p);
    known(b, p + ".", {"type", "args"});
    const std::string type = get<std::string>(b["type"], p + ".type", "");
    const YAML::Node a = b["args"];
    if (type == "bridgescaler_transform") {
      scaler_block(a, p, "transform", c->scaler_json, c->scaler_vars, &c->scaler_data_types);
    } else if (type == "era5_normalizer") {
      is_map(a, p + ".args");
      known(a, p + ".args.", {"mean_path", "std_path"});
      c->mean_nc = path(a["mean_path"], p + ".args.mean_path");
      c->std_nc = path(a["std_path"], p + ".args.std_path");
    } else if (type == "concat" || type == "to_device") {  // what wxe does anyway
      c->warnings.push_back(where(p) + ": " + type + " ignored (wxe concatenates the channels in CREDIT's order)");
    } else if (type == "fill_values" || type == "log_transform" || type == "sqrt_transform") {
      if (pre_scaler_)
        fail(where(p), ": ", type, " after the scaler is not implemented (wxe applies it to physical values: "
             "put it before the scaler block)");
      c->pre_transforms.push_back(point_transform(type, p, a, true));
    } else {
      fail(where(p + ".type"), ": preblock '", type, "' is not implemented (bridgescaler_transform, era5_normalizer, "
           "fill_values, log_transform, sqrt_transform, concat, to_device)");
    }
  }

  // A variable selection: a list of full keys or partial paths (empty: every variable). CREDIT
  // iterates a plain string character by character and so selects no variable with it: the same
  // here, with a warning.
  std::vector<std::string> selection(const YAML::Node& n, const std::string& key) {
    if (n && n.IsScalar()) {
      c->warnings.push_back(where(key) + ": '" + printable(n.Scalar()) +
                            "' is a string, not a list: CREDIT matches no variable with it, so this block changes "
                            "nothing (as in CREDIT); write ['" + printable(n.Scalar()) + "'] to select the variable");
      return {""};  // an empty key matches no variable (data/era5.cpp selected)
    }
    return strings(n, key);
  }

  // A postblock's type and arguments as one line, to compare the prediction's chain with the twin's.
  std::string block_line(const std::string& type, const YAML::Node& a) {
    std::string line = type;
    if (a && a.IsMap())
      for (auto it = a.begin(); it != a.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        if (k == "key" || k == "in_key" || k == "out_key" || k == "detach") continue;
        line += " " + k + "=" + (k == "scaler_path" ? path(it->second, "") : YAML::Dump(it->second));
      }
    return line;
  }

  PointTransform point_transform(const std::string& type, const std::string& p, const YAML::Node& a, bool pre) {
    PointTransform t;
    t.block = p;
    if (!is_map(a, p + ".args")) fail(where(p + ".args"), ": missing (CREDIT's ", type, " takes its variables there)");
    std::set<std::string> keys = {"variables"};
    if (pre) keys.insert("data_types");
    else keys.insert("key");
    if (type == "fill_values") keys.insert("rules");
    if (type == "log_transform" || type == "exp_transform") keys.insert({"base", "eps"});
    known(a, p + ".args.", keys);
    t.vars = selection(a["variables"], p + ".args.variables");
    if (pre) {
      t.data_types = strings(a["data_types"], p + ".args.data_types");
      if (t.data_types.empty()) t.data_types = {"input", "target"};
      for (const std::string& d : t.data_types)
        if (d != "input" && d != "target") fail(where(p + ".args.data_types"), ": '", d, "' is not input or target");
    } else {
      const std::string key = get<std::string>(a["key"], p + ".args.key", "y_processed");
      if (key != "y_processed" && key != "y_target_processed")
        fail(where(p + ".args.key"), ": '", key, "' (only y_processed: a target twin serves loss.type base, which "
             "wxe does not implement)");
    }
    if (type == "log_transform" || type == "exp_transform") {
      t.kind = type == "log_transform" ? PointTransform::Log : PointTransform::Exp;
      const std::string b = get<std::string>(a["base"], p + ".args.base", "e");
      if (b != "e" && b != "2" && b != "10") fail(where(p + ".args.base"), ": '", b, "' is not e, 2 or 10");
      t.base = b == "e" ? 0 : std::stoi(b);
      t.eps = ranged<double>(a["eps"], p + ".args.eps", 1e-8, 0, 1e30);
    } else if (type == "sqrt_transform") {
      t.kind = PointTransform::Sqrt;
    } else if (type == "square_transform") {
      t.kind = PointTransform::Square;
    } else {  // fill_values
      t.kind = PointTransform::Fill;
      const YAML::Node rules = a["rules"];
      if (!rules || !rules.IsSequence() || rules.size() == 0) fail(where(p + ".args.rules"), ": expected a list of rules");
      for (size_t i = 0; i < rules.size(); ++i) {
        const std::string rk = str(p, ".args.rules[", i, "]");
        is_map(rules[i], rk);
        known(rules[i], rk + ".", {"search", "op", "fill"});
        if (!rules[i]["search"] || !rules[i]["fill"]) fail(where(rk), ": each rule needs search and fill");
        PointTransform::Rule r;
        const std::string search = get<std::string>(rules[i]["search"], rk + ".search", "");
        r.nan = search == "nan";
        if (!r.nan) {
          r.search = get<double>(rules[i]["search"], rk + ".search", 0);
          r.op = get<std::string>(rules[i]["op"], rk + ".op", "==");
          static const std::set<std::string> ops = {"==", "!=", "<", "<=", ">", ">="};
          if (!ops.count(r.op)) fail(where(rk + ".op"), ": '", r.op, "' is not one of == != < <= > >=");
        }
        r.fill = get<double>(rules[i]["fill"], rk + ".fill", 0);
        t.rules.push_back(r);
      }
    }
    return t;
  }

  // CREDIT 2026's layout preblocks.{ic_only, per_step}.<name>, or the flat preblocks.<name>.
  void preblocks(const YAML::Node& pb) {
    if (!is_map(pb, "preblocks")) return;
    const bool sections = pb["per_step"] || pb["ic_only"];
    for (auto it = pb.begin(); it != pb.end(); ++it) {
      const std::string k = it->first.as<std::string>();
      if (!sections) {
        preblock("preblocks." + k, it->second);
        continue;
      }
      if (k != "per_step" && k != "ic_only")
        fail(where("preblocks." + k), ": expected only the sections per_step and ic_only (as CREDIT 2026)");
      if (!is_map(it->second, "preblocks." + k)) continue;
      for (auto jt = it->second.begin(); jt != it->second.end(); ++jt) {
        const std::string p = "preblocks." + k + "." + jt->first.as<std::string>();
        if (k == "ic_only") {  // run once on the initial conditions: only the no-ops are known
          const std::string type = is_map(jt->second, p) ? get<std::string>(jt->second["type"], p + ".type", "") : "";
          if (type != "concat" && type != "to_device") fail(where(p + ".type"), ": ic_only preblock '", type, "' is not implemented");
        }
        preblock(p, jt->second);
      }
    }
  }

  // A geopotential_diagnostic block's arguments, CREDIT's defaults where missing.
  GeopotentialSpec geopotential(const std::string& p, const YAML::Node& a) {
    const std::string k = p + ".args.";
    GeopotentialSpec g;
    g.block = p;
    if (a && !is_map(a, p + ".args")) return g;
    known(a, k, {"output_name", "chunk_size", "surface_geopotential_var", "surface_pressure_var", "temperature_var",
                 "specific_humidity_var", "flip_vertical", "level_info_file", "model_a_half_var", "model_b_half_var",
                 "key", "static_source_key", "levels"});
    g.output_name = get<std::string>(a["output_name"], k + "output_name", "ARCO_ERA5/derived_diagnostic/3d/geopotential");
    g.zs = get<std::string>(a["surface_geopotential_var"], k + "surface_geopotential_var", "ARCO_ERA5/static/2d/geopotential_at_surface");
    g.sp = get<std::string>(a["surface_pressure_var"], k + "surface_pressure_var", "ARCO_ERA5/prognostic/2d/surface_pressure");
    g.t = get<std::string>(a["temperature_var"], k + "temperature_var", "ARCO_ERA5/prognostic/3d/temperature");
    g.q = get<std::string>(a["specific_humidity_var"], k + "specific_humidity_var", "ARCO_ERA5/prognostic/3d/specific_humidity");
    g.flip = get<bool>(a["flip_vertical"], k + "flip_vertical", true);
    g.a_var = get<std::string>(a["model_a_half_var"], k + "model_a_half_var", "a_half");
    g.b_var = get<std::string>(a["model_b_half_var"], k + "model_b_half_var", "b_half");
    g.level_info_file = get<std::string>(a["level_info_file"], k + "level_info_file", "ERA5_Lev_Info.nc");
    if (g.level_info_file.empty()) fail(where(k + "level_info_file"), ": empty");
    // a bare name: beside the config or CREDIT's own (credit/metadata); else a path
    if (!fs::path(g.level_info_file).parent_path().empty()) g.level_info_file = path(a["level_info_file"], k + "level_info_file");
    const std::string ss = get<std::string>(a["static_source_key"], k + "static_source_key", "ic_raw");
    if (ss != "ic_raw")
      fail(where(k + "static_source_key"), ": '", ss, "' is not implemented (ic_raw: the raw initial condition's static)");
    if (a["chunk_size"]) ranged<int>(a["chunk_size"], k + "chunk_size", 1000, 1, 1 << 30);  // CREDIT's memory knob
    for (double l : get<std::vector<double>>(a["levels"], k + "levels", {})) {
      if (!(l >= 1 && l <= 100000) || l != std::floor(l)) fail(where(k + "levels"), ": ", l, " is not a model level number");
      g.levels.push_back((int64_t)l);
    }
    const std::string& o = g.output_name;
    if (std::count(o.begin(), o.end(), '/') != 3 || o.find("/3d/") == std::string::npos || o.back() == '/')
      fail(where(k + "output_name"), ": '", o, "' is not a 3D variable key <source>/<field type>/3d/<name>");
    return g;
  }

  // A physics postblock's arguments (CREDIT 2026's credit/postblock/conservation.py and
  // wind_filter.py: keyword arguments, its defaults where missing). normalised: before the inverse
  // scaler.
  PhysicsBlockSpec physics(const std::string& type, const std::string& p, const YAML::Node& a, bool normalised) {
    PhysicsBlockSpec s;
    s.block = p;
    s.normalised = normalised;
    const std::string k = p + ".args.";
    if (!is_map(a, p + ".args")) fail(where(p + ".args"), ": missing (CREDIT's ", type, " takes its variables there)");
    auto key = [&](const char* arg, bool input = false) {
      if (!a || !a[arg]) fail(where(k + arg), ": missing (CREDIT's ", type, " needs it)");
      const std::string v = get<std::string>(a[arg], k + arg, "");
      if (std::count(v.begin(), v.end(), '/') != 3) fail(where(k + arg), ": '", v, "' is not a variable key <source>/<field type>/<2d or 3d>/<name>");
      (input ? s.input : s.pred).push_back({arg, v});
      return v;
    };
    auto keys = [&](const char* arg) {
      const std::vector<std::string> v = strings(a ? a[arg] : YAML::Node(), k + arg);
      if (v.empty()) fail(where(k + arg), ": expected a list of variable keys");
      for (const std::string& x : v) s.pred.push_back({arg, x});
      return v.size();
    };
    if (type == "wind_artifact_filter") {
      s.kind = PhysicsBlockSpec::Wind;
      known(a, k, {"u_var", "v_var", "target_vars", "mask_level", "target_levels", "speed_threshold", "smooth_sigma",
                   "smooth_sigma_zonal", "smooth_sigma_meridional", "dilation_zonal", "dilation_meridional",
                   "falloff_sigma", "preserve_amplitude"});
      key("u_var");
      key("v_var");
      keys("target_vars");
      s.mask_level = ranged<int64_t>(a["mask_level"], k + "mask_level", 14, 0, 1 << 20);
      if (a["target_levels"]) s.target_levels = get<std::vector<int64_t>>(a["target_levels"], k + "target_levels", {});
      for (int64_t l : s.target_levels)
        if (l < 0) fail(where(k + "target_levels"), ": ", l, " is not a level index");
      s.speed_threshold = get<double>(a["speed_threshold"], k + "speed_threshold", s.speed_threshold);
      s.smooth_sigma = ranged<double>(a["smooth_sigma"], k + "smooth_sigma", 1.0, 1e-6, 1e4);
      if (a["smooth_sigma_zonal"] && !a["smooth_sigma_zonal"].IsNull())
        s.sigma_zonal = ranged<double>(a["smooth_sigma_zonal"], k + "smooth_sigma_zonal", 1.0, 1e-6, 1e4);
      if (a["smooth_sigma_meridional"] && !a["smooth_sigma_meridional"].IsNull())
        s.sigma_meridional = ranged<double>(a["smooth_sigma_meridional"], k + "smooth_sigma_meridional", 1.0, 1e-6, 1e4);
      s.falloff_sigma = ranged<double>(a["falloff_sigma"], k + "falloff_sigma", 4.0, 1e-6, 1e4);
      s.dilation_zonal = ranged<int64_t>(a["dilation_zonal"], k + "dilation_zonal", 13, 1, 1 << 16);
      s.dilation_meridional = ranged<int64_t>(a["dilation_meridional"], k + "dilation_meridional", 5, 1, 1 << 16);
      // an even kernel with padding size // 2 makes torch's mask one row or column larger than the grid
      for (const char* d : {"dilation_zonal", "dilation_meridional"})
        if ((d[9] == 'z' ? s.dilation_zonal : s.dilation_meridional) % 2 == 0)
          fail(where(k + d), ": ", d[9] == 'z' ? s.dilation_zonal : s.dilation_meridional,
               " is even (CREDIT's mask then does not fit the grid): give an odd size");
      s.preserve_amplitude = get<bool>(a["preserve_amplitude"], k + "preserve_amplitude", false);
      return s;
    }
    if (type == "tracer_fixer") {
      s.kind = PhysicsBlockSpec::Tracer;
      known(a, k, {"tracer_vars", "tracer_thres", "tracer_thres_max"});
      const size_t n = keys("tracer_vars");
      // a number for every variable, or a list of one per variable
      auto bounds = [&](const char* arg, double dflt) {
        const YAML::Node b = a[arg];
        if (!b || b.IsNull()) return std::vector<double>(n, dflt);
        if (!b.IsSequence()) return std::vector<double>(n, get<double>(b, k + arg, 0));
        std::vector<double> v = get<std::vector<double>>(b, k + arg, {});
        if (v.size() != n) fail(where(k + arg), ": ", v.size(), " values for the ", n, " tracer_vars");
        return v;
      };
      if (!a["tracer_thres"]) fail(where(k + "tracer_thres"), ": missing (CREDIT's tracer_fixer needs it)");
      s.lo = bounds("tracer_thres", 0);
      s.hi = bounds("tracer_thres_max", NAN);
    } else {
      known(a, k, {"save_loc_physics", "lon_lat_level_name", "grid_type", "midpoint", "fix_level_num", "q_var", "sp_var",
                   "precip_var", "evapor_var", "lead_time_periods", "input_source_key", "surface_geopotential_name",
                   "T_var", "U_var", "V_var", "toa_down_solar_input_var", "toa_up_solar_var", "toa_up_olr_var",
                   "surf_down_solar_var", "surf_up_solar_var", "surf_down_lw_var", "surf_up_lw_var", "surf_sh_var",
                   "surf_lh_var"});
      const std::string grid = get<std::string>(a["grid_type"], k + "grid_type", "sigma");
      if (grid != "sigma")
        fail(where(k + "grid_type"), ": '", grid, "' is not implemented (CREDIT 2026's gen2 fixers support the hybrid "
             "sigma grid only)");
      const std::string src = get<std::string>(a["input_source_key"], k + "input_source_key", "x_physical");
      if (src != "x_physical")
        fail(where(k + "input_source_key"), ": '", src, "' is not implemented (x_physical: the step's physical input)");
      if (!a["save_loc_physics"]) fail(where(k + "save_loc_physics"), ": missing (the statics file with the grid and the hybrid coefficients)");
      // os.path.expandvars: $NAME and ${NAME} from the environment, unknown ones left as written
      std::string f = get<std::string>(a["save_loc_physics"], k + "save_loc_physics", "");
      for (size_t i = f.find('$'); i != std::string::npos; i = f.find('$', i + 1)) {
        const bool brace = i + 1 < f.size() && f[i + 1] == '{';
        size_t e = i + 1 + brace;
        while (e < f.size() && (std::isalnum((unsigned char)f[e]) || f[e] == '_')) ++e;
        if (e == i + 1 + brace || (brace && (e >= f.size() || f[e] != '}'))) continue;
        const char* v = std::getenv(f.substr(i + 1 + brace, e - i - 1 - brace).c_str());
        if (!v) continue;
        f.replace(i, e + brace - i, v);
        i += std::strlen(v) - 1;
      }
      YAML::Node fn(f);
      s.statics = path(fn, k + "save_loc_physics");
      if (a["lon_lat_level_name"]) {
        const std::vector<std::string> names = strings(a["lon_lat_level_name"], k + "lon_lat_level_name");
        if (names.size() < 4)
          fail(where(k + "lon_lat_level_name"), ": ", names.size(), " names; the sigma grid needs four (lon, lat, a, b)");
        s.lon_name = names[0], s.lat_name = names[1], s.a_name = names[2], s.b_name = names[3];
      } else {
        fail(where(k + "lon_lat_level_name"), ": missing (the statics file's names: [lon2d, lat2d, hyai, hybi])");
      }
      s.midpoint = get<bool>(a["midpoint"], k + "midpoint", false);
      key("q_var");
      key("sp_var");
      if (type != "global_mass_fixer") {
        if (!a["lead_time_periods"]) fail(where(k + "lead_time_periods"), ": missing (CREDIT's ", type, " needs it)");
        s.seconds = 3600.0 * ranged<int64_t>(a["lead_time_periods"], k + "lead_time_periods", 6, 1, 1 << 20);
      }
      if (type == "global_mass_fixer") {
        s.kind = PhysicsBlockSpec::Mass;
      } else if (type == "global_water_fixer") {
        s.kind = PhysicsBlockSpec::Water;
        key("precip_var");
        key("evapor_var");
      } else {
        s.kind = PhysicsBlockSpec::Energy;
        for (const char* v : {"T_var", "U_var", "V_var", "toa_up_solar_var", "toa_up_olr_var", "surf_down_solar_var",
                              "surf_up_solar_var", "surf_down_lw_var", "surf_up_lw_var", "surf_sh_var", "surf_lh_var"})
          key(v);
        key("toa_down_solar_input_var", true);
        const YAML::Node g = a["surface_geopotential_name"];
        if (!g) fail(where(k + "surface_geopotential_name"), ": missing (the statics file's surface geopotential, PHIS)");
        s.phis_name = g.IsSequence() && g.size() ? get<std::string>(g[0], k + "surface_geopotential_name", "")
                                                 : get<std::string>(g, k + "surface_geopotential_name", "");
      }
      // the t0 state each fixer reads from x_physical under the prediction's keys
      for (size_t i = 0, n = s.pred.size(); i < n; ++i)
        if (s.pred[i].first == "q_var" || s.pred[i].first == "sp_var" || s.pred[i].first == "T_var" ||
            s.pred[i].first == "U_var" || s.pred[i].first == "V_var")
          s.input.push_back(s.pred[i]);
    }
    if (normalised && s.kind != PhysicsBlockSpec::Tracer)
      fail(where(p), ": ", type, " before the inverse bridgescaler_transform sees normalised values; CREDIT's fixers "
           "need physical units (put it after the inverse scaler)");
    if (normalised)
      c->warnings.push_back(where(p) + ": clamps normalised values (it is before the inverse scaler), as CREDIT's does");
    return s;
  }

  // A mslp_diagnostic block's arguments (CREDIT's credit/postblock/mslp.py), its defaults where missing.
  GeopotentialSpec mslp(const std::string& p, const YAML::Node& a) {
    const std::string k = p + ".args.";
    GeopotentialSpec g;
    g.block = p;
    g.mslp = true;
    const YAML::Node none;
    const YAML::Node& args = a && is_map(a, p + ".args") ? a : none;
    if (args) known(args, k, {"output_name", "surface_pressure_var", "temperature_var", "surface_geopotential_var", "key",
                              "static_source_key"});
    auto arg = [&](const char* name, const char* def) {
      return args ? get<std::string>(args[name], k + name, def) : std::string(def);
    };
    g.output_name = arg("output_name", "ARCO_ERA5/derived_diagnostic/2d/mean_sea_level_pressure");
    g.sp = arg("surface_pressure_var", "ARCO_ERA5/prognostic/2d/surface_pressure");
    g.t = arg("temperature_var", "ARCO_ERA5/prognostic/2d/2m_temperature");
    g.zs = arg("surface_geopotential_var", "ARCO_ERA5/static/2d/geopotential_at_surface");
    if (arg("static_source_key", "ic_raw") != "ic_raw")
      fail(where(k + "static_source_key"), ": '", arg("static_source_key", "ic_raw"),
           "' is not implemented (ic_raw: the raw initial condition's static)");
    const std::string& o = g.output_name;
    if (std::count(o.begin(), o.end(), '/') != 3 || o.find("/2d/") == std::string::npos || o.back() == '/')
      fail(where(k + "output_name"), ": '", o, "' is not a 2D variable key <source>/<field type>/2d/<name>");
    return g;
  }

  // postblocks.per_step: reconstruct (what wxe does) and the inverse scaler of the forecast.
  void postblocks(const YAML::Node& pb) {
    if (!is_map(pb, "postblocks")) return;
    for (auto it = pb.begin(); it != pb.end(); ++it) {
      const std::string k = it->first.as<std::string>();
      if (k != "per_step" && k != "post_rollout")
        fail(where("postblocks." + k), ": expected only the sections per_step and post_rollout (CREDIT 2026's build_postblocks refuses other keys too: put the blocks under per_step)");
      if (!is_map(it->second, "postblocks." + k)) continue;
      for (auto jt = it->second.begin(); jt != it->second.end(); ++jt) {
        const std::string p = "postblocks." + k + "." + jt->first.as<std::string>();
        const YAML::Node b = jt->second;
        is_map(b, p);
        known(b, p + ".", {"type", "args"});
        const std::string type = get<std::string>(b["type"], p + ".type", "");
        const YAML::Node a = b["args"];
        // blocks writing y_target_processed serve loss.type base, which wxe does not implement
        const std::string key = is_map(a, p + ".args") ? get<std::string>(a["key"], p + ".args.key", "y_processed") : "y_processed";
        const std::string out = a && a.IsMap() ? get<std::string>(a["out_key"], p + ".args.out_key", "y_processed") : "y_processed";
        const bool twin = key == "y_target_processed" || out == "y_target_processed";
        if (twin && !training) continue;  // the loss's target twin: nothing a forecast computes
        if (k == "per_step" && type == "reconstruct" && (out == "y_processed" || out == "y_target_processed")) {
          known(a, p + ".args.", {"detach", "in_key", "out_key"});
          if (twin && c->twin_block.empty()) c->twin_block = p;
        } else if (k == "per_step" && twin && (type == "bridgescaler_transform" || type == "exp_transform" ||
                                               type == "square_transform")) {
          if (type != "bridgescaler_transform") point_transform(type, p, a, false);  // its checks
          c->twin_chain.push_back(block_line(type, a));
        } else if (k == "per_step" && type == "bridgescaler_transform" && key == "y_processed") {
          if (!c->post_transforms.empty())
            fail(where(p), ": the inverse scaler after ", c->post_transforms.back().block,
                 " is not implemented (put exp_transform / square_transform after the scaler)");
          scaler_block(a, p, "inverse_transform", c->post_scaler_json, c->post_scaler_vars, nullptr);
          c->pred_chain.push_back(block_line(type, a));
        } else if (k == "per_step" && (type == "exp_transform" || type == "square_transform") && key == "y_processed") {
          for (const PhysicsBlockSpec& ph : c->physics)
            if (!ph.normalised)
              fail(where(p), ": ", type, " after ", ph.block, " is not implemented (put the transforms before the physics blocks)");
          c->post_transforms.push_back(point_transform(type, p, a, false));
          c->pred_chain.push_back(block_line(type, a));
        } else if (kPhysicsBlocks.count(type)) {
          if (k != "per_step")
            fail(where(p), ": ", type, " under post_rollout is not implemented (put it under per_step, as CREDIT's own configs do)");
          if (!c->computed.empty() && !c->post_scaler_json.empty())
            fail(where(p), ": ", type, " after ", c->computed.back().block,
                 " is not implemented (the diagnostic is computed from the written state: put it after the physics blocks)");
          c->physics.push_back(physics(type, p, a, c->post_scaler_json.empty()));
          c->pred_chain.push_back(block_line(type, a));
        } else if (k == "per_step" && (type == "geopotential_diagnostic" || type == "mslp_diagnostic")) {
          GeopotentialSpec g = type == "mslp_diagnostic" ? mslp(p, a) : geopotential(p, a);
          (twin ? c->twin_chain : c->pred_chain).push_back(block_line(type, a));
          if (!twin) c->computed.push_back(std::move(g));
        } else {
          fail(where(p + ".type"), ": postblock '", type, "' is not implemented (per_step: reconstruct, "
               "bridgescaler_transform, exp_transform, square_transform, geopotential_diagnostic, mslp_diagnostic, tracer_fixer, "
               "global_mass_fixer, global_water_fixer, global_energy_fixer, global_energy_fixer_updown, wind_artifact_filter)");
        }
      }
    }
  }

  // CREDIT's date_ranges (gen_2 _utils.build_time_index_multi): a list of [start, end] pairs,
  // not beside start_datetime / end_datetime at the same level; sorted by start, they must not
  // overlap. start and end become the first block's start and the last block's end.
  void date_ranges(const YAML::Node& m, const std::string& at, std::vector<std::pair<int64_t, int64_t>>& out,
                   int64_t& start, int64_t& end) {
    const YAML::Node r = m["date_ranges"];
    if (!r) return;
    const std::string k = at + "date_ranges";
    if (m["start_datetime"] || m["end_datetime"])
      fail(where(k), ": not beside start_datetime / end_datetime (CREDIT refuses both at one level: use one or the other)");
    if (!r.IsSequence() || r.size() == 0) fail(where(k), ": expected a list of [start, end] pairs");
    out.clear();
    for (size_t i = 0; i < r.size(); ++i) {
      const std::string ki = str(k, "[", i, "]");
      if (!r[i].IsSequence() || r[i].size() != 2) fail(where(ki), ": expected a [start, end] pair");
      const int64_t a = parse_datetime(get<std::string>(r[i][0], ki + "[0]", ""), where(ki + "[0]"));
      const int64_t b = parse_datetime(get<std::string>(r[i][1], ki + "[1]", ""), where(ki + "[1]"));
      if (b <= a) fail(where(ki), ": its end ", format_datetime(b), " is not after its start ", format_datetime(a));
      out.push_back({a, b});
    }
    std::sort(out.begin(), out.end());
    for (size_t i = 1; i < out.size(); ++i)
      if (out[i].first <= out[i - 1].second)
        fail(where(k), ": the blocks overlap (one ends ", format_datetime(out[i - 1].second), ", the next starts ",
             format_datetime(out[i].first), "); they must not");
    start = out.front().first;
    end = out.back().second;
  }

  // CREDIT 2026 reads validation from validation_data (all of data's keys, source inherited).
  void validation_data(const YAML::Node& v, const YAML::Node& data) {
    if (!is_map(v, "validation_data")) return;
    // its own files (CREDIT builds the validation dataset from this section): the same sources,
    // variables and levels as data.source, which the model's channels follow
    if (v["source"] && !(data && data["source"] && YAML::Dump(v["source"]) == YAML::Dump(data["source"]))) {
      int history = 0;
      sources(v["source"], "validation_data.source", c->valid_sources, history);
      const auto layout = [](const SourceConfig& s) {
        std::vector<std::vector<std::string>> l = {{s.name, s.dataset_type, s.level_coord}};
        for (const VarGroup* g : {&s.prognostic, &s.diagnostic, &s.dynamic_forcing, &s.statics}) {
          l.push_back(g->vars_3D);
          l.push_back(g->vars_2D);
        }
        return l;
      };
      bool same = c->valid_sources.size() == c->sources.size();
      for (size_t i = 0; same && i < c->sources.size(); ++i)
        same = layout(c->valid_sources[i]) == layout(c->sources[i]) && c->valid_sources[i].levels == c->sources[i].levels &&
               c->valid_sources[i].args == c->sources[i].args;
      if (!same)
        fail(where("validation_data.source"), ": its sources, variables or levels differ from data.source's (the model "
             "takes one channel layout: only the paths may differ)");
    }
    known(v, "validation_data.", {"source", "start_datetime", "end_datetime", "timestep", "history_len", "forecast_len",
                                  "valid_history_len", "valid_forecast_len", "valid_start_datetime", "valid_end_datetime",
                                  "mean_path", "std_path", "scaler_path", "retain_graph", "backprop_on_timestep",
                                  "date_ranges"});
    auto dt = [&](const char* k) {
      const std::string s = get<std::string>(v[k], std::string("validation_data.") + k, "");
      return s.empty() ? (int64_t)0 : parse_datetime(s, where(std::string("validation_data.") + k));
    };
    if (v["start_datetime"]) c->valid_start = dt("start_datetime");
    if (v["end_datetime"]) c->valid_end = dt("end_datetime");
    date_ranges(v, "validation_data.", c->valid_date_ranges, c->valid_start, c->valid_end);
    if (v["history_len"] && get<int>(v["history_len"], "validation_data.history_len", 1) != c->history_len)
      fail(where("validation_data.history_len"), ": differs from data.history_len ", c->history_len,
           " (the model takes one window length)");
    if (v["timestep"] &&
        parse_timestep(get<std::string>(v["timestep"], "validation_data.timestep", ""), where("validation_data.timestep")) !=
            c->timestep)
      fail(where("validation_data.timestep"), ": differs from data.timestep");
    if (v["forecast_len"])
      c->valid_forecast_len = ranged<int>(v["forecast_len"], "validation_data.forecast_len", 1, 1, 100000);
  }

  void trainer(const YAML::Node& t) {
    if (!is_map(t, "trainer")) return;
    known(t, "trainer.", {"learning_rate", "weight_decay", "use_scheduler", "scheduler", "grad_max_norm",
                          "grad_accum_every", "use_ema", "ema_decay", "train_batch_size", "valid_batch_size",
                          "batches_per_epoch", "valid_batches_per_epoch", "epochs", "num_epoch", "load_weights",
                          "load_optimizer", "load_scaler", "load_scheduler", "seed", "type", "mode", "amp",
                          "save_backup_weights", "save_best_weights", "thread_workers", "valid_thread_workers",
                          "activation_checkpoint", "ensemble_size", "parallelism", "skip_validation",
                          "update_learning_rate", "start_epoch", "reload_epoch", "use_tensorboard", "prefetch_factor",
                          "stopping_patience"});
    const double big = 1e30;
    const int64_t kMaxCount = (int64_t)1 << 40;  // steps, batches: products of two stay far from overflow
    c->learning_rate = ranged<double>(t["learning_rate"], "trainer.learning_rate", c->learning_rate, 0, big);
    c->weight_decay = ranged<double>(t["weight_decay"], "trainer.weight_decay", c->weight_decay, 0, big);
    // 'dynamic': CREDIT's gen2 trainer clips to the gradient's own global norm each step
    if (t["grad_max_norm"] && t["grad_max_norm"].IsScalar() && t["grad_max_norm"].Scalar() == "dynamic")
      c->grad_clip_dynamic = true;
    else
      c->grad_max_norm = ranged<double>(t["grad_max_norm"], "trainer.grad_max_norm", c->grad_max_norm, 0, big);
    // FSDP shards the weights, gradients and optimizer state over the data-parallel ranks: wxe's
    // --shard-weights (ZeRO-3 over dp x domain); ddp and none train as wxe does without it
    const auto fsdp = [](const YAML::Node& n) {
      return n && n.IsScalar() && (n.Scalar() == "fsdp" || n.Scalar() == "fsdp2");
    };
    c->shard_weights = fsdp(t["mode"]) || (t["parallelism"] && t["parallelism"].IsMap() && fsdp(t["parallelism"]["data"]));
    if (t["parallelism"])
      c->warnings.push_back(where("trainer.parallelism") +
                            ": the mesh is not read from it (wxe's mesh: mpirun -n N with --tp T and --domain D; the rest "
                            "is data parallel)" + (c->shard_weights ? "; data: fsdp is --shard-weights" : ""));
    c->ensemble_size = ranged<int>(t["ensemble_size"], "trainer.ensemble_size", 1, 1, 1 << 16);
    if (c->ensemble_size > 1 && c->forecast_len > 1)
      fail(where("trainer.ensemble_size"), ": ", c->ensemble_size, " with data.forecast_len ", c->forecast_len,
           ": ensemble rollouts are not implemented (train ensembles with forecast_len 1)");
    // one micro-batch per sample: their product is wxe's --accum (an int)
    c->grad_accum_every = ranged<int>(t["grad_accum_every"], "trainer.grad_accum_every", 1, 1, 1 << 20);
    c->train_batch_size = ranged<int>(t["train_batch_size"], "trainer.train_batch_size", 1, 1, 1 << 20);
    if ((int64_t)c->grad_accum_every * c->train_batch_size > (1 << 20))
      fail(where("trainer.grad_accum_every"), ": ", c->grad_accum_every, " x trainer.train_batch_size ",
           c->train_batch_size, " micro-batches per step is more than ", 1 << 20);
    c->use_ema = get<bool>(t["use_ema"], "trainer.use_ema", false);
    c->activation_checkpoint = get<bool>(t["activation_checkpoint"], "trainer.activation_checkpoint", true);
    c->ema_decay = ranged<double>(t["ema_decay"], "trainer.ema_decay", c->ema_decay, 0, 1);
    c->batches_per_epoch = ranged<int64_t>(t["batches_per_epoch"], "trainer.batches_per_epoch", 0, 0, kMaxCount);
    c->valid_batches_per_epoch =
        ranged<int64_t>(t["valid_batches_per_epoch"], "trainer.valid_batches_per_epoch", 0, 0, kMaxCount);
    const char* ek = t["epochs"] ? "epochs" : "num_epoch";
    c->epochs = ranged<int64_t>(t[ek], std::string("trainer.") + ek, 1, 1, kMaxCount);
    if (c->batches_per_epoch > kMaxCount / c->epochs)
      fail(where(std::string("trainer.") + ek), ": ", c->epochs, " x trainer.batches_per_epoch ", c->batches_per_epoch, " steps is more than ",
           kMaxCount);
    c->load_weights = get<bool>(t["load_weights"], "trainer.load_weights", false);
    c->load_optimizer = get<bool>(t["load_optimizer"], "trainer.load_optimizer", false);
    c->seed = get<uint64_t>(t["seed"], "trainer.seed", c->seed);
    c->amp = get<bool>(t["amp"], "trainer.amp", false);
    c->use_scheduler = get<bool>(t["use_scheduler"], "trainer.use_scheduler", false);
    const YAML::Node s = t["scheduler"];
    if (c->use_scheduler) {
      is_map(s, "trainer.scheduler");
      const std::string type = get<std::string>(s["scheduler_type"], "trainer.scheduler.scheduler_type", "");
      c->scheduler_type = type;
      const std::string k = "trainer.scheduler.";
      // each scheduler's constructor arguments, with CREDIT's (torch's) defaults; counted in
      // batches (per-batch schedulers) or epochs (per-epoch ones)
      if (type == "linear-warmup-cosine") {
        known(s, k, {"scheduler_type", "warmup_steps", "total_steps", "min_lr"});
        c->warmup_steps = ranged<int64_t>(s["warmup_steps"], k + "warmup_steps", 1000, 0, kMaxCount);
        c->total_steps = ranged<int64_t>(s["total_steps"], k + "total_steps", 500000, 0, kMaxCount);
        c->min_lr = ranged<double>(s["min_lr"], k + "min_lr", 1e-5, 0, big);
      } else if (type == "cosine-annealing") {
        known(s, k, {"scheduler_type", "T_max", "eta_min", "last_epoch", "verbose"});
        if (!s["T_max"]) fail(where(k + "T_max"), ": missing (torch's CosineAnnealingLR needs it)");
        c->t_max = ranged<int64_t>(s["T_max"], k + "T_max", 1, 1, kMaxCount);
        c->eta_min = ranged<double>(s["eta_min"], k + "eta_min", 0, 0, big);
      } else if (type == "cosine-annealing-restarts") {
        known(s, k, {"scheduler_type", "first_cycle_steps", "cycle_mult", "max_lr", "min_lr", "warmup_steps", "gamma",
                     "last_epoch"});
        if (!s["first_cycle_steps"]) fail(where(k + "first_cycle_steps"), ": missing (CREDIT's CosineAnnealingWarmupRestarts needs it)");
        c->first_cycle_steps = ranged<int64_t>(s["first_cycle_steps"], k + "first_cycle_steps", 1, 1, kMaxCount);
        c->cycle_mult = ranged<double>(s["cycle_mult"], k + "cycle_mult", 1.0, 1.0, 1e6);
        c->max_lr = ranged<double>(s["max_lr"], k + "max_lr", 0.1, 0, big);
        c->min_lr = ranged<double>(s["min_lr"], k + "min_lr", 0.001, 0, big);
        c->warmup_steps = ranged<int64_t>(s["warmup_steps"], k + "warmup_steps", 0, 0, kMaxCount);
        c->gamma = ranged<double>(s["gamma"], k + "gamma", 1.0, 0, big);
        if (c->warmup_steps >= c->first_cycle_steps)
          fail(where(k + "warmup_steps"), ": ", c->warmup_steps, " is not below first_cycle_steps ", c->first_cycle_steps);
      } else if (type == "lambda") {
        // CREDIT's LambdaLR takes none of the section's keys (lr_lambda_phase1: 10 warm-up epochs of 100)
        for (auto it = s.begin(); it != s.end(); ++it)
          if (it->first.as<std::string>() != "scheduler_type")
            c->warnings.push_back(where(k + it->first.as<std::string>()) + ": ignored (as CREDIT's lambda scheduler does)");
      } else if (type == "plateau") {
        known(s, k, {"scheduler_type", "mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr",
                     "eps", "verbose"});
        c->plateau_mode = get<std::string>(s["mode"], k + "mode", "min");
        if (c->plateau_mode != "min" && c->plateau_mode != "max") fail(where(k + "mode"), ": '", c->plateau_mode, "' is not min or max");
        c->plateau_threshold_mode = get<std::string>(s["threshold_mode"], k + "threshold_mode", "rel");
        if (c->plateau_threshold_mode != "rel" && c->plateau_threshold_mode != "abs")
          fail(where(k + "threshold_mode"), ": '", c->plateau_threshold_mode, "' is not rel or abs");
        c->plateau_factor = ranged<double>(s["factor"], k + "factor", 0.1, 0, 1);
        if (c->plateau_factor >= 1) fail(where(k + "factor"), ": must be below 1");
        c->plateau_patience = ranged<int64_t>(s["patience"], k + "patience", 10, 0, kMaxCount);
        c->plateau_threshold = ranged<double>(s["threshold"], k + "threshold", 1e-4, 0, big);
        c->plateau_cooldown = ranged<int64_t>(s["cooldown"], k + "cooldown", 0, 0, kMaxCount);
        c->min_lr = ranged<double>(s["min_lr"], k + "min_lr", 0, 0, big);
        c->plateau_eps = ranged<double>(s["eps"], k + "eps", 1e-8, 0, big);
      } else {
        fail(where(k + "scheduler_type"), ": '", type, "' is not one of CREDIT's schedulers (linear-warmup-cosine, "
             "cosine-annealing, cosine-annealing-restarts, lambda, plateau)");
      }
    }
  }

  // loss.training_loss / validation_loss with their *_parameters (huber's delta; reduction is
  // CREDIT's own business)
  LossSpec loss_spec(const YAML::Node& l, const std::string& which) {
    LossSpec ls;
    ls.name = get<std::string>(l[which], "loss." + which, "mse");
    if (!kElementwiseLosses.count(ls.name) && !kCrpsLosses.count(ls.name) && !kTensorLosses.count(ls.name))
      fail(where("loss." + which), ": '", ls.name, "' is not one of CREDIT's losses (mse, mae, msle, huber, logcosh, "
           "xtanh, xsigmoid, KCRPS, almost-fair-crps, ring-crps, spectral, power, covmse)");
    if (ls.name == "power")  // _instantiate_loss passes reduction, which PSDLoss does not take
      fail(where("loss." + which), ": 'power': CREDIT 2026.2 cannot build it here (PSDLoss takes no reduction: a "
           "TypeError); use loss.type: power, or use_power_loss: true for the term");
    loss_parameters(ls, l[which + "_parameters"], "loss." + which + "_parameters");
    return ls;
  }

  // A loss's *_parameters: huber's delta, KCRPS's biased, almost-fair-crps's alpha (reduction
  // and no_autocast are CREDIT's own business)
  void loss_parameters(LossSpec& ls, const YAML::Node& p, const std::string& key) {
    if (!is_map(p, key)) return;
    known(p, key + ".", {"reduction", "delta", "biased", "alpha", "no_autocast", "wavenum_init", "batch_normalize",
                         "off_diagonal_scale"});
    auto only = [&](const char* param, const char* loss) {
      if (p[param] && ls.name != loss) fail(where(key + "." + param), ": only ", loss, " takes ", param);
    };
    only("delta", "huber");
    only("biased", "KCRPS");
    only("alpha", "almost-fair-crps");
    if (p["wavenum_init"] && ls.name != "spectral" && ls.name != "power")
      fail(where(key + ".wavenum_init"), ": only spectral and power take wavenum_init");
    only("batch_normalize", "covmse");
    only("off_diagonal_scale", "covmse");
    ls.wavenum_init = ranged<int64_t>(p["wavenum_init"], key + ".wavenum_init", 20, 0, 1 << 30);
    ls.batch_normalize = get<bool>(p["batch_normalize"], key + ".batch_normalize", false);
    ls.off_diagonal_scale = ranged<double>(p["off_diagonal_scale"], key + ".off_diagonal_scale", 1.0, -1e30, 1e30);
    ls.delta = ranged<double>(p["delta"], key + ".delta", 1.0, 1e-30, 1e30);
    ls.biased = get<bool>(p["biased"], key + ".biased", false);
    ls.alpha = ranged<double>(p["alpha"], key + ".alpha", 1.0, -1e30, 1e30);
  }

  // CREDIT's gen2 trainer's rules for the ensemble losses (credit/applications/train_gen2.py,
  // credit/losses/__init__.py load_loss); `name` is the loss it trains with (a BaseLoss's
  // args.training_loss)
  void ensemble_rules(const std::string& name, const std::string& key) {
    if (kCrpsLosses.count(name) && c->ensemble_size <= 1)
      fail(where(key), ": '", name, "' is an ensemble CRPS loss and requires trainer.ensemble_size > 1 (CREDIT's rule); "
           "got ", c->ensemble_size);
    if (name == "ring-crps" && !c->base_loss.on && (c->use_latitude_weights || c->use_variable_weights))
      fail(where(key), ": ring-crps cannot be combined with use_latitude_weights / use_variable_weights (CREDIT's rule: "
           "VariableTotalLoss2D needs an elementwise loss); disable the weights");
  }

  // loss.type base: its args (credit/losses/base.py BaseLoss's constructor arguments)
  void base_loss(const YAML::Node& l) {
    known(l, "loss.", {"type", "args"});
    const YAML::Node a = l["args"];
    const std::string k = "loss.args.";
    if (!c->physics.empty())
      fail(where("loss.type"), ": base with the physics postblock ", c->physics[0].block,
           " is not implemented (BaseLoss scores the prediction through the blocks with their gradients; wxe "
           "runs them forward in rollouts only): use the flat loss keys (training_loss) without type base");
    BaseLossSpec& b = c->base_loss;
    b.on = true;
    if (is_map(a, "loss.args")) {
      known(a, k, {"training_loss", "base_loss_parameters", "validation_loss", "validation_loss_parameters",
                   "base_loss_overrides", "var_weighting", "scaler_path", "variable_weights", "normalize_weights",
                   "include_computed_diagnostics", "use_latitude_weights", "latitude_weights"});
      auto spec = [&](const YAML::Node& name, const YAML::Node& params, const std::string& key) {
        LossSpec ls;
        ls.name = get<std::string>(name, key, "mse");
        if (kCrpsLosses.count(ls.name) && (ls.name != "ring-crps" || key.find("overrides") != std::string::npos))
          fail(where(key), ": '", ls.name, "' is an ensemble CRPS loss and cannot be BaseLoss's univariate loss (CREDIT's "
               "rule: only ring-crps, as training_loss or validation_loss, whose members live across dp ranks)");
        if (!kElementwiseLosses.count(ls.name) && ls.name != "ring-crps")
          fail(where(key), ": '", ls.name, "' is not implemented as BaseLoss's univariate loss (mse, mae, msle, "
               "huber, logcosh, xtanh, xsigmoid, ring-crps)");
        if (is_map(params, key + "_parameters")) {
          known(params, key + "_parameters.", {"reduction", "delta"});
          ls.delta = ranged<double>(params["delta"], key + "_parameters.delta", 1.0, 1e-30, 1e30);
        }
        return ls;
      };
      b.training = spec(a["training_loss"], a["base_loss_parameters"], k + "training_loss");
      b.has_validation = a["validation_loss"] && !a["validation_loss"].IsNull();
      if (b.has_validation) b.validation = spec(a["validation_loss"], a["validation_loss_parameters"], k + "validation_loss");
      const YAML::Node ov = a["base_loss_overrides"];
      if (is_map(ov, k + "base_loss_overrides"))
        for (auto it = ov.begin(); it != ov.end(); ++it) {
          const std::string vk = it->first.as<std::string>(), ok = k + "base_loss_overrides." + vk;
          is_map(it->second, ok);
          known(it->second, ok + ".", {"loss", "parameters"});
          b.overrides[vk] = spec(it->second["loss"], it->second["parameters"], ok + ".loss");
        }
      b.weighting = get<std::string>(a["var_weighting"], k + "var_weighting", "inverse_variance");
      if (b.weighting == "learnable")
        fail(where(k + "var_weighting"), ": 'learnable' (Kendall-Gal weights trained with the model) is not "
             "implemented (inverse_variance, manual, none)");
      if (b.weighting != "inverse_variance" && b.weighting != "manual" && b.weighting != "none")
        fail(where(k + "var_weighting"), ": '", b.weighting, "' is not one of inverse_variance, manual, none");
      b.scaler_path = path(a["scaler_path"], k + "scaler_path");
      if (b.weighting == "inverse_variance" && b.scaler_path.empty())
        fail(where(k + "scaler_path"), ": missing (var_weighting inverse_variance reads the target variances there)");
      const YAML::Node vw = a["variable_weights"];
      if (is_map(vw, k + "variable_weights"))
        for (auto it = vw.begin(); it != vw.end(); ++it)
          b.manual[it->first.as<std::string>()] =
              ranged<double>(it->second, k + "variable_weights." + it->first.as<std::string>(), 1.0, 0, 1e30);
      b.normalize = get<bool>(a["normalize_weights"], k + "normalize_weights", true);
      c->include_computed = get<bool>(a["include_computed_diagnostics"], k + "include_computed_diagnostics", true);
      b.use_latitude_weights = get<bool>(a["use_latitude_weights"], k + "use_latitude_weights", false);
      if (a["latitude_weights"])
        c->warnings.push_back(where(k + "latitude_weights") +
                              ": ignored (wxe weighs rows by cos(latitude) of the data's own latitudes)");
    } else {
      fail(where("loss.args"), ": missing (loss.type base takes its settings there)");
    }
    // the scored prediction and its target twin must come through the same postblocks
    if (c->twin_block.empty())
      fail(where("postblocks.per_step"), ": loss.type base needs the target twin: a reconstruct block with in_key y "
           "and out_key y_target_processed, then the prediction's postblocks again with key y_target_processed");
    if (c->twin_chain != c->pred_chain)
      fail(where(c->twin_block), ": the target twin's postblocks (", c->twin_chain.size(),
           " after reconstruct) differ from the prediction's (", c->pred_chain.size(),
           "): wxe scores both through the prediction's chain, so they must be the same blocks with the same arguments");
    c->use_latitude_weights = b.use_latitude_weights;
    c->training_loss = b.training;
    if (b.training.name == "ring-crps" && !b.overrides.empty())
      fail(where(k + "base_loss_overrides"), ": with training_loss ring-crps the per-variable overrides are not "
           "implemented (wxe scores every variable with ring-crps)");
    ensemble_rules(b.training.name, k + "training_loss");
    if (c->include_computed && !c->computed.empty() && kCrpsLosses.count(b.training.name))
      fail(where(k + "include_computed_diagnostics"), ": scoring ", c->computed.front().block, "'s variable with ",
           b.training.name, " is not implemented (set include_computed_diagnostics: false)");
  }

  void loss(const YAML::Node& l) {
    if (!is_map(l, "loss")) return;
    known(l, "loss.", {"training_loss", "validation_loss", "training_loss_parameters", "validation_loss_parameters",
                       "use_latitude_weights", "latitude_weights", "use_variable_weights", "variable_weights",
                       "use_power_loss", "use_spectral_loss", "spectral_lambda_reg", "spectral_wavenum_init", "type",
                       "args"});
    if (l["type"]) {
      const std::string type = get<std::string>(l["type"], "loss.type", "");
      if (type == "base") {
        base_loss(l);
        return;
      }
      // another registry loss by type: that loss alone, args its constructor's (no weights, no
      // terms: CREDIT's load_loss builds cls(**args) and nothing else), validated with it too
      if (!kElementwiseLosses.count(type) && !kTensorLosses.count(type))
        fail(where("loss.type"), ": '", printable(type), "' is not implemented (base, a registry loss: mse, mae, msle, "
             "huber, logcosh, xtanh, xsigmoid, spectral, power, covmse; or the flat keys loss.training_loss, "
             "use_latitude_weights, use_variable_weights)");
      known(l, "loss.", {"type", "args"});
      c->training_loss.name = type;
      loss_parameters(c->training_loss, l["args"], "loss.args");
      c->validation_loss = c->training_loss;
      c->has_validation_loss = true;
      return;
    }
    if (!c->twin_chain.empty() || !c->twin_block.empty())
      fail(where(c->twin_block.empty() ? "postblocks" : c->twin_block), ": the target twin y_target_processed "
           "is read only by CREDIT's loss.type base (this config's loss has the flat keys)");
    c->training_loss = loss_spec(l, "training_loss");
    c->has_validation_loss = (bool)l["validation_loss"];
    if (c->has_validation_loss) c->validation_loss = loss_spec(l, "validation_loss");
    c->use_latitude_weights = get<bool>(l["use_latitude_weights"], "loss.use_latitude_weights", false);
    if (l["latitude_weights"])
      c->warnings.push_back(where("loss.latitude_weights") +
                            ": ignored (wxe weighs rows by cos(latitude) of the data's own latitudes)");
    c->use_variable_weights = get<bool>(l["use_variable_weights"], "loss.use_variable_weights", false);
    const YAML::Node vw = l["variable_weights"];
    if (is_map(vw, "loss.variable_weights"))
      for (auto it = vw.begin(); it != vw.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        const std::string name = k.substr(k.rfind('/') + 1);  // "era5/prognostic/3d/T" or "T"
        const std::string key = "loss.variable_weights." + k;
        std::vector<double> w;
        if (it->second.IsSequence()) {  // one per level (CREDIT's form for 3D variables)
          for (size_t i = 0; i < it->second.size(); ++i) w.push_back(ranged<double>(it->second[i], key, 1.0, 0, 1e30));
          if (w.empty()) fail(where(key), ": an empty list");
        } else {
          w.push_back(ranged<double>(it->second, key, 1.0, 0, 1e30));
        }
        c->variable_weights[name] = w;
      }
    ensemble_rules(c->training_loss.name, "loss.training_loss");
    // the whole-tensor losses return one number: VariableTotalLoss2D (the weights) indexes an
    // elementwise loss by channel (CREDIT fails so)
    for (const char* which : {"training_loss", "validation_loss"}) {
      const LossSpec& ls = std::string(which) == "training_loss" ? c->training_loss : c->validation_loss;
      if ((std::string(which) == "training_loss" || c->has_validation_loss) && kTensorLosses.count(ls.name) &&
          (c->use_latitude_weights || c->use_variable_weights))
        fail(where(std::string("loss.") + which), ": '", ls.name, "' returns one number and CREDIT's weighted loss "
             "(use_latitude_weights / use_variable_weights) needs an elementwise one; set both false");
    }
    // VariableTotalLoss2D's terms: only with the weights (else CREDIT builds a plain loss without them)
    const bool spectral = get<bool>(l["use_spectral_loss"], "loss.use_spectral_loss", false);
    const bool power = get<bool>(l["use_power_loss"], "loss.use_power_loss", false);
    if ((spectral || power) && !c->use_latitude_weights && !c->use_variable_weights) {
      c->warnings.push_back(where(spectral ? "loss.use_spectral_loss" : "loss.use_power_loss") +
                            ": ignored, as CREDIT does without use_latitude_weights or use_variable_weights (the "
                            "terms belong to its weighted loss)");
    } else if (spectral || power) {
      for (const char* k : {"spectral_lambda_reg", "spectral_wavenum_init"})
        if (!l[k]) fail(where(std::string("loss.") + k), ": missing (use_spectral_loss / use_power_loss read it)");
      c->spectral_term = spectral;
      c->power_term = power;
      c->spectral_lambda = ranged<double>(l["spectral_lambda_reg"], "loss.spectral_lambda_reg", 0.1, -1e30, 1e30);
      c->spectral_wavenum = ranged<int64_t>(l["spectral_wavenum_init"], "loss.spectral_wavenum_init", 20, 0, 1 << 30);
    }
  }
};

}  // namespace

CreditConfig read_credit_config(const std::string& path, bool training) {
  CreditConfig c;
  c.file = path;
  c.dir = fs::path(path).parent_path().string();
  if (c.dir.empty()) c.dir = ".";
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail(path, ": cannot read the config");
  } catch (const YAML::Exception& e) {
    fail(path, ": malformed YAML: ", e.what());
  }
  if (!root.IsMap()) fail(path, ": not a YAML mapping");
  try {
    if (is_gen1(root)) root = gen1_to_gen2(root, path, c.warnings);
  } catch (const YAML::Exception& e) {
    fail(path, ": ", e.what());
  }
  Reader r{path, &c};
  r.training = training;
  try {
    r.known(root, "", {"save_loc", "seed", "data", "validation_data", "trainer", "loss", "preblocks", "postblocks",
                       "model", "predict", "pbs", "inference", "metrics"});
    if (root["model"])
      c.warnings.push_back(path + ": model: ignored (the model is the --model ONNX export; its architecture is in the graph)");
    c.seed = r.get<uint64_t>(root["seed"], "seed", 0);
    c.save_loc = r.path(root["save_loc"], "save_loc");
    r.data(root["data"]);
    r.validation_data(root["validation_data"], root["data"]);
    r.preblocks(root["preblocks"]);
    r.postblocks(root["postblocks"]);
    if (training) {
      r.trainer(root["trainer"]);
      r.loss(root["loss"]);
    }
  } catch (const YAML::Exception& e) {
    fail(path, ": ", e.what());
  }
  return c;
}

}  // namespace wxe
