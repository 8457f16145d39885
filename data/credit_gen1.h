// Layer: data/ (CREDIT data formats), over engine/ only. Used by data/credit_config.cpp.
// CREDIT's gen1 (v1) flat data schema, rewritten as `credit convert` rewrites it (credit/cli/
// _convert.py): one source ERA5 (dataset_type local, level_coord level, levels from
// data.level_ids or the first model.levels of CREDIT's 16 default model levels), the paths with
// filename_time_format %Y, the years as datetimes, validation_data from valid_years, the timestep
// from lead_time_periods, forecast_len and valid_forecast_len one more (v1 counted from 0), the
// mean/std netCDF files as an era5_normalizer preblock. Unlike `credit convert`, history_len is
// kept (the model's input window).
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace wxe {

// A config in the gen1 schema: a data section with gen1's flat keys and no source.
bool is_gen1(const YAML::Node& root);
// The gen2 config `credit convert` would write; a warning line is appended to `warnings`. Errors
// name `file` and the key.
YAML::Node gen1_to_gen2(const YAML::Node& root, const std::string& file, std::vector<std::string>& warnings);

}  // namespace wxe
