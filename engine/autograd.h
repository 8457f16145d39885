// Reverse-mode autograd over a graph: the forward pass keeps the values the backward kernels
// read, the backward pass runs each node's backward kernel (engine/ops.h BackwardFn) in
// reverse order and accumulates parameter gradients until zero_grad(), so a graph can run
// several times per optimizer step (gradient accumulation, rollouts).
//
// Parameters are the graph's named leaves: values with a constant payload. The executor
// shares their storage, so an optimizer that updates them in place changes the next forward,
// and ops that own buffers (SpectralNorm's u and v) update them in place too.
// The training graph is run unfused (no CPU fusion passes); the fast kernels are used where
// the op has one (their weight caches are off for graphs without `constant_weights`).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "engine/graph.h"
#include "engine/ops.h"

namespace wxe {

class GradExecutor {
 public:
  // `trainable`: value ids of the parameters that get gradients (float32 constants).
  // Fails, naming node and op, if a node between them and the outputs has no backward kernel.
  GradExecutor(const Graph& g, std::vector<int> trainable, ExecOptions opt = {});
  // Runs the graph; keeps what backward() needs. Returns the graph outputs.
  std::vector<Tensor> forward(const std::map<std::string, Tensor>& inputs);
  // grad_outputs[k] = dL/d(output k) of the last forward (undefined Tensor: zero). Adds the
  // parameter gradients into grads(); releases the forward values.
  void backward(const std::vector<Tensor>& grad_outputs);
  void zero_grad();
  // One per trainable value, in the order given; zeros until a backward adds to them.
  std::vector<Tensor>& grads() { return grads_; }
  const std::vector<int>& trainable() const { return trainable_; }
  const Graph& graph() const { return g_; }
  // With opt.profile: milliseconds per op type, forward and backward.
  const std::map<std::string, OpProfile>& profile() const { return profile_; }

 private:
  const Graph& g_;
  std::vector<int> trainable_;
  ExecOptions opt_;
  std::vector<KernelFn> kernels_;
  std::vector<BackwardFn> backward_;
  std::vector<bool> needs_grad_;  // per value: a trainable parameter depends on it
  std::vector<Tensor> vals_;      // forward values, kept for backward
  std::vector<Tensor> grads_;
  std::map<std::string, OpProfile> profile_;
};

}  // namespace wxe
