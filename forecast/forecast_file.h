// Layer: library (forecast/), over data/ and engine/.
// Reading back a forecast file as ForecastWriter (data/era5.h) writes it: time (hours since
// init), level, latitude, longitude, and the fields (time, [level,] latitude, longitude).
// `wxe plot` and `wxe score` read forecasts through it. Errors name the file and the variable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/netcdf.h"

namespace wxe {

// One field of a forecast file: a variable, at one level for a 3D variable.
struct FieldRef {
  std::string var;
  int level = -1;           // index into ForecastFile::levels; -1: a 2D variable
  double level_value = 0;   // levels[level]
  std::string label() const;  // "T@500", "SP"
};

class ForecastFile {
 public:
  explicit ForecastFile(const std::string& path);
  const std::string& path() const { return nc_.path(); }
  int64_t init = 0;            // seconds since 1970 (UTC), from time's units
  std::vector<double> lead_h;  // per step: hours since init
  std::vector<double> levels, lat, lon;
  std::string level_units;
  std::vector<std::string> variables;  // the fields, in the file's order
  int steps() const { return (int)lead_h.size(); }
  int64_t valid_time(int step) const;  // step 0-based
  bool is3d(const std::string& var) const;
  std::string units(const std::string& var) const { return nc_.attr(var, "units"); }
  std::string long_name(const std::string& var) const { return nc_.attr(var, "long_name"); }
  // "NAME" or "NAME@LEVEL": an error naming the file when the variable or level is absent, or
  // a level is missing for a 3D variable (or given for a 2D one).
  FieldRef field_ref(const std::string& spec) const;
  // Every field of the file: each 2D variable, each 3D variable at each level.
  std::vector<FieldRef> fields() const;
  // The field at step (0-based) as (latitude, longitude), row-major, float32 widened.
  std::vector<double> read(const FieldRef& f, int step) const;

 private:
  NcFile nc_;
};

// "hours since 2020-12-31 18:00:00" -> 2020-12-31T18 in seconds since 1970; errors name `what`.
int64_t parse_time_units(const std::string& units, const std::string& what);

}  // namespace wxe
