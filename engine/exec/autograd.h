// Reverse-mode autograd over a graph: the forward pass keeps the values the backward kernels
// read (engine/ir/ops.h BackwardReads; the others are freed after their last forward use), the
// backward pass frees each kept value once the last backward kernel reading it ran, and runs each node's backward kernel (engine/ir/ops.h BackwardFn) in
// reverse order and accumulates parameter gradients until zero_grad(), so a graph can run
// several times per optimizer step (gradient accumulation, rollouts).
//
// Parameters are the graph's named leaves: values with a constant payload. The executor
// shares their storage, so an optimizer that updates them in place changes the next forward,
// and ops that own buffers (SpectralNorm's u and v) update them in place too.
// The executor runs the graph it is given: no fusion passes of its own (the trainer fuses the
// norms and GELU first: engine/passes/fuse.h fuse_for_training); the fast kernels are used where
// the op has one (their weight caches are off for graphs without `constant_weights`).
//
// On a device (ExecOptions.device, engine/exec/backend.h) the forward and backward kernels come
// from that backend's table and the values stay in device memory. A node whose op has no
// kernel there (forward or backward) runs its CPU kernel on host copies of its tensors
// ("host fallback", listed by host_nodes()); constants read on the host are the graph's own,
// so ops that update buffers in place (SpectralNorm's u and v) keep updating them there. The
// trainable parameters live on the device: copied there at the first forward (or after
// reload_constants()), then updated there by the optimizer (device_param(), the backend's
// train_kernels()); so do buffers that a device kernel updates in place (op_updates_inputs:
// SpectralNorm's u and v when the device has SpectralNorm). params_to_host() copies both back
// into the graph for checkpoints. Other constants are the host's, copied to the device once.
// grads() are in the device's memory.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/exec/executor.h"
#include "engine/ir/graph.h"
#include "engine/ir/ops.h"

namespace wxe {

// Trainable parameters that are whole only while nodes read them (ZeRO-3, the Trainer's
// --shard-weights): the trainable indices in modules; fetch(m) makes module m's graph constants
// whole (the executor then reads them), evict(m) lets them go. The executor fetches a module
// before the first node that reads one of its parameters (forward, recompute, or a backward
// kernel that reads its elements: BackwardReads), and evicts it after its last such node of the
// forward (unless it is the forward's last module, which the backward reads first) and of the
// backward. grad_done(p, g) takes trainable p's gradient of this backward as soon as it is
// complete (after the backward of the first node reading p; undefined: zero), so whole
// gradients do not all exist at once; grads() are then not kept (shapes only).
struct ParamResidency {
  std::vector<std::vector<size_t>> modules;
  std::function<void(int)> fetch, evict;
  // Optional: the module the executor will fetch next, told once the current one is whole, so
  // its gather can run while the current one computes.
  std::function<void(int)> prefetch;
  std::function<void(size_t, Tensor)> grad_done;
};

class GradExecutor {
 public:
  // `trainable`: value ids of the parameters that get gradients (float32 constants).
  // Fails, naming node and op, if a node between them and the outputs has no backward kernel.
  GradExecutor(const Graph& g, std::vector<int> trainable, ExecOptions opt = {});
  // Runs the graph; keeps what backward() needs. Returns the graph outputs. The second form
  // takes the inputs: one the caller no longer holds is freed after its last use in the forward
  // (when no backward kernel reads it), not at the end of the step.
  std::vector<Tensor> forward(const std::map<std::string, Tensor>& inputs);
  std::vector<Tensor> forward(std::map<std::string, Tensor>&& inputs);
  // grad_outputs[k] = dL/d(output k) of the last forward (undefined Tensor: zero). Adds the
  // parameter gradients into grads(); releases the forward values. The first form copies the
  // gradients; the second takes them (no copy of a tensor nothing else holds, e.g. the trainer's
  // loss gradient, as large as the model's output).
  void backward(const std::vector<Tensor>& grad_outputs);
  void backward(std::vector<Tensor>&& grad_outputs);
  // Whether a backward kernel reads output k of the forward; when none does, the caller may
  // write output k's gradient over the returned output (one whole tensor less at the peak).
  bool backward_reads_output(size_t k) const;
  void zero_grad();
  // One per trainable value, in the order given; zeros until a backward adds to them. On a
  // device they are in its memory (Backend::download to read them).
  std::vector<Tensor>& grads() { return grads_; }
  // On a device: trainable parameter i's device copy, which the forward reads (an optimizer
  // updates it in place); made from the graph's host copy on first use.
  Tensor& device_param(size_t i);
  // On a device: copies the trainable parameters' device copies, and the buffers device kernels
  // updated, into the graph's constants.
  void params_to_host();
  const std::vector<int>& trainable() const { return trainable_; }
  const Graph& graph() const { return g_; }
  // With opt.profile: milliseconds per op type, forward and backward.
  const std::map<std::string, OpProfile>& profile() const { return profile_; }
  // With opt.profile: milliseconds per node summed over the steps, [k] node k's
  // forward (with its recompute) and [nodes + k] its backward (empty before the first step).
  const std::vector<double>& node_profile() const { return node_ms_; }
  // Turns the per-op timing on or off (on a device it waits for each kernel).
  void set_profile(bool on) { opt_.profile = on; }
  // On a device: "node (op, forward|backward)" for every kernel that runs on the host because
  // the backend has none, or whose device backward refused the case at run time ("no <device>
  // backward for ..."; from then on that node's backward runs on the host). Empty on the CPU.
  const std::vector<std::string>& host_nodes() const { return host_nodes_; }
  // Bytes of forward values (not constants, not inputs) the last forward kept for the backward.
  size_t kept_bytes() const { return kept_bytes_; }
  // CPU only; before the first forward. Frees grads().
  void set_param_residency(ParamResidency r);
  // Evicts every module still whole (after a forward without a backward, before an update).
  void evict_params();
  // On a device: copy every constant, trainable parameters included, to the device again at
  // the next forward (after a checkpoint load changed the graph's host copies).
  void reload_constants();

