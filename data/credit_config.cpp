#include "data/credit_config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>

#include "engine/ir/error.h"

namespace fs = std::filesystem;

namespace wxe {

int64_t parse_datetime(const std::string& s, const std::string& what) {
  int Y = 0, M = 0, D = 0, h = 0, m = 0, sec = 0;
  char sep = 0;
  const int n = std::sscanf(s.c_str(), "%4d-%2d-%2d%c%2d:%2d:%2d", &Y, &M, &D, &sep, &h, &m, &sec);
  const bool ok = (n == 3 && s.size() == 10) || (n >= 5 && (sep == 'T' || sep == ' '));
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
  const int64_t n = i ? std::stoll(s.substr(0, i)) : 0;
  int64_t mult = 0;
  if (unit == "h" || unit == "hour" || unit == "hours") mult = 3600;
  else if (unit == "d" || unit == "day" || unit == "days") mult = 86400;
  else if (unit == "min" || unit == "t") mult = 60;
  else if (unit == "s") mult = 1;
  if (!n || !mult) fail(what, ": '", s, "' is not a timestep (such as 6h, 1d, 30min)");
  return n * mult;
}

namespace {

struct Reader {
  std::string file;
  CreditConfig* c;

  std::string where(const std::string& key) const { return file + ": " + key; }

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
      fail(where(key), ": bad value '", YAML::Dump(n), "'");
    }
  }
  std::vector<std::string> strings(const YAML::Node& n, const std::string& key) {
    if (!n || n.IsNull()) return {};
    if (!n.IsSequence()) fail(where(key), ": expected a list");
    return get<std::vector<std::string>>(n, key, {});
  }
  std::string path(const YAML::Node& n, const std::string& key) {
    std::string p = get<std::string>(n, key, "");
    if (p.empty()) return p;
    return fs::path(p).is_absolute() ? p : (fs::path(c->dir) / p).lexically_normal().string();
  }

  void group(const YAML::Node& n, const std::string& key, VarGroup& g) {
    if (!n || n.IsNull()) return;
    known(n, key + ".", {"vars_3D", "vars_2D", "path", "filename_time_format"});
    g.vars_3D = strings(n["vars_3D"], key + ".vars_3D");
    g.vars_2D = strings(n["vars_2D"], key + ".vars_2D");
    g.path = path(n["path"], key + ".path");
    const std::string tf = get<std::string>(n["filename_time_format"], key + ".filename_time_format", "");
    if (!tf.empty()) {  // CREDIT's form: the '*' of the path is the time in this format
      const size_t star = g.path.find('*');
      if (star == std::string::npos) fail(where(key + ".filename_time_format"), ": the path has no '*' to put it in");
      g.path.replace(star, 1, tf);
    }
    if (!g.empty() && g.path.empty()) fail(where(key + ".path"), ": missing");
  }

