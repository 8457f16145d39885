#include "forecast/plot.h"

#include <plplot.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "data/credit_config.h"
#include "engine/ir/error.h"
#include "forecast/forecast_file.h"
#include "forecast/score.h"
#include "train/loss_plot.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

// cmap1: a sequential palette (dark blue, teal, green, yellow) or a diverging one (blue,
// white, red)
void palette(bool diverging) {
  if (diverging) {
    PLFLT pos[5] = {0, 0.25, 0.5, 0.75, 1}, r[5] = {0.13, 0.57, 1, 0.96, 0.7}, g[5] = {0.4, 0.77, 1, 0.65, 0.09},
          b[5] = {0.67, 0.87, 1, 0.51, 0.17};
    plscmap1n(256);
    plscmap1l(1, 5, pos, r, g, b, nullptr);
  } else {
    PLFLT pos[5] = {0, 0.25, 0.5, 0.75, 1}, r[5] = {0.27, 0.23, 0.13, 0.37, 0.99}, g[5] = {0.0, 0.32, 0.57, 0.79, 0.91},
          b[5] = {0.33, 0.55, 0.55, 0.38, 0.14};
    plscmap1n(256);
    plscmap1l(1, 5, pos, r, g, b, nullptr);
  }
}

std::string hours(double h) {
  char b[32];
  std::snprintf(b, sizeof b, "%+g h", h);
  return b;
}

std::string when(int64_t t) {  // "2021-01-01 06:00 UTC"
  std::string s = format_datetime(t).substr(0, 16);
  s[10] = ' ';
  return s + " UTC";
}

}  // namespace

void draw_maps(const std::string& png_path, const std::vector<MapPanel>& panels) {
  WXE_CHECK(!panels.empty(), png_path, ": no field to draw");
  PlotPng png(png_path, 900, 470 * (int)panels.size());
  plssub(1, (PLINT)panels.size());
  for (const MapPanel& p : panels) {
    const size_t ny = p.lat.size(), nx = p.lon.size();
    WXE_ASSERT(p.field.size() == ny * nx && nx >= 2 && ny >= 2);
    // rows by ascending latitude; cell edges half a grid step beyond the first and last points
    std::vector<size_t> rows(ny);
    std::iota(rows.begin(), rows.end(), 0);
    std::sort(rows.begin(), rows.end(), [&](size_t a, size_t b) { return p.lat[a] < p.lat[b]; });
    const double dlat = (p.lat[rows.back()] - p.lat[rows[0]]) / (double)(ny - 1), dlon = (p.lon[nx - 1] - p.lon[0]) / (double)(nx - 1);
    const double x0 = p.lon[0] - dlon / 2, x1 = p.lon[nx - 1] + dlon / 2;
    const double y0 = p.lat[rows[0]] - dlat / 2, y1 = p.lat[rows.back()] + dlat / 2;
    double lo = INFINITY, hi = -INFINITY;
    for (double v : p.field)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    WXE_CHECK(std::isfinite(lo), png_path, ": ", p.title, ": no finite value to draw");
    if (p.diverging) hi = std::max(std::max(std::fabs(lo), std::fabs(hi)), 1e-30), lo = -hi;
    if (hi <= lo) hi = lo + std::max(std::fabs(lo) * 1e-6, 1e-12);
    std::vector<PLFLT> cells(nx * ny);
    std::vector<PLFLT*> cols(nx);
    for (size_t i = 0; i < nx; ++i) {
      cols[i] = cells.data() + i * ny;
      for (size_t j = 0; j < ny; ++j) {
        const double v = p.field[rows[j] * nx + i];
        cols[i][j] = std::isfinite(v) ? v : lo;
      }
    }
    palette(p.diverging);
    pladv(0);
    plvpor(0.1, 0.85, 0.12, 0.88);
    plwind(x0, x1, std::max(y0, -90.0), std::min(y1, 90.0));
    plimage((const PLFLT* const*)cols.data(), (PLINT)nx, (PLINT)ny, x0, x1, y0, y1, lo, hi, x0, x1, std::max(y0, -90.0),
            std::min(y1, 90.0));
    plcol0(1);
    plwidth(1);
    plmap(nullptr, "globe", x0, x1, -90, 90);  // coastlines (libplplot-data's globe.shp)
    plbox("bcnst", 60, 2, "bcnstv", 30, 3);
    plschr(0, 0.9);
    pllab("longitude (degrees east)", "latitude", p.title.c_str());
    plschr(0, 1.0);
    // the colour bar beside the map: the palette from lo to hi, labelled with the units
    std::vector<PLFLT> bar(128);
    for (size_t k = 0; k < bar.size(); ++k) bar[k] = lo + (hi - lo) * (double)k / (double)(bar.size() - 1);
    const PLFLT* bar_cols[2] = {bar.data(), bar.data()};  // plimage draws nothing of one column
    plvpor(0.87, 0.895, 0.12, 0.88);
    plwind(0, 1, lo, hi);
    plimage(bar_cols, 2, (PLINT)bar.size(), 0, 1, lo, hi, lo, hi, 0, 1, lo, hi);
    plcol0(1);
    plbox("bc", 0, 0, "bcmstv", 0, 0);
    plmtex("r", 5.6, 0.5, 0.5, p.units.c_str());
  }
  png.finish();
}

