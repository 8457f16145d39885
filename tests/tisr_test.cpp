// CREDIT 2026's computed tisr source (data/tisr.h) against CREDIT's own TISRDataset output
// (tests/data/tisr, models/make_tisr_fixture.py): the grids (torch.linspace specs, a 1-D and a
// curvilinear netCDF grid) value for value, the fields within 1e-6 of each field's maximum, and
// the errors for bad input.
#include <gtest/gtest.h>
#include <netcdf.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <map>

#include "data/tisr.h"
#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "engine/ir/error.h"
#include "test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/tisr/");

// What tests/tisr_test.cpp holds CREDIT's fields to: max |wxe - CREDIT| / max |CREDIT|.
constexpr double kRelTol = 1e-6;

Json cases() { return parse_json(slurp(kDir + "cases.json"), kDir + "cases.json"); }

int64_t num(const Json& j, const char* k) { return parse_int64(j.get(k)->s, k); }
double real(const Json& j) { return parse_double(j.s, "number"); }

std::vector<float> npy_floats(const std::string& name) {
  Tensor t = read_npy(kDir + name);
  EXPECT_EQ(t.dtype, DType::F32) << name;
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TisrGrid grid_of(const Json& entry) {
  if (const Json* f = entry.get("file")) return tisr_grid_from_file(kDir + f->s);
  auto axis = [](const Json& s) { return TisrAxisSpec{real(s.items[0]), real(s.items[1]), parse_int64(s.items[2].s, "n")}; };
  return tisr_grid_from_spec(axis(*entry.get("lat_spec")), axis(*entry.get("lon_spec")));
}

}  // namespace

// The grids CREDIT builds: lat_spec / lon_spec through torch.linspace (float32, fused
// multiply-adds; 7 latitudes and 72 longitudes are inexact steps), the netCDF grids read
// with CREDIT's names and squeezing, every value as CREDIT's float32 tensor holds it.
TEST(Tisr, GridsAreCredits) {
  const Json idx = cases();
  const Json& grids = *idx.get("grids");
  ASSERT_GE(grids.keys.size(), 7u);
  for (size_t g = 0; g < grids.keys.size(); ++g) {
    SCOPED_TRACE(grids.keys[g]);
    const TisrGrid grid = grid_of(grids.items[g]);
    const std::vector<float> lat = npy_floats("lat_" + grids.keys[g] + ".npy");  // (ny, nx) meshgrid
    const std::vector<float> lon = npy_floats("lon_" + grids.keys[g] + ".npy");
    ASSERT_EQ(int64_t(lat.size()), grid.ny * grid.nx);
    EXPECT_EQ(grid.curvilinear, grids.keys[g] == "grid_2d.nc");
    for (int64_t i = 0; i < grid.ny; ++i)
      for (int64_t j = 0; j < grid.nx; ++j) {
        const int64_t p = i * grid.nx + j;
        EXPECT_EQ(float(grid.curvilinear ? grid.lat[p] : grid.lat[i]), lat[p]) << i << "," << j;
        EXPECT_EQ(float(grid.curvilinear ? grid.lon[p] : grid.lon[j]), lon[p]) << i << "," << j;
      }
  }
}

// The axes of multi_source_data.yml's lat_spec [90, -90, 192] and lon_spec [0, 358.75, 288]
// as CREDIT's _get_latlon_grid makes them: 54 latitudes differ from start + step * i rounded
// twice (torch fuses the multiply-add).
TEST(Tisr, LinspaceIsTorchs) {
  EXPECT_EQ(credit_linspace_f32(90, -90, 192), npy_floats("axis_lat_90_-90_192.npy"));
  EXPECT_EQ(credit_linspace_f32(0, 358.75, 288), npy_floats("axis_lon_0_358.75_288.npy"));
  EXPECT_EQ(credit_linspace_f32(12.5, -3, 1), std::vector<float>{12.5f});
}

