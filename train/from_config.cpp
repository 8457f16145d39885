#include "train/from_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/io/file_util.h"
#include "engine/ir/error.h"
#include "train/ensemble_loss.h"
#include "train/loss.h"
#include "train/spectral_loss.h"
#include "data/era5.h"
#include "load/model.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

// A registry loss's whole-tensor form (train/spectral_loss.h).
TensorLoss tensor_loss_of(const LossSpec& l) {
  TensorLoss f;
  f.kind = l.name == "spectral" ? TensorLossKind::Spectral : l.name == "power" ? TensorLossKind::Power : TensorLossKind::CovMSE;
  f.wavenum_init = l.wavenum_init;
  f.batch_normalize = l.batch_normalize;
  f.off_diagonal_scale = l.off_diagonal_scale;
  return f;
}

// Validation over valid_start_datetime..valid_end_datetime once per epoch: the rollout of
// forecast_len steps from each sample (as in training, no gradients), the training loss, and
// per variable (all its levels) the RMSE and bias (mean of prediction - truth) in physical
// units, as CREDIT's valid_loss, valid_rmse/<var_key>, valid_bias/<var_key> columns.
void validation(const CreditConfig& c, std::shared_ptr<Era5Data> data, FinetuneConfig& fc, int L,
                const LossSpec& vspec, const std::function<double(const Tensor&, const Tensor&, Tensor*, double)>& vcomputed) {
  // an ensemble validates its members (the input repeated, as in training): a CRPS loss over them,
  // another loss of each member against the target; RMSE and bias of the ensemble mean
  WXE_CHECK(vspec.name != "ring-crps", c.file, ": validation with ring-crps is not implemented (CREDIT's own check "
            "says the same: validation keeps dp sharding); set loss.validation_loss (loss.args.validation_loss), e.g. mae");
  const bool crps = is_crps_loss(vspec.name);
  const bool whole = is_tensor_loss(vspec.name);
  const TensorLoss vwhole = whole ? tensor_loss_of(vspec) : TensorLoss{};
  const CrpsLoss vcrps = crps ? crps_loss(vspec.name, vspec.biased, vspec.alpha) : CrpsLoss{};
  const LossFunction vloss = crps || whole ? LossFunction{} : loss_function(vspec.name, vspec.delta);
  const int64_t E = fc.use_crps && fc.crps.kind == CrpsKind::Ring ? 1 : fc.ensemble_size;
  WXE_CHECK(E == 1 || L == 1, c.file, ": validation rollouts of ", L, " steps with trainer.ensemble_size ", E,
            " are not implemented (set validation_data.forecast_len 1)");
  WXE_CHECK(!crps || E > 1, c.file, ": validation loss ", vspec.name, " needs an ensemble (trainer.ensemble_size > 1)");
  // BaseLoss validates with its validation loss (or the training one) in physical units, the same
  // per-variable overrides
  std::vector<LossFunction> per_channel = fc.channel_losses;
  if (c.base_loss.on && c.base_loss.has_validation)
    for (size_t k = 0; k < per_channel.size(); ++k) {
      auto o = c.base_loss.overrides.find(var_key(c, data->target_channels()[k]));
      if (o == c.base_loss.overrides.end()) per_channel[k] = vloss;
    }
  const bool physical = (bool)fc.to_physical;
  // validation_data.source's own files where it names others (the same channels: data's scaler,
  // transforms and postblocks apply)
  std::shared_ptr<SampleSource> vs = open_era5_samples(
      c.valid_sources.empty() ? data : std::make_shared<Era5Data>(validation_config(c)), validation_blocks(c), L);
  WXE_CHECK(vs->size() > 0, c.file, ": no validation samples of ", L,
            " steps in valid_start_datetime..valid_end_datetime");
  const int64_t n = c.valid_batches_per_epoch > 0 ? std::min(c.valid_batches_per_epoch, vs->size()) : vs->size();
  std::vector<std::string> keys;
  std::vector<int> var_of;  // target channel -> index into keys
  for (const ChannelInfo& ch : data->target_channels()) {
    const std::string key = var_key(c, ch);
    if (keys.empty() || keys.back() != key) keys.push_back(key);
    var_of.push_back((int)keys.size() - 1);
  }
  fc.validate_columns = {"valid_loss"};
  for (const std::string& k : keys) fc.validate_columns.push_back("valid_rmse/" + k);
  for (const std::string& k : keys) fc.validate_columns.push_back("valid_bias/" + k);
  LossWeights w;
  if (!fc.plain_mse) {
    w.lat_weights = latitude_weights(fc.lat.empty() ? data->lat() : fc.lat);
    w.channel_weights = fc.channel_weights;
  }
  const size_t nv = keys.size();
  fc.validate_every = fc.steps / std::max<int64_t>(1, c.epochs);
  fc.validate = [vs, data, w, n, L, nv, var_of, vloss, per_channel, physical, crps, vcrps, E,
                 vcomputed, whole, vwhole](const std::function<Tensor(const Tensor&)>& predict) {
    double loss = 0;
    std::vector<double> sq(nv), sum(nv), cnt(nv);
    for (int64_t i = 0; i < n; ++i) {
      Sample s = vs->get(i);
      Tensor x = s.input, y;
      for (int k = 0; k < L; ++k) {
        if (k > 0) {
          const Tensor fed = data->has_physics() ? data->physical_to_input(data->postprocess(y, x))
                                                 : data->prediction_to_input(y);
          x = slide_window(x, s.forcing[k]);
          feed_back(x, fed, data->feedback_map());
        }
        y = predict(x);
        if (crps) {
          loss += ensemble_crps(y, s.targets[k], w, vcrps);
        } else if (whole) {
          loss += tensor_loss(vwhole, y, E > 1 ? repeat_members(s.targets[k], E) : s.targets[k], {});
        } else {
          const Tensor tm = E > 1 ? repeat_members(s.targets[k], E) : s.targets[k];
          Tensor pp = y.clone(), tp = tm.clone();
          if (physical) {
            data->denormalise_target(pp);
            data->denormalise_target(tp);
          }
          loss += weighted_loss(physical ? pp : y, physical ? tp : tm, w, vloss, nullptr, 1.0, per_channel);
          if (vcomputed) loss += vcomputed(pp, tp, nullptr, 1.0);
        }
        Tensor p = E > 1 ? ensemble_mean(y, E) : y.clone(), t = s.targets[k].clone();
        data->denormalise_target(p);
        data->denormalise_target(t);
        const int64_t hw = p.numel() / p.shape[1];
        for (int64_t ch = 0; ch < p.shape[1]; ++ch)
          for (int64_t j = 0; j < hw; ++j) {
            const double d = (double)p.data<float>()[ch * hw + j] - t.data<float>()[ch * hw + j];
            sq[var_of[ch]] += d * d;
            sum[var_of[ch]] += d;
            cnt[var_of[ch]] += 1;
          }
      }
    }
    std::vector<double> out = {loss / (double)(n * L)};
    for (size_t v = 0; v < nv; ++v) out.push_back(std::sqrt(sq[v] / cnt[v]));
    for (size_t v = 0; v < nv; ++v) out.push_back(sum[v] / cnt[v]);
    return out;
  };
}

}  // namespace