  void data(const YAML::Node& d) {
    if (!d || !d.IsMap()) fail(where("data"), ": missing");
    known(d, "data.", {"source", "start_datetime", "end_datetime", "valid_start_datetime", "valid_end_datetime",
                       "timestep", "history_len", "forecast_len", "valid_history_len", "valid_forecast_len",
                       "mean_path", "std_path", "scaler_path"});
    const YAML::Node src = d["source"];
    if (!src || !src.IsMap() || src.size() == 0) fail(where("data.source"), ": missing");
    if (src.size() != 1)
      fail(where("data.source"), ": ", src.size(), " sources; wxe reads one (several sources are not implemented)");
    c->source = src.begin()->first.as<std::string>();
    const std::string p = "data.source." + c->source;
    const YAML::Node s = src.begin()->second;
    known(s, p + ".", {"dataset_type", "level_coord", "levels", "variables", "history_len", "grid_type"});
    c->dataset_type = get<std::string>(s["dataset_type"], p + ".dataset_type", "local");
    if (c->dataset_type != "local")
      fail(where(p + ".dataset_type"), ": '", c->dataset_type, "' is not implemented (wxe reads 'local' netCDF/zarr files)");
    c->level_coord = get<std::string>(s["level_coord"], p + ".level_coord", "level");
    c->levels = get<std::vector<double>>(s["levels"], p + ".levels", {});
    const YAML::Node v = s["variables"];
    known(v, p + ".variables.", {"prognostic", "diagnostic", "dynamic_forcing", "static"});
    group(v["prognostic"], p + ".variables.prognostic", c->prognostic);
    group(v["diagnostic"], p + ".variables.diagnostic", c->diagnostic);
    group(v["dynamic_forcing"], p + ".variables.dynamic_forcing", c->dynamic_forcing);
    group(v["static"], p + ".variables.static", c->statics);
    if (c->prognostic.empty()) fail(where(p + ".variables.prognostic"), ": no variables");
    const bool any3d = !c->prognostic.vars_3D.empty() || !c->diagnostic.vars_3D.empty() ||
                       !c->dynamic_forcing.vars_3D.empty() || !c->statics.vars_3D.empty();
    if (any3d && c->levels.empty()) fail(where(p + ".levels"), ": 3D variables need a list of levels");
    c->history_len = get<int>(s["history_len"], p + ".history_len", get<int>(d["history_len"], "data.history_len", 1));
    if (c->history_len < 1) fail(where("data.history_len"), ": ", c->history_len, " must be at least 1");
    if (d["valid_history_len"] && get<int>(d["valid_history_len"], "data.valid_history_len", 1) != c->history_len)
      fail(where("data.valid_history_len"), ": differs from history_len ", c->history_len,
           " (the model takes one window length)");
    c->forecast_len = get<int>(d["forecast_len"], "data.forecast_len", 1);
    if (c->forecast_len < 1) fail(where("data.forecast_len"), ": must be at least 1");
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
    c->mean_nc = path(d["mean_path"], "data.mean_path");
    c->std_nc = path(d["std_path"], "data.std_path");
    c->scaler_json = path(d["scaler_path"], "data.scaler_path");
  }

  void preblocks(const YAML::Node& pb) {
    if (!pb || pb.IsNull()) return;
    for (auto it = pb.begin(); it != pb.end(); ++it) {
      const std::string p = "preblocks." + it->first.as<std::string>();
      const YAML::Node b = it->second;
      known(b, p + ".", {"type", "args"});
      const std::string type = get<std::string>(b["type"], p + ".type", "");
      const YAML::Node a = b["args"];
      if (type == "bridgescaler_transform") {
        known(a, p + ".args.", {"scaler_path", "variables", "method"});
        const std::string method = get<std::string>(a["method"], p + ".args.method", "transform");
        if (method != "transform") fail(where(p + ".args.method"), ": '", method, "' is not implemented");
        if (!strings(a["variables"], p + ".args.variables").empty())
          fail(where(p + ".args.variables"), ": a subset of variables is not implemented (leave it empty)");
        c->scaler_json = path(a["scaler_path"], p + ".args.scaler_path");
      } else if (type == "era5_normalizer") {
        known(a, p + ".args.", {"mean_path", "std_path"});
        c->mean_nc = path(a["mean_path"], p + ".args.mean_path");
        c->std_nc = path(a["std_path"], p + ".args.std_path");
      } else {
        fail(where(p + ".type"), ": preblock '", type, "' is not implemented (bridgescaler_transform, era5_normalizer)");
      }
    }
  }

