#include "forecast/forecast.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/ir/error.h"
#include "engine/exec/executor.h"
#include "engine/io/file_util.h"
#include "train/loss.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"

namespace fs = std::filesystem;

namespace wxe {

void rollout(const Era5Data& data, Tensor x, int64_t init, int steps, const std::function<Tensor(const Tensor&)>& model,
             const std::function<void(int, const Tensor&)>& emit) {
  const int64_t dt = data.config().timestep;
  const int np = data.prognostic_channels();
  Tensor step = last_step(x);
  const int64_t hw = step.numel() / step.shape[1];
  for (int k = 0; k < steps; ++k) {
    Tensor y = model(x);  // (1, C_out, 1, H, W)
    WXE_CHECK(y.dtype == DType::F32 && y.shape.size() == x.shape.size() && y.numel() / y.shape[1] == hw &&
                  y.shape[1] == (int64_t)data.target_channels().size(),
              "the model's output ", shape_str(y.shape), " does not match the config's ", data.target_channels().size(),
              " target channels on the input's grid ", shape_str(step.shape));
    emit(k, y);
    if (k + 1 == steps) break;
    // the next step: the prediction's prognostic channels, the statics kept, the forcing read
    step = step.clone();
    feed_back(step, data.prediction_to_input(y), np);
    data.set_forcing(step, init + (k + 1) * dt);
    x = slide_window(x, step);
  }
}

int run_forecast(const ForecastArgs& a, Mesh* mesh) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool lead = !mesh || mesh->rank == 0;
  WXE_CHECK(a.steps >= 1, "--steps must be at least 1");
  WXE_CHECK(!a.output.empty(), "--output FILE.nc is required");
  CreditConfig cfg = read_credit_config(a.config);
  for (const std::string& w : cfg.warnings) note("wxe: warning: %s\n", w.c_str());
  auto data = std::make_shared<Era5Data>(cfg);
  for (const std::string& w : data->warnings) note("wxe: warning: %s: %s\n", a.config.c_str(), w.c_str());
  const int64_t init = parse_datetime(a.init, "--init");
  if (lead) {
    const fs::path dir = fs::path(a.output).parent_path();
    WXE_CHECK(dir.empty() || fs::is_directory(dir), a.output, ": no folder ", dir.string());
  }
  Tensor x0 = data->input_window(init);
  data->read_metadata(init);
  note("wxe: %s: %zu input channels, %zu target channels (%d prognostic), grid %zux%zu, init %s\n", a.config.c_str(),
       data->input_channels().size(), data->target_channels().size(), data->prognostic_channels(), data->lat().size(),
       data->lon().size(), format_datetime(init).c_str());

  Graph g = import_onnx(a.model);
  WXE_CHECK(g.inputs.size() == 1, a.model, ": forecast needs a model with one input, it has ", g.inputs.size());
  const std::string in_name = g.values[g.inputs[0]].name;
  const Shape& declared = g.values[g.inputs[0]].shape;
  WXE_CHECK(declared.size() != 5 || declared[2] < 0 || declared[2] == cfg.history_len, a.model, ": input '", in_name,
            "' takes ", declared[2], " time steps (dim 2 of ", shape_str(declared), "); ", a.config,
            " has data.history_len ", cfg.history_len);
  const int tp = mesh ? mesh->tp : 1;
  WXE_CHECK(!mesh || mesh->dp == 1, "forecast runs one model copy: the world must equal --tp (", mesh ? mesh->world : 1,
            " ranks, --tp ", tp, ")");
  TpSharding sharding(mesh, a.plan);
  LoadOptions lo;
  lo.weights = a.weights;
  lo.slices_of = sharding.slices_of(a.weights);
  prepare_model(g, {{in_name, {DType::F32, x0.shape}}}, lo);
  if (tp > 1) {
    ShardStats st = sharding.shard(g);
    note("wxe: tp %d: %d column- and %d row-parallel layers\n", tp, st.column, st.row);
  }
  ExecOptions opt;
  opt.threads = a.threads;
  opt.kernels = a.reference ? KernelKind::Reference : KernelKind::Fast;
  opt.device = a.device;
  Executor ex(g, opt);