Schedule credit_schedule(const CreditConfig& c, int64_t accum, int64_t epoch_batches) {
  Schedule sc;
  sc.lr = c.learning_rate;
  if (!c.use_scheduler) return sc;
  sc.kind = schedule_kind(c.scheduler_type);
  sc.accum_batches = accum;
  sc.epoch_batches = epoch_batches;
  sc.min_lr = c.min_lr;
  sc.warmup_steps = c.warmup_steps;
  sc.total_steps = c.total_steps;
  sc.t_max = c.t_max;
  sc.eta_min = c.eta_min;
  sc.first_cycle_steps = c.first_cycle_steps;
  sc.cycle_mult = c.cycle_mult;
  sc.max_lr = c.max_lr;
  sc.gamma = c.gamma;
  sc.plateau_max = c.plateau_mode == "max";
  sc.plateau_abs = c.plateau_threshold_mode == "abs";
  sc.factor = c.plateau_factor;
  sc.threshold = c.plateau_threshold;
  sc.plateau_eps = c.plateau_eps;
  sc.patience = c.plateau_patience;
  sc.cooldown = c.plateau_cooldown;
  return sc;
}

LossSpec credit_validation_spec(const CreditConfig& c) {
  if (c.base_loss.on) return c.base_loss.has_validation ? c.base_loss.validation : c.base_loss.training;
  const bool weighted = c.use_latitude_weights || c.use_variable_weights;
  // VariableTotalLoss2D: "for ensembles, load same loss for train and valid"
  if (weighted && c.training_loss.name == "KCRPS") return c.training_loss;
  if (c.has_validation_loss) return c.validation_loss;
  if (weighted) return LossSpec{"mae"};
  return c.training_loss;
}

