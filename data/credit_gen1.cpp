// CREDIT's gen1 config schema rewritten as `credit convert` rewrites it (data/credit_gen1.h).
#include "data/credit_gen1.h"

#include <set>
#include <string>

#include "engine/ir/error.h"
#include "engine/io/json.h"

namespace wxe {

namespace {
const std::set<std::string> kGen1DataKeys = {
    "variables", "surface_variables", "dynamic_forcing_variables", "static_variables", "save_loc", "save_loc_surface",
    "save_loc_dynamic_forcing", "save_loc_static", "save_loc_diagnostic", "diagnostic_variables", "mean_path",
    "std_path", "train_years", "valid_years", "lead_time_periods", "scaler_type", "history_len", "valid_history_len",
    "dataset_type", "static_first", "skip_periods", "one_shot", "level_ids"};

}  // namespace

bool is_gen1(const YAML::Node& root) {
  const YAML::Node d = root["data"];
  if (!d || !d.IsMap() || d["source"]) return false;
  for (auto it = d.begin(); it != d.end(); ++it)
    if (kGen1DataKeys.count(it->first.as<std::string>())) return true;
  return false;
}

YAML::Node gen1_to_gen2(const YAML::Node& root, const std::string& file, std::vector<std::string>& warnings) {
  YAML::Node out = YAML::Clone(root);
  const YAML::Node d = root["data"];
  auto list = [&](const char* k) { return d[k] && d[k].IsSequence() ? d[k] : YAML::Node(YAML::NodeType::Sequence); };
  auto text = [&](const char* k) { return d[k] && d[k].IsScalar() ? d[k].Scalar() : std::string(); };
  auto group = [&](YAML::Node v3, YAML::Node v2, const std::string& path, bool time_format) {
    YAML::Node g;
    if (v3.size()) g["vars_3D"] = v3;
    g["vars_2D"] = v2;
    g["path"] = path;
    if (time_format) g["filename_time_format"] = "%Y";
    return g;
  };
  YAML::Node vars;
  const std::string prog_path = !text("save_loc").empty() ? text("save_loc") : text("save_loc_surface");
  vars["prognostic"] = group(list("variables"), list("surface_variables"), prog_path, true);
  if (list("dynamic_forcing_variables").size())
    vars["dynamic_forcing"] =
        group(YAML::Node(YAML::NodeType::Sequence), list("dynamic_forcing_variables"), text("save_loc_dynamic_forcing"), true);
  if (list("static_variables").size())
    vars["static"] = group(YAML::Node(YAML::NodeType::Sequence), list("static_variables"), text("save_loc_static"), false);
  if (list("diagnostic_variables").size())
    vars["diagnostic"] =
        group(YAML::Node(YAML::NodeType::Sequence), list("diagnostic_variables"), text("save_loc_diagnostic"), true);
  YAML::Node src;
  src["dataset_type"] = "local";
  src["level_coord"] = "level";
  if (d["level_ids"]) {
    src["levels"] = d["level_ids"];
  } else {
    static const int kDefault16[] = {10, 30, 40, 50, 60, 70, 80, 90, 95, 100, 105, 110, 120, 130, 136, 137};
    const YAML::Node m = root["model"];
    int n = 16;
    try {
      if (m && m.IsMap() && m["levels"]) n = m["levels"].as<int>();
    } catch (const YAML::Exception&) {
      fail(file, ": model.levels: bad value '", printable(YAML::Dump(m["levels"])), "'");
    }
    if (n < 0 || n > 16) fail(file, ": model.levels: ", n, " levels without data.level_ids (CREDIT's default has 16)");
    YAML::Node lv(YAML::NodeType::Sequence);
    for (int i = 0; i < n; ++i) lv.push_back(kDefault16[i]);
    src["levels"] = lv;
  }
  src["variables"] = vars;
  YAML::Node nd;
  nd["source"]["ERA5"] = src;
  auto year = [&](const char* k, size_t i, int dflt) {
    const YAML::Node y = d[k];
    try {
      return y && y.IsSequence() && y.size() == 2 ? y[i].as<int>() : dflt;
    } catch (const YAML::Exception&) {
      fail(file, ": data.", k, ": expected two years, found '", printable(YAML::Dump(y)), "'");
    }
  };
  int lead = 6;
  try {
    if (d["lead_time_periods"]) lead = d["lead_time_periods"].as<int>();
  } catch (const YAML::Exception&) {
    fail(file, ": data.lead_time_periods: bad value '", printable(YAML::Dump(d["lead_time_periods"])), "'");
  }
  nd["timestep"] = std::to_string(lead) + "h";
  nd["start_datetime"] = std::to_string(year("train_years", 0, 1979)) + "-01-01";
  nd["end_datetime"] = std::to_string(year("train_years", 1, 2018)) + "-12-31";
  if (d["history_len"]) nd["history_len"] = d["history_len"];
  // the other keys stay (backprop_on_timestep, ...); forecast lengths count from 1 in v2
  for (auto it = d.begin(); it != d.end(); ++it)
    if (!kGen1DataKeys.count(it->first.as<std::string>())) nd[it->first] = it->second;
  int fl = 0, vfl = 0;
  try {
    fl = d["forecast_len"] ? d["forecast_len"].as<int>() : 0;
    vfl = d["valid_forecast_len"] ? d["valid_forecast_len"].as<int>() : fl;
  } catch (const YAML::Exception&) {
    fail(file, ": data.forecast_len: bad value");
  }
  nd["forecast_len"] = fl + 1;
  nd["valid_forecast_len"] = vfl + 1;
  out["data"] = nd;
  YAML::Node vd = out["validation_data"];
  if (!vd || !vd.IsMap()) vd = YAML::Node(YAML::NodeType::Map);
  vd["start_datetime"] = std::to_string(year("valid_years", 0, 2018)) + "-01-01";
  vd["end_datetime"] = std::to_string(year("valid_years", 1, 2019)) + "-12-31";
  out["validation_data"] = vd;
  if (!text("mean_path").empty() || !text("std_path").empty()) {
    YAML::Node pb = out["preblocks"];
    if (!pb || !pb.IsMap()) pb = YAML::Node(YAML::NodeType::Map);
    YAML::Node norm;
    norm["type"] = "era5_normalizer";
    norm["args"]["mean_path"] = text("mean_path");
    norm["args"]["std_path"] = text("std_path");
    pb["per_step"]["norm"] = norm;
    out["preblocks"] = pb;
    if (text("std_path").find("residual") != std::string::npos)
      warnings.push_back(file + ": data.std_path: '" + text("std_path") +
                         "' looks like a residual (6 h difference) std; gen2 trains on absolute values (as `credit "
                         "convert` warns)");
  }
  warnings.push_back(file + ": data: CREDIT's gen1 flat schema, read as `credit convert` converts it (one source "
                            "ERA5, forecast_len + 1, validation_data from valid_years)");
  return out;
}


}  // namespace wxe
