// What wxe forecast writes beyond the targets, as CREDIT's output does: the variables the
// postblocks compute (geopotential_diagnostic) and one level axis for sources with different
// levels. Oracles: data/geopotential.h's column (checked against CREDIT's module in
// geopotential_test.cpp) on the file's own values, and the values written.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "data/credit_config.h"
#include "data/era5.h"
#include "data/geopotential.h"
#include "data/netcdf.h"
#include "forecast/forecast.h"
#include "test_util.h"
#include "tests/tiny_forecast.h"

using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/era5_tiny");

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// era5_tiny's config with text inserted before `before` (paths made absolute: the copy lives elsewhere)
std::string config_with(const std::string& name, const std::string& before, const std::string& text) {
  std::string c = era5_tiny_config(name);
  std::string y = slurp(c);
  const size_t at = y.find(before);
  EXPECT_NE(at, std::string::npos) << before;
  y.insert(at, text);
  spit(c, y);
  return c;
}

const char* kGeopotential = R"(postblocks:
  per_step:
    reconstruct:
      type: reconstruct
    scaler:
      type: bridgescaler_transform
      args:
        scaler_path: "SCALER"
        method: inverse_transform
    geopotential:
      type: geopotential_diagnostic
      args:
        output_name: era5/computed_diagnostic/3d/geopotential
        surface_geopotential_var: era5/static/2d/LSM
        surface_pressure_var: era5/prognostic/2d/SP
        temperature_var: era5/prognostic/3d/T
        specific_humidity_var: era5/prognostic/3d/U
        levels: [136, 137]
)";

std::string geopotential_config(const std::string& name, std::string block = kGeopotential) {
  block.replace(block.find("SCALER"), 6, kDir + "/scaler.json");
  return config_with(name, "trainer:", block);
}

// A forecast of the tiny WXFormer with CREDIT's geopotential_diagnostic postblock: the file holds
// `geopotential` on the levels of T, equal to the block's arithmetic on the file's own T, "q" (U
// here: any 3D variable), SP and the raw static (LSM standing in for the surface geopotential).
TEST(ForecastOutput, ComputedGeopotentialFromTheForecastsOwnValues) {
  const ForecastArgs a = tiny_forecast(geopotential_config("geo_forecast"), tmp_path("geo_forecast.nc"));
  ASSERT_EQ(run_forecast(a), 0);
  NcFile f(a.output);
  ASSERT_TRUE(f.has("geopotential"));
  EXPECT_EQ(f.dims("geopotential"), (std::vector<std::string>{"time", "level", "latitude", "longitude"}));
  EXPECT_EQ(f.attr("geopotential", "units"), "m**2 s**-2");
  NcFile st(kDir + "/static.nc");
  const std::vector<float> lsm = st.read_f32("LSM", {0, 0}, {32, 64});
  GeopotentialSpec spec;
  spec.levels = {136, 137};
  const HybridLevels h = hybrid_levels(spec, kDir);
  const size_t n = 32 * 64;
  for (size_t k = 0; k < 2; ++k) {
    auto read = [&](const char* v, bool is3d) {
      return is3d ? f.read_f32(v, {k, 0, 0, 0}, {1, 2, 32, 64}) : f.read_f32(v, {k, 0, 0}, {1, 32, 64});
    };
    const std::vector<float> T = read("T", true), U = read("U", true), SP = read("SP", false);
    const std::vector<float> got = read("geopotential", true);
    std::vector<float> want(2 * n);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      geopotential_column(h, true, lsm[i], SP[i], T.data() + i, U.data() + i, (int64_t)n, want.data() + i);
      for (size_t l = 0; l < 2; ++l) worst = std::max(worst, (double)std::fabs(got[l * n + i] - want[l * n + i]));
    }
    EXPECT_EQ(worst, 0.0) << "step " << k;
  }
}

// Its errors name the block's argument: a variable the config lacks, half levels that do not fit.
TEST(ForecastOutput, GeopotentialErrorsNameTheArgument) {
  std::string b = kGeopotential;
  b.replace(b.find("era5/prognostic/3d/U"), 20, "era5/prognostic/3d/Q");
  std::string e = error_of([&] { Era5Data d(read_credit_config(geopotential_config("geo_noq", b), false)); });
  EXPECT_TRUE(has(e, "postblocks.per_step.geopotential.args.specific_humidity_var: 'era5/prognostic/3d/Q' is not a 3D "
                     "predicted variable")) << e;
  b = kGeopotential;
  b.erase(b.find("        levels: [136, 137]\n"));
  e = error_of([&] { Era5Data d(read_credit_config(geopotential_config("geo_nolevels", b), false)); });
  EXPECT_TRUE(has(e, "postblocks.per_step.geopotential.args.level_info_file: 138 half levels for the 2 levels of "
                     "'era5/prognostic/3d/T'")) << e;
}

