// Layer: data/ (CREDIT data formats), over engine/ only. Used by data/era5.cpp.
// bridgescaler's scaler files as CREDIT's bridgescaler_transform blocks read them, and the
// elementwise blocks' math (PointTransform::apply, data/credit_config.h).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/credit_config.h"
#include "data/quantile_scaler.h"

namespace wxe {

using Stats = std::pair<std::vector<double>, std::vector<double>>;  // mean, std per level (or one)
using Quantiles = std::map<std::string, std::shared_ptr<const QuantileScaler>>;

// Does a scaler block's `variables` select this scaler key? Full keys ("era5/prognostic/3d/T"),
// partial paths ("era5/prognostic") and, for a flat scaler file's bare names, the name; none
// listed: all (CREDIT's _parse_variable_selection).
bool selected(const std::vector<std::string>& sel, const std::string& key);
// Does a spatial_variables list select this key? (empty: none, unlike a scaler's variables)
bool selected_any(const std::vector<std::string>& sel, const std::string& key);

// A bridgescaler JSON (save_scaler_dict: {data_type: {source: {"source/field_type/3d/VAR": "<the
// scaler's own JSON text>"}}}, or a flat {VAR: {mean_x_, var_x_}}) into per-variable statistics
// of each side: side[0] input, side[1] target; quantile scalers into quant[0], quant[1] (null:
// a quantile scaler is an error). A flat file gives both sides. Within one side a variable must
// have one scaler.
void read_bridgescaler(const std::string& file, const std::vector<std::string>& sel, std::map<std::string, Stats> side[2],
                       Quantiles* quant = nullptr);

// A variable's scaler in a map read_bridgescaler filled: by its full key ("era5/prognostic/3d/T"),
// else by its name (a flat file's key, or a full key of another source name); two different ones
// by name are an error naming `file`. Null: none.
template <class V>
const V* find_scaler(const std::map<std::string, V>& m, const std::string& var_key, const std::string& file);

// The target side of a bridgescaler file: each variable's variance, the mean over its levels (CREDIT
// BaseLoss's inverse-variance weights), by the file's keys (look one up with find_scaler).
std::map<std::string, double> scaler_target_variances(const std::string& file);

}  // namespace wxe
