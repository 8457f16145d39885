// engine/optim: AdamW against an independent step-by-step computation in double, the state
// round trip, schedules, global-norm clipping and EMA against hand computation.
#include "train/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/test_util.h"

namespace wxe {
namespace {

using namespace wxe::test;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Tensor*> ptrs(std::vector<Tensor>& ts) {
  std::vector<Tensor*> r;
  for (Tensor& t : ts) r.push_back(&t);
  return r;
}

std::vector<const Tensor*> cptrs(const std::vector<Tensor>& ts) {
  std::vector<const Tensor*> r;
  for (const Tensor& t : ts) r.push_back(&t);
  return r;
}

// The AdamW update written out from the paper's form (decoupled decay, bias-corrected
// moments) in double: an oracle independent of the float32 operation order.
struct RefAdamW {
  double b1, b2, eps, wd;
  std::vector<std::vector<double>> p, m, v;
  int t = 0;
  void step(const std::vector<std::vector<double>>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t j = 0; j < p[i].size(); ++j) {
        p[i][j] -= lr * wd * p[i][j];
        m[i][j] = b1 * m[i][j] + (1 - b1) * g[i][j];
        v[i][j] = b2 * v[i][j] + (1 - b2) * g[i][j] * g[i][j];
        double mhat = m[i][j] / (1 - std::pow(b1, t)), vhat = v[i][j] / (1 - std::pow(b2, t));
        p[i][j] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
  }
};

std::vector<double> as_doubles(const Tensor& t) {
  return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(AdamW, MatchesStepByStepComputationWithScheduleAndDecay) {
  AdamWConfig c;
  c.weight_decay = 0.1;  // large enough that a missing decay shows
  std::vector<Tensor> params = {randn({3, 4}, 1), randn({5}, 2)};
  RefAdamW ref{c.beta1, c.beta2, c.eps, c.weight_decay, {}, {}, {}};
  for (const Tensor& p : params) {
    ref.p.push_back(as_doubles(p));
    ref.m.emplace_back(p.numel(), 0.0);
    ref.v.emplace_back(p.numel(), 0.0);
  }
  Schedule s{ScheduleKind::LinearWarmupCosine, 0.05, 0.001, 2, 6};
  AdamW opt(c);
  for (int step = 0; step < 6; ++step) {
    std::vector<Tensor> grads = {randn({3, 4}, 10 + step), randn({5}, 20 + step, 0.1f)};
    std::vector<std::vector<double>> g = {as_doubles(grads[0]), as_doubles(grads[1])};
    // The float32 grads are what both sides see: the reference gets them as doubles exactly.
    opt.step(ptrs(params), cptrs(grads), s.lr_at(step));
    ref.step(g, s.lr_at(step));
    EXPECT_EQ(opt.steps(), step + 1);
    for (size_t i = 0; i < params.size(); ++i)
      for (int64_t j = 0; j < params[i].numel(); ++j) {
        ASSERT_NEAR(params[i].data<float>()[j], ref.p[i][j], 2e-6 * (1 + std::fabs(ref.p[i][j])))
            << "step " << step << " param " << i << " elem " << j;
        ASSERT_NEAR(opt.exp_avg()[i].data<float>()[j], ref.m[i][j], 1e-6 * (1 + std::fabs(ref.m[i][j])));
        ASSERT_NEAR(opt.exp_avg_sq()[i].data<float>()[j], ref.v[i][j], 1e-6 * (1 + std::fabs(ref.v[i][j])));
      }
  }
}

TEST(AdamW, FirstStepIsSignedLrWithoutDecay) {
  // t = 1: mhat = g, vhat = g^2, so the update is lr * g / (|g| + eps) = lr * sign(g).
  AdamWConfig c;
  c.weight_decay = 0;
  AdamW opt(c);
  Tensor p = Tensor::from_f32({3}, {1.f, -2.f, 0.5f});
  Tensor g = Tensor::from_f32({3}, {3.f, -0.25f, 1e-3f});
  opt.step({&p}, {&g}, 0.1);
  EXPECT_NEAR(p.data<float>()[0], 0.9f, 1e-6);
  EXPECT_NEAR(p.data<float>()[1], -1.9f, 1e-6);
  EXPECT_NEAR(p.data<float>()[2], 0.4f, 1e-5);  // eps matters a little at |g| = 1e-3
}

TEST(AdamW, StateRoundTripContinuesBitForBit) {
  AdamWConfig c;
  std::vector<Tensor> a = {randn({4, 3}, 3), randn({7}, 4)};
  AdamW straight(c);
  auto grads_of = [](int step) { return std::vector<Tensor>{randn({4, 3}, 30 + step), randn({7}, 40 + step)}; };
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g = grads_of(step);
    straight.step(ptrs(a), cptrs(g), 1e-2);
  }
  // Resume: a fresh optimizer from copies of the state, on copies of the parameters.
  AdamW resumed(c);
  std::vector<Tensor> b = {a[0].clone(), a[1].clone()};
  resumed.set_state(straight.steps(), {straight.exp_avg()[0].clone(), straight.exp_avg()[1].clone()},
                    {straight.exp_avg_sq()[0].clone(), straight.exp_avg_sq()[1].clone()});
  EXPECT_EQ(resumed.steps(), 3);
  for (int step = 3; step < 6; ++step) {
    std::vector<Tensor> g = grads_of(step);
    straight.step(ptrs(a), cptrs(g), 1e-2);
    resumed.step(ptrs(b), cptrs(g), 1e-2);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bits(a[i], b[i])) << "param " << i;
    EXPECT_TRUE(same_bits(straight.exp_avg()[i], resumed.exp_avg()[i]));
    EXPECT_TRUE(same_bits(straight.exp_avg_sq()[i], resumed.exp_avg_sq()[i]));
  }
  EXPECT_EQ(resumed.steps(), 6);
}

TEST(AdamW, RejectsMismatchedInputs) {
  AdamW opt(AdamWConfig{});
  Tensor p = randn({2, 3}, 1), g = randn({3, 2}, 2), q = randn({4}, 3);
  EXPECT_NE(error_of([&] { opt.step({&p}, {&g}, 1e-3); }).find("parameter 0 is (2, 3), its gradient (3, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { opt.step({&p, &q}, {&g}, 1e-3); }).find("2 parameters but 1 gradients"), std::string::npos);
  Tensor g2 = randn({2, 3}, 4);
  opt.step({&p}, {&g2}, 1e-3);
  Tensor gq = randn({4}, 5);
  EXPECT_NE(error_of([&] { opt.step({&q}, {&gq}, 1e-3); }).find("its optimizer state (2, 3)"), std::string::npos);
  EXPECT_NE(error_of([&] { opt.set_state(1, {randn({2}, 1)}, {}); }).find("1 exp_avg but 0 exp_avg_sq"),
            std::string::npos);
}

TEST(Schedule, LinearWarmupCosineValues) {
  Schedule s{ScheduleKind::LinearWarmupCosine, 1e-3, 1e-5, 10, 110};
  EXPECT_EQ(s.lr_at(0), 0.0);
  EXPECT_NEAR(s.lr_at(5), 5e-4, 1e-15);                     // mid-warmup
  EXPECT_NEAR(s.lr_at(10), 1e-3, 1e-15);                    // end of warmup: the peak
  EXPECT_NEAR(s.lr_at(60), 1e-5 + (1e-3 - 1e-5) * 0.5, 1e-15);  // cosine midpoint
  EXPECT_NEAR(s.lr_at(35), 1e-5 + (1e-3 - 1e-5) * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(s.lr_at(110), 1e-5, 1e-15);                   // end of the cosine
  EXPECT_NEAR(s.lr_at(500), 1e-5, 1e-15);                   // past total: min_lr
  Schedule no_warmup{ScheduleKind::LinearWarmupCosine, 2.0, 0.0, 0, 4};
  EXPECT_EQ(no_warmup.lr_at(0), 2.0);
  EXPECT_NEAR(no_warmup.lr_at(2), 1.0, 1e-15);
}

TEST(Schedule, ConstantIgnoresSteps) {
  Schedule s;
  s.lr = 3e-4;
  s.warmup_steps = 5;
  EXPECT_EQ(s.lr_at(0), 3e-4);
  EXPECT_EQ(s.lr_at(1000), 3e-4);
}

TEST(Clip, NormAndScaledGradsMatchHandComputation) {
  Tensor a = Tensor::from_f32({2}, {3.f, 4.f});
  Tensor b = Tensor::from_f32({1, 2}, {12.f, 0.f});
  // total = sqrt(9 + 16 + 144) = 13
  double total = clip_grad_norm({&a, &b}, 1.3);
  EXPECT_DOUBLE_EQ(total, 13.0);
  const double f = 1.3 / (13.0 + 1e-6);
  EXPECT_NEAR(a.data<float>()[0], 3 * f, 1e-6);
  EXPECT_NEAR(a.data<float>()[1], 4 * f, 1e-6);
  EXPECT_NEAR(b.data<float>()[0], 12 * f, 1e-6);
  EXPECT_EQ(b.data<float>()[1], 0.f);
  EXPECT_NEAR(std::sqrt(grad_norm_squared({&a, &b})), 1.3, 1e-6);
}

TEST(Clip, LargeTensorNormUsesDoubleAccumulation) {
  Tensor g = randn({300000}, 7);
  double ref = 0;
  for (int64_t i = 0; i < g.numel(); ++i) ref += (double)g.data<float>()[i] * g.data<float>()[i];
  EXPECT_NEAR(grad_norm_squared({&g}), ref, 1e-9 * ref);
}

TEST(Clip, NoScalingBelowMaxNormOrWithoutMaxNorm) {
  Tensor a = Tensor::from_f32({2}, {3.f, 4.f});
  Tensor keep = a.clone();
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a}, 10.0), 5.0);
  EXPECT_TRUE(same_bits(a, keep));
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a}, 0.0), 5.0);  // max_norm 0: only the norm
  EXPECT_TRUE(same_bits(a, keep));
}

