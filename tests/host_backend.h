// A backend on host memory for tests: a table the test fills from the CPU kernels, and the
// CPU's training kernels. It runs the device paths of the executors and the trainer
// (uploads, device values, host fallback, device-resident parameters) without a GPU.
#pragma once
#include <cstring>
#include <memory>
#include <string>

#include "engine/exec/backend.h"

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

}  // namespace wxe::test
