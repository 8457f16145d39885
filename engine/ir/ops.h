// Op tables. Each op has a shape rule (device-independent) and kernels per backend: a plain
// reference kernel (the oracle) and optionally a fast one. Kernels register themselves here;
// the engine knows no op by name except in passes that rewrite graphs.
#pragma once
#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace wxe {

struct TypeShape {
  DType dtype;
  Shape shape;
};

// Inputs are the node's input values (nullptr for omitted optionals); a value's constant
// payload is available for shape-carrying inputs (Reshape's shape, Slice's starts, ...).
// Returns one TypeShape per node output. Throws wxe::Error for malformed nodes.
using ShapeFn = std::vector<TypeShape> (*)(const Node& n, const std::vector<const Value*>& in);

// Outputs are allocated by the caller with the shapes the shape rule gave.
// Omitted optional inputs are nullptr.
using KernelFn = void (*)(const Node& n, const std::vector<const Tensor*>& in,
                          const std::vector<Tensor*>& out);

enum class KernelKind { Reference, Fast };

// Backward kernel: the gradients of a node's inputs from the gradients of its outputs.
// `in` and `out` are the forward pass's tensors; gout[k] is the gradient of output k
// (nullptr: nothing reads that output, its gradient is zero). gin[i] is nullptr when input i
// needs no gradient (constants, integer inputs, omitted optionals), otherwise a float32 tensor
// shaped like input i, uninitialized, that the kernel overwrites (it does not accumulate, unless
// backward_accumulates(i) says so: register_gradient_accumulation below).
// Broadcast inputs get the gradient summed over the broadcast dims.
using BackwardFn = void (*)(const Node& n, const std::vector<const Tensor*>& in,
                            const std::vector<const Tensor*>& out,
                            const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin);

void register_op(const std::string& op, ShapeFn shape, KernelFn reference);
void register_fast_kernel(const std::string& op, KernelFn fast);
void register_backward(const std::string& op, BackwardFn backward);
// The op's backward kernel, or nullptr when it has none.
BackwardFn backward_kernel(const std::string& op);

// What an op's (CPU) backward kernel reads of its forward pass: input i's elements when bit i
// of `inputs` is set (inputs past 31: always), the outputs' elements when `outputs` is set.
// Everything by default. What it does not read reaches it as a shape-only tensor (dtype and
// shape, no storage): the training executor frees those values after their last forward use
// instead of keeping them for the backward (engine/exec/autograd.h).
struct BackwardReads {
  uint32_t inputs = ~0u;
  bool outputs = true;
  bool input(size_t i) const { return i >= 32 || (inputs >> i & 1u); }
};
void register_backward_reads(const std::string& op, BackwardReads reads);
BackwardReads backward_reads(const std::string& op);

// Inputs (bit i: input i) whose gradient is output 0's gradient unchanged wherever the input has
// the output's shape: Add's two, Sub's first, WindowAttention's residual. The training executor
// (CPU) hands such an input the output's gradient itself, its storage shared, and the kernel gets
// nullptr for it as for an input that needs no gradient: no copy, no buffer. None by default.
void register_gradient_passthrough(const std::string& op, uint32_t inputs);
uint32_t gradient_passthrough(const std::string& op);

// Inputs (bit i: input i) whose gradient the op's backward kernel can add to the tensor it is
// handed instead of overwriting it. The training executor (CPU) then hands it the gradient
// already summed for that input (the residual stream's, which another reader filled first) and
// sets backward_accumulates(i) for the call, instead of summing a new tensor into it in a pass
// of its own. None by default.
void register_gradient_accumulation(const std::string& op, uint32_t inputs);
uint32_t gradient_accumulation(const std::string& op);
// Inside a backward kernel (on the calling thread): whether gin[i] holds a gradient to add to.
bool backward_accumulates(size_t i);
// Set by the executor around a backward kernel's call (0 after it).
void set_backward_accumulates(uint32_t inputs);

// Random ops (RandomNormal, RandomNormalLike): their output depends on no input's value, so they
// are never folded into constants (engine/passes/fold.cpp) and no gradient flows through them
// (engine/exec/autograd.cpp: their outputs need none). Their numbers are a function of the
// node's "stream" attribute and the element index alone (kernels/cpu/data_ops.cpp), so running a
// node again with the same stream (activation checkpointing's recompute) gives the same numbers;
// a trainer sets the stream before each forward (train/trainer.cpp set_random_streams).
void register_random_op(const std::string& op);
bool op_is_random(const std::string& op);

bool op_known(const std::string& op);
ShapeFn shape_rule(const std::string& op);
// Fast kernel if asked and present, otherwise the reference kernel.
KernelFn kernel_for(const std::string& op, KernelKind kind);
std::vector<std::string> known_ops();

// Helpers shared by shape rules and kernels.
int64_t norm_axis(int64_t axis, int64_t rank, const Node& n);  // checks range
Shape broadcast_shapes(const Shape& a, const Shape& b, const Node& n);
// Constant int64 contents of input i, or fails naming the node (shape-carrying inputs).
std::vector<int64_t> const_ints(const Node& n, const std::vector<const Value*>& in, size_t i);

// Registers every CPU op (defined in kernels/cpu). Safe to call more than once.
void register_cpu_kernels();

// What the CPU kernels run on this machine, chosen once per process from the instruction set
// oneDNN may use (ONEDNN_MAX_CPU_ISA caps it; kernels/cpu/cpu_isa.h) and registered by
// register_cpu_kernels: that ISA's name; whether bfloat16 products run natively (what
// --precision bf16 needs; without it the kernels multiply in float32); one line per kernel
// path that needs more than the build's baseline (what it needs, whether it runs, what runs
// otherwise); and the path a node takes on its input shapes ("" for an op without a choice).
struct CpuKernelInfo {
  std::string isa = "unknown (CPU kernels not registered)";
  bool native_bf16 = false;
  std::vector<std::string> paths;
  std::string (*path_of)(const Node& n, const std::vector<Shape>& inputs) = nullptr;
};
void register_cpu_kernel_info(const CpuKernelInfo& info);
const CpuKernelInfo& cpu_kernel_info();

}  // namespace wxe
