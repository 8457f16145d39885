// Fine-tuning test helpers: a small data directory, a tiny CrossFormer fine-tuning config, steps.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/npy.h"
#include "tests/test_util.h"
#include "train/finetune.h"

namespace wxe::test {

// Test data: a directory of x/y pairs drawn from the fixture input.
inline std::string make_series(const std::string& name, int count, const Shape& xs, const Shape& ys, unsigned seed) {
  std::string dir = tmp_path(name);
  std::filesystem::create_directories(dir);
  for (int i = 0; i < count; ++i) {
    char b[16];
    std::snprintf(b, sizeof b, "%04d", i);
    write_npy(dir + "/x_" + b + ".npy", randn(xs, seed + 2 * i));
    write_npy(dir + "/y_" + b + ".npy", randn(ys, seed + 2 * i + 1, 0.5f));
  }
  return dir;
}

inline FinetuneConfig tiny_config(const std::string& data, const std::string& save) {
  FinetuneConfig c;
  c.model = data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx");
  c.data = data;
  c.save = save;
  c.steps = 6;
  c.accum = 2;
  c.schedule.kind = ScheduleKind::LinearWarmupCosine;
  c.schedule.lr = 1e-3;
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = 6;
  c.progress = false;
  return c;
}

inline std::vector<double> run_steps(Trainer& t, int n) {
  std::vector<double> losses;
  for (int i = 0; i < n; ++i) losses.push_back(t.step().loss);
  return losses;
}

}  // namespace wxe::test