int run_plot(const PlotArgs& a) {
  WXE_CHECK(!a.vars.empty(), "plot: give at least one --var NAME[@LEVEL]");
  WXE_CHECK(!a.output.empty(), "plot: -o OUT.png is required");
  WXE_CHECK(a.minus.empty() || a.minus_truth.empty(), "plot: --minus and --minus-truth exclude each other");
  const fs::path out(a.output);
  WXE_CHECK(out.parent_path().empty() || fs::is_directory(out.parent_path()), a.output, ": no folder ",
            out.parent_path().string());
  ForecastFile ff(a.forecast);
  std::vector<FieldRef> refs;
  for (const std::string& v : a.vars) refs.push_back(ff.field_ref(v));
  WXE_CHECK(a.all_steps || (a.step >= 1 && a.step <= ff.steps()), a.forecast, ": --step ", a.step, ": the file has ",
            ff.steps(), " steps (1..", ff.steps(), ")");
  std::unique_ptr<ForecastFile> other;
  if (!a.minus.empty()) {
    other = std::make_unique<ForecastFile>(a.minus);
    WXE_CHECK(other->lat == ff.lat && other->lon == ff.lon, a.minus, ": its grid is not the one of ", a.forecast);
  }
  std::unique_ptr<Truth> truth;
  if (!a.minus_truth.empty()) truth = std::make_unique<Truth>(a.minus_truth, "");
  std::vector<int> steps;
  if (a.all_steps)
    for (int k = 1; k <= ff.steps(); ++k) steps.push_back(k);
  else
    steps.push_back(a.step);
  for (int k : steps) {
    const int s = k - 1;
    const int64_t valid = ff.valid_time(s);
    std::vector<MapPanel> panels;
    for (const FieldRef& f : refs) {
      MapPanel p;
      p.field = ff.read(f, s);
      p.lat = ff.lat;
      p.lon = ff.lon;
      p.units = ff.units(f.var);
      std::string name = f.level >= 0 ? f.var + " at " + f.label().substr(f.var.size() + 1) + " " + ff.level_units : f.var;
      if (other) {
        const FieldRef g = other->field_ref(f.label());
        int so = -1;
        for (int j = 0; j < other->steps(); ++j)
          if (other->valid_time(j) == valid) so = j;
        WXE_CHECK(so >= 0, a.minus, ": variable '", f.var, "': no step valid at ", format_datetime(valid));
        const std::vector<double> b = other->read(g, so);
        for (size_t i = 0; i < p.field.size(); ++i) p.field[i] -= b[i];
        name += " minus " + fs::path(a.minus).filename().string();
        p.diverging = true;
      }
      if (truth) {
        const int ch = truth->channel(f);
        WXE_CHECK(ch >= 0, a.minus_truth, ": no target variable ", f.label(), " (of ", a.forecast, ")");
        const std::vector<double> t = truth->field(truth->at(valid), ch);
        WXE_CHECK(ff.lat == truth->data().lat() && ff.lon == truth->data().lon(), a.forecast,
                  ": its grid is not the data's of ", a.minus_truth);
        for (size_t i = 0; i < p.field.size(); ++i) p.field[i] -= t[i];
        name += " minus truth";
        p.diverging = true;
      }
      p.title = name + ", valid " + when(valid) + " (" + hours(ff.lead_h[s]) + " from " + when(ff.init) + ")";
      panels.push_back(std::move(p));
    }
    const std::string path =
        a.all_steps ? ((out.parent_path() / out.stem()).string() + "_step" + std::to_string(k) + out.extension().string())
                    : a.output;
    draw_maps(path, panels);
    std::printf("plot: %s\n", path.c_str());
  }
  return 0;
}

