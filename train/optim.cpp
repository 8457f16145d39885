#include "train/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/io/json.h"

namespace wxe {

namespace {

void check_f32(const Tensor* t, const char* what, size_t i) {
  WXE_CHECK(t && t->defined(), what, " ", i, " is missing");
  WXE_CHECK(t->dtype == DType::F32, what, " ", i, " is ", dtype_name(t->dtype), ", expected float32");
}

double sum_squares(const Tensor& t) {
  double s = 0;
  const std::vector<int64_t> bounds = {0, t.numel()};
  cpu_train_kernels().segment_sum_squares(t.data<float>(), bounds, &s);
  return s;
}

}  // namespace

AdamW::AdamW(AdamWConfig c) : c_(c) {
  WXE_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, "AdamW: betas (", c.beta1, ", ", c.beta2,
            ") must lie in [0, 1)");
  WXE_CHECK(c.eps > 0, "AdamW: eps ", c.eps, " must be positive");
}

void AdamW::step(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads, double lr) {
  WXE_CHECK(params.size() == grads.size(), "AdamW: ", params.size(), " parameters but ", grads.size(), " gradients");
  WXE_CHECK(m_.empty() || m_.size() == params.size(), "AdamW: ", params.size(), " parameters, the optimizer state has ",
            m_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    check_f32(params[i], "AdamW: parameter", i);
    check_f32(grads[i], "AdamW: gradient", i);
    WXE_CHECK(params[i]->shape == grads[i]->shape, "AdamW: parameter ", i, " is ", shape_str(params[i]->shape),
              ", its gradient ", shape_str(grads[i]->shape));
    if (!m_.empty())
      WXE_CHECK(m_[i].shape == params[i]->shape, "AdamW: parameter ", i, " is ", shape_str(params[i]->shape),
                ", its optimizer state ", shape_str(m_[i].shape));
  }
  if (m_.empty()) {
    for (Tensor* p : params) {
      m_.push_back(Tensor::zeros(DType::F32, p->shape));
      v_.push_back(Tensor::zeros(DType::F32, p->shape));
    }
  }
  const AdamWScalars s = next_step(lr);
  for (size_t i = 0; i < params.size(); ++i)
    cpu_train_kernels().adamw(s, params[i]->data<float>(), grads[i]->data<float>(), m_[i].data<float>(), v_[i].data<float>(),
              params[i]->numel());
}

void AdamW::step_flat(const std::vector<float*>& params, const std::vector<const float*>& grads,
                      const std::vector<int64_t>& n, const std::vector<int64_t>& offset, int64_t total, double lr) {
  WXE_CHECK(params.size() == grads.size() && params.size() == n.size() && params.size() == offset.size(),
            "AdamW: ", params.size(), " parameters but ", grads.size(), " gradients");
  WXE_CHECK(m_.empty() || (m_.size() == 1 && m_[0].numel() == total), "AdamW: the optimizer state holds ", m_.size(),
            " tensors, not one of ", total, " floats");
  if (m_.empty()) {
    m_.push_back(Tensor::zeros(DType::F32, {total}));
    v_.push_back(Tensor::zeros(DType::F32, {total}));
  }
  const AdamWScalars s = next_step(lr);
  for (size_t i = 0; i < params.size(); ++i) {
    WXE_CHECK(offset[i] >= 0 && offset[i] + n[i] <= total, "AdamW: parameter ", i, " outside the state");
    cpu_train_kernels().adamw(s, params[i], grads[i], m_[0].data<float>() + offset[i], v_[0].data<float>() + offset[i], n[i]);
  }
}

AdamWScalars AdamW::next_step(double lr) {
  ++t_;
  // Scalars in double, as PyTorch computes them in Python, then rounded once to float32
  // where the tensor ops take them.
  const double bc1 = 1 - std::pow(c_.beta1, (double)t_);
  const double bc2 = 1 - std::pow(c_.beta2, (double)t_);
  AdamWScalars s;
  s.decay = (float)(1 - lr * c_.weight_decay);
  s.w1 = (float)(1 - c_.beta1);
  s.b2 = (float)c_.beta2;
  s.w2 = (float)(1 - c_.beta2);
  s.bc2_sqrt = (float)std::sqrt(bc2);
  s.eps = (float)c_.eps;
  s.neg_step = (float)(-(lr / bc1));
  return s;
}