TEST(Clip, NonFiniteNormPassesThroughUnscaled) {
  Tensor a = Tensor::from_f32({3}, {1.f, std::numeric_limits<float>::quiet_NaN(), 2.f});
  Tensor b = Tensor::from_f32({1}, {100.f});
  double total = clip_grad_norm({&a, &b}, 1.0);
  EXPECT_TRUE(std::isnan(total));
  EXPECT_EQ(a.data<float>()[0], 1.f);
  EXPECT_EQ(b.data<float>()[0], 100.f);
  Tensor c = Tensor::from_f32({1}, {std::numeric_limits<float>::infinity()});
  EXPECT_TRUE(std::isinf(clip_grad_norm({&c}, 1.0)));
}

TEST(Ema, MatchesHandComputation) {
  // CREDIT's EMATracker: update n uses d = min(decay, (1 + n) / (10 + n))
  Tensor p = Tensor::from_f32({2}, {1.f, -2.f});
  Ema ema(0.9, {&p});
  p.data<float>()[0] = 3.f;
  p.data<float>()[1] = 0.f;
  EXPECT_EQ(ema.shadow()[0].data<float>()[0], 1.f);  // a copy, not an alias
  ema.update({&p});
  double d = 2.0 / 11;
  EXPECT_NEAR(ema.shadow()[0].data<float>()[0], d * 1 + (1 - d) * 3, 1e-6);
  EXPECT_NEAR(ema.shadow()[0].data<float>()[1], d * -2 + (1 - d) * 0, 1e-6);
  const double s0 = ema.shadow()[0].data<float>()[0], s1 = ema.shadow()[0].data<float>()[1];
  p.data<float>()[0] = -1.f;
  ema.update({&p});
  d = 3.0 / 12;
  EXPECT_NEAR(ema.shadow()[0].data<float>()[0], d * s0 + (1 - d) * -1, 1e-6);
  EXPECT_NEAR(ema.shadow()[0].data<float>()[1], d * s1, 1e-6);
  Ema capped(0.5, {&p});
  capped.set_updates(99);  // (1 + 100) / 110 > 0.5: the maximum decay
  EXPECT_EQ(capped.next_decay(), 0.5);
  EXPECT_EQ(capped.updates(), 100);
  Tensor q = randn({3}, 1);
  EXPECT_NE(error_of([&] { ema.update({&q}); }).find("parameter 0 is (3), its shadow (2)"), std::string::npos);
}

}  // namespace
}  // namespace wxe
