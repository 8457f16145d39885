// The forecast runs the tests make: the tiny WXFormer shipped in models/ (or `model`) from
// 2020-12-31T18 over a config's data, on one thread, without the progress line.
#pragma once
#include <string>

#include "forecast/forecast.h"
#include "tests/test_util.h"

namespace wxe::test {

inline ForecastArgs tiny_forecast(const std::string& config, const std::string& out, int steps = 2,
                                  const std::string& model = data_path("models/wxformer_tiny/model.onnx")) {
  ForecastArgs a;
  a.config = config;
  a.model = model;
  a.init = "2020-12-31T18";
  a.steps = steps;
  a.output = out;
  a.threads = 1;
  a.progress = false;
  return a;
}

}  // namespace wxe::test