  void trainer(const YAML::Node& t) {
    if (!t || t.IsNull()) return;
    known(t, "trainer.", {"learning_rate", "weight_decay", "use_scheduler", "scheduler", "grad_max_norm",
                          "grad_accum_every", "use_ema", "ema_decay", "train_batch_size", "valid_batch_size",
                          "batches_per_epoch", "valid_batches_per_epoch", "epochs", "num_epoch", "load_weights",
                          "load_optimizer", "load_scaler", "load_scheduler", "seed", "type", "mode", "amp",
                          "save_backup_weights", "save_best_weights", "thread_workers", "valid_thread_workers"});
    c->learning_rate = get<double>(t["learning_rate"], "trainer.learning_rate", c->learning_rate);
    c->weight_decay = get<double>(t["weight_decay"], "trainer.weight_decay", c->weight_decay);
    c->grad_max_norm = get<double>(t["grad_max_norm"], "trainer.grad_max_norm", c->grad_max_norm);
    c->grad_accum_every = get<int>(t["grad_accum_every"], "trainer.grad_accum_every", 1);
    c->train_batch_size = get<int>(t["train_batch_size"], "trainer.train_batch_size", 1);
    if (c->grad_accum_every < 1) fail(where("trainer.grad_accum_every"), ": must be at least 1");
    if (c->train_batch_size < 1) fail(where("trainer.train_batch_size"), ": must be at least 1");
    c->use_ema = get<bool>(t["use_ema"], "trainer.use_ema", false);
    c->ema_decay = get<double>(t["ema_decay"], "trainer.ema_decay", c->ema_decay);
    c->batches_per_epoch = get<int64_t>(t["batches_per_epoch"], "trainer.batches_per_epoch", 0);
    c->valid_batches_per_epoch = get<int64_t>(t["valid_batches_per_epoch"], "trainer.valid_batches_per_epoch", 0);
    c->epochs = get<int64_t>(t["epochs"], "trainer.epochs", get<int64_t>(t["num_epoch"], "trainer.num_epoch", 1));
    c->load_weights = get<bool>(t["load_weights"], "trainer.load_weights", false);
    c->load_optimizer = get<bool>(t["load_optimizer"], "trainer.load_optimizer", false);
    c->seed = get<uint64_t>(t["seed"], "trainer.seed", c->seed);
    if (get<bool>(t["amp"], "trainer.amp", false)) fail(where("trainer.amp"), ": mixed precision is not implemented");
    c->use_scheduler = get<bool>(t["use_scheduler"], "trainer.use_scheduler", false);
    const YAML::Node s = t["scheduler"];
    if (c->use_scheduler) {
      known(s, "trainer.scheduler.", {"scheduler_type", "warmup_steps", "total_steps", "min_lr"});
      const std::string type = get<std::string>(s["scheduler_type"], "trainer.scheduler.scheduler_type", "");
      if (type != "linear-warmup-cosine")
        fail(where("trainer.scheduler.scheduler_type"), ": '", type, "' is not implemented (linear-warmup-cosine)");
      c->warmup_steps = get<int64_t>(s["warmup_steps"], "trainer.scheduler.warmup_steps", 0);
      c->total_steps = get<int64_t>(s["total_steps"], "trainer.scheduler.total_steps", 0);
      c->min_lr = get<double>(s["min_lr"], "trainer.scheduler.min_lr", 0.0);
    }
  }

  void loss(const YAML::Node& l) {
    if (!l || l.IsNull()) return;
    known(l, "loss.", {"training_loss", "validation_loss", "use_latitude_weights", "latitude_weights",
                       "use_variable_weights", "variable_weights", "use_power_loss", "use_spectral_loss"});
    const std::string tl = get<std::string>(l["training_loss"], "loss.training_loss", "mse");
    if (tl != "mse") fail(where("loss.training_loss"), ": '", tl, "' is not implemented (mse)");
    if (get<bool>(l["use_power_loss"], "loss.use_power_loss", false)) fail(where("loss.use_power_loss"), ": not implemented");
    if (get<bool>(l["use_spectral_loss"], "loss.use_spectral_loss", false))
      fail(where("loss.use_spectral_loss"), ": not implemented");
    c->use_latitude_weights = get<bool>(l["use_latitude_weights"], "loss.use_latitude_weights", false);
    c->use_variable_weights = get<bool>(l["use_variable_weights"], "loss.use_variable_weights", false);
    const YAML::Node vw = l["variable_weights"];
    if (vw && vw.IsMap())
      for (auto it = vw.begin(); it != vw.end(); ++it) {
        const std::string k = it->first.as<std::string>();
        const std::string name = k.substr(k.rfind('/') + 1);  // "era5/prognostic/3d/T" or "T"
        c->variable_weights[name] = get<double>(it->second, "loss.variable_weights." + k, 1.0);
      }
  }
};

}  // namespace

CreditConfig read_credit_config(const std::string& path) {
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
  Reader r{path, &c};
  try {
    r.known(root, "", {"save_loc", "seed", "data", "trainer", "loss", "preblocks", "model", "predict", "pbs"});
    c.seed = r.get<uint64_t>(root["seed"], "seed", 0);
    c.save_loc = r.path(root["save_loc"], "save_loc");
    r.data(root["data"]);
    r.preblocks(root["preblocks"]);
    r.trainer(root["trainer"]);
    r.loss(root["loss"]);
  } catch (const YAML::Exception& e) {
    fail(path, ": ", e.what());
  }
  return c;
}

}  // namespace wxe