// Every case of the fixture: seasons and hours, a leap day, before 2000, past 2014 and both
// ends of the TSI table, year-crossing windows, 1 h / 360 (the default), 3 h / 1080 and
// 6 h / 2160 integrations, a step of 514285714 us (1 h / 7), one step, and grids of 1, 5, 35,
// 42, 144 and 504 points (each of torch's summation paths).
TEST(Tisr, MatchesCreditsTisrDataset) {
  const Json idx = cases();
  const Json& grids = *idx.get("grids");
  std::map<std::string, TisrGrid> grid;
  for (size_t g = 0; g < grids.keys.size(); ++g) grid[grids.keys[g]] = grid_of(grids.items[g]);
  const Json& cs = *idx.get("cases");
  ASSERT_GE(cs.items.size(), 19u);
  double worst = 0;
  int64_t exact = 0, total = 0;
  for (const Json& c : cs.items) {
    const std::string name = c.get("name")->s;
    SCOPED_TRACE(name);
    TisrOptions o;
    o.integration_period_s = num(c, "timestep_s");
    o.num_integration_steps = static_cast<int>(num(c, "num_integration_steps"));
    const TisrGrid& g = grid.at(c.get("grid")->s);
    const std::vector<float> want = npy_floats(name + ".npy");
    const std::vector<float> got = credit_tisr(num(c, "unix_s"), g, o);
    ASSERT_EQ(got.size(), want.size());
    double vmax = 0, dmax = 0;
    for (size_t p = 0; p < want.size(); ++p) {
      vmax = std::max(vmax, std::fabs(double(want[p])));
      dmax = std::max(dmax, std::fabs(double(got[p]) - double(want[p])));
      exact += got[p] == want[p];
      EXPECT_GE(got[p], 0.0f) << p;
    }
    total += want.size();
    ASSERT_GT(vmax, 0);
    EXPECT_EQ(vmax, real(*c.get("max")));
    EXPECT_LE(dmax / vmax, kRelTol) << "max |diff| " << dmax << " J m-2 of max " << vmax;
    worst = std::max(worst, dmax / vmax);
  }
  EXPECT_GE(exact, total * 4 / 5);  // 83 %: the rest differ by an ulp or two (torch's sin and cos)
  std::printf("[ tisr ] worst max|wxe - CREDIT| / max|CREDIT| %.3g; %lld of %lld values bit-identical\n", worst,
              (long long)exact, (long long)total);
}

// Polar night and day: no sun at 90S in June, at 90N in December; the pole's TISR under the
// midnight sun does not depend on longitude.
TEST(Tisr, PolesAndSymmetry) {
  TisrOptions o;
  o.integration_period_s = 3600;
  const int64_t june = 1592740800;  // 2020-06-21T12:00:00
  const std::vector<float> v = credit_tisr(june, {90, 0, -90}, {0, 90, 180, 270}, o);
  for (int j = 0; j < 4; ++j) {
    EXPECT_GT(v[j], 1.5e6f);
    EXPECT_EQ(v[8 + j], 0.0f);
  }
  // at 90N cos(float32 latitude) is -4.4e-8, not 0: the longitudes differ by no more than that
  for (int j = 1; j < 4; ++j) EXPECT_NEAR(v[j], v[0], 1e-6 * v[0]);
}

TEST(Tisr, TsiTable) {
  // the table's own mid-year values come back (w = 0 or 1 at 1850.5 + i)
  const int64_t y2000_mid = (946684800LL + 183 * 86400) * 1000000;  // 2000-07-02T00:00, 2000.5 (leap year)
  EXPECT_NEAR(credit_tsi(y2000_mid), 1361.5f, 2.0f);
  EXPECT_NE(error_of([] { credit_tsi(-3786825600LL * 1000000 - 1); }).find("1849-12-31T23:59:59"), std::string::npos);
  EXPECT_NE(error_of([] { credit_tsi(10413792000LL * 1000000); }).find("2300-01-01T00:00:00"), std::string::npos);
}