// A local source without `levels`: CREDIT takes every level of its first file's level
// coordinate (the first, sorted, of its first field type's files); a file without that
// coordinate is an error naming it.
TEST(ForecastOutput, LevelsFromTheFilesWhenTheConfigListsNone) {
  // (no scaler: era5_tiny's has T and U on the config's two levels, the files hold three)
  std::string y = slurp(era5_tiny_config("no_levels", {{"      levels: [500, 850]\n", ""}}));
  y.erase(y.find("preblocks:"), y.find("trainer:") - y.find("preblocks:"));
  const std::string c = tmp_path("no_levels2.yml");
  spit(c, y);
  Era5Data d(read_credit_config(c));
  EXPECT_EQ(d.config().sources[0].levels, (std::vector<double>{300, 500, 850}));
  EXPECT_EQ(d.input_channels().size(), 9u);  // T, U on three levels, SP, LSM, tsi
  const Tensor x = d.input(parse_datetime("2020-12-31T06", "t"));
  EXPECT_EQ(x.dim(1), 9);
  const std::string bad = era5_tiny_config("no_levels_coord", {{"      levels: [500, 850]\n", ""},
                                                                {"level_coord: \"level\"", "level_coord: \"plev\""}});
  const std::string e = error_of([&] { Era5Data x(read_credit_config(bad)); });
  EXPECT_TRUE(has(e, "data.source.era5.levels: missing, and ") && has(e, "era5_2020.nc (whose levels CREDIT would take) "
                                                                        "has no coordinate 'plev'")) << e;
}

// Two sources with different levels in one forecast file: the level axis their union
// (ascending), each variable NaN at the levels its source lacks (CREDIT's output aligns so).
TEST(ForecastOutput, SourcesWithDifferentLevelsShareTheUnion) {
  std::string y = slurp(era5_tiny_config("two_levels"));
  const std::string src = y.substr(y.find("    era5:"), y.find("  start_datetime") - y.find("    era5:"));
  std::string upper = src;  // a second source: U on 850 only, from the same files (the first: T)
  upper.replace(upper.find("    era5:"), 9, "    upper:");
  upper.replace(upper.find("[500, 850]"), 10, "[850]");
  std::string lower = src;
  lower.replace(lower.find("\"T\", \"U\""), 8, "\"T\"");
  upper.replace(upper.find("\"T\", \"U\""), 8, "\"U\"");
  // the second source: only its prognostic U (no SP, tp, tsi, LSM twice)
  upper = upper.substr(0, upper.find("          vars_2D")) + "          path: \"" + kDir + "/era5_%Y.*\"\n";
  y.replace(y.find(src), src.size(), lower + upper);
  y.erase(y.find("preblocks:"), y.find("trainer:") - y.find("preblocks:"));  // era5_tiny's scaler has U on 2 levels
  const std::string c = tmp_path("two_levels2.yml");
  spit(c, y);
  Era5Data d(read_credit_config(c, false));
  (void)d.input(parse_datetime("2020-12-31T18", "t"));
  const auto& chans = d.target_channels();
  Tensor out(DType::F32, {1, (int64_t)chans.size(), 1, 32, 64});
  for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = (float)i;
  const std::string path = tmp_path("two_levels.nc");
  {
    ForecastWriter w(path, d, parse_datetime("2020-12-31T18", "t"), 1);
    w.write(0, out);
    w.close();
  }
  NcFile f(path);
  EXPECT_EQ(f.read("level"), (std::vector<double>{500, 850}));
  int upper_u = -1;
  for (size_t k = 0; k < chans.size(); ++k)
    if (chans[k].var == "U") upper_u = (int)k;
  ASSERT_GE(upper_u, 0);
  const std::vector<float> u = f.read_f32("U", {0, 0, 0, 0}, {1, 2, 32, 64});
  for (size_t i = 0; i < 2048; ++i) {
    ASSERT_TRUE(std::isnan(u[i])) << i;  // 500: not upper's
    ASSERT_EQ(u[2048 + i], out.data<float>()[upper_u * 2048 + i]) << i;
  }
  const std::vector<float> t = f.read_f32("T", {0, 0, 0, 0}, {1, 2, 32, 64});
  EXPECT_EQ(t[5], out.data<float>()[5]);
  EXPECT_EQ(t[2048 + 5], out.data<float>()[2048 + 5]);
}

}  // namespace
