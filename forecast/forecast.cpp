#include "forecast/forecast.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "engine/ir/error.h"
#include "engine/exec/executor.h"
#include "engine/io/file_util.h"
#include "engine/io/samples.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"

namespace fs = std::filesystem;

namespace wxe {

void rollout(const Era5Data& data, Tensor x, int64_t init, int steps, const std::function<Tensor(const Tensor&)>& model,
             const std::function<void(int, const Tensor&)>& emit) {
  const int64_t dt = data.config().timestep;
  Tensor step = last_step(x);
  const int64_t hw = step.numel() / step.shape[1];
  for (int k = 0; k < steps; ++k) {
    // the next step's forcing is read while the model runs (joined before emit, which may write
    // netCDF: the library is not used from two threads at once)
    std::future<Tensor> next;
    if (k + 1 < steps)
      next = std::async(std::launch::async, [&data, s = step.clone(), t = init + (k + 1) * dt]() mutable {
        data.set_forcing(s, t);
        return s;
      });
    Tensor y = model(x);  // (1, C_out, 1, H, W)
    if (next.valid()) step = next.get();
    WXE_CHECK(y.dtype == DType::F32 && y.shape.size() == x.shape.size() && y.numel() / y.shape[1] == hw &&
                  y.shape[1] == (int64_t)data.target_channels().size(),
              "the model's output ", shape_str(y.shape), " does not match the config's ", data.target_channels().size(),
              " target channels on the input's grid ", shape_str(step.shape));
    // the written state: y through the postblocks (CREDIT's y_processed), which is also what the
    // next step takes where the config has physics postblocks
    const Tensor phys = data.postprocess(y, x);
    emit(k, phys);
    if (k + 1 == steps) break;
    // the next step: the prediction's prognostic channels, the statics kept, the forcing read above
    feed_back(step, data.has_physics() ? data.physical_to_input(phys) : data.prediction_to_input(y), data.feedback_map());
    x = slide_window(x, step);
  }
}

int run_forecast(const ForecastArgs& a, Mesh* mesh) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool lead = !mesh || mesh->rank == 0;
  WXE_CHECK(a.steps >= 1, "--steps must be at least 1");
  WXE_CHECK(!a.output.empty(), "--output FILE.nc is required");
  CreditConfig cfg = read_credit_config(a.config, /*training=*/false);
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
  WXE_CHECK(!mesh || mesh->dp == 1, "forecast runs one model copy: the world must equal --tp x --domain (",
            mesh ? mesh->world : 1, " ranks, --tp ", tp, ", --domain ", mesh ? mesh->domain : 1, ")");
  TpSharding sharding(mesh, a.plan);
  LoadOptions lo;
  lo.weights = a.weights;
  lo.slices_of = sharding.slices_of(a.weights);
  prepare_model(g, {{in_name, {DType::F32, x0.shape}}}, lo);
  if (tp > 1) {
    ShardStats st = sharding.shard(g);
    note("wxe: tp %d: %d column- and %d row-parallel layers\n", tp, st.column, st.row);
  }
  shard_domain(g, mesh, false);
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
        out->write(k, y);
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

}  // namespace wxe