// CREDIT raises for a window that reaches before 1850 (the fixture records its message); wxe
// names the first such sample time and the table's years.
TEST(Tisr, WindowOutsideTheTsiTable) {
  const Json idx = cases();
  const Json& e = idx.get("errors")->items.at(0);
  EXPECT_NE(e.get("credit_error")->s.find("outside the TSI data range"), std::string::npos);
  TisrOptions o;
  o.integration_period_s = num(e, "timestep_s");
  o.num_integration_steps = 2160;
  const std::string msg = error_of([&] { credit_tisr(num(e, "unix_s"), {0.0}, {0.0}, o); });
  EXPECT_NE(msg.find("1849-12-31T18:00:00"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1850, 2299]"), std::string::npos) << msg;
  // the last accepted window ends in 2299; 2300-01-01T00:00 itself is outside
  o.integration_period_s = 3600;
  o.num_integration_steps = 4;
  EXPECT_EQ(error_of([&] { credit_tisr(10413792000LL - 3600, {0.0}, {0.0}, o); }), "<no error>");
  EXPECT_NE(error_of([&] { credit_tisr(10413792000LL, {0.0}, {0.0}, o); }).find("2300-01-01T00:00:00"),
            std::string::npos);
}

TEST(Tisr, BadInputsNameTheValue) {
  TisrOptions o;
  o.integration_period_s = 3600;
  const int64_t t = 1622505600;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto err = [&](const std::vector<double>& lat, const std::vector<double>& lon) {
    return error_of([&] { credit_tisr(t, lat, lon, o); });
  };
  EXPECT_EQ(err({0, 90.5}, {0}), "tisr: latitude 90.5 (index 1) is not in [-90, 90]");
  EXPECT_EQ(err({-91}, {0}), "tisr: latitude -91 (index 0) is not in [-90, 90]");
  EXPECT_EQ(err({nan}, {0}), "tisr: latitude nan (index 0) is not finite");
  EXPECT_EQ(err({0}, {1, inf}), "tisr: longitude inf (index 1) is not finite");
  EXPECT_EQ(err({0}, {-inf}), "tisr: longitude -inf (index 0) is not finite");
  EXPECT_NE(err({}, {0}).find("0 latitudes"), std::string::npos);
  EXPECT_EQ(error_of([&] { credit_tisr_points(t, {0, 95}, {0, 0}, o); }),
            "tisr: latitude 95 (index 1) is not in [-90, 90]");
  EXPECT_NE(error_of([&] { credit_tisr_points(t, {0, 1}, {0}, o); }).find("2 latitudes and 1 longitudes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { credit_tisr(INT64_MAX, {0}, {0}, o); }).find("out of range"), std::string::npos);
  TisrOptions bad = o;
  bad.num_integration_steps = 0;
  EXPECT_NE(error_of([&] { credit_tisr(t, {0}, {0}, bad); }).find("num_integration_steps is 0"), std::string::npos);
  bad = o;
  bad.integration_period_s = 0;
  EXPECT_NE(error_of([&] { credit_tisr(t, {0}, {0}, bad); }).find("integration period"), std::string::npos);
  EXPECT_NE(error_of([] { credit_linspace_f32(90, -90, 0); }).find("num_points is 0"), std::string::npos);
  EXPECT_NE(error_of([] { tisr_grid_from_spec({95, -90, 3}, {0, 10, 2}); }).find("latitude 95"), std::string::npos);
  EXPECT_NE(error_of([&] { tisr_grid_from_spec({90, -90, 3}, {0, inf, 2}); }).find("not finite"), std::string::npos);
  EXPECT_NE(error_of([] { tisr_grid_from_file(kDir + "nonexistent.nc"); }).find("nonexistent.nc"), std::string::npos);
}

// latlon_grid_path files CREDIT cannot use: no recognised names; a 1-D latitude with 2-D
// longitudes; 2-D coordinates of different shapes; a latitude outside [-90, 90].
TEST(Tisr, GridFileErrors) {
  auto write = [](const std::string& name, const std::vector<std::pair<std::string, std::vector<size_t>>>& vars,
                  double value) {
    const std::string path = tmp_path(name);
    int nc = -1;
    EXPECT_EQ(nc_create(path.c_str(), NC_CLOBBER, &nc), NC_NOERR);
    std::map<size_t, int> dims;
    for (const auto& v : vars) {
      std::vector<int> ids;
      for (size_t n : v.second) {
        if (!dims.count(n)) nc_def_dim(nc, ("d" + std::to_string(n)).c_str(), n, &dims[n]);
        ids.push_back(dims[n]);
      }
      int id = -1;
      nc_def_var(nc, v.first.c_str(), NC_DOUBLE, (int)ids.size(), ids.data(), &id);
    }
    nc_enddef(nc);
    for (const auto& v : vars) {
      int id = -1;
      nc_inq_varid(nc, v.first.c_str(), &id);
      size_t n = 1;
      for (size_t d : v.second) n *= d;
      std::vector<double> vals(n, value);
      nc_put_var_double(nc, id, vals.data());
    }
    nc_close(nc);
    return path;
  };
  std::string p = write("tisr_names.nc", {{"y", {3}}, {"x", {4}}}, 1.0);
  EXPECT_EQ(error_of([&] { tisr_grid_from_file(p); }),
            p + ": no latitude variable for the tisr grid (CREDIT's names: latitude, lat, XLAT, nav_lat)");
  p = write("tisr_dims.nc", {{"lat", {3}}, {"lon", {3, 4}}}, 1.0);
  EXPECT_NE(error_of([&] { tisr_grid_from_file(p); }).find("(1-D) and 'lon' (2-D)"), std::string::npos);
  p = write("tisr_shapes.nc", {{"nav_lat", {3, 4}}, {"nav_lon", {4, 3}}}, 1.0);
  EXPECT_EQ(error_of([&] { tisr_grid_from_file(p); }), p + ": 'nav_lat' is 3 x 4 but 'nav_lon' is 4 x 3");
  p = write("tisr_range.nc", {{"latitude", {1, 3}}, {"longitude", {5}}}, 91.0);
  EXPECT_EQ(error_of([&] { tisr_grid_from_file(p); }),
            p + ": latitude value 91 (index 0) is not in [-90, 90]");
  p = write("tisr_ok.nc", {{"latitude", {1, 3}}, {"longitude", {5}}}, 45.0);  // (1, 3): squeezed to 1-D
  const TisrGrid g = tisr_grid_from_file(p);
  EXPECT_FALSE(g.curvilinear);
  EXPECT_EQ(g.ny, 3);
  EXPECT_EQ(g.nx, 5);
}