  std::unique_ptr<ForecastWriter> out;
  const bool tty = isatty(fileno(stderr));
  auto t1 = std::chrono::steady_clock::now();
  rollout(
      *data, x0, init, a.steps, [&](const Tensor& x) { return ex.run({{in_name, x}}).at(0); },
      [&](int k, const Tensor& y) {
        if (!lead) return;
        if (!out) out = std::make_unique<ForecastWriter>(a.output, *data, init, a.steps);
        Tensor phys = y.clone();
        data->denormalise_target(phys);
        out->write(k, phys);
        if (a.progress && !g_quiet) {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
          const double eta = s / (k + 1) * (a.steps - k - 1);
          const int width = 24, fill = width * (k + 1) / a.steps;
          const std::string valid = format_datetime(init + (int64_t)(k + 1) * cfg.timestep);
          if (tty)
            std::fprintf(stderr, "\r[%s%s] step %d/%d  %s  ETA %.0f s   %s", std::string(fill, '#').c_str(),
                         std::string(width - fill, '.').c_str(), k + 1, a.steps, valid.c_str(), eta,
                         k + 1 == a.steps ? "\n" : "");
          else
            std::fprintf(stderr, "wxe: step %d/%d valid %s ETA %.0f s\n", k + 1, a.steps, valid.c_str(), eta);
        }
      });
  if (!lead) return 0;
  out->close();
  std::printf("forecast: %d steps of %g h from %s written to %s (%.1f s)\n", a.steps, cfg.timestep / 3600.0,
              format_datetime(init).c_str(), a.output.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

namespace {

// Validation over valid_start_datetime..valid_end_datetime once per epoch: the rollout of
// forecast_len steps from each sample (as in training, no gradients), the training loss, and
// per variable (all its levels) the RMSE and bias (mean of prediction - truth) in physical
// units, as CREDIT's valid_loss, valid_rmse/<var_key>, valid_bias/<var_key> columns.
void validation(const CreditConfig& c, std::shared_ptr<Era5Data> data, FinetuneConfig& fc, int L) {
  std::shared_ptr<SampleSource> vs = open_era5_samples(data, c.valid_start, c.valid_end, L);
  WXE_CHECK(vs->size() > 0, c.file, ": no validation samples of ", L,
            " steps in valid_start_datetime..valid_end_datetime");
  const int64_t n = c.valid_batches_per_epoch > 0 ? std::min(c.valid_batches_per_epoch, vs->size()) : vs->size();
  std::vector<std::string> keys;
  std::vector<int> var_of;  // target channel -> index into keys
  for (const ChannelInfo& ch : data->target_channels()) {
    const std::string key = c.source + "/" + ch.field_type + (ch.is3d ? "/3d/" : "/2d/") + ch.var;
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
  const int np = data->prognostic_channels();
  const size_t nv = keys.size();
  fc.validate_every = fc.steps / std::max<int64_t>(1, c.epochs);
  fc.validate = [vs, data, w, n, L, np, nv, var_of](const std::function<Tensor(const Tensor&)>& predict) {
    double loss = 0;
    std::vector<double> sq(nv), sum(nv), cnt(nv);
    for (int64_t i = 0; i < n; ++i) {
      Sample s = vs->get(i);
      Tensor x = s.input, y;
      for (int k = 0; k < L; ++k) {
        if (k > 0) {
          x = slide_window(x, s.forcing[k]);
          feed_back(x, data->prediction_to_input(y), np);
        }
        y = predict(x);
        loss += weighted_mse(y, s.targets[k], w);
        Tensor p = y.clone(), t = s.targets[k].clone();
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
  fc.open_data = [data, c, L] { return open_era5_samples(data, c.start, c.end, L); };
  fc.to_input = [data](const Tensor& y) { return data->prediction_to_input(y); };
  if (!given("--prognostic")) fc.prognostic = data->prognostic_channels();
  if (!given("--save")) fc.save = c.save_loc;
  WXE_CHECK(!fc.save.empty(), config, ": save_loc is missing (or give --save)");
  if (!given("--lr")) fc.schedule.lr = c.learning_rate;
  if (!given("--weight-decay")) fc.adam.weight_decay = c.weight_decay;
  if (!given("--grad-max-norm")) fc.grad_max_norm = c.grad_max_norm;
  if (!given("--accum")) fc.accum = c.grad_accum_every * c.train_batch_size;  // one sample per micro-batch
  if (!given("--ema")) fc.ema = c.use_ema;
  if (!given("--ema-decay")) fc.ema_decay = c.ema_decay;
  if (!given("--seed")) fc.seed = c.seed;
  if (!given("--shuffle")) fc.shuffle = true;  // CREDIT's sampler shuffles every epoch
  // CREDIT's epoch: batches_per_epoch batches of train_batch_size samples (at most the data's),
  // an optimizer step every grad_accum_every batches and at the epoch's end
  const int64_t data_batches =
      std::max<int64_t>(1, open_era5_samples(data, c.start, c.end, L)->size() / c.train_batch_size);
  const int64_t epoch_batches = c.batches_per_epoch > 0 ? std::min(c.batches_per_epoch, data_batches) : data_batches;
  const int64_t A = c.grad_accum_every;
  const int64_t epoch_steps = (epoch_batches + A - 1) / A;
  WXE_CHECK(given("--steps") || c.epochs <= ((int64_t)1 << 40) / epoch_steps, config, ": trainer.epochs ", c.epochs,
            " x ", epoch_steps, " optimizer steps per epoch is more than 2^40 steps");
  if (!given("--steps")) fc.steps = c.epochs * epoch_steps;
  if (!given("--schedule") && c.use_scheduler) {
    // CREDIT steps linear-warmup-cosine once per batch: the config's warmup_steps and
    // total_steps count batches, so optimizer step j takes the lr of the batch that ends it.
    // Given on the command line they count optimizer steps (both then come from the flags).
    fc.schedule.kind = ScheduleKind::LinearWarmupCosine;
    const bool w = given("--warmup-steps"), t = given("--total-steps");
    WXE_CHECK(w == t, "--warmup-steps and --total-steps with ", config,
              "'s scheduler: give both (on the command line they count optimizer steps, in the config batches)");
    if (!w) {
      fc.schedule.warmup_steps = c.warmup_steps;
      fc.schedule.total_steps = c.total_steps;
      fc.schedule.accum_batches = A;
      fc.schedule.epoch_batches = epoch_batches;
      if (A > 1 && epoch_batches % A)
        note("wxe: warning: %s: trainer.batches_per_epoch %lld is not a multiple of grad_accum_every %lld: CREDIT's "
             "last optimizer step of an epoch sums fewer batches, wxe's sums %d micro-batches (the lr is CREDIT's)\n",
             config.c_str(), (long long)epoch_batches, (long long)A, fc.accum);
    }
    if (!given("--min-lr")) fc.schedule.min_lr = c.min_lr;
  }
  if (!given("--resume") && c.load_weights && c.load_optimizer) fc.resume = true;
  if (!given("--weights") && c.load_weights && !c.load_optimizer) {
    const fs::path latest = fs::path(fc.save) / "latest";
    WXE_CHECK(fs::exists(latest), config, ": trainer.load_weights: no checkpoint in ", fc.save, " (", latest.string(),
              " is missing)");
    std::ifstream f(latest);
    std::string step;
    f >> step;
    fc.weights = (fs::path(fc.save) / step / "model.safetensors").string();
  }
  if (!given("--loss")) {
    fc.plain_mse = !c.use_latitude_weights && !c.use_variable_weights;
    // latitudes at 0 degrees weigh every row 1 (cos(0) normalised)
    fc.lat = c.use_latitude_weights ? data->lat() : std::vector<double>(data->lat().size(), 0.0);
    fc.channel_weights.clear();
    if (c.use_variable_weights)
      for (const ChannelInfo& ch : data->target_channels())
        fc.channel_weights.push_back(c.variable_weights.count(ch.var) ? c.variable_weights.at(ch.var) : 1.0);
  }
  if (c.valid_start && c.valid_end) validation(c, data, fc, c.valid_forecast_len > 0 ? c.valid_forecast_len : L);
  if (lead) {
    fs::create_directories(fc.save);
    write_file_atomic((fs::path(fc.save) / "channel_schema.yaml").string(), data->channel_schema_yaml());
  }
}

}  // namespace wxe
