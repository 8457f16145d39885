// CREDIT gen2 YAML configs (yaml-cpp): the keys wxe implements, under CREDIT's names.
// A key wxe does not know is a warning naming it; a known key with a value whose meaning wxe
// does not implement (a second data source, a scheduler type other than
// linear-warmup-cosine, ...) is an error naming it. Relative paths resolve from the config's
// folder. The data layer (data/) knows netCDF and YAML; engine/ knows neither.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace wxe {

// data.source.<name>.variables.<field type>
struct VarGroup {
  std::vector<std::string> vars_3D, vars_2D;
  std::string path;  // path template: strftime codes (%Y, %m, %d, %H) and an optional '*' glob
  std::string path_3d;  // where set, the 3D variables' path (arco_era5's model-level store)
  bool empty() const { return vars_3D.empty() && vars_2D.empty(); }
};

// An elementwise transform of a variable's physical values, as CREDIT's preblocks fill_values,
// log_transform and sqrt_transform (before the scaler) and postblocks exp_transform and
// square_transform (after the inverse scaler) compute them, in float32.
struct PointTransform {
  enum Kind { Fill, Log, Sqrt, Exp, Square } kind = Fill;
  std::string block;                    // "preblocks.per_step.log", for messages
  std::vector<std::string> vars;        // full keys or partial paths; empty: every variable
  std::vector<std::string> data_types;  // preblocks: input and/or target
  int base = 0;                         // Log, Exp: 0 (e), 2 or 10
  double eps = 1e-8;                    // Log, Exp
  struct Rule {
    bool nan = false;     // search: nan
    std::string op = "==";
    double search = 0, fill = 0;
  };
  std::vector<Rule> rules;  // Fill: all matched on the original values, the last match wins
  // y = f(x) on n float32 values in place, as CREDIT's blocks compute on float32 tensors; with d,
  // also d[i] *= f'(x[i]) (the chain rule through the block)
  void apply(float* x, int64_t n, float* d = nullptr) const;
};

// postblocks.per_step geopotential_diagnostic and mslp_diagnostic (data/geopotential.h): a
// variable computed from the prediction (and, for the loss's target twin, from the target) in
// physical units.
struct GeopotentialSpec {
  std::string block;        // "postblocks.per_step.geopotential", for messages
  std::string output_name;  // its variable key: "<source>/<field type>/3d/<name>" (mslp: /2d/)
  bool mslp = false;        // mslp_diagnostic: 2D, from sp, t (near-surface temperature) and zs
  std::string zs, sp, t, q;  // the keys of surface geopotential (a static), sp, T, q
  bool flip = true;
  std::string level_info_file = "ERA5_Lev_Info.nc", a_var = "a_half", b_var = "b_half";
  std::vector<int64_t> levels;  // args.levels; empty: every level of the file
};

