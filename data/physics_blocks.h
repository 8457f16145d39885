// Layer: data/ (CREDIT data formats), over engine/ only.
// CREDIT 2026's physics postblocks on one sample's fields (credit/postblock/conservation.py,
// wind_filter.py; credit/physics_core.py physics_hybrid_sigma_level; CREDIT's constants):
// tracer_fixer (clamps), global_mass_fixer (surface pressure scaled to keep the global dry-air
// mass of the step's input), global_water_fixer (precipitation scaled to close the global water
// budget), global_energy_fixer_updown (temperature carrying the global total-energy budget of the
// TOA and surface fluxes) and wind_artifact_filter (fields blended toward a Gaussian-smoothed copy
// near high wind speed). Computed in double from float32 inputs (CREDIT computes in float32: the
// results agree to float32 rounding, about 1e-6 relative).
//
// Fields are float arrays on the grid (h rows of latitude, w columns of longitude); a 3D field
// holds its L levels one after another (level l at [l * h * w]), top first, as CREDIT's data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/credit_config.h"

namespace wxe {

// The statics file of a fixer (save_loc_physics): the grid-cell areas and the hybrid coefficients.
struct SigmaGrid {
  int64_t h = 0, w = 0;
  std::vector<double> area;  // (h, w) m^2, as physics_core computes it
  std::vector<double> a, b;  // (levels + 1 with midpoint, else levels): pressure = a + b * sp (Pa)
  std::vector<double> phis;  // (h, w) surface geopotential (the energy fixer's), else empty
  bool midpoint = false;
  // the levels a 3D field must have: a's size less one (midpoint) or a's size (trapezoid)
  int64_t levels() const { return (int64_t)a.size() - (midpoint ? 1 : 0); }
};

// Reads the block's statics file; errors name the file, the block and the variable.
SigmaGrid read_sigma_grid(const PhysicsBlockSpec& s, const std::string& config_file);

// physics_core's cell area: |R^2 d sin(lat) d lon| with torch.gradient's differences (central
// inside, second order at the edges) along rows of lat2d and columns of lon2d (degrees), d lon
// wrapped to [-pi, pi). h and w at least 3.
std::vector<double> grid_area(const std::vector<double>& lon2d, const std::vector<double>& lat2d, int64_t h, int64_t w);

// tracer_fixer: n values clamped to lo and, where hi is not NaN, to hi (as torch.clamp: NaN stays),
// the bounds as float32.
void tracer_fix(float* p, int64_t n, double lo, double hi);
// global_mass_fixer: sp (h, w) scaled in place; q (levels) the prediction's, q0 and sp0 the input's.
void mass_fix(const SigmaGrid& g, const float* q, float* sp, const float* q0, const float* sp0);
// global_water_fixer: precip (h, w) scaled in place; seconds the step (lead_time_periods).
void water_fix(const SigmaGrid& g, double seconds, const float* q, const float* sp, float* precip, const float* evap,
               const float* q0, const float* sp0);

// global_energy_fixer_updown's fields: the prediction's (T corrected in place) and the input's.
struct EnergyFields {
  float* T = nullptr;
  const float *q = nullptr, *u = nullptr, *v = nullptr, *sp = nullptr;
  const float *T0 = nullptr, *q0 = nullptr, *u0 = nullptr, *v0 = nullptr, *sp0 = nullptr, *solin0 = nullptr;
  const float *toa_up_solar = nullptr, *olr = nullptr, *sfc_down_solar = nullptr, *sfc_up_solar = nullptr,
              *sfc_down_lw = nullptr, *sfc_up_lw = nullptr, *sh = nullptr, *lh = nullptr;
};
void energy_fix(const SigmaGrid& g, double seconds, const EnergyFields& f);

// wind_artifact_filter: the blend weight (h, w) from one level of u and v, and the smoothing
// kernel's two 1-D factors (latitude, longitude).
struct WindMask {
  int64_t h = 0, w = 0;
  std::vector<double> blend, k_lat, k_lon;
};
WindMask wind_mask(const PhysicsBlockSpec& s, const float* u, const float* v, int64_t h, int64_t w);
// One level of a field (h, w) blended in place toward its smoothed copy.
void wind_blend(const WindMask& m, bool preserve_amplitude, float* field);

}  // namespace wxe
