// compare_netcdf A.nc B.nc TOL VAR...: every VAR equal in shape in both files and within
// max abs difference TOL (relative to max |A| of that variable, at least 1). Exit 0/1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "data/netcdf.h"
#include "engine/ir/error.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: compare_netcdf A.nc B.nc TOL VAR...\n");
    return 2;
  }
  try {
    wxe::NcFile a(argv[1]), b(argv[2]);
    const double tol = std::atof(argv[3]);
    int bad = 0;
    for (int i = 4; i < argc; ++i) {
      if (a.shape(argv[i]) != b.shape(argv[i])) {
        std::fprintf(stderr, "%s: shapes differ\n", argv[i]);
        ++bad;
        continue;
      }
      std::vector<double> x = a.read(argv[i]), y = b.read(argv[i]);
      double diff = 0, scale = 1;
      for (size_t k = 0; k < x.size(); ++k) {
        diff = std::max(diff, std::fabs(x[k] - y[k]));
        scale = std::max(scale, std::fabs(x[k]));
      }
      std::printf("%s: max abs diff %.3g (scale %.3g)\n", argv[i], diff, scale);
      if (!(diff <= tol * scale)) ++bad;
    }
    return bad ? 1 : 0;
  } catch (const wxe::Error& e) {
    std::fprintf(stderr, "compare_netcdf: %s\n", e.what());
    return 1;
  }
}
