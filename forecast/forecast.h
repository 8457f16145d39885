// Layer: library (forecast/), over train/, load/, data/ and engine/.
// `wxe forecast CONFIG.yml`: an autoregressive rollout from initial conditions read from the
// config's data files (data/era5.h), denormalised and written as CF-convention netCDF.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "data/era5.h"
#include "parallel/mesh.h"

namespace wxe {

struct ForecastArgs {
  std::string config, model, weights, init, output, plan;
  int steps = 1;
  int threads = 0;
  std::string device = "cpu";  // a backend (engine/exec/backend.h): "cpu" or "cuda"
  bool reference = false;
  bool progress = true;
};

// The rollout from x0 = data.input_window(init) (history_len steps): step k (0-based) runs
// y_k = model(x_k); x_{k+1} is x_k slid by one step (slide_window), the new step being x_k's
// newest with its prognostic channels replaced by y_k's (still normalised) and its dynamic
// forcing read at init + (k+1)*dt (on a second thread while the model runs); static channels
// are kept. emit(k, y_k) gets the output in physical units after the postblocks
// (Era5Data::postprocess), the state written. With physics postblocks that state,
// re-normalised, is what the next step takes (CREDIT's rollout).
void rollout(const Era5Data& data, Tensor x0, int64_t init, int steps, const std::function<Tensor(const Tensor&)>& model,
             const std::function<void(int, const Tensor&)>& emit);

// Loads the model (sharded over mesh->tp when tp > 1), runs the rollout and, on rank 0,
// writes the forecast. Returns the exit code.
int run_forecast(const ForecastArgs& a, Mesh* mesh = nullptr);

}  // namespace wxe
