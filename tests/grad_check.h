// Gradient-check harness over the op table (ggml test-backend-ops, grad mode): every op's
// backward kernel against central finite differences of its reference forward kernel.
//
// A case is one node with its forward inputs. The harness draws fixed random weights r_k for
// each output, takes L = sum_k sum(r_k * out_k) (accumulated in double), runs the backward
// kernel with gout = r_k, and compares each float32 input's gradient with
// (L(x + h e_i) - L(x - h e_i)) / 2h on up to `max_probes` elements. The forward kernels are
// float32, so the comparison is in relative L2 over the probed elements with tolerance `tol`.
//
// Cases register themselves (GRAD_CASES below) from any test file; grad_test.cpp runs them
// all and fails for an op that has a backward kernel but no case, and for a differentiable op
// that has no backward kernel.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/ir/ops.h"
#include "engine/ir/tensor.h"

namespace wxe::test {

struct GradCase {
  std::string label;           // shown in failures, e.g. "Pad reflect"
  Node node;                   // op and attributes; inputs/outputs are set by the harness
  std::vector<Tensor> inputs;  // undefined Tensor = omitted optional input
  // Inputs whose gradient is checked (default: every float32 input that is not `fixed`).
  std::vector<int> fixed;      // float32 inputs treated as constants (e.g. shape-like)
  double tol = 2e-2;           // relative L2 of (analytic - numeric) over the probed elements
  double h = 1e-2;             // finite-difference step
  int max_probes = 48;         // elements probed per input (all if fewer)
};

using CaseMaker = std::function<std::vector<GradCase>()>;

// op -> makers (an op may have cases in several files)
std::multimap<std::string, CaseMaker>& grad_case_registry();

struct GradCaseRegistrar {
  GradCaseRegistrar(const std::string& op, CaseMaker m) { grad_case_registry().emplace(op, std::move(m)); }
};

#define WXE_GRAD_CAT2(a, b) a##b
#define WXE_GRAD_CAT(a, b) WXE_GRAD_CAT2(a, b)
// GRAD_CASES("Pad") { return {case1, case2}; }
#define GRAD_CASES(op)                                                                      \
  static std::vector<::wxe::test::GradCase> WXE_GRAD_CAT(grad_cases_, __LINE__)();         \
  static ::wxe::test::GradCaseRegistrar WXE_GRAD_CAT(grad_reg_, __LINE__)(                  \
      op, WXE_GRAD_CAT(grad_cases_, __LINE__));                                             \
  static std::vector<::wxe::test::GradCase> WXE_GRAD_CAT(grad_cases_, __LINE__)()

// A case for `op` with the given attributes and inputs.
GradCase grad_case(const std::string& label, const std::string& op, std::vector<Tensor> inputs,
                   std::map<std::string, Attr> attrs = {});

// Runs one case; returns "" when it passes, else a description of every mismatch.
std::string check_grad(const GradCase& c);

// Ops that have no gradient by nature (shape queries, comparisons, integer ops, constants)
// or that exist only for inference (fusion products).
bool non_differentiable(const std::string& op);

}  // namespace wxe::test
