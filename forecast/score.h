// Layer: library (forecast/), over data/ and engine/.
// `wxe score`: forecast files against the truth a CREDIT config's data hold, scored as
// WeatherBench 2 (google-research/weatherbench2, weatherbench2/metrics.py) defines its
// deterministic metrics, per model, field (variable and level) and lead time:
//   weights w_i: the area of latitude row i's cell (sin of its upper minus sin of its lower
//     bound, bounds half-way between rows and +-90 degrees), normalised to mean 1 (WB2's
//     get_lat_weights); mean_w(x) = sum_ij w_i x_ij / sum_ij w_i over latitude i, longitude j;
//   per init time:  mse = mean_w((f - t)^2), bias = mean_w(f - t),
//                   acc = mean_w(f' t') / sqrt(mean_w(f'^2) mean_w(t'^2)), f' = f - c, t' = t - c
//                   (c the climatology; no mean is removed from the anomalies);
//   over init times: the mean of each; rmse = sqrt(mean of mse) (WB2's "mse" metric, the
//     square root taken after the time mean as WB2's published RMSE; WB2's
//     RMSESqrtBeforeTimeAvg is the other order).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/era5.h"
#include "forecast/forecast_file.h"

namespace wxe {

// WB2's latitude weights (cell areas, mean 1) for latitudes in any order (degrees).
std::vector<double> wb2_lat_weights(const std::vector<double>& lat);

struct FieldStats {
  double mse = 0, bias = 0, acc = 0;
};
// One init time's statistics of forecast f against truth t with climatology c, each
// (lat, lon) row-major, weights w per latitude row.
FieldStats field_stats(const std::vector<double>& f, const std::vector<double>& t, const std::vector<double>& c,
                       const std::vector<double>& w);

// Two-sided paired t-test at 5%: is the mean of d (one difference per init time) non-zero?
// False with fewer than 2 values.
bool paired_t_significant(const std::vector<double>& d, double* t_stat = nullptr);

// The truth and climatology of a config's target variables on its grid.
class Truth {
 public:
  // `climatology`: a netCDF file of the variables on ([level,] latitude, longitude); "": the
  // mean of the data over the config's training period (start_datetime..end_datetime, every
  // timestep), per grid point.
  Truth(const std::string& config, const std::string& climatology);
  // The target channel of a forecast field, -1 where the config predicts none.
  int channel(const FieldRef& f) const;
  // Every target channel at time t: (1, C_out, 1, H, W), physical units (Era5Data::target_raw).
  Tensor at(int64_t t) const { return data_->target_raw(t); }
  // One channel of at(t) as (lat, lon).
  std::vector<double> field(const Tensor& y, int channel) const;
  const std::vector<double>& clim(int channel, const FieldRef& f);
  const Era5Data& data() const { return *data_; }
  std::string clim_source;  // said in the output: "file:CLIM.nc" or "training-mean:START..END"
  std::string config_path;

 private:
  std::shared_ptr<Era5Data> data_;
  std::string clim_path_;
  std::map<int, std::vector<double>> clim_;  // channel -> climatology (lat, lon)
  std::vector<std::vector<double>> mean_;    // the training mean of every channel, once read
};

// One model's scores for a field at a lead time, per init time.
struct Score {
  std::string model, field, var, units;
  double level = 0;
  bool is3d = false;
  double lead_h = 0;
  std::map<int64_t, FieldStats> per_init;  // init time -> that init's statistics
  double rmse() const;
  double bias() const;
  double acc() const;
};

struct ScoreArgs {
  // each model: its forecast files (one per init time); a model's name: its first file's stem
  std::vector<std::vector<std::string>> models;
  std::string truth, climatology, output = "scores.csv";
  bool compare = false;  // a scorecard of each model against the first
};

// Scores of every field every model's files share with the config's targets, sorted by model,
// field, lead time.
std::vector<Score> score_models(const ScoreArgs& a, Truth& truth);

// The command: scores to a.output (CSV) and line plots beside it (OUT_<field>.png); with
// a.compare the scorecard instead (OUT.csv, OUT.png). Returns the exit code.
int run_score(const ScoreArgs& a);

}  // namespace wxe
