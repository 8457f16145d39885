#include "train/loss_plot.h"

#include <plplot.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>
#include <mutex>

#include "engine/ir/error.h"
#include "engine/io/file_util.h"

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

bool has_device(const char* name) {
  int n = 128;
  std::vector<const char*> menu(n), names(n);
  const char** pm = menu.data();
  const char** pn = names.data();
  plgDevs(&pm, &pn, &n);
  for (int i = 0; i < n; ++i)
    if (pn[i] && std::strcmp(pn[i], name) == 0) return true;
  return false;
}

// The legend (opaque, boxed) in the corner of the plot with the fewest curve points, so that
// it hides as little of the curves as possible.
void legend(double x0, double x1, double y0, double y1, std::initializer_list<const std::vector<PLFLT>*> xs,
            std::initializer_list<const std::vector<PLFLT>*> ys, bool validation) {
  const PLINT corners[4] = {PL_POSITION_TOP | PL_POSITION_RIGHT, PL_POSITION_TOP | PL_POSITION_LEFT,
                            PL_POSITION_BOTTOM | PL_POSITION_RIGHT, PL_POSITION_BOTTOM | PL_POSITION_LEFT};
  int count[4] = {0, 0, 0, 0};
  for (size_t s = 0; s < xs.size(); ++s) {
    const std::vector<PLFLT>&x = *xs.begin()[s], &y = *ys.begin()[s];
    for (size_t i = 0; i < x.size(); ++i) {
      const double u = (x[i] - x0) / (x1 - x0), v = (y[i] - y0) / (y1 - y0);
      const bool right = u > 0.55, left = u < 0.45, top = v > 0.75, bottom = v < 0.25;
      count[0] += top && right;
      count[1] += top && left;
      count[2] += bottom && right;
      count[3] += bottom && left;
    }
  }
  const int best = (int)(std::min_element(count, count + 4) - count);
  const int n = validation ? 2 : 1;
  PLINT opt[2] = {PL_LEGEND_LINE, PL_LEGEND_LINE}, text_colors[2] = {1, 1}, line_colors[2] = {2, 3},
        line_styles[2] = {1, 1};
  PLFLT line_widths[2] = {2, 2};
  const char* text[2] = {"training loss", "validation loss"};
  PLFLT w = 0, h = 0;
  pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, PL_POSITION_INSIDE | corners[best], 0.02, 0.03,
           0.08, 0, 1, 1, 0, 0, n, opt, 1.0, 1.0, 2.0, 0.0, text_colors, text, nullptr, nullptr, nullptr, nullptr,
           line_colors, line_styles, line_widths, nullptr, nullptr, nullptr, nullptr);
}

}  // namespace

void plot_loss_curve(const std::string& png_path, const std::string& title, const std::vector<double>& steps,
                     const std::vector<double>& loss, const std::vector<double>& val_steps,
                     const std::vector<double>& val_loss) {
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
  PlotPng png(png_path, 900, 560);
  plscol0(2, 31, 119, 180);    // training loss
  plscol0(3, 214, 39, 40);     // validation loss
  pladv(0);
  plvsta();
  plwind(x0, x1, y0, y1);
  plcol0(1);
  // whole steps on a short run (no "1.5" step ticks); PLplot's own spacing otherwise
  plbox("bcnst", x1 - x0 <= 10 ? 1 : 0, 0, log_y ? "bcnstvl" : "bcnstv", 0, 0);
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
  plwidth(1);
  legend(x0, x1, y0, y1, {&tx, &vx}, {&ty, &vy}, !vx.empty());
  png.finish();
}

static std::mutex& plplot_mutex() {  // PLplot keeps global state
  static std::mutex mu;
  return mu;
}

PlotPng::PlotPng(const std::string& png_path, int width, int height) : path_(png_path), lock_(plplot_mutex()) {
  WXE_CHECK(has_device("pngcairo"), png_path,
            ": PLplot has no pngcairo driver (install plplot-driver-cairo)");  // plinit would exit()
  file_ = std::make_unique<TempFile>(png_path, ".png");  // PLplot writes it by name; a fresh name, removed on error
  PLINT stream = 0;
  plmkstrm(&stream);  // a fresh stream per plot; plend1 frees it and returns to stream 0
  WXE_CHECK(stream >= 0, png_path, ": PLplot could not open a stream");
  plsdev("pngcairo");
  plsfnam(file_->name().c_str());
  plspage(0, 0, width, height, 0, 0);
  plscolbg(255, 255, 255);
  plscol0(1, 0, 0, 0);  // axes, labels
  plinit();
  open_ = true;
}

PlotPng::~PlotPng() {
  if (open_) plend1();
}

void PlotPng::finish() {
  plend1();
  open_ = false;
  struct stat st;
  WXE_CHECK(::stat(file_->name().c_str(), &st) == 0 && st.st_size > 0, path_,
            ": PLplot wrote nothing (is plplot-driver-cairo installed?)");
  file_->commit();
}

}  // namespace wxe
