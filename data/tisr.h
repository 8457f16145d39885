// Layer: data/ (CREDIT data formats), over engine/ only.
// CREDIT 2026's computed "tisr" source (dataset_type: "tisr"; credit/datasets/gen_2/tisr.py
// TISRDataset): top-of-atmosphere incident solar radiation in J m-2, the ERA5/IFS solar
// geometry (GraphCast's port) times a CMIP6 total-solar-irradiance table, integrated with the
// trapezoidal rule over (t - period, t] where the period is the source's timestep.
//
// Config (data.source.<name>): dataset_type: "tisr"; variables.dynamic_forcing.vars_2D:
// ['tisr'] (the only variable; its key is "<name>/dynamic_forcing/2d/tisr", a 2D dynamic
// forcing input, never a target); num_integration_steps (default 360); the grid, exactly one
// of latlon_grid_path or both lat_spec and lon_spec; the source's timestep (else
// data.timestep) is the integration period. (device only says where torch computes it.)
//
// Numerics are CREDIT's on the CPU in float32, operation by operation: the times of the
// N + 1 samples (int64, pandas), their Julian dates (float64, pandas' formula) rounded to
// float32 J2000 days, the orbital terms, TSI interpolation, zenith cosines and the trapezoid in
// float32; the 6-, 5- and 3-term dot products (a matmul in CREDIT: MKL sgemv) and the time sum
// (torch's cascade sum) in the orders this x86 build of torch (2.15, MKL, one thread as in
// CREDIT's DataLoader workers) uses. sin and cos are correctly rounded here where torch's are
// within 1 ulp; tests/tisr_test.cpp measures the difference against CREDIT's own output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace wxe {

// The config keys of a tisr source that change its values.
struct TisrOptions {
  // The integration period in seconds: TISRDataset passes the source's timestep
  // (data.source.<name>.timestep, else data.timestep), which CREDIT requires (no default).
  int64_t integration_period_s = 0;
  int num_integration_steps = 360;  // data.source.<name>.num_integration_steps
};

// A tisr source's grid. Rectangular: lat (ny values) and lon (nx values), the field row-major
// (ny, nx). Curvilinear: lat and lon per point (ny * nx each, row-major).
struct TisrGrid {
  int64_t ny = 0, nx = 0;
  bool curvilinear = false;
  std::vector<double> lat, lon;  // degrees (north, east); float32 values as CREDIT holds them
};

// One axis of lat_spec / lon_spec: [start, end, num_points], both ends included.
struct TisrAxisSpec {
  double start = 0, end = 0;
  int64_t num_points = 0;  // >= 1
};

// torch.linspace(start, end, n, dtype=float32) as this torch computes it (step in float32,
// start + step*i for the first half and end - step*(n-1-i) for the rest, each one fused
// multiply-add), which CREDIT's lat_spec / lon_spec grids are.
std::vector<float> credit_linspace_f32(double start, double end, int64_t n);

// lat_spec and lon_spec: a rectangular grid of torch.linspace axes (meshgrid, "ij").
TisrGrid tisr_grid_from_spec(const TisrAxisSpec& lat, const TisrAxisSpec& lon);

// latlon_grid_path: the first variable present of latitude, lat, XLAT, nav_lat and of
// longitude, lon, XLONG, nav_lon; size-1 dimensions dropped; both 1-D: a rectangular grid, both
// 2-D (of one shape): curvilinear; anything else an error naming the file. Values are read as
// stored (no scale_factor / _FillValue decoding) and rounded to float32, as CREDIT does.
TisrGrid tisr_grid_from_file(const std::string& path);

// TISR (J m-2) at time t (seconds since 1970 UTC, the end of the integration window) on a
// rectangular grid: lat.size() x lon.size() values, row-major. Latitudes must be in [-90, 90]
// and every coordinate finite (a wxe::Error naming the value); each is rounded to float32 as
// CREDIT's grid tensors are. The window's samples must fall in the TSI table's years
// [1850, 2299] (CREDIT's check; an error naming the time otherwise).
std::vector<float> credit_tisr(int64_t t, const std::vector<double>& lat, const std::vector<double>& lon,
                               const TisrOptions& o);
// The same on per-point coordinates (a curvilinear grid): lat.size() == lon.size() values.
std::vector<float> credit_tisr_points(int64_t t, const std::vector<double>& lat, const std::vector<double>& lon,
                                      const TisrOptions& o);
// On a TisrGrid of either kind: (ny, nx) values, row-major.
std::vector<float> credit_tisr(int64_t t, const TisrGrid& g, const TisrOptions& o);

// CREDIT's _get_tsi: the CMIP6 annual-mean TSI at 1 AU (W m-2) linearly interpolated at time
// t_us (microseconds since 1970) in float32, the year's fraction from pandas' calendar.
float credit_tsi(int64_t t_us);

}  // namespace wxe
