// The fine-tuning commands' loops over a Trainer (train/trainer.h).
#pragma once
#include <string>

#include "train/trainer.h"

namespace wxe {

// `wxe finetune`: the loop with progress, training_log.csv, loss_curve.png and checkpoints.
// Under a mesh every rank calls it; rank 0 prints and writes the log. Returns the exit code
// (4: non-finite loss).
int run_finetune(const FinetuneConfig& cfg, Mesh* mesh = nullptr);

// `wxe bench --train`: time per training step (forward, backward, clip, AdamW) on one input
// against a zero target, after one warm-up step, on `device`, at `precision` (FinetuneConfig).
// Prints a table (time per op on the cpu), with nodes > 0 the slowest nodes' forward and backward,
// and, with json, one JSON line.
int run_train_bench(const std::string& model, const std::string& input, const std::string& weights, int threads,
                    int runs, bool json, const std::string& device = "cpu",
                    const std::string& activation_checkpoint = "none", const std::string& precision = "fp32",
                    int nodes = 0);

}  // namespace wxe