// postblocks.per_step tracer_fixer, global_mass_fixer, global_water_fixer, global_energy_fixer
// (_updown) and wind_artifact_filter: CREDIT 2026's physics blocks on the prediction
// (data/physics_blocks.h), in the config's order. A block before the inverse bridgescaler_transform
// sees normalised values (the wind filter only), one after it physical values.
struct PhysicsBlockSpec {
  enum Kind { Tracer, Mass, Water, Energy, Wind } kind = Tracer;
  std::string block;        // "postblocks.per_step.mass_fixer", for messages
  bool normalised = false;  // before the inverse scaler
  // the variable keys each argument names: of the prediction (y_processed), and for the fixers of
  // the step's physical input (x_physical), as (argument, key)
  std::vector<std::pair<std::string, std::string>> pred, input;
  std::vector<double> lo, hi;  // tracer_fixer: per pred key its bounds (hi NaN: none)
  // the fixers: the statics file (save_loc_physics, $VARs expanded) and its variable names
  std::string statics, lon_name = "lon2d", lat_name = "lat2d", a_name = "hyai", b_name = "hybi", phis_name;
  bool midpoint = false;
  double seconds = 0;  // lead_time_periods in seconds (water and energy)
  // wind_artifact_filter, CREDIT's defaults (sigma_zonal, sigma_meridional NaN: smooth_sigma)
  int64_t mask_level = 14, dilation_zonal = 13, dilation_meridional = 5;
  std::vector<int64_t> target_levels = {9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  double speed_threshold = 3.0193274566643846, smooth_sigma = 1.0, sigma_zonal = NAN, sigma_meridional = NAN;
  double falloff_sigma = 4.0;
  bool preserve_amplitude = false;
};

// A loss of CREDIT's registry (credit/losses): mse, mae, msle, huber, logcosh, xtanh, xsigmoid,
// the ensemble CRPS losses KCRPS, almost-fair-crps, ring-crps (train/ensemble_loss.h), and the
// whole-tensor spectral, power, covmse (train/spectral_loss.h).
struct LossSpec {
  std::string name = "mse";
  double delta = 1.0;   // huber's
  bool biased = false;  // KCRPS's
  double alpha = 1.0;   // almost-fair-crps's
  // the whole-tensor losses (train/spectral_loss.h): spectral's and power's wavenum_init;
  // covmse's batch_normalize and off_diagonal_scale
  int64_t wavenum_init = 20;
  bool batch_normalize = false;
  double off_diagonal_scale = 1.0;
};

// CREDIT 2026's loss.type base (credit/losses/base.py BaseLoss): each target variable scored in
// physical units (through the postblocks) against the target twin the same postblocks make of the
// target, per-variable means combined with inverse-variance (or manual, or no) weights.
struct BaseLossSpec {
  bool on = false;
  LossSpec training, validation;
  bool has_validation = false;
  std::map<std::string, LossSpec> overrides;  // base_loss_overrides, by variable key
  std::string weighting = "inverse_variance";  // inverse_variance, manual, none
  std::string scaler_path;                     // the target variances (inverse_variance)
  std::map<std::string, double> manual;        // variable_weights, by variable key
  bool normalize = true, use_latitude_weights = false;
};

// data.source.<name>: one source of variables (CREDIT's gen2 dataset types local and tisr).
struct SourceConfig {
  std::string name = "era5";
  std::string dataset_type = "local";
  std::string level_coord = "level";
  std::vector<double> levels;  // level coordinate values selected for 3D variables
  VarGroup prognostic, diagnostic, dynamic_forcing, statics;
  // dataset_type tisr (computed top-of-atmosphere solar radiation): its arguments as given
  std::map<std::string, std::string> args;
};

// The config validation reads: its validation_data.source in place of data.source where given.
struct CreditConfig;
CreditConfig validation_config(const CreditConfig& c);

struct CreditConfig {
  std::string file, dir;                 // the config file and its folder
  std::vector<SourceConfig> sources;     // data.source, in the config's order (CREDIT's channel order)
  // validation_data.source where its files differ from data.source's (its variables, levels and
  // dataset types must be data.source's: the model takes one layout); empty: data.source
  std::vector<SourceConfig> valid_sources;
  std::string source_key = "data.source";  // the section `sources` came from, for messages
  int64_t start = 0, end = 0;            // data.start_datetime / end_datetime, seconds since 1970 (UTC)
  int64_t valid_start = 0, valid_end = 0;  // data.valid_start/end_datetime; 0: no validation
  // data.date_ranges / validation_data.date_ranges: non-contiguous (start, end) blocks, sorted,
  // in place of one start..end (start and end then the first block's start and the last's end).
  // CREDIT applies the history and forecast margins to each block: no sample's window leaves its
  // block. Empty: the one block start..end.
  std::vector<std::pair<int64_t, int64_t>> date_ranges, valid_date_ranges;
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
  // args.spatial_variables of the pre- and postblock scalers: variables scaled per grid point
  // (a grid-wise scaler: one mean and variance per point of a 2D variable)
  std::vector<std::string> scaler_spatial, post_scaler_spatial;
  std::string save_loc;
  // trainer.*
  double learning_rate = 1e-3, weight_decay = 0.0, grad_max_norm = 1.0, ema_decay = 0.9999;  // ema_decay: CREDIT's default
  bool grad_clip_dynamic = false;  // grad_max_norm: dynamic (clip to the gradient's own norm, as CREDIT's gen2 trainer)
  bool use_scheduler = false, use_ema = false, load_weights = false, load_optimizer = false;
  bool activation_checkpoint = true;  // trainer.activation_checkpoint: CREDIT's default
  bool amp = false;  // trainer.amp: mixed precision (CREDIT: float16 autocast on the GPU; finetune: --precision bf16)
  // trainer.scheduler: linear-warmup-cosine and cosine-annealing-restarts step once per batch,
  // cosine-annealing, lambda and plateau once per epoch (CREDIT's update_on_batch /
  // update_on_epoch); CREDIT's defaults
  std::string scheduler_type;
  int64_t warmup_steps = 1000, total_steps = 500000;
  double min_lr = 1e-5;
  // cosine-annealing (torch CosineAnnealingLR)
  int64_t t_max = 1;
  double eta_min = 0;
  // cosine-annealing-restarts (CREDIT's CosineAnnealingWarmupRestarts; warmup_steps, min_lr above)
  int64_t first_cycle_steps = 1;
  double cycle_mult = 1.0, max_lr = 0.1, gamma = 1.0;
  // plateau (torch ReduceLROnPlateau)
  std::string plateau_mode = "min", plateau_threshold_mode = "rel";
  double plateau_factor = 0.1, plateau_threshold = 1e-4, plateau_eps = 1e-8;
  int64_t plateau_patience = 10, plateau_cooldown = 0;
  int grad_accum_every = 1, train_batch_size = 1;
  int ensemble_size = 1;
  // trainer.mode fsdp (or trainer.parallelism.data fsdp / fsdp2): wxe's --shard-weights (ZeRO-3)
  bool shard_weights = false;  // trainer.ensemble_size: members per sample (CRPS losses; ring-crps: one per dp rank)
  int64_t batches_per_epoch = 0, epochs = 1, valid_batches_per_epoch = 0;
  uint64_t seed = 0;
  // loss.*
  LossSpec training_loss, validation_loss;
  bool has_validation_loss = false;  // loss.validation_loss given (else CREDIT's default: see train/loss.h)
  bool use_latitude_weights = false, use_variable_weights = false;
  // VariableTotalLoss2D's use_spectral_loss / use_power_loss terms (training only), each times
  // spectral_lambda_reg, over wavenumbers from spectral_wavenum_init
  bool spectral_term = false, power_term = false;
  double spectral_lambda = 0;
  int64_t spectral_wavenum = 20;
  std::map<std::string, std::vector<double>> variable_weights;  // by variable name: one value, or one per level
  // preblocks before the scaler, postblocks after the inverse scaler, in the config's order
  std::vector<PointTransform> pre_transforms, post_transforms;
  // computed diagnostics of the prediction's postblocks (after its transforms), in order
  std::vector<GeopotentialSpec> computed;
  std::vector<PhysicsBlockSpec> physics;  // the physics postblocks, in order
  bool include_computed = true;  // BaseLoss's include_computed_diagnostics
  BaseLossSpec base_loss;
  // the per_step postblocks after reconstruct, on the prediction and on the target twin
  // (y_target_processed), each as a line of its type and arguments
  std::vector<std::string> pred_chain, twin_chain;
  std::string twin_block;  // the first block of the twin chain, for messages
  std::vector<std::string> warnings;               // unknown keys, one line each
};

// Reads and checks a config. Errors name the file and the key. training false (forecast): the
// sections only training reads (trainer, loss) and the loss's target-twin postblocks are not
// read, so whatever they hold is no error.
CreditConfig read_credit_config(const std::string& path, bool training = true);

// "2020-01-01", "2020-01-01T06", "2020-01-01 06:00", "2020-01-01T06:00:00" (UTC) -> seconds
// since 1970; errors name `what`.
int64_t parse_datetime(const std::string& s, const std::string& what);
// "2020-01-01T06:00:00"
std::string format_datetime(int64_t t);
// "6h", "1d", "30min", "3600s", "6H" -> seconds.
int64_t parse_timestep(const std::string& s, const std::string& what);

}  // namespace wxe
