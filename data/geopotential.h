// Layer: data/ (CREDIT data formats), over engine/ only.
// CREDIT's geopotential_diagnostic postblock (credit/postblock/geopotential.py): geopotential
// (m2 s-2) on hybrid sigma-pressure model levels from the surface geopotential, surface pressure,
// temperature and specific humidity in physical units, integrated hydrostatically from the
// surface with virtual temperature (CREDIT's constants Rd 287.06, Rv 461.51), each level's value
// at its centre (ECMWF's alpha). Computed in double from float32 inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/credit_config.h"

namespace wxe {

// The a (Pa) and b coefficients at a column's interfaces, top first: levels + 1 of them.
struct HybridLevels {
  std::vector<double> a, b;
};

// The coefficients the block names: its level_info_file (beside the config, or a path; CREDIT's
// own ERA5_Lev_Info.nc is built in: ECMWF's L137 table), the half levels of its `levels` as
// CREDIT selects them (lv - 1 for each level lv, then the last level's), else all of them.
HybridLevels hybrid_levels(const GeopotentialSpec& g, const std::string& config_dir);

// One column of L = h.a.size() - 1 levels, each array's level j at [j * stride] (file order,
// pressure growing with j when flip, CREDIT's flip_vertical): phi = geopotential. With gphi
// (d loss / d phi), also accumulates d loss / d T, q into gT, gq and d loss / d sp into *gsp.
// phi may be null (the backward only).
void geopotential_column(const HybridLevels& h, bool flip, double zs, double sp, const float* T, const float* q,
                         int64_t stride, float* phi, const float* gphi = nullptr, float* gT = nullptr,
                         float* gq = nullptr, double* gsp = nullptr);

// CREDIT's mslp_diagnostic (credit/postblock/mslp.py): mean sea-level pressure (Pa) from surface
// pressure sp (Pa), near-surface temperature t (K) and surface geopotential zs (m2 s-2) by the
// simplified Trenberth et al. (1993) formula, CREDIT's constants (Rd 287.05, g 9.80665, lapse
// rate 0.0065 K/m, the 290.5 K and 255 K branches); sp itself where the surface is at sea level
// (|zs / g| < 1e-4 m). In double; with dsp and dt, also d mslp / d sp and d mslp / d t.
double mslp_trenberth(double sp, double t, double zs, double* dsp = nullptr, double* dt = nullptr);

}  // namespace wxe
