// Runs every registered gradient case (tests/grad_check.h) and checks the op table's coverage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {

std::multimap<std::string, CaseMaker>& grad_case_registry() {
  static std::multimap<std::string, CaseMaker> r;
  return r;
}

GradCase grad_case(const std::string& label, const std::string& op, std::vector<Tensor> inputs,
                   std::map<std::string, Attr> attrs) {
  GradCase c;
  c.label = label;
  c.node = make_node(op, (int)inputs.size(), 1, std::move(attrs));
  c.inputs = std::move(inputs);
  return c;
}

bool non_differentiable(const std::string& op) {
  static const std::set<std::string> ops = {
      // shape queries, index and integer producers, comparisons, logic, rounding
      "Shape", "Size", "Constant", "ConstantOfShape", "Range", "Equal", "Less", "Greater",
      "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Floor", "Ceil", "Mod",
      // control flow: folded (passes.h fold_if) before any graph runs
      "If",
      // random: no gradient to its input (it reads only the shape)
      "RandomNormal", "RandomNormalLike",
      // made by the CPU fusion passes for inference only (training fuses the norms, GELU and
      // the window attention: engine/passes/fuse.h fuse_for_training)
      "ConvChannelsLast", "DepthToSpaceChannelsLast",
      // collectives: their backward is the conjugate collective (parallel/), not a kernel
      "AllReduceTP", "CopyToTP"};
  return ops.count(op) != 0;
}

namespace {

// Loss of the outputs with fixed weights r (double accumulation).
double weighted_sum(const std::vector<Tensor>& outs, const std::vector<Tensor>& r) {
  double s = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k].dtype != DType::F32) continue;
    for (int64_t i = 0; i < outs[k].numel(); ++i) s += (double)outs[k].data<float>()[i] * r[k].data<float>()[i];
  }
  return s;
}

std::vector<Tensor> forward(const Node& n, const std::vector<Tensor>& inputs) {
  std::vector<const Tensor*> p;
  for (auto& t : inputs) p.push_back(t.defined() ? &t : nullptr);
  return run_node(n, p, KernelKind::Reference);
}

}  // namespace

std::string check_grad(const GradCase& c) {
  register_cpu_kernels();
  const Node& n = c.node;
  BackwardFn bw = backward_kernel(n.op);
  if (!bw) return n.op + " has no backward kernel";
  std::vector<Tensor> x;
  for (auto& t : c.inputs) x.push_back(t.defined() ? t.clone() : Tensor());
  std::vector<Tensor> outs = forward(n, x);
  // fixed random output weights
  std::vector<Tensor> r;
  for (size_t k = 0; k < outs.size(); ++k) r.push_back(randn(outs[k].shape, 1000 + (unsigned)k));
  // The backward sees the elements its BackwardReads declares, as in the training executor
  // (which frees the others); the others are NaN here, so a kernel reading them fails its case.
  const BackwardReads reads = backward_reads(n.op);
  std::vector<Tensor> unread;
  unread.reserve(x.size() + outs.size());  // pointers into it stay valid
  auto as_read = [&](const Tensor& t, bool read) -> const Tensor* {
    if (read || t.dtype != DType::F32) return &t;
    unread.push_back(Tensor(DType::F32, t.shape));
    std::fill(unread.back().data<float>(), unread.back().data<float>() + t.numel(), NAN);
    return &unread.back();
  };
  std::vector<const Tensor*> pin, pout, gout;
  std::vector<Tensor*> gin;
  std::vector<Tensor> grads(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    pin.push_back(x[i].defined() ? as_read(x[i], reads.input(i)) : nullptr);
    bool want = x[i].defined() && x[i].dtype == DType::F32 &&
                std::find(c.fixed.begin(), c.fixed.end(), (int)i) == c.fixed.end();
    if (want) grads[i] = Tensor(DType::F32, x[i].shape);
    gin.push_back(want ? &grads[i] : nullptr);
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    pout.push_back(as_read(outs[k], reads.outputs));
    gout.push_back(outs[k].dtype == DType::F32 ? &r[k] : nullptr);
  }
  bw(n, pin, pout, gout, gin);
  std::string report;
  std::mt19937 rng(7);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!gin[i]) continue;
    const int64_t count = x[i].numel();
    std::vector<int64_t> probes;
    if (count <= c.max_probes) {
      for (int64_t e = 0; e < count; ++e) probes.push_back(e);
    } else {
      std::uniform_int_distribution<int64_t> pick(0, count - 1);
      for (int p = 0; p < c.max_probes; ++p) probes.push_back(pick(rng));
    }
    double num2 = 0, diff2 = 0;
    std::string worst;
    double worst_d = -1;
    for (int64_t e : probes) {
      float* xe = x[i].data<float>() + e;
      const float orig = *xe;
      *xe = orig + (float)c.h;
      double lp = weighted_sum(forward(n, x), r);
      *xe = orig - (float)c.h;
      double lm = weighted_sum(forward(n, x), r);
      *xe = orig;
      double numeric = (lp - lm) / (2 * c.h);
      double analytic = grads[i].data<float>()[e];
      num2 += numeric * numeric;
      diff2 += (analytic - numeric) * (analytic - numeric);
      if (std::fabs(analytic - numeric) > worst_d) {
        worst_d = std::fabs(analytic - numeric);
        worst = str("element ", e, ": backward ", analytic, ", finite difference ", numeric);
      }
    }
    double rel = std::sqrt(diff2) / std::max(std::sqrt(num2), 1e-6);
    if (!(rel <= c.tol))
      report += str(c.label, ": input ", i, " ", shape_str(x[i].shape), ": relative L2 error ", rel, " > ", c.tol,
                    " (worst ", worst, ")\n");
  }
  return report;
}

