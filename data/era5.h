// Layer: data/ (CREDIT data formats), over engine/ only.
// CREDIT's ERA5 data (gen2 "local" dataset): netCDF/zarr files per year, channels concatenated
// exactly as CREDIT does, normalised by the config's scaler; forecasts written as netCDF.
//
// Input channels (model input x), source by source in the config's order: prognostic 3D
// variables variable-major by level, then prognostic 2D, then static (3D, 2D), then dynamic
// forcing (3D, 2D); targets (y), source by source: prognostic then diagnostic, 3D then 2D each
// (credit/datasets/gen_2/channel_utils.py ChannelSchema).
// Normalisation: (x - mean) / std per variable and level, inputs with the scaler's input side,
// targets with its target side; variables the scaler lacks pass through unchanged (CREDIT's
// preblocks). Forecasts are de-normalised with the postblock's inverse scaler (its target side)
// where the config has one, else with the preblock's target side.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/credit_config.h"
#include "data/data_file.h"
#include "data/geopotential.h"
#include "data/physics_blocks.h"
#include "data/quantile_scaler.h"
#include "data/scalers.h"
#include "data/tisr.h"
#include "engine/io/file_util.h"
#include "engine/io/samples.h"
#include "engine/ir/tensor.h"

namespace wxe {

struct ChannelInfo {
  std::string var, field_type;  // field_type: prognostic, diagnostic, static, dynamic_forcing
  bool is3d = false;
  int level_index = 0;          // into its source's levels (3D)
  int src = 0;                  // its source, an index into CreditConfig::sources
  int computed = -1;            // a computed diagnostic's: its block, an index into CreditConfig::computed
  // the preblock scaler's statistics of this channel (its input side for input channels, its
  // target side for targets); (0, 1) where it has none
  double mean = 0, std = 1;
  // targets: the statistics that de-normalise predictions (the postblock's inverse scaler where
  // it selects the variable, else mean and std)
  double post_mean = 0, post_std = 1;
  // the config's elementwise transforms of this channel's physical values: before its scaler
  // (the preblocks selecting it on its side), after the inverse scaler (targets' postblocks)
  std::vector<const PointTransform*> pre, post;
  // bridgescaler quantile scalers (scaler_type: quantile) in place of mean and std: the
  // preblock's (its digest quant_channel) and the one de-normalising predictions
  std::shared_ptr<const QuantileScaler> quant, post_quant;
  int quant_channel = 0, post_quant_channel = 0;
  // grid-wise scalers (spatial_variables): a mean and std per grid point (H x W) in place of
  // mean and std, the preblock's and the one de-normalising predictions
  std::shared_ptr<const std::vector<float>> grid_mean, grid_std, post_grid_mean, post_grid_std;
};

// CREDIT's key of a channel's variable: "<source>/<field type>/3d/<var>" (or /2d/).
std::string var_key(const CreditConfig& cfg, const ChannelInfo& c);

class Era5Data {
 public:
  explicit Era5Data(const CreditConfig& cfg);
  const CreditConfig& config() const { return cfg_; }
  const std::vector<ChannelInfo>& input_channels() const { return in_; }
  const std::vector<ChannelInfo>& target_channels() const { return out_; }
  int prognostic_channels() const { return n_prog_; }
  // Per target channel the input channel its prediction feeds in rollouts (prognostic), or -1
  // (diagnostic). With one source the prognostic channels lead both: k -> k.
  const std::vector<int64_t>& feedback_map() const { return feedback_; }
  // (1, C_in, 1, H, W) / (1, C_out, 1, H, W), normalised, at time t (seconds since 1970).
  Tensor input(int64_t t) const;
  Tensor target(int64_t t) const;
  // (1, C_out, 1, H, W): the target channels as the files hold them at time t (physical units;
  // no transform, no scaler), the truth `wxe score` and `wxe plot --minus-truth` compare with.
  Tensor target_raw(int64_t t) const;
  // data.history_len steps ending at t (oldest first) on dim 2: (1, C_in, history_len, H, W),
  // every step's channels as input() reads them (CREDIT's history window).
  Tensor input_window(int64_t t) const;
  // Overwrites x's dynamic-forcing channels with time t's (normalised).
  void set_forcing(Tensor& x, int64_t t) const;
  // y (1, C_out, ...) normalised -> physical units (post_mean, post_std, then the post
  // transforms), in place; with dy, also d physical / d normalised per element (CREDIT's
  // BaseLoss differentiates through these postblocks).
  void denormalise_target(Tensor& y, Tensor* dy = nullptr) const;
  // The variables the prediction's postblocks compute (geopotential_diagnostic), one channel per
  // level, in the blocks' order; their levels are their temperature's source's.
  const std::vector<ChannelInfo>& computed_channels() const { return computed_; }
  // y (B, C_out, 1, H, W) in physical units -> the computed channels (B, C_computed, 1, H, W).
  // The surface geopotential is the static input's raw value at time t (CREDIT's ic_raw).
  // With g (d loss / d computed) and gy, also accumulates d loss / d y into *gy (y's shape).
  Tensor compute_diagnostics(const Tensor& y, int64_t t, const Tensor* g = nullptr, Tensor* gy = nullptr) const;
  // A prediction's prognostic channels as the next step's input takes them: y itself where the
  // target (postblock) and input statistics agree and no transform applies, else through the
  // postblocks to physical values and the input side's preblocks back, as CREDIT's rollout does
  // (the other channels copied unchanged).
  Tensor prediction_to_input(const Tensor& y) const;
  // CREDIT 2026's physics postblocks (CreditConfig::physics, data/physics_blocks.h).
  bool has_physics() const { return !cfg_.physics.empty(); }
  // y (B, C_out, 1, H, W) normalised -> the physical prediction after every per_step postblock,
  // CREDIT's y_processed: the blocks before the inverse scaler on y, then y de-normalised as
  // denormalise_target does, then the blocks after it, in the config's order. The fixers' t0 state
  // (x_physical) is x's (B, C_in, T, H, W) last time step de-normalised with the input side's
  // statistics. Without physics blocks: denormalise_target's values.
  Tensor postprocess(const Tensor& y, const Tensor& x) const;
  // phys (B, C_out, 1, H, W) in physical units -> its prognostic channels normalised as the next
  // step's input takes them (the input side's preblocks and scaler: the second half of
  // prediction_to_input); the other channels unchanged.
  Tensor physical_to_input(const Tensor& phys) const;
  // The grid and variable metadata, known after the first read.
  const std::vector<double>& lat() const { return lat_; }
  const std::vector<double>& lon() const { return lon_; }
  // Reads the target variables' units and long names from their files at time t (those not
  // read yet: diagnostics are never inputs); a file that is missing leaves them empty.
  void read_metadata(int64_t t) const;
  std::string units(const std::string& var) const;
  std::string long_name(const std::string& var) const;
  std::string level_units() const { return level_units_; }
  // CREDIT's channel_schema.yaml (schema_version 1: input and target layouts).
  std::string channel_schema_yaml() const;
  std::vector<std::string> warnings;  // scaler: variables passed through unnormalised

