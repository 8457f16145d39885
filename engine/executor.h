// Runs a simplified graph: nodes in their (topological) order, buffers freed after their last
// reader and reused by later values, view ops (Reshape, Squeeze, ...) as aliases.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/graph.h"
#include "engine/ops.h"

namespace wxe {

struct ExecOptions {
  int threads = 0;                       // 0: leave the OpenMP default
  KernelKind kernels = KernelKind::Fast;  // Reference runs the oracle kernels only
  bool profile = false;                  // accumulate time per op type
};

struct OpProfile {
  double ms = 0;
  int calls = 0;
};

class Executor {
 public:
  Executor(const Graph& g, ExecOptions opt = {});
  // inputs by graph-input name; returns the graph outputs in order.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& inputs);
  const std::map<std::string, OpProfile>& profile() const { return profile_; }
  // Bytes of activation buffers held at the peak of the last run (excludes constants).
  size_t peak_activation_bytes() const { return peak_bytes_; }

 private:
  const Graph& g_;
  ExecOptions opt_;
  std::vector<KernelFn> kernels_;
  std::vector<std::vector<int>> frees_;  // per node: values whose last reader it is
  std::vector<bool> is_view_;
  std::map<std::string, OpProfile> profile_;
  size_t peak_bytes_ = 0;
};

// Sets the OpenMP thread count used by kernels (and oneDNN).
void set_threads(int n);

}  // namespace wxe
