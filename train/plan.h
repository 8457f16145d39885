// `wxe plan` and finetune's start-up check: the peak memory per rank of a run on each mesh a
// model allows (dp x tp x domain = ranks) and each --activation-checkpoint setting, from shapes.
//
// Not a formula: for each mesh the training graph is built as the Trainer builds it
// (rank_training_graph: tp shard, sequence parallel, domain bands, fusions, segments) and one
// step is run by a plan-only GradExecutor (ExecOptions::plan_only: the executor's own memory
// plan, no kernel, tensors that hold no bytes but are counted), so the activations at the peak
// and the values kept for the backward are what the real step makes. Parameters, gradients and
// the AdamW state (ZeRO-1 over dp x domain) are the Trainer's blocks; the optimizer's packing
// buffers under ZeRO are added. What no plan sees (the program and its libraries, the kernels'
// scratch, the allocator's slack) is the process's own resident size before planning plus a
// measured allowance (docs/internals/memory-plan.md#predicting-the-peak-wxe-plan).
#pragma once
#include <string>
#include <vector>

#include "engine/ir/tensor.h"
#include "train/trainer.h"

namespace wxe {

struct PlanRequest {
  std::string model;
  DType dtype = DType::F32;
  Shape input;               // one micro-batch: (B, C, T, H, W); empty: the model's declared shape
  int ranks = 1;
  double memory = 0;         // bytes available per rank; <= 0: none given (every row fits)
  bool train = true;         // false: inference (no gradients, no optimizer, no checkpointing)
  int accum = 0;             // micro-batches per step over all dp groups; 0: any (dp not limited)
  // the run's other options: tp plan file, precision, sequence parallelism, fusions, prefetch,
  // frozen parameters; its activation_checkpoint is ignored unless `only` is set
  FinetuneConfig cfg;
  // only this mesh and cfg.activation_checkpoint (finetune's own run): tp, domain > 0
  int only_tp = 0, only_domain = 0;
  // the planning process runs under mpirun already (its resident size holds MPI's buffers)
  bool in_mpi = false;
  // the resident size of the process before it loaded anything (0: measured at plan_run's start);
  // a second plan in one process gives the first's (Plan::resident)
  double resident = 0;
};

struct PlanRow {
  int dp = 1, tp = 1, domain = 1;
  std::string checkpoint = "none";  // "none" or "blocks"; "-" for inference
  // bytes per rank
  double params = 0, grads = 0, adamw = 0;
  double kept = 0;         // activations kept for the backward at the end of the forward
  double activations = 0;  // the step's tensors at its peak beyond what persists (the memory line's)
  double other = 0;        // the graph's other constants, samples read ahead
  double overhead = 0;     // what no plan sees: the program, libraries, scratch, slack
  double peak = 0;         // predicted peak resident size of the process
  double comm = 0;         // bytes each rank sends per optimizer step (estimate)
  bool fits = true;
};

struct Plan {
  std::vector<PlanRow> rows;
  std::vector<std::string> refused;  // "dp 1 x tp 3 x domain 1: why", meshes the model cannot take
  int best = -1;                     // the row recommended: the fastest that fits (plan.cpp rank_rows)
  double resident = 0;               // PlanRequest::resident as used
};

// Builds and plans every candidate (or the one request.only_* names). Errors (no model, bad
// input) are wxe::Error with one line.
Plan plan_run(const PlanRequest& r);
// The table and the recommendation, as `wxe plan` prints them; one JSON object.
std::string plan_table(const Plan& p, const PlanRequest& r);
std::string plan_json(const Plan& p, const PlanRequest& r);
// "--activation-checkpoint blocks (17.2 GB) or mpirun -n 4 --tp 2 (12.0 GB)": the rows that fit,
// best first, at most `n`, as the options that give them; "" when none fits.
std::string fitting_options(const Plan& p, int n = 3);

// Bytes each rank may use here: the smaller of MemAvailable and the cgroup's limit (less what
// it uses), over the ranks on this node (Open MPI's, MPICH's or Slurm's local size; else `world`).
double available_per_rank(int world);

}  // namespace wxe
