// Training building blocks that do not depend on the graph: AdamW, learning-rate schedules,
// global-norm gradient clipping, EMA of the weights. Parameters and gradients are float32
// tensors that pair up by index. Every reduction sums fixed blocks in a fixed order, so the
// results do not depend on the thread count (a resumed run repeats an uninterrupted one bit
// for bit).
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/exec/train_kernels.h"
#include "engine/ir/tensor.h"

namespace wxe {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.01;
};

// PyTorch torch.optim.AdamW (no amsgrad), float32 element math in the order of PyTorch's CPU
// single-tensor path, scalars computed in double and rounded to float32 as PyTorch does:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = b2*v + (1-b2)*g*g;  t += 1;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Weight decay on every parameter. One step counter t for all parameters.
class AdamW {
 public:
  explicit AdamW(AdamWConfig c);
  // params[i] and grads[i] pair up (same shape). The moments of all parameters are created
  // (zeros) on the first step; later steps must pass the same parameters in the same order.
  void step(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads, double lr);
  // The same update with the moments of all parameters in one flat tensor of `total` floats,
  // parameter i's n[i] at offset[i] (the ZeRO block layout of a rank that holds every block).
  void step_flat(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 const std::vector<int64_t>& n, const std::vector<int64_t>& offset, int64_t total, double lr);
  // Counts one step and returns its scalars, for a caller that updates state it holds itself
  // (a device's buffers, through TrainKernels::adamw).
  AdamWScalars next_step(double lr);
  int64_t steps() const { return t_; }  // t: optimizer steps done
  // State for checkpoints: exp_avg / exp_avg_sq per parameter index, plus t. A round trip
  // through set_state is bit-exact.
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }
  void set_state(int64_t t, std::vector<Tensor> m, std::vector<Tensor> v);
  const AdamWConfig& config() const { return c_; }

 private:
  AdamWConfig c_;
  int64_t t_ = 0;
  std::vector<Tensor> m_, v_;  // per parameter, shaped like it
};

// CREDIT's schedulers (credit/scheduler.py) as its gen2 trainer steps them: linear-warmup-cosine
// and cosine-annealing-restarts after every batch, cosine-annealing, lambda and plateau at the end
// of every epoch (lambda also at its start: CREDIT's train_one_epoch steps it once more).
enum class ScheduleKind { Constant, LinearWarmupCosine, CosineAnnealing, CosineRestarts, Lambda, Plateau };
// "constant", "linear-warmup-cosine", "cosine-annealing", "cosine-annealing-restarts", "lambda",
// "plateau"; the reverse is an error for an unknown name.
const char* schedule_name(ScheduleKind k);
// CREDIT's lr_lambda_phase1(epoch) (num_epochs 100, warmup_epochs 10): the lambda schedule's factor.
double credit_lambda_phase1(int64_t epoch);
ScheduleKind schedule_kind(const std::string& name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::Constant;
  double lr = 1e-3, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 1;
  // cosine-annealing: torch's CosineAnnealingLR(T_max, eta_min), its recursive form
  int64_t t_max = 1;
  double eta_min = 0;
  // cosine-annealing-restarts: CREDIT's CosineAnnealingWarmupRestarts (warmup_steps and min_lr
  // above; its lr starts at min_lr and rises to max_lr, trainer.learning_rate is not used)
  int64_t first_cycle_steps = 1;
  double cycle_mult = 1, max_lr = 0.1, gamma = 1;
  // plateau: torch's ReduceLROnPlateau on the metric of each epoch that ended (epoch_metrics,
  // one per epoch: the validation loss, or the training loss without validation)
  bool plateau_max = false, plateau_abs = false;
  double factor = 0.1, threshold = 1e-4, plateau_eps = 1e-8;
  int64_t patience = 10, cooldown = 0;
  std::vector<double> epoch_metrics;
  // Counting in batches, as CREDIT's trainer steps its scheduler once per batch (micro-batch)
  // while the optimizer steps every `accum_batches` batches and at the end of each epoch of
  // `epoch_batches` batches (0: no epochs). 1: the schedule counts optimizer steps.
  int64_t accum_batches = 1, epoch_batches = 0;
  // The schedule's step at optimizer step `step`: step itself, or with accum_batches > 1 the
  // index of the batch that ends it (CREDIT's scheduler.last_epoch at that optimizer.step()).
  int64_t schedule_step(int64_t step) const;
  // The epoch (0-based) of optimizer step `step` (0 without epochs).
  int64_t epoch_of(int64_t step) const;
  bool per_epoch() const {
    return kind == ScheduleKind::CosineAnnealing || kind == ScheduleKind::Lambda || kind == ScheduleKind::Plateau;
  }
  // lr of optimizer step `step` (0-based: the first update is step 0), at s = schedule_step(step).
  // LinearWarmupCosine: s < warmup: lr * s / warmup (so 0 at s 0);
  // else p = min(1, (s - warmup) / max(1, total - warmup)),
  //      min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi p)).
  // The others as CREDIT computes them (see the fields above); plateau from epoch_metrics of the
  // epochs before step's (an error when one is missing).
  double lr_at(int64_t step) const;
  // The scheduler's own state at batch (per-batch kinds) or epoch (per-epoch kinds) `s`, for
  // lr_at and for CREDIT's scheduler_state_dict (train/credit_checkpoint.h).
  struct Restarts {
    int64_t step_in_cycle = 0, cur_cycle_steps = 0, cycle = 0;
    double max_lr = 0, lr = 0;
  };
  Restarts restarts_at(int64_t s) const;
  struct Plateau {
    double lr = 0, best = 0;
    int64_t num_bad_epochs = 0, cooldown_counter = 0;
  };
  Plateau plateau_after(int64_t epochs) const;  // after the metrics of the first `epochs` epochs
};