LossFunction credit_validation_loss(const CreditConfig& c) {
  const LossSpec l = credit_validation_spec(c);
  return loss_function(l.name, l.delta);
}

// CREDIT's BaseLoss: each target variable's mean loss in physical units, combined with weights w_v
// (manual / variance, normalised to mean 1): channel c of variable v weighs
// w_v * C / (V * levels_v) in the mean over all C elements' channels. The variables the postblocks
// compute (include_computed_diagnostics) count among the V; their channels' weights follow the
// targets' (C then their own channel count).
std::vector<double> base_loss_channel_weights(const CreditConfig& c, const Era5Data& data, const std::string& config,
                                              bool lead) {
  const BaseLossSpec& b = c.base_loss;
  const std::vector<ChannelInfo>& tc = data.target_channels();
  std::vector<const std::vector<ChannelInfo>*> groups = {&tc};
  if (c.include_computed && !data.computed_channels().empty()) groups.push_back(&data.computed_channels());
  std::map<std::string, double> variances;
  if (b.weighting == "inverse_variance") variances = scaler_target_variances(b.scaler_path);
  std::vector<std::string> keys;
  std::map<std::string, int> levels;
  for (const auto* g : groups)
    for (const ChannelInfo& ch : *g) {
      const std::string key = var_key(c, ch);
      if (!levels[key]++) keys.push_back(key);
    }
  for (const auto& kv : b.manual)
    WXE_CHECK(levels.count(kv.first), config, ": loss.args.variable_weights.", kv.first,
              ": no such target variable (keys as ", keys.front(), ")");
  for (const auto& kv : b.overrides)
    WXE_CHECK(levels.count(kv.first), config, ": loss.args.base_loss_overrides.", kv.first,
              ": no such target variable (keys as ", keys.front(), ")");
  std::map<std::string, double> wv;
  double sum = 0;
  for (const std::string& key : keys) {
    const double manual = b.manual.count(key) ? b.manual.at(key) : 1.0;
    double w = manual;
    if (b.weighting == "inverse_variance") {
      if (const double* var = find_scaler(variances, key, b.scaler_path)) {
        w = manual / std::max(*var, 1e-12);
      } else if (lead) {
        note("wxe: warning: %s: loss.args.scaler_path %s has no target variance of '%s': weight %g\n",
             config.c_str(), b.scaler_path.c_str(), key.c_str(), manual);
      }
    }
    wv[key] = w;
    sum += w;
  }
  if (b.normalize && sum > 0)
    for (auto& kv : wv) kv.second /= sum / (double)keys.size();
  std::vector<double> out;
  for (const auto* g : groups)
    for (const ChannelInfo& ch : *g) {
      const std::string key = var_key(c, ch);
      out.push_back(wv[key] * (double)g->size() / ((double)keys.size() * levels[key]));
    }
  return out;
}

// BaseLoss's share of the computed diagnostics: each scored as a target variable is (`loss`, or
// its base_loss_overrides entry), from the computed prediction against the same block on the
// target twin, with `weights` (base_loss_channel_weights' tail); its gradient goes back through
// the block into the physical prediction. The surface geopotential: the static at the data's start.
std::function<double(const Tensor&, const Tensor&, Tensor*, double)> computed_loss(
    const CreditConfig& c, std::shared_ptr<const Era5Data> data, std::vector<double> weights, const LossSpec& loss) {
  std::vector<LossFunction> per;
  for (const ChannelInfo& ch : data->computed_channels()) {
    auto o = c.base_loss.overrides.find(var_key(c, ch));
    const LossSpec& l = o != c.base_loss.overrides.end() ? o->second : loss;
    per.push_back(loss_function(l.name, l.delta));
  }
  LossWeights w;
  if (c.use_latitude_weights) w.lat_weights = latitude_weights(data->lat());
  w.channel_weights = std::move(weights);
  const int64_t t0 = c.start;
  return [data, w, per, t0](const Tensor& p, const Tensor& t, Tensor* g, double scale) {
    const Tensor cp = data->compute_diagnostics(p, t0);
    // an ensemble's members each against the target (as the targets' loss)
    const Tensor tt = p.dim(0) != t.dim(0) ? repeat_members(t, p.dim(0) / t.dim(0)) : t;
    const Tensor ct = data->compute_diagnostics(tt, t0);
    Tensor gc;
    const double l = weighted_loss(cp, ct, w, per[0], g ? &gc : nullptr, scale, per);
    if (g) data->compute_diagnostics(p, t0, &gc, g);
    return l;
  };
}