void AdamW::set_state(int64_t t, std::vector<Tensor> m, std::vector<Tensor> v) {
  WXE_CHECK(t >= 0, "AdamW state: step ", t, " is negative");
  WXE_CHECK(m.size() == v.size(), "AdamW state: ", m.size(), " exp_avg but ", v.size(), " exp_avg_sq tensors");
  for (size_t i = 0; i < m.size(); ++i) {
    check_f32(&m[i], "AdamW state: exp_avg", i);
    check_f32(&v[i], "AdamW state: exp_avg_sq", i);
    WXE_CHECK(m[i].shape == v[i].shape, "AdamW state: exp_avg ", i, " is ", shape_str(m[i].shape), ", exp_avg_sq ",
              shape_str(v[i].shape));
  }
  t_ = t;
  m_ = std::move(m);
  v_ = std::move(v);
}

int64_t Schedule::schedule_step(int64_t step) const {
  if (accum_batches <= 1) return step;
  if (epoch_batches <= 0) return (step + 1) * accum_batches - 1;
  const int64_t per_epoch = (epoch_batches + accum_batches - 1) / accum_batches;  // the last may be short
  return step / per_epoch * epoch_batches + std::min((step % per_epoch + 1) * accum_batches, epoch_batches) - 1;
}

int64_t Schedule::epoch_of(int64_t step) const {
  return epoch_batches > 0 ? schedule_step(step) / epoch_batches : 0;
}

namespace {
const std::pair<const char*, ScheduleKind> kSchedules[] = {
    {"constant", ScheduleKind::Constant},
    {"linear-warmup-cosine", ScheduleKind::LinearWarmupCosine},
    {"cosine-annealing", ScheduleKind::CosineAnnealing},
    {"cosine-annealing-restarts", ScheduleKind::CosineRestarts},
    {"lambda", ScheduleKind::Lambda},
    {"plateau", ScheduleKind::Plateau}};

}  // namespace

double credit_lambda_phase1(int64_t epoch) {
  if (epoch < 10) return (double)epoch / 10;
  return 0.5 * (1 + std::cos(M_PI * (double)(epoch - 10) / 90));
}

const char* schedule_name(ScheduleKind k) {
  for (const auto& [n, kind] : kSchedules)
    if (kind == k) return n;
  return "?";
}

ScheduleKind schedule_kind(const std::string& name) {
  std::string known;
  for (const auto& [n, k] : kSchedules) {
    if (name == n) return k;
    known += std::string(known.empty() ? "" : ", ") + n;
  }
  fail("learning-rate schedule '", name, "' is not known (", known, ")");
}

double Schedule::lr_at(int64_t optimizer_step) const {
  WXE_CHECK(optimizer_step >= 0, "learning-rate schedule: step ", optimizer_step, " is negative");
  if (kind == ScheduleKind::Constant) return lr;
  const int64_t step = schedule_step(optimizer_step);
  const int64_t epoch = epoch_of(optimizer_step);
  switch (kind) {
    case ScheduleKind::LinearWarmupCosine: {
      if (step < warmup_steps) return lr * (double)step / (double)warmup_steps;
      const double p =
          std::min(1.0, (double)(step - warmup_steps) / (double)std::max<int64_t>(1, total_steps - warmup_steps));
      return min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(M_PI * p));
    }
    case ScheduleKind::CosineAnnealing: {
      // torch's chainable form, from the lr of the epoch before (last_epoch = epoch)
      double cur = lr;
      const double T = (double)t_max;
      for (int64_t e = 1; e <= epoch; ++e) {
        const int64_t m = ((e - 1 - t_max) % (2 * t_max) + 2 * t_max) % (2 * t_max);  // Python's %
        if (m == 0)
          cur = cur + (lr - eta_min) * (1 - std::cos(M_PI / T)) / 2;
        else
          cur = (1 + std::cos(M_PI * (double)e / T)) / (1 + std::cos(M_PI * (double)(e - 1) / T)) * (cur - eta_min) +
                eta_min;
      }
      return cur;
    }
    case ScheduleKind::CosineRestarts:
      return restarts_at(step).lr;
    case ScheduleKind::Lambda:
      // LambdaLR stepped at the start of every epoch and again at its end: epoch e runs at 2e + 1
      return lr * credit_lambda_phase1(2 * epoch + 1);
    case ScheduleKind::Plateau:
      return plateau_after(epoch).lr;
    case ScheduleKind::Constant:
      break;
  }
  return lr;
}

