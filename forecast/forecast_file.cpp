#include "forecast/forecast_file.h"

#include <algorithm>
#include <cmath>

#include "data/credit_config.h"
#include "engine/ir/error.h"

namespace wxe {

namespace {

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

std::string list(const std::vector<std::string>& xs) {
  std::string s;
  for (const std::string& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::string FieldRef::label() const { return level < 0 ? var : var + "@" + num(level_value); }

int64_t parse_time_units(const std::string& units, const std::string& what) {
  const std::string pre = "hours since ";
  WXE_CHECK(units.compare(0, pre.size(), pre) == 0, what, ": time units '", units, "', expected 'hours since DATE'");
  std::string d = units.substr(pre.size());
  if (d.size() > 10 && d[10] == ' ') d[10] = 'T';
  return parse_datetime(d, what);
}

ForecastFile::ForecastFile(const std::string& path) : nc_(path) {
  for (const char* c : {"time", "latitude", "longitude"})
    WXE_CHECK(nc_.has(c), path, ": no coordinate '", c, "' (not a forecast file written by wxe forecast?)");
  init = parse_time_units(nc_.attr("time", "units"), path + ": time");
  lead_h = nc_.read("time");
  lat = nc_.read("latitude");
  lon = nc_.read("longitude");
  if (nc_.has("level")) {
    levels = nc_.read("level");
    level_units = nc_.attr("level", "units");
  }
  // the fields: every variable on (time, [level,] latitude, longitude)
  for (const std::string& v : nc_.variables()) {
    const std::vector<std::string> d = nc_.dims(v);
    const bool f2 = d == std::vector<std::string>{"time", "latitude", "longitude"};
    const bool f3 = d == std::vector<std::string>{"time", "level", "latitude", "longitude"};
    if (f2 || f3) variables.push_back(v);
  }
  WXE_CHECK(!variables.empty(), path, ": no variable on (time, [level,] latitude, longitude)");
}

int64_t ForecastFile::valid_time(int step) const { return init + (int64_t)std::llround(lead_h.at(step) * 3600.0); }

bool ForecastFile::is3d(const std::string& var) const { return nc_.dims(var).size() == 4; }

FieldRef ForecastFile::field_ref(const std::string& spec) const {
  FieldRef f;
  const size_t at = spec.find('@');
  f.var = spec.substr(0, at);
  if (std::find(variables.begin(), variables.end(), f.var) == variables.end())
    fail(path(), ": no variable '", f.var, "' (the file has ", list(variables), ")");
  std::vector<std::string> have;
  for (double l : levels) have.push_back(num(l));
  if (at == std::string::npos) {
    WXE_CHECK(!is3d(f.var), path(), ": variable '", f.var, "' has levels (", list(have), "): give ", f.var, "@LEVEL");
    return f;
  }
  WXE_CHECK(is3d(f.var), path(), ": variable '", f.var, "' has no levels (give ", f.var, " without @", spec.substr(at + 1), ")");
  char* end = nullptr;
  const std::string ls = spec.substr(at + 1);
  const double want = std::strtod(ls.c_str(), &end);
  WXE_CHECK(!ls.empty() && end && *end == '\0', "'", spec, "': the level '", ls, "' is not a number");
  for (size_t i = 0; i < levels.size(); ++i)
    if (std::fabs(levels[i] - want) < 1e-6 * std::max(1.0, std::fabs(want))) {
      f.level = (int)i;
      f.level_value = levels[i];
      return f;
    }
  fail(path(), ": variable '", f.var, "' has no level ", ls, " (levels: ", list(have), ")");
}

std::vector<FieldRef> ForecastFile::fields() const {
  std::vector<FieldRef> out;
  for (const std::string& v : variables) {
    if (!is3d(v)) {
      out.push_back({v, -1, 0});
      continue;
    }
    for (size_t i = 0; i < levels.size(); ++i) out.push_back({v, (int)i, levels[i]});
  }
  return out;
}

std::vector<double> ForecastFile::read(const FieldRef& f, int step) const {
  WXE_CHECK(step >= 0 && step < steps(), path(), ": variable '", f.var, "': no step ", step + 1, " (the file has ",
            steps(), " steps)");
  std::vector<size_t> start{(size_t)step}, count{1};
  if (f.level >= 0) {
    start.push_back((size_t)f.level);
    count.push_back(1);
  }
  start.insert(start.end(), {0, 0});
  count.insert(count.end(), {lat.size(), lon.size()});
  const std::vector<float> v = nc_.read_f32(f.var, start, count);
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace wxe
