// Backends: where kernels run. A backend allocates memory on its device, copies to and from
// the host, waits for its queued work, prepares a graph for itself (fusion passes) and holds
// one kernel table (forward and backward per op). The engine knows backends only through
// this interface and a registry by name; kernel libraries register theirs (the CPU backend
// is built in; kernels/cuda registers "cuda" from register_gpu_backends(), a no-op in a build
// without CUDA, which programs call at startup). Shape rules stay device-independent (engine/ir/ops.h).
//
// The CPU backend's kernel table is the one in engine/ir/ops.h (register_op,
// register_fast_kernel, register_backward) and its prepare() is optimize_for_cpu().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/passes/fuse.h"
#include "engine/ir/ops.h"
#include "engine/exec/train_kernels.h"
#include "engine/ir/tensor.h"

namespace wxe {

// One op's kernels on a backend. host_inputs: bit i set when the kernel reads input i on the
// host (shape-carrying inputs such as Slice's starts or Resize's scales); the executor passes
// such inputs as host tensors and every other input in the backend's memory.
struct BackendKernel {
  KernelFn forward = nullptr;
  BackwardFn backward = nullptr;
  uint32_t host_inputs = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual DeviceKind device() const = 0;
  // Whether the device can run now; otherwise *why says why (one line).
  virtual bool available(std::string* why) const = 0;
  // Uninitialized device memory, freed when the last tensor on it goes.
  virtual std::shared_ptr<Storage> allocate(size_t nbytes) = 0;
  // Copies between host and device memory; they wait for queued work on the device.
  virtual void copy_to_device(void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t nbytes) = 0;
  // A copy within device memory, in stream order (this default goes through the host).
  virtual void copy_on_device(void* dst, const void* src, size_t nbytes);
  // Waits until every queued kernel has finished; throws the device's error, if any.
  virtual void synchronize() = 0;
  // Backend-specific rewrites of a simplified graph (fusion); numbers stay the same up to
  // float rounding.
  virtual void prepare(Graph& g, Precision precision) = 0;
  // The fusions of a training graph whose fused ops have forward and backward kernels here
  // (engine/passes/fuse.h). Default: on host memory fuse_for_training (any op a backend there
  // lacks runs its CPU kernel without copies), elsewhere none, the graph as exported.
  virtual void prepare_training(Graph& g);
  // The op's kernels, or nullptr / {} when this backend has none.
  virtual const BackendKernel* kernel(const std::string& op) const = 0;
  virtual std::vector<std::string> ops() const = 0;  // ops with a forward kernel
  // The optimizer's kernels on this device's memory (train/optim.h), with which training
  // keeps parameters, gradients and optimizer state on the device; nullptr: none (a device
  // without them cannot train).
  virtual const TrainKernels* train_kernels() const { return nullptr; }
  // Device memory held by tensors and the kernels' scratch, in bytes: now, and the most held
  // since reset_peak() (as PyTorch's torch.cuda.max_memory_allocated); 0 where the backend does
  // not count (host memory is counted by engine/ir/tensor.h).
  virtual size_t bytes_in_use() const { return 0; }
  virtual size_t bytes_peak() const { return 0; }
  virtual void reset_peak() {}

  // An uninitialized tensor in this device's memory.
  Tensor empty(DType dtype, const Shape& shape);
  // A host tensor copied to this device / a device tensor copied to the host.
  Tensor upload(const Tensor& host);
  Tensor download(const Tensor& dev);
};

// A backend whose kernel table is a map filled by its kernel library.
class TableBackend : public Backend {
 public:
  void register_kernel(const std::string& op, KernelFn forward, uint32_t host_inputs = 0);
  void register_backward(const std::string& op, BackwardFn backward);
  const BackendKernel* kernel(const std::string& op) const override;
  std::vector<std::string> ops() const override;

 private:
  std::map<std::string, BackendKernel> table_;
};

// Registry. The CPU backend is always there.
void register_backend(std::unique_ptr<Backend> b);
// The backend of that name, or nullptr when this build has none.
Backend* find_backend(const std::string& name);
// The backend of that name, ready to run; fails with one line saying why not (unknown name,
// a build without it, no device present).
Backend& backend_for(const std::string& name);
std::vector<std::string> backend_names();

// Registers the GPU backends this build has (kernels/cuda; nothing in a build without CUDA).
// Safe to call more than once; touches no device. Defined by the kernel library (like
// register_cpu_kernels), not by engine/: programs call it before asking for a backend.
void register_gpu_backends();

}  // namespace wxe
