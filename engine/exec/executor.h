// Layer: engine/exec, over engine/ir and engine/passes (the backends' own fusions).
// Runs a simplified graph: nodes in their (topological) order, view ops (Reshape, Squeeze,
// ...) as aliases of their input. On a device other than the CPU (ExecOptions.device, a
// backend from engine/exec/backend.h) the kernels come from that backend's table, the graph is
// prepared by the backend's own passes, constants are uploaded once at construction, the
// arena lives in device memory, inputs are uploaded at every run and the outputs come back as
// host tensors. With the fast kernels it first applies the CPU fusion
// passes (engine/passes/fuse.h) to its own copy of the graph, made at construction; the caller's
// graph is left as it is (the copy shares its constants).
// Memory plan (shapes are static): every activation but the graph outputs gets an offset in
// one arena, chosen at construction so that values alive at the same time never share bytes
// (greedy: largest first, lowest offset that fits; an alias keeps its source alive). The
// arena is allocated at the first run and kept, so run() is not reentrant: one run at a time
// per executor. Graph outputs get new storage every run, since the caller keeps them.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec/backend.h"
#include "engine/passes/fuse.h"
#include "engine/ir/graph.h"
#include "engine/ir/ops.h"

namespace wxe {

struct ExecOptions {
  int threads = 0;                       // 0: leave the OpenMP default
  KernelKind kernels = KernelKind::Fast;  // Reference runs the oracle kernels only
  bool profile = false;                  // accumulate time per op type
  bool optimize = true;                  // with Fast kernels: run optimize_for_cpu() first
  Precision precision = Precision::F32;  // with optimize: BF16 convs and Linear (engine/passes/fuse.h)
  std::string device = "cpu";            // a backend name (engine/exec/backend.h): "cpu", "cuda"
  // Training (GradExecutor on the CPU): keep every forward value for the backward instead of
  // only what the backward kernels read (engine/ir/ops.h BackwardReads); the oracle of that plan.
  bool keep_forward = false;
  // Training on the CPU, activation checkpointing: per node, the segment it belongs to (-1:
  // none; engine/passes/passes.h checkpoint_segments). A segment's inner values (produced and
  // read only inside it) are dropped when its forward ends and recomputed, from its inputs, when
  // the backward reaches it; ops that update their inputs (SpectralNorm's power iteration) and
  // collectives are never in a segment, so the recompute repeats no update and no collective.
  std::vector<int> segments = {};
  // Training on the CPU (GradExecutor): the memory plan without memory or kernels. Every tensor
  // the executor makes (values, gradients, recomputes) is Tensor::counted, no kernel runs, and
  // a step makes, keeps and frees exactly what the real one does, so host_bytes_peak() over a
  // forward and backward is the step's activations at the peak (train/plan.h, `wxe plan`).
  bool plan_only = false;
};

struct OpProfile {
  double ms = 0;
  int calls = 0;
};

// The `top` slowest nodes of g, one line each: milliseconds per run ((ms - warm) / runs; warm may
// be empty) and node_signature. ms per node as Executor::node_profile gives it, or twice as long
// (GradExecutor::node_profile: forward, then backward, marked so).
std::string slowest_nodes(const Graph& g, const std::vector<double>& ms, const std::vector<double>& warm, int runs,
                          int top);

// What the CPU kernels run here (cpu_kernel_info, engine/ir/ops.h): the ISA and the paths that
// need more than the build's baseline, one line each; then, for a graph prepared for the CPU,
// how many Conv, ConvTranspose, ConvChannelsLast and Linear nodes of each class (op, kernel,
// strides, group) take each path on their shapes.
std::string cpu_paths_report(const Graph& g);

// The precision the CPU kernels really run for `asked`: BF16 only where the CPU multiplies
// bfloat16 natively; otherwise F32, and *why says so in one line.
Precision cpu_precision(Precision asked, std::string* why);

class Executor {
 public:
  Executor(const Graph& g, ExecOptions opt = {});
  ~Executor();
  // inputs by graph-input name; returns the graph outputs in order.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& inputs);
  const std::map<std::string, OpProfile>& profile() const { return profile_; }
  // With opt.profile: milliseconds per node (index into graph().nodes), summed over runs.
  const std::vector<double>& node_profile() const { return node_ms_; }
  // The graph the executor runs (after the fusion passes, if they ran).
  const Graph& graph() const { return *g_; }
  // Bytes of activation buffers of the last run: the arena plus the outputs (no constants).
  size_t peak_activation_bytes() const { return peak_bytes_; }
  // Bytes of the arena the memory plan laid out at construction (allocated at the first run):
  // the activations at the peak but the graph outputs, known before any run (`wxe plan`).
  size_t planned_arena_bytes() const { return arena_bytes_; }

 private:
  Graph own_;        // the optimized copy, when the passes ran
  const Graph* g_;   // &own_ or the caller's graph
  ExecOptions opt_;
  std::vector<KernelFn> kernels_;
  std::vector<bool> is_view_;
  std::map<std::string, OpProfile> profile_;
  std::vector<double> node_ms_;
  size_t peak_bytes_ = 0;
  std::vector<int64_t> offset_;       // per value: byte offset in the arena, -1 if not in it
  size_t arena_bytes_ = 0;
  std::shared_ptr<Storage> arena_;    // allocated at the first run, kept
  void plan_memory();
  // device backends (nullptr: the CPU)
  Backend* dev_ = nullptr;
  std::vector<uint32_t> host_inputs_;  // per node: inputs its kernel reads on the host
  std::vector<Tensor> dev_const_;      // per value: the constant in device memory, if used there
};

// Every graph input given, with its dtype and shape; errors name the input.
void check_inputs(const Graph& g, const std::map<std::string, Tensor>& inputs);

// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the executors run them as aliases of input 0.
bool is_view_op(const std::string& op);

// The op types of g that backend b has no kernel for once b has prepared g as the Executor
// does (with optimize), with their node counts; empty: g runs wholly on b. Reads b's tables
// only: the device need not be present.
std::map<std::string, int> ops_without_kernels(const Graph& g, Backend& b, Precision precision = Precision::F32);

// Sets the OpenMP thread count used by kernels (and oneDNN).
void set_threads(int n);

}  // namespace wxe