// A schedule as checkpoint metadata ("schedule", its parameters, "epoch_metrics"; doubles to
// 17 digits) and back (what a key lacks keeps its default; errors name `where`).
std::map<std::string, std::string> schedule_metadata(const Schedule& s);
Schedule schedule_from_metadata(const std::map<std::string, std::string>& meta, const std::string& where);

// torch.nn.utils.clip_grad_norm_(norm_type=2): total = sqrt(sum over all grads of g^2),
// accumulated in double. With max_norm > 0 the factor is max_norm / (total + 1e-6) in float32
// (as PyTorch computes it) and every gradient is multiplied by it when it is below 1 (that is,
// when total + 1e-6 > max_norm). Returns total (before clipping). A non-finite total is
// returned as is and nothing is scaled.
double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm);
// Sum of g^2 over a set of gradients (double), the square of the global L2 norm: the
// distributed version all-reduces it across shards before the square root.
double grad_norm_squared(const std::vector<const Tensor*>& grads);
// Multiplies every gradient by `factor` (float32), as clip_grad_norm does.
void scale_grads(const std::vector<Tensor*>& grads, float factor);

// EMA of parameters as CREDIT's EMATracker (credit/trainers/base_trainer.py) keeps it: the
// shadow starts as a copy of the parameters; update n (1-based) after the n-th optimizer step
// takes d = min(decay, (1 + n) / (10 + n)) and sets shadow = d * shadow + (1 - d) * p (float32,
// coefficients rounded to float32). Spectral norm's weight_u / weight_v are not parameters here
// (train/trainer.h trains neither), as CREDIT leaves them out of its average.
class Ema {
 public:
  Ema(double decay, const std::vector<const Tensor*>& params);
  void update(const std::vector<const Tensor*>& params);
  // Counts one update and returns its decay d (for a caller that updates state it holds itself,
  // through TrainKernels::ema).
  double next_decay();
  std::vector<Tensor>& shadow() { return shadow_; }
  double decay() const { return decay_; }  // the maximum decay
  int64_t updates() const { return n_; }
  void set_updates(int64_t n) { n_ = n; }  // resuming: the updates the loaded shadow has seen

 private:
  double decay_;
  int64_t n_ = 0;
  std::vector<Tensor> shadow_;
};

}  // namespace wxe