namespace {

TEST(GradHarness, EveryRegisteredCasePasses) {
  register_cpu_kernels();
  int cases = 0;
  std::string failures;
  for (auto& [op, make] : grad_case_registry())
    for (const GradCase& c : make()) {
      EXPECT_EQ(c.node.op, op) << c.label << " is registered under " << op;
      std::string r = check_grad(c);
      failures += r;
      ++cases;
    }
  EXPECT_EQ(failures, "");
  EXPECT_GT(cases, 0);
}

// Fails for an op with a backward kernel and no gradient case, and for a differentiable op
// without a backward kernel.
TEST(GradHarness, EveryOpHasBackwardAndCase) {
  register_cpu_kernels();
  std::string missing_backward, missing_case;
  for (const std::string& op : known_ops()) {
    if (non_differentiable(op)) continue;
    if (!backward_kernel(op)) missing_backward += " " + op;
    else if (!grad_case_registry().count(op)) missing_case += " " + op;
  }
  EXPECT_EQ(missing_backward, "") << "ops without a backward kernel";
  EXPECT_EQ(missing_case, "") << "ops with a backward kernel but no gradient case";
}

// The harness can fail: a deliberately wrong backward (twice the true gradient) is caught.
void doubled_identity_backward(const Node&, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>&,
                               const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  for (int64_t e = 0; e < in[0]->numel(); ++e) gin[0]->data<float>()[e] = 2 * gout[0]->data<float>()[e];
}

TEST(GradHarness, CatchesAWrongBackward) {
  register_cpu_kernels();
  BackwardFn saved = backward_kernel("Neg");
  register_backward("Neg", doubled_identity_backward);
  GradCase c = grad_case("Neg (wrong on purpose)", "Neg", {randn({3, 4}, 1)});
  std::string r = check_grad(c);
  register_backward("Neg", saved);
  EXPECT_NE(r, "");
}

// And a backward that reads what its BackwardReads says it does not (the executor would have
// freed it): Gelu declared as reading nothing.
TEST(GradHarness, CatchesAnUndeclaredRead) {
  register_cpu_kernels();
  const BackwardReads saved = backward_reads("Gelu");
  register_backward_reads("Gelu", {0u, false});
  std::string r = check_grad(grad_case("Gelu (reads undeclared)", "Gelu", {randn({3, 4}, 1)}));
  register_backward_reads("Gelu", saved);
  EXPECT_NE(r, "");
}

}  // namespace
}  // namespace wxe::test
