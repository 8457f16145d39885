#include "train/optim.h"

#include <algorithm>
#include <cmath>

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

double Schedule::lr_at(int64_t optimizer_step) const {
  WXE_CHECK(optimizer_step >= 0, "learning-rate schedule: step ", optimizer_step, " is negative");
  if (kind == ScheduleKind::Constant) return lr;
  const int64_t step = schedule_step(optimizer_step);
  if (step < warmup_steps) return lr * (double)step / (double)warmup_steps;
  const double p = std::min(1.0, (double)(step - warmup_steps) / (double)std::max<int64_t>(1, total_steps - warmup_steps));
  return min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(M_PI * p));
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