Schedule::Restarts Schedule::restarts_at(int64_t step) const {
  // construction steps once (step_in_cycle 0) and sets the lr to min_lr; each batch steps once
  Restarts r;
  r.cur_cycle_steps = first_cycle_steps;
  r.step_in_cycle = step;
  while (r.step_in_cycle >= r.cur_cycle_steps) {
    const int64_t next = (int64_t)((double)(r.cur_cycle_steps - warmup_steps) * cycle_mult) + warmup_steps;
    if (next == r.cur_cycle_steps) {  // every later cycle as long: jump over them
      r.cycle += r.step_in_cycle / r.cur_cycle_steps;
      r.step_in_cycle %= r.cur_cycle_steps;
      break;
    }
    r.step_in_cycle -= r.cur_cycle_steps;
    ++r.cycle;
    r.cur_cycle_steps = next;
  }
  r.max_lr = max_lr * std::pow(gamma, (double)r.cycle);
  const double mx = r.max_lr;
  const int64_t in = r.step_in_cycle, cur = r.cur_cycle_steps;
  if (step == 0)
    r.lr = min_lr;
  else if (in < warmup_steps)
    r.lr = (mx - min_lr) * (double)in / (double)warmup_steps + min_lr;
  else
    r.lr = min_lr + (mx - min_lr) * (1 + std::cos(M_PI * (double)(in - warmup_steps) / (double)(cur - warmup_steps))) / 2;
  return r;
}

Schedule::Plateau Schedule::plateau_after(int64_t epochs) const {
  WXE_CHECK((int64_t)epoch_metrics.size() >= epochs, "plateau schedule: the metric of epoch ",
            (int64_t)epoch_metrics.size() + 1, " is missing (", epochs, " epochs ended)");
  Plateau p;
  p.lr = lr;
  p.best = plateau_max ? -INFINITY : INFINITY;
  for (int64_t e = 0; e < epochs; ++e) {
    const double a = epoch_metrics[e];
    const bool better = plateau_max ? (plateau_abs ? a > p.best + threshold : a > p.best * (threshold + 1))
                                    : (plateau_abs ? a < p.best - threshold : a < p.best * (1 - threshold));
    if (better) {
      p.best = a;
      p.num_bad_epochs = 0;
    } else {
      ++p.num_bad_epochs;
    }
    if (p.cooldown_counter > 0) {
      --p.cooldown_counter;
      p.num_bad_epochs = 0;
    }
    if (p.num_bad_epochs > patience) {
      const double next = std::max(p.lr * factor, min_lr);
      if (p.lr - next > plateau_eps) p.lr = next;
      p.cooldown_counter = cooldown;
      p.num_bad_epochs = 0;
    }
  }
  return p;
}

namespace {
std::string num17(double d) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", d);
  return b;
}
}  // namespace

std::map<std::string, std::string> schedule_metadata(const Schedule& s) {
  std::string metrics;
  for (double m : s.epoch_metrics) metrics += (metrics.empty() ? "" : ",") + num17(m);
  return {{"schedule", schedule_name(s.kind)},
          {"lr", num17(s.lr)},
          {"min_lr", num17(s.min_lr)},
          {"warmup_steps", std::to_string(s.warmup_steps)},
          {"total_steps", std::to_string(s.total_steps)},
          {"accum_batches", std::to_string(s.accum_batches)},
          {"epoch_batches", std::to_string(s.epoch_batches)},
          {"t_max", std::to_string(s.t_max)},
          {"eta_min", num17(s.eta_min)},
          {"first_cycle_steps", std::to_string(s.first_cycle_steps)},
          {"cycle_mult", num17(s.cycle_mult)},
          {"max_lr", num17(s.max_lr)},
          {"gamma", num17(s.gamma)},
          {"plateau_mode", s.plateau_max ? "max" : "min"},
          {"threshold_mode", s.plateau_abs ? "abs" : "rel"},
          {"factor", num17(s.factor)},
          {"threshold", num17(s.threshold)},
          {"plateau_eps", num17(s.plateau_eps)},
          {"patience", std::to_string(s.patience)},
          {"cooldown", std::to_string(s.cooldown)},
          {"epoch_metrics", metrics}};
}

