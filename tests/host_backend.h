// A backend on host memory for tests: a table the test fills from the CPU kernels, and the
// CPU's training kernels. It runs the device paths of the executors and the trainer
// (uploads, device values, host fallback, device-resident parameters) without a GPU.
#pragma once
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "engine/exec/backend.h"
#include "engine/ir/ops.h"

namespace wxe::test {

class HostMemoryBackend : public TableBackend {
 public:
  explicit HostMemoryBackend(std::string name) : name_(std::move(name)) {}
  const char* name() const override { return name_.c_str(); }
  DeviceKind device() const override { return DeviceKind::CPU; }
  bool available(std::string*) const override { return true; }
  std::shared_ptr<Storage> allocate(size_t nbytes) override {
    ++allocations;
    return std::make_shared<Storage>(nbytes);
  }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    ++uploads;
    std::memcpy(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void synchronize() override {}
  void prepare(Graph&, Precision) override {}
  const TrainKernels* train_kernels() const override { return &cpu_train_kernels(); }
  int allocations = 0, uploads = 0;

 private:
  std::string name_;
};

// A device of its own kind (cuda) whose memory is host memory, for a machine without a GPU: tensors
// in it are not host tensors to the code under test, so the paths that stage through host copies
// run (counted in downloads). register_cpu_kernels_but_collectives fills its table with every
// CPU kernel but the collectives (the *TP ops), which register_collective_device_kernels() gives it.
class FakeDevice : public HostMemoryBackend {
 public:
  using HostMemoryBackend::HostMemoryBackend;
  DeviceKind device() const override { return DeviceKind::CUDA; }
  std::shared_ptr<Storage> allocate(size_t nbytes) override {
    ++allocations;
    return std::make_shared<Storage>(std::aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64), nbytes, DeviceKind::CUDA,
                                     std::free);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    ++downloads;
    std::memcpy(dst, src, n);
  }
  void register_cpu_kernels_but_collectives() {
    for (const std::string& op : known_ops()) {
      if (op.size() > 2 && op.compare(op.size() - 2, 2, "TP") == 0) continue;
      if (KernelFn k = kernel_for(op, KernelKind::Fast)) register_kernel(op, k);
      if (BackwardFn k = backward_kernel(op)) register_backward(op, k);
    }
  }
  int downloads = 0;
};

}  // namespace wxe::test
