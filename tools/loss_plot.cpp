#include "tools/loss_plot.h"

#include <plplot.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "engine/error.h"

namespace wxe {

namespace {

// Finite positive values only on a log axis; log10 of them when `log_y`.
void series(const std::vector<double>& xs, const std::vector<double>& ys, bool log_y, std::vector<PLFLT>& px,
            std::vector<PLFLT>& py) {
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) {
    if (!std::isfinite(ys[i]) || (log_y && ys[i] <= 0)) continue;
    px.push_back(xs[i]);
    py.push_back(log_y ? std::log10(ys[i]) : ys[i]);
  }
}

}  // namespace

void plot_loss_curve(const std::string& png_path, const std::string& title, const std::vector<double>& steps,
                     const std::vector<double>& loss, const std::vector<double>& val_steps,
                     const std::vector<double>& val_loss) {
  static std::mutex mu;  // PLplot keeps global state
  std::lock_guard<std::mutex> lock(mu);
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* v : {&loss, &val_loss})
    for (double y : *v)
      if (std::isfinite(y)) {
        lo = std::min(lo, y);
        hi = std::max(hi, y);
      }
  WXE_CHECK(std::isfinite(lo), png_path, ": no finite loss to plot");
  const bool log_y = lo > 0 && hi / lo > 20;
  std::vector<PLFLT> tx, ty, vx, vy;
  series(steps, loss, log_y, tx, ty);
  series(val_steps, val_loss, log_y, vx, vy);
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& [xs, ys] : {std::make_pair(&tx, &ty), std::make_pair(&vx, &vy)})
    for (size_t i = 0; i < xs->size(); ++i) {
      x0 = std::min(x0, (*xs)[i]);
      x1 = std::max(x1, (*xs)[i]);
      y0 = std::min(y0, (*ys)[i]);
      y1 = std::max(y1, (*ys)[i]);
    }
  if (x1 <= x0) x1 = x0 + 1;
  const double pad = y1 > y0 ? 0.05 * (y1 - y0) : (log_y ? 0.1 : 0.05 * std::max(std::fabs(y0), 1e-12));
  y0 -= pad;
  y1 += pad;
  const std::string tmp = png_path + ".tmp" + std::to_string(getpid()) + ".png";
  PLINT stream = 0;
  plmkstrm(&stream);
  WXE_CHECK(stream >= 0, png_path, ": PLplot could not open a stream");
  plsdev("pngcairo");
  plsfnam(tmp.c_str());
  plspage(0, 0, 900, 560, 0, 0);
  plscolbg(255, 255, 255);
  plscol0(1, 0, 0, 0);         // axes, labels
  plscol0(2, 31, 119, 180);    // training loss
  plscol0(3, 214, 39, 40);     // validation loss
  plinit();
  plcol0(1);
  plenv(x0, x1, y0, y1, 0, log_y ? 20 : 0);
  pllab("optimizer step", log_y ? "loss (log scale)" : "loss", title.c_str());
  plwidth(2);
  plcol0(2);
  if (tx.size() > 1) plline((PLINT)tx.size(), tx.data(), ty.data());
  else if (!tx.empty()) plpoin(1, tx.data(), ty.data(), 4);
  if (!vx.empty()) {
    plcol0(3);
    plpoin((PLINT)vx.size(), vx.data(), vy.data(), 4);
    if (vx.size() > 1) plline((PLINT)vx.size(), vx.data(), vy.data());
  }
  // legend, by hand in the top right corner (plot coordinates)
  const double lx = x0 + 0.72 * (x1 - x0), ly = y0 + 0.93 * (y1 - y0), dy = 0.06 * (y1 - y0);
  PLFLT seg_x[2] = {lx, lx + 0.06 * (x1 - x0)};
  PLFLT seg_y[2] = {ly, ly};
  plcol0(2);
  plline(2, seg_x, seg_y);
  plcol0(1);
  plptex(seg_x[1] + 0.01 * (x1 - x0), ly, 1, 0, 0, "training loss");
  if (!vx.empty()) {
    seg_y[0] = seg_y[1] = ly - dy;
    plcol0(3);
    plline(2, seg_x, seg_y);
    plcol0(1);
    plptex(seg_x[1] + 0.01 * (x1 - x0), ly - dy, 1, 0, 0, "validation loss");
  }
  plend1();
  FILE* f = std::fopen(tmp.c_str(), "rb");
  WXE_CHECK(f, png_path, ": PLplot wrote nothing (is plplot-driver-cairo installed?)");
  std::fclose(f);
  if (std::rename(tmp.c_str(), png_path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(png_path, ": cannot write the loss curve");
  }
}

}  // namespace wxe
