// CREDIT's geopotential_diagnostic postblock (data/geopotential.h) against CREDIT's own module
// (tests/data/geopotential from models/make_geopotential_fixture.py): the geopotential and, by
// torch autograd of sum(phi * g), its gradients by T, q and sp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "data/geopotential.h"
#include "engine/io/npy.h"
#include "tests/test_util.h"

namespace wxe {
namespace {
using namespace test;

bool has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

double at(const Tensor& t, int64_t i) {
  return t.dtype == DType::F64 ? t.data<double>()[i] : (double)t.data<float>()[i];
}

// |got - want| <= rel * max|want| elementwise (an all-zero gradient, b = 0 at the top, too)
void expect_close(const std::vector<double>& got, const Tensor& want, double rel, const std::string& what) {
  ASSERT_EQ((int64_t)got.size(), want.numel()) << what;
  double m = 0;
  for (int64_t i = 0; i < want.numel(); ++i) m = std::max(m, std::fabs(at(want, i)));
  const double tol = std::max(rel * m, 1e-12);
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_NEAR(got[i], at(want, i), tol) << what << " element " << i;
}

TEST(Geopotential, MatchesCreditsPostblockAndItsGradient) {
  const std::string dir = data_path("tests/data/geopotential/");
  struct Case {
    const char* name;
    std::vector<int64_t> levels;
    bool flip;
  };
  std::vector<int64_t> low, top;
  for (int64_t l = 128; l <= 137; ++l) low.push_back(l);
  for (int64_t l = 1; l <= 10; ++l) top.push_back(l);
  for (const Case& c : {Case{"all", {}, true}, Case{"low10", low, true}, Case{"noflip", top, false}}) {
    auto in = [&](const char* k) { return read_npy(dir + c.name + "_" + k + ".npy"); };
    const Tensor T = in("T"), q = in("q"), sp = in("sp"), zs = in("zs"), g = in("g");
    GeopotentialSpec spec;
    spec.block = "postblocks.per_step.geopotential";
    spec.levels = c.levels;
    spec.flip = c.flip;
    const HybridLevels h = hybrid_levels(spec, dir);  // CREDIT's ERA5_Lev_Info.nc: the built-in table
    const int64_t L = T.dim(0), n = T.dim(1) * T.dim(2);
    ASSERT_EQ((int64_t)h.a.size(), L + 1) << c.name;
    std::vector<float> phi(L * n), gT(L * n, 0.f), gq(L * n, 0.f);
    std::vector<double> gsp(n);
    for (int64_t i = 0; i < n; ++i)
      geopotential_column(h, c.flip, zs.data<float>()[i], sp.data<float>()[i], T.data<float>() + i, q.data<float>() + i, n,
                          phi.data() + i, g.data<float>() + i, gT.data() + i, gq.data() + i, &gsp[i]);
    const std::vector<double> phid(phi.begin(), phi.end()), gTd(gT.begin(), gT.end()), gqd(gq.begin(), gq.end());
    // the arithmetic: CREDIT's module on float64 tensors (our float32 outputs' rounding only)
    expect_close(phid, in("phi"), 1e-7, std::string(c.name) + " phi");
    expect_close(gTd, in("gT"), 1e-6, std::string(c.name) + " dT");
    expect_close(gqd, in("gq"), 1e-6, std::string(c.name) + " dq");
    expect_close(gsp, in("gsp"), 1e-9, std::string(c.name) + " dsp");
    // and as CREDIT trains, on float32 tensors: within float32's rounding, which the near-cancelling
    // alpha (1 - pu / (pl - pu) log(pl / pu)) of the lowest levels amplifies
    expect_close(phid, in("phi32"), 2e-4, std::string(c.name) + " phi (float32)");
    expect_close(gTd, in("gT32"), 2e-2, std::string(c.name) + " dT (float32)");
    expect_close(gsp, in("gsp32"), 2e-2, std::string(c.name) + " dsp (float32)");
  }
}

TEST(Geopotential, LevelInfoFileErrorsNameTheBlock) {
  GeopotentialSpec spec;
  spec.block = "postblocks.per_step.geo";
  spec.level_info_file = "cesm_level_info.nc";
  EXPECT_TRUE(has(error_of([&] { hybrid_levels(spec, tmp_path("")); }),
                  "postblocks.per_step.geo.args.level_info_file: 'cesm_level_info.nc' is not beside the config"));
  spec.level_info_file = "ERA5_Lev_Info.nc";
  spec.levels = {136, 138};
  EXPECT_TRUE(has(error_of([&] { hybrid_levels(spec, tmp_path("")); }), "postblocks.per_step.geo.args.levels: level 139"));
}

}  // namespace
}  // namespace wxe

namespace wxe {
namespace {

// CREDIT's mslp_diagnostic (credit/postblock/mslp.py) on points in each of its branches
// (models/make_mslp_fixture.py): the value and its derivatives by sp and t, against the module
// run in float64 with torch autograd.
TEST(Mslp, MatchesCreditsTrenberthFormulaAndItsGradient) {
  const std::string dir = data_path("tests/data/mslp/");
  const Tensor sp = read_npy(dir + "sp.npy"), t = read_npy(dir + "t.npy"), zs = read_npy(dir + "zs.npy");
  const Tensor want = read_npy(dir + "mslp.npy"), wdsp = read_npy(dir + "dsp.npy"), wdt = read_npy(dir + "dt.npy");
  ASSERT_EQ(sp.numel(), 400);
  double worst = 0, worst_dsp = 0, worst_dt = 0, dt_scale = 0;
  for (int64_t i = 0; i < sp.numel(); ++i) dt_scale = std::max(dt_scale, (double)std::fabs(wdt.data<float>()[i]));
  int at_sea_level = 0;
  for (int64_t i = 0; i < sp.numel(); ++i) {
    double dsp = 0, dt = 0;
    const double m = mslp_trenberth(sp.data<float>()[i], t.data<float>()[i], zs.data<float>()[i], &dsp, &dt);
    at_sea_level += m == (double)sp.data<float>()[i];
    worst = std::max(worst, std::fabs(m - want.data<float>()[i]) / std::fabs(want.data<float>()[i]));
    worst_dsp = std::max(worst_dsp, std::fabs(dsp - wdsp.data<float>()[i]) / std::fabs(wdsp.data<float>()[i]));
    worst_dt = std::max(worst_dt, std::fabs(dt - wdt.data<float>()[i]) / dt_scale);
  }
  std::printf("mslp: worst relative %.2e, d/dsp %.2e, d/dt %.2e (of max |d/dt|), %d points at sea level\n", worst,
              worst_dsp, worst_dt, at_sea_level);
  EXPECT_LE(worst, 1e-6);
  EXPECT_LE(worst_dsp, 1e-6);
  EXPECT_LE(worst_dt, 1e-6);
  EXPECT_GE(at_sea_level, 20);  // the fixture's zs = 0 and |zs| < 5e-4 points
}

}  // namespace
}  // namespace wxe