void plot_score_lines(const std::string& png_path, const std::string& field, const std::string& units,
                      const std::vector<ScoreSeries>& series) {
  static const int colours[6][3] = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {255, 127, 14}, {148, 103, 189}, {140, 86, 75}};
  PlotPng png(png_path, 1350, 420);
  for (int c = 0; c < 6; ++c) plscol0(2 + c, colours[c][0], colours[c][1], colours[c][2]);
  plssub(3, 1);
  const char* names[3] = {"RMSE", "bias", "ACC"};
  for (int panel = 0; panel < 3; ++panel) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const ScoreSeries& s : series) {
      const std::vector<double>& ys = panel == 0 ? s.rmse : panel == 1 ? s.bias : s.acc;
      for (size_t i = 0; i < s.lead_h.size(); ++i) {
        x0 = std::min(x0, s.lead_h[i]);
        x1 = std::max(x1, s.lead_h[i]);
        if (std::isfinite(ys[i])) y0 = std::min(y0, ys[i]), y1 = std::max(y1, ys[i]);
      }
    }
    if (!std::isfinite(y0)) y0 = 0, y1 = 1;
    if (panel == 0) y0 = std::min(y0, 0.0);
    if (panel == 1) y0 = std::min(y0, 0.0), y1 = std::max(y1, 0.0);
    if (panel == 2) y1 = std::max(y1, 1.0);
    if (x1 <= x0) x0 -= 1, x1 += 1;
    const double pad = y1 > y0 ? 0.08 * (y1 - y0) : std::max(std::fabs(y0) * 0.1, 1e-6);
    pladv(0);
    plvsta();
    plwind(x0 - 0.03 * (x1 - x0), x1 + 0.03 * (x1 - x0), y0 - pad, y1 + pad);
    plcol0(1);
    plbox("bcnstg", 0, 0, "bcnstvg", 0, 0);
    const std::string ylab = std::string(names[panel]) + (panel < 2 && !units.empty() ? " (" + units + ")" : "");
    pllab("lead time (hours)", ylab.c_str(), (field + ": " + names[panel]).c_str());
    plwidth(2);
    for (size_t m = 0; m < series.size(); ++m) {
      const ScoreSeries& s = series[m];
      const std::vector<double>& ys = panel == 0 ? s.rmse : panel == 1 ? s.bias : s.acc;
      plcol0(2 + (int)(m % 6));
      plline((PLINT)s.lead_h.size(), s.lead_h.data(), ys.data());
      plpoin((PLINT)s.lead_h.size(), s.lead_h.data(), ys.data(), 17);
    }
    plwidth(1);
    if (panel == 0 && series.size() > 1) {
      const int n = (int)std::min<size_t>(series.size(), 6);
      std::vector<PLINT> opt(n, PL_LEGEND_LINE), tc(n, 1), lc(n), ls(n, 1);
      std::vector<PLFLT> lw(n, 2);
      std::vector<const char*> text(n);
      for (int i = 0; i < n; ++i) lc[i] = 2 + i, text[i] = series[i].name.c_str();
      PLFLT w = 0, h = 0;
      pllegend(&w, &h, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX, PL_POSITION_INSIDE | PL_POSITION_TOP | PL_POSITION_LEFT,
               0.02, 0.03, 0.08, 0, 1, 1, 0, 0, n, opt.data(), 1.0, 1.0, 2.0, 0.0, tc.data(), text.data(), nullptr, nullptr,
               nullptr, nullptr, lc.data(), ls.data(), lw.data(), nullptr, nullptr, nullptr, nullptr);
    }
  }
  png.finish();
}

void plot_scorecard(const std::string& png_path, const Scorecard& card) {
  const size_t nf = card.fields.size(), nl = card.lead_h.size(), nm = card.models.size();
  WXE_CHECK(nf && nl && nm, png_path, ": nothing to draw");
  PlotPng png(png_path, std::max(640, 220 + 100 * (int)nl), (int)nm * (120 + 44 * (int)nf));
  plssub(1, (PLINT)nm);
  palette(true);
  for (size_t m = 0; m < nm; ++m) {
    double vmax = 0.01;  // the colour scale: +-the largest |relative difference|, at least 1%
    for (auto& row : card.rel[m])
      for (double v : row)
        if (std::isfinite(v)) vmax = std::max(vmax, std::fabs(v));
    pladv(0);
    plvpor(0.22, 0.95, 0.16, 0.84);
    plwind(0, (double)nl, 0, (double)nf);
    for (size_t i = 0; i < nf; ++i)
      for (size_t j = 0; j < nl; ++j) {
        const double v = card.rel[m][i][j];
        const double y = (double)(nf - 1 - i);
        PLFLT xs[4] = {(double)j, (double)j + 1, (double)j + 1, (double)j}, ys[4] = {y, y, y + 1, y + 1};
        if (std::isfinite(v)) {
          plcol1(0.5 + 0.5 * v / vmax);
          plfill(4, xs, ys);
          char t[32];
          std::snprintf(t, sizeof t, "%+.1f%%%s", 100 * v, card.significant[m][i][j] ? "*" : "");
          plcol0(1);
          plschr(0, 0.9);
          plptex((double)j + 0.5, y + 0.5, 1, 0, 0.5, t);
          plschr(0, 1.0);
        }
        plcol0(1);
        plline(4, xs, ys);
      }
    plcol0(1);
    for (size_t i = 0; i < nf; ++i)
      plmtex("lv", 0.8, ((double)(nf - 1 - i) + 0.5) / (double)nf, 1.0, card.fields[i].c_str());
    for (size_t j = 0; j < nl; ++j) {
      char t[32];
      std::snprintf(t, sizeof t, "%+g h", card.lead_h[j]);
      plmtex("b", 1.5, ((double)j + 0.5) / (double)nl, 0.5, t);
    }
    const std::string title = card.models[m] + " vs " + card.reference + ": RMSE difference (blue better; * significant)";
    plmtex("t", 1.5, 0.5, 0.5, title.c_str());
  }
  png.finish();
}

}  // namespace wxe