 private:
  void read_channels(const std::vector<ChannelInfo>& chans, int64_t t, float* out, const char* only = nullptr) const;
  void read_var(const ChannelInfo& c, int64_t t, float* out) const;  // (levels or 1, H, W), physical
  // fails naming the variable (and the last transform) where p (H x W) holds NaN or inf
  void check_finite(const ChannelInfo& c, const std::vector<const PointTransform*>& ts, int64_t t, const float* p) const;
  const VarGroup& group(int source, const std::string& field_type) const;
  DataFile& file_for(const ChannelInfo& c, int64_t t) const;
  size_t time_index(DataFile& f, const std::string& var, int64_t t) const;
  void load_scaler();
  void bind_transforms();
  void learn_grid(int64_t h, int64_t w, std::vector<double> lat, std::vector<double> lon, const std::string& from) const;
  void check_coordinates(const DataFile& f, const std::string& var, const std::string& lat_name,
                         const std::string& lon_name, int64_t h, int64_t w) const;
  // tisr sources (computed solar radiation): their grid and options, by source index
  struct Tisr {
    TisrGrid grid;
    TisrOptions opt;
  };
  std::map<int, Tisr> tisr_;
  // computed diagnostics, by block: the coefficients and the channels they read
  struct Computed {
    HybridLevels levels;
    int64_t zs = -1, sp = -1, t = -1, q = -1;  // zs an input channel; sp, t, q (its first level) targets
    bool mslp = false;                         // mslp_diagnostic: one 2D channel from sp, t (2D) and zs
    mutable std::vector<float> zs_raw;  // zs's raw values at zs_time
    mutable int64_t zs_time = 0;
  };
  std::vector<Computed> comp_;
  // physics blocks, by block: per key of its spec's pred / input its first channel (a target /
  // input channel) and how many channels (levels) it spans; the fixers' statics
  struct Physics {
    std::vector<int64_t> pred, pred_levels, input;
    std::shared_ptr<const SigmaGrid> grid;
  };
  std::vector<Physics> phys_;
  void bind_physics();
  void apply_physics(size_t b, float* y, const float* x0) const;  // one sample's (C_out / C_in) x H x W
  std::vector<ChannelInfo> computed_;
  void bind_computed();
  // a local source without levels: its files' (CREDIT's rule), into sc.levels
  void levels_from_files(SourceConfig& sc) const;
  CreditConfig cfg_;
  std::vector<ChannelInfo> in_, out_;
  int n_prog_ = 0;
  std::vector<int64_t> feedback_;
  mutable int64_t h_ = 0, w_ = 0;
  mutable std::vector<double> lat_, lon_;
  mutable std::string grid_file_;             // the data file the grid came from ("": a tisr grid)
  mutable std::set<std::string> grid_checked_;  // files whose coordinates check_coordinates read
  mutable std::string level_units_;
  mutable std::map<std::string, std::pair<std::string, std::string>> meta_;  // var -> units, long_name
  mutable std::map<std::string, std::unique_ptr<DataFile>> files_;
  mutable std::map<std::string, std::vector<int64_t>> times_;  // file -> its times (s since 1970)
  mutable std::recursive_mutex io_;  // read_var: the files and caches above, one thread at a time
};

// Training samples over [t0, t1] every timestep: sample i starts at t = t0 + (history_len - 1
// + i) * dt; input the window ending at t, targets of the forecast_len steps after it,
// forcing[k] (k >= 1) the one-step input at t + k * dt.
std::unique_ptr<SampleSource> open_era5_samples(std::shared_ptr<const Era5Data> data, int64_t t0, int64_t t1,
                                                int forecast_len);
// The same over several (t0, t1) blocks (data.date_ranges), their samples one after the other;
// with more than one block, a block too short for a sample is an error (CREDIT's).
std::unique_ptr<SampleSource> open_era5_samples(std::shared_ptr<const Era5Data> data,
                                                const std::vector<std::pair<int64_t, int64_t>>& blocks, int forecast_len);
// The training (validation) blocks of a config: its date_ranges, else start..end.
inline std::vector<std::pair<int64_t, int64_t>> training_blocks(const CreditConfig& c) {
  return c.date_ranges.empty() ? std::vector<std::pair<int64_t, int64_t>>{{c.start, c.end}} : c.date_ranges;
}
inline std::vector<std::pair<int64_t, int64_t>> validation_blocks(const CreditConfig& c) {
  return c.valid_date_ranges.empty() ? std::vector<std::pair<int64_t, int64_t>>{{c.valid_start, c.valid_end}}
                                     : c.valid_date_ranges;
}

// A forecast as a CF-convention netCDF-4 file: time (hours since init), level, latitude,
// longitude, the target variables with their units, then the variables the postblocks compute
// (geopotential_diagnostic). One level axis: sources with different levels share their union
// (ascending), each variable NaN at the levels it lacks, as CREDIT's output aligns them. Written to a fresh temporary file beside PATH
// (mkstemp: never a fixed name a planted symlink could take) and renamed over PATH on close().
class ForecastWriter {
 public:
  ForecastWriter(const std::string& path, const Era5Data& data, int64_t init, int steps);
  ~ForecastWriter();
  // y: (1, C_out, 1, H, W) in physical units, step k (0-based) valid at init + (k+1)*dt.
  void write(int k, const Tensor& y);
  void close();

 private:
  std::string path_;
  std::unique_ptr<TempFile> file_;  // a fresh name beside path_ (engine/io/file_util.h)
  std::string tmp_;                 // its name
  const Era5Data& data_;
  int id_ = -1;
  std::map<std::string, int> var_ids_;  // by the variable's name in the file
  std::vector<ChannelInfo> chans_;      // the targets, then the computed diagnostics
  std::vector<int> chan_ids_;           // per channel of chans_
  std::vector<int> level_at_;           // per channel: its level's index on the file's level axis
  int64_t init_ = 0;
  std::string nc_name(const ChannelInfo& c) const;  // the variable's name in the file
};

}  // namespace wxe