 private:
  const Graph& g_;
  std::vector<int> trainable_;
  ExecOptions opt_;
  std::vector<KernelFn> kernels_;
  std::vector<BackwardFn> backward_;
  std::vector<uint32_t> passthrough_;  // per node: engine/ir/ops.h gradient_passthrough of its op
  std::vector<uint32_t> accumulation_;  // per node: engine/ir/ops.h gradient_accumulation of its op
  std::vector<bool> needs_grad_;  // per value: a trainable parameter depends on it
  std::vector<Tensor> vals_;      // forward values; those the backward reads are kept for it
  // The memory plan of a training step (CPU and device): per value, whether a backward kernel reads its
  // elements (BackwardReads); the last node reading it in the forward and the first whose
  // backward reads it. A value the backward does not read is dropped (a shape-only tensor)
  // after its last forward use; one it reads, after the first reader's backward.
  std::vector<bool> bw_reads_;
  std::vector<int> last_fwd_use_, first_bw_use_;
  // activation checkpointing (ExecOptions::segments): per value, the segment it is inner to
  // (-1: none); per segment, its last node and whether its inner values are dropped now
  std::vector<int> inner_of_;
  std::vector<std::vector<int>> seg_inner_;  // per segment, its inner values
  std::vector<int> seg_last_;
  std::vector<bool> seg_dropped_;
  void recompute(int s);
  void run_forward_node(size_t k, std::vector<Tensor>* discard = nullptr);  // on fresh outputs (device or host)
  void alias_view(size_t k);  // a view op's output: its input's storage, reshaped
  size_t kept_bytes_ = 0;
  std::vector<Tensor> grads_;
  std::map<std::string, OpProfile> profile_;
  std::vector<double> node_ms_;
  void add_node_ms(size_t k, double ms);
  // device path (dev_ != nullptr)
  Backend* dev_ = nullptr;
  std::vector<const BackendKernel*> dk_;  // per node: the backend's kernels, nullptr if none
  std::vector<bool> bw_on_host_;          // per node: its device backward refused the case
  const TrainKernels* tk_ = nullptr;      // the device's (zeroing gradients)
  // per value: a constant whose device copy is authoritative (trainable parameters; buffers a
  // device kernel updates in place)
  std::vector<bool> dev_owned_;
  std::vector<Tensor> dconst_;            // per value: the constant's device copy, once made
  std::vector<Tensor> dvals_;             // per value: device copy of the forward value, if any
  std::vector<std::string> host_nodes_;
  Tensor& dev_value(int v);
  Tensor& dev_param(int v);  // a constant's device copy, made on first use
  Tensor& host_value(int v);
  void release(int v, bool in_backward);  // the memory plan: v's storage dropped (autograd.h)
  void drop(int v);                       // v's storage goes (host and device), its shape stays
  bool held(int v) const;                 // v's elements are on the host or the device
  void release_read_by(size_t k);         // release() of the kept values node k's backward read last
  void backward_device(const std::vector<Tensor>& grad_outputs);
  // ZeRO-3 (set_param_residency): per value its module (-1: none); per module whether it is
  // whole, its last forward reader and the backward position after which it goes; per trainable
  // the backward position at which its gradient is complete
  ParamResidency res_;
  std::vector<int> mod_of_;
  std::vector<bool> whole_;
  std::vector<int> mod_fwd_last_, mod_bw_last_;
  int keep_mod_ = -1;  // the forward's last module, kept whole for the backward
  // the order modules are fetched in the forward and in the backward; whether the backward runs
  std::vector<int> fwd_order_, bw_order_;
  bool in_backward_ = false;
  // per backward position k (the iteration of node k; nodes.size(): after the loop), the
  // trainables whose gradient is complete and the modules no later node reads
  std::vector<std::vector<size_t>> grads_at_;
  std::vector<std::vector<int>> evict_at_;
  void need_params(size_t k, bool backward);  // fetches the modules node k reads
  void evict_module(int m);
};

}  // namespace wxe
