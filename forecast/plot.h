// Layer: library (forecast/), over train/ (the PLplot PNG setup of train/loss_plot.h), data/
// and engine/.
// `wxe plot`: maps of a forecast file's fields (equirectangular, PLplot's coastlines from
// Debian's libplplot-data, a colour bar with units, valid and lead time in the title), and the
// plots `wxe score` draws: scores against lead time, and the scorecard.
#pragma once
#include <string>
#include <vector>

namespace wxe {

struct PlotArgs {
  std::string forecast;           // FORECAST.nc
  std::vector<std::string> vars;  // NAME or NAME@LEVEL; one panel each
  int step = 1;                   // 1-based: lead time step * dt
  bool all_steps = false;         // one PNG per step: OUT_stepK.png
  std::string output;             // OUT.png
  std::string minus;              // OTHER.nc: the difference forecast - OTHER at the same valid time
  std::string minus_truth;        // CONFIG.yml: the difference forecast - the config's data
};

// Writes the PNG(s); returns the exit code. Errors name the file and the variable.
int run_plot(const PlotArgs& a);

// One map: a (lat, lon) row-major field on the grid, into the current PLplot page's next
// subpage. `diverging`: a blue-white-red palette symmetric about 0, else a sequential one.
struct MapPanel {
  std::vector<double> field, lat, lon;
  std::string title, units;
  bool diverging = false;
};
void draw_maps(const std::string& png_path, const std::vector<MapPanel>& panels);

// Scores against lead time: RMSE, bias and ACC panels, one line per model.
struct ScoreSeries {
  std::string name;
  std::vector<double> lead_h, rmse, bias, acc;
};
void plot_score_lines(const std::string& png_path, const std::string& field, const std::string& units,
                      const std::vector<ScoreSeries>& series);

// Fields x lead times, each cell coloured by the relative RMSE difference of a model against
// the reference (blue: lower RMSE), '*' where a paired t-test over init times finds the
// difference significant at 5%. One panel per model.
struct Scorecard {
  std::vector<std::string> fields, models;  // models: those compared with `reference`
  std::vector<double> lead_h;
  std::string reference;
  std::vector<std::vector<std::vector<double>>> rel;      // [model][field][lead], NaN: none
  std::vector<std::vector<std::vector<int>>> significant;  // same shape
};
void plot_scorecard(const std::string& png_path, const Scorecard& card);

}  // namespace wxe