// A whole-tensor loss as the trainer's loss (train/trainer.h whole_loss): its gradient written
// into *g (which may be the prediction itself: computed aside first).
std::function<double(const Tensor&, const Tensor&, Tensor*, double)> whole_loss(const LossSpec& l) {
  const TensorLoss f = tensor_loss_of(l);
  return [f](const Tensor& p, const Tensor& t, Tensor* g, double scale) {
    Tensor tmp;
    const double v = tensor_loss(f, p, t, {}, g ? &tmp : nullptr, scale);
    if (g) *g = tmp;
    return v;
  };
}

void finetune_from_config(const std::string& config, FinetuneConfig& fc,
                          const std::function<bool(const std::string&)>& given, bool lead) {
  CreditConfig c = read_credit_config(config);
  for (const std::string& w : c.warnings) note("wxe: warning: %s\n", w.c_str());
  auto data = std::make_shared<Era5Data>(c);
  for (const std::string& w : data->warnings) note("wxe: warning: %s: %s\n", config.c_str(), w.c_str());
  WXE_CHECK(c.start && c.end, config, ": data.start_datetime and data.end_datetime are required for finetune");
  data->input(c.start);  // the grid, and any error in the files, now
  if (!given("--forecast-len")) fc.forecast_len = c.forecast_len;
  const int L = fc.forecast_len;
  fc.data = config;
  fc.open_data = [data, c, L] { return open_era5_samples(data, training_blocks(c), L); };
  fc.to_input = [data](const Tensor& y, const Tensor& x) {
    return data->has_physics() ? data->physical_to_input(data->postprocess(y, x)) : data->prediction_to_input(y);
  };
  if (!given("--prognostic")) {
    fc.prognostic = data->prognostic_channels();
    fc.feedback_map = data->feedback_map();
  }
  if (!given("--save")) fc.save = c.save_loc;
  WXE_CHECK(!fc.save.empty(), config, ": save_loc is missing (or give --save)");
  if (!given("--lr")) fc.schedule.lr = c.learning_rate;
  if (!given("--weight-decay")) fc.adam.weight_decay = c.weight_decay;
  if (!given("--grad-max-norm")) {
    fc.grad_max_norm = c.grad_max_norm;
    fc.grad_clip_dynamic = c.grad_clip_dynamic;
  }
  if (!given("--accum")) fc.accum = c.grad_accum_every * c.train_batch_size;  // one sample per micro-batch
  if (!given("--ema")) fc.ema = c.use_ema;
  // trainer.mode fsdp: ZeRO-3 on the cpu; a GPU run keeps whole weights (ZeRO-1), saying so
  if (!given("--shard-weights") && c.shard_weights) {
    fc.shard_weights = fc.device == "cpu";
    if (lead)
      note("wxe: %s: trainer.mode fsdp: %s\n", config.c_str(),
           fc.shard_weights ? "--shard-weights (parameters, gradients and AdamW state sharded over dp x domain)"
                            : "weights not sharded on --device cuda yet (the optimizer state is: ZeRO-1)");
  }
  if (!given("--activation-checkpoint")) fc.activation_checkpoint = c.activation_checkpoint ? "blocks" : "none";
  // CREDIT's amp autocasts to float16 on a GPU (with a gradient scaler); wxe's mixed precision is
  // bfloat16 (float32's range: no loss scaling), Conv and Linear only
  if (!given("--precision") && c.amp) {
    fc.precision = "bf16";
    if (lead) note("wxe: %s: trainer.amp: --precision bf16 (Conv and Linear in bfloat16, float32 accumulation)\n",
                   config.c_str());
  }
  if (!given("--ema-decay")) fc.ema_decay = c.ema_decay;
  if (!given("--seed")) fc.seed = c.seed;
  if (!given("--shuffle")) fc.shuffle = true;  // CREDIT's sampler shuffles every epoch
  // CREDIT's epoch: batches_per_epoch batches of train_batch_size samples (at most the data's),
  // an optimizer step every grad_accum_every batches and at the epoch's end
  const int64_t data_batches =
      std::max<int64_t>(1, open_era5_samples(data, training_blocks(c), L)->size() / c.train_batch_size);
  const int64_t epoch_batches = c.batches_per_epoch > 0 ? std::min(c.batches_per_epoch, data_batches) : data_batches;
  const int64_t A = c.grad_accum_every;
  const int64_t epoch_steps = (epoch_batches + A - 1) / A;
  WXE_CHECK(given("--steps") || c.epochs <= ((int64_t)1 << 40) / epoch_steps, config, ": trainer.epochs ", c.epochs,
            " x ", epoch_steps, " optimizer steps per epoch is more than 2^40 steps");
  if (!given("--steps")) fc.steps = c.epochs * epoch_steps;
  if (!given("--schedule") && c.use_scheduler) {
    // the config's steps count batches (optimizer step j takes the lr of the batch that ends it)
    // or epochs; given on the command line warmup and total steps count optimizer steps (both
    // then come from the flags)
    const Schedule flags = fc.schedule;  // the command line's values
    fc.schedule = credit_schedule(c, A, epoch_batches);
    fc.schedule.lr = flags.lr;  // the config's learning_rate unless --lr was given (set above)
    Schedule& sc = fc.schedule;
    const bool w = given("--warmup-steps"), t = given("--total-steps");
    if (sc.kind == ScheduleKind::LinearWarmupCosine) {
      WXE_CHECK(w == t, "--warmup-steps and --total-steps with ", config,
                "'s scheduler: give both (on the command line they count optimizer steps, in the config batches)");
      if (w) {
        sc.warmup_steps = flags.warmup_steps;
        sc.total_steps = flags.total_steps;
        sc.accum_batches = 1;
        sc.epoch_batches = 0;
      }
    } else {
      WXE_CHECK(!w && !t, "--warmup-steps / --total-steps: ", config, "'s scheduler is ", c.scheduler_type,
                " (they set linear-warmup-cosine)");
      if (sc.kind == ScheduleKind::CosineRestarts && given("--lr") && lead)
        note("wxe: warning: %s: cosine-annealing-restarts runs from min_lr to max_lr; --lr is not used\n", config.c_str());
      if (sc.kind == ScheduleKind::Plateau && !(c.valid_start && c.valid_end) && lead)
        note("wxe: warning: %s: plateau without validation dates steps on each epoch's mean training loss\n",
             config.c_str());
    }
    if (A > 1 && epoch_batches % A)
      note("wxe: warning: %s: trainer.batches_per_epoch %lld is not a multiple of grad_accum_every %lld: CREDIT's "
           "last optimizer step of an epoch sums fewer batches, wxe's sums %d micro-batches (the lr is CREDIT's)\n",
           config.c_str(), (long long)epoch_batches, (long long)A, fc.accum);
    if (given("--min-lr")) sc.min_lr = flags.min_lr;
  }
  if (!given("--resume") && c.load_weights && c.load_optimizer) fc.resume = true;
  if (!given("--weights") && c.load_weights && !c.load_optimizer) {
    const std::string latest = latest_checkpoint(fc.save);
    WXE_CHECK(!latest.empty(), config, ": trainer.load_weights: no checkpoint in ", fc.save, " (",
              (fs::path(fc.save) / "latest").string(), " is missing)");
    fc.weights = (fs::path(latest) / "model.safetensors").string();
  }
  const LossSpec vspec = credit_validation_spec(c);
  std::function<double(const Tensor&, const Tensor&, Tensor*, double)> valid_computed;  // BaseLoss: computed diagnostics
  fc.ensemble_size = c.ensemble_size;
  fc.use_crps = !given("--loss") && is_crps_loss(c.training_loss.name);  // a BaseLoss's is its training_loss
  if (fc.use_crps) fc.crps = crps_loss(c.training_loss.name, c.training_loss.biased, c.training_loss.alpha);
  if (!given("--loss") && c.base_loss.on) {
    const BaseLossSpec& b = c.base_loss;
    const std::vector<ChannelInfo>& tc = data->target_channels();
    fc.loss = fc.use_crps ? LossFunction{} : loss_function(b.training.name, b.training.delta);
    fc.plain_mse = false;
    fc.lat = c.use_latitude_weights ? data->lat() : std::vector<double>(data->lat().size(), 0.0);
    fc.channel_weights = base_loss_channel_weights(c, *data, config, lead);
    if (fc.channel_weights.size() > tc.size()) {  // the computed diagnostics' weights follow the targets'
      const std::vector<double> tail(fc.channel_weights.begin() + (int64_t)tc.size(), fc.channel_weights.end());
      fc.channel_weights.resize(tc.size());
      fc.extra_loss = computed_loss(c, data, tail, b.training);
      if (c.valid_start && c.valid_end) valid_computed = computed_loss(c, data, tail, credit_validation_spec(c));
    }
    fc.channel_losses.clear();
    for (const ChannelInfo& ch : tc) {
      auto o = b.overrides.find(var_key(c, ch));
      fc.channel_losses.push_back(o != b.overrides.end() ? loss_function(o->second.name, o->second.delta) : fc.loss);
    }
    fc.to_physical = [data](Tensor& y, Tensor* d) { data->denormalise_target(y, d); };
  } else if (!given("--loss") && is_tensor_loss(c.training_loss.name)) {  // unweighted (the config reader's rule)
    fc.whole_loss = whole_loss(c.training_loss);
    fc.plain_mse = true;
  } else if (!given("--loss")) {
    fc.loss = fc.use_crps ? LossFunction{} : loss_function(c.training_loss.name, c.training_loss.delta);
    fc.plain_mse = !c.use_latitude_weights && !c.use_variable_weights;
    // latitudes at 0 degrees weigh every row 1 (cos(0) normalised)
    fc.lat = c.use_latitude_weights ? data->lat() : std::vector<double>(data->lat().size(), 0.0);
    fc.channel_weights.clear();
    if (c.use_variable_weights) {
      std::set<std::string> used;
      for (const ChannelInfo& ch : data->target_channels()) {
        auto it = c.variable_weights.find(ch.var);
        double wv = 1.0;
        if (it != c.variable_weights.end()) {
          used.insert(ch.var);
          const std::vector<double>& v = it->second;
          const size_t nl = c.sources[ch.src].levels.size();
          WXE_CHECK(v.size() == 1 || (ch.is3d && v.size() == nl), config, ": loss.variable_weights.", ch.var, ": ",
                    v.size(), " values, expected one", ch.is3d ? str(" or one per level (", nl, ")") : std::string());
          wv = v.size() == 1 ? v[0] : v[ch.level_index];
        } else if (lead && ch.level_index == 0) {
          note("wxe: warning: %s: loss.variable_weights has no weight for '%s': 1\n", config.c_str(), ch.var.c_str());
        }
        fc.channel_weights.push_back(wv);
      }
      for (const auto& kv : c.variable_weights)
        WXE_CHECK(used.count(kv.first), config, ": loss.variable_weights.", kv.first,
                  ": no such target variable in the data (prognostic and diagnostic variables are weighted)");
      WXE_CHECK(std::any_of(fc.channel_weights.begin(), fc.channel_weights.end(), [](double w) { return w > 0; }), config,
                ": loss.variable_weights: every target's weight is 0 (the loss would be 0 and nothing trained)");
    }
    if (c.spectral_term || c.power_term) {  // VariableTotalLoss2D's terms, latitude-weighted as its loss
      const std::vector<double> lat = c.use_latitude_weights ? latitude_weights(data->lat()) : std::vector<double>{};
      TensorLoss s, pw;
      s.kind = TensorLossKind::Spectral;
      pw.kind = TensorLossKind::Power;
      s.wavenum_init = pw.wavenum_init = c.spectral_wavenum;
      const double lambda = c.spectral_lambda;
      const bool spectral = c.spectral_term, power = c.power_term;
      fc.extra_loss = [=](const Tensor& p, const Tensor& t, Tensor* g, double scale) {
        const Tensor tt = p.dim(0) != t.dim(0) ? repeat_members(t, p.dim(0) / t.dim(0)) : t;
        double v = 0;
        if (power) v += lambda * tensor_loss(pw, p, tt, lat, g, lambda * scale);
        if (spectral) v += lambda * tensor_loss(s, p, tt, lat, g, lambda * scale);
        return v;
      };
    }
  }
  if (c.valid_start && c.valid_end)
    validation(c, data, fc, c.valid_forecast_len > 0 ? c.valid_forecast_len : L, vspec, valid_computed);
  if (lead) {
    fs::create_directories(fc.save);
    write_file_atomic((fs::path(fc.save) / "channel_schema.yaml").string(), data->channel_schema_yaml());
  }
}

}  // namespace wxe
