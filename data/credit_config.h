// CREDIT gen2 YAML configs (yaml-cpp): the keys wxe implements, under CREDIT's names.
// A key wxe does not know is a warning naming it; a known key with a value whose meaning wxe
// does not implement (a second data source, a scheduler type other than
// linear-warmup-cosine, ...) is an error naming it. Relative paths resolve from the config's
// folder. The data layer (data/) knows netCDF and YAML; engine/ knows neither.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wxe {

// data.source.<name>.variables.<field type>
struct VarGroup {
  std::vector<std::string> vars_3D, vars_2D;
  std::string path;  // path template: strftime codes (%Y, %m, %d, %H) and an optional '*' glob
  bool empty() const { return vars_3D.empty() && vars_2D.empty(); }
};

struct CreditConfig {
  std::string file, dir;                 // the config file and its folder
  std::string source = "era5";           // data.source's one key
  std::string dataset_type = "local";
  std::string level_coord = "level";
  std::vector<double> levels;            // level coordinate values selected for 3D variables
  VarGroup prognostic, diagnostic, dynamic_forcing, statics;
  int64_t start = 0, end = 0;            // data.start_datetime / end_datetime, seconds since 1970 (UTC)
  int64_t valid_start = 0, valid_end = 0;  // data.valid_start/end_datetime; 0: no validation
  int64_t timestep = 6 * 3600;           // data.timestep, seconds
  int history_len = 1, forecast_len = 1;
  int valid_forecast_len = 0;  // data.valid_forecast_len or validation_data.forecast_len; 0: forecast_len
  // the scaler: preblocks bridgescaler_transform (scaler_path) or era5_normalizer (mean_path,
  // std_path), or the gen1 data.mean_path / data.std_path
  std::string scaler_json, mean_nc, std_nc;
  std::vector<std::string> scaler_vars;        // args.variables: full keys or partial paths; empty: all
  std::vector<std::string> scaler_data_types;  // args.data_types (input, target); empty: both
  // postblocks.per_step bridgescaler_transform (inverse_transform): its file's target side
  // de-normalises the forecast's variables it selects
  std::string post_scaler_json;
  std::vector<std::string> post_scaler_vars;
  std::string save_loc;
  // trainer.*
  double learning_rate = 1e-3, weight_decay = 0.0, grad_max_norm = 1.0, ema_decay = 0.9999;  // ema_decay: CREDIT's default
  bool use_scheduler = false, use_ema = false, load_weights = false, load_optimizer = false;
  bool activation_checkpoint = true;  // trainer.activation_checkpoint: CREDIT's default
  bool amp = false;  // trainer.amp: mixed precision (CREDIT: float16 autocast on the GPU; finetune: --precision bf16)
  // trainer.scheduler (linear-warmup-cosine), counted in batches as CREDIT's trainer steps it
  // once per batch; CREDIT's defaults
  int64_t warmup_steps = 1000, total_steps = 500000;
  double min_lr = 1e-5;
  int grad_accum_every = 1, train_batch_size = 1;
  int64_t batches_per_epoch = 0, epochs = 1, valid_batches_per_epoch = 0;
  uint64_t seed = 0;
  // loss.*
  bool use_latitude_weights = false, use_variable_weights = false;
  std::map<std::string, double> variable_weights;  // by variable name
  std::vector<std::string> warnings;               // unknown keys, one line each
};

// Reads and checks a config. Errors name the file and the key.
CreditConfig read_credit_config(const std::string& path);

// "2020-01-01", "2020-01-01T06", "2020-01-01 06:00", "2020-01-01T06:00:00" (UTC) -> seconds
// since 1970; errors name `what`.
int64_t parse_datetime(const std::string& s, const std::string& what);
// "2020-01-01T06:00:00"
std::string format_datetime(int64_t t);
// "6h", "1d", "30min", "3600s", "6H" -> seconds.
int64_t parse_timestep(const std::string& s, const std::string& what);

}  // namespace wxe