Schedule schedule_from_metadata(const std::map<std::string, std::string>& meta, const std::string& where) {
  Schedule s;
  auto get = [&](const char* k) { return meta.count(k) ? meta.at(k) : std::string(); };
  auto d = [&](const char* k, double& v) {
    if (!get(k).empty()) v = parse_double(get(k), str(where, ": metadata '", k, "'"));
  };
  auto i = [&](const char* k, int64_t& v) {
    if (!get(k).empty()) v = parse_int64(get(k), str(where, ": metadata '", k, "'"));
  };
  if (!get("schedule").empty()) s.kind = schedule_kind(get("schedule"));
  d("lr", s.lr);
  d("min_lr", s.min_lr);
  i("warmup_steps", s.warmup_steps);
  i("total_steps", s.total_steps);
  i("accum_batches", s.accum_batches);
  i("epoch_batches", s.epoch_batches);
  i("t_max", s.t_max);
  d("eta_min", s.eta_min);
  i("first_cycle_steps", s.first_cycle_steps);
  d("cycle_mult", s.cycle_mult);
  d("max_lr", s.max_lr);
  d("gamma", s.gamma);
  s.plateau_max = get("plateau_mode") == "max";
  s.plateau_abs = get("threshold_mode") == "abs";
  d("factor", s.factor);
  d("threshold", s.threshold);
  d("plateau_eps", s.plateau_eps);
  i("patience", s.patience);
  i("cooldown", s.cooldown);
  const std::string m = get("epoch_metrics");
  for (size_t a = 0; a < m.size();) {
    size_t b = m.find(',', a);
    if (b == std::string::npos) b = m.size();
    s.epoch_metrics.push_back(parse_double(m.substr(a, b - a), str(where, ": metadata 'epoch_metrics'")));
    a = b + 1;
  }
  WXE_CHECK(s.warmup_steps >= 0 && s.total_steps >= 0 && s.accum_batches >= 1 && s.epoch_batches >= 0 && s.t_max >= 1 &&
                s.first_cycle_steps >= 1 && s.cycle_mult >= 1 && s.warmup_steps < (int64_t)1 << 40,
            where, ": the schedule's metadata is out of range");
  return s;
}

double grad_norm_squared(const std::vector<const Tensor*>& grads) {
  double s = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    check_f32(grads[i], "gradient", i);
    s += sum_squares(*grads[i]);
  }
  return s;
}

void scale_grads(const std::vector<Tensor*>& grads, float factor) {
  for (Tensor* t : grads) cpu_train_kernels().scale(t->data<float>(), t->numel(), factor);
}

double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm) {
  const double total = std::sqrt(grad_norm_squared(std::vector<const Tensor*>(grads.begin(), grads.end())));
  if (!std::isfinite(total) || max_norm <= 0) return total;
  // PyTorch: clip_coef = max_norm / (total_norm + 1e-6) on a float32 tensor, which Python
  // evaluates as total.reciprocal() * max_norm; clamped to 1 (a factor of 1 changes nothing).
  const float coef = (1.0f / ((float)total + 1e-6f)) * (float)max_norm;
  if (coef < 1.0f) scale_grads(grads, coef);
  return total;
}

Ema::Ema(double decay, const std::vector<const Tensor*>& params) : decay_(decay) {
  WXE_CHECK(decay >= 0 && decay <= 1, "EMA decay ", decay, " must lie in [0, 1]");
  for (size_t i = 0; i < params.size(); ++i) {
    check_f32(params[i], "EMA: parameter", i);
    shadow_.push_back(params[i]->clone());
  }
}

double Ema::next_decay() {
  ++n_;
  return std::min(decay_, (1.0 + (double)n_) / (10.0 + (double)n_));
}

void Ema::update(const std::vector<const Tensor*>& params) {
  WXE_CHECK(params.size() == shadow_.size(), "EMA: ", params.size(), " parameters, the EMA holds ", shadow_.size());
  const double decay = next_decay();
  const float d = (float)decay, w = (float)(1 - decay);
  for (size_t i = 0; i < params.size(); ++i) {
    check_f32(params[i], "EMA: parameter", i);
    WXE_CHECK(params[i]->shape == shadow_[i].shape, "EMA: parameter ", i, " is ", shape_str(params[i]->shape),
              ", its shadow ", shape_str(shadow_[i].shape));
    cpu_train_kernels().ema(shadow_[i].data<float>(), params[i]->data<float>(), params[i]->numel(), d, w);
  }
}

}  // namespace wxe
