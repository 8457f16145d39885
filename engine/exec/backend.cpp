#include "engine/exec/backend.h"

#include <cstring>
#include <mutex>
#include <vector>

namespace wxe {

Tensor Backend::empty(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.storage = allocate(t.nbytes());
  return t;
}

Tensor Backend::upload(const Tensor& host) {
  WXE_ASSERT(host.device() == DeviceKind::CPU);
  Tensor t = empty(host.dtype, host.shape);
  if (host.nbytes()) copy_to_device(t.raw(), host.raw(), host.nbytes());
  return t;
}

Tensor Backend::download(const Tensor& dev) {
  Tensor t(dev.dtype, dev.shape);
  if (dev.nbytes()) {
    if (dev.device() == DeviceKind::CPU)
      std::memcpy(t.raw(), dev.raw(), dev.nbytes());
    else
      copy_to_host(t.raw(), dev.raw(), dev.nbytes());
  }
  return t;
}

void Backend::prepare_training(Graph& g) {
  if (device() == DeviceKind::CPU) fuse_for_training(g);
}

void Backend::copy_on_device(void* dst, const void* src, size_t nbytes) {
  std::vector<char> tmp(nbytes);
  copy_to_host(tmp.data(), src, nbytes);
  copy_to_device(dst, tmp.data(), nbytes);
}

void TableBackend::register_kernel(const std::string& op, KernelFn forward, uint32_t host_inputs) {
  auto& e = table_[op];
  e.forward = forward;
  e.host_inputs = host_inputs;
}

void TableBackend::register_backward(const std::string& op, BackwardFn backward) {
  table_[op].backward = backward;
}

const BackendKernel* TableBackend::kernel(const std::string& op) const {
  auto it = table_.find(op);
  return it == table_.end() || !it->second.forward ? nullptr : &it->second;
}

std::vector<std::string> TableBackend::ops() const {
  std::vector<std::string> r;
  for (auto& kv : table_)
    if (kv.second.forward) r.push_back(kv.first);
  return r;
}

namespace {

// The CPU backend: host memory, the op tables of engine/ir/ops.h (fast kernels where present),
// optimize_for_cpu() as its preparation. Kernels read every input on the host.
class CpuBackend : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::CPU; }
  bool available(std::string*) const override { return true; }
  std::shared_ptr<Storage> allocate(size_t nbytes) override { return std::make_shared<Storage>(nbytes); }
  void copy_to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void synchronize() override {}
  void prepare(Graph& g, Precision precision) override { optimize_for_cpu(g, precision); }
  const BackendKernel* kernel(const std::string& op) const override {
    if (!op_known(op)) return nullptr;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = cache_.find(op);
    if (it == cache_.end())
      it = cache_.emplace(op, BackendKernel{kernel_for(op, KernelKind::Fast), backward_kernel(op), ~0u}).first;
    return &it->second;
  }
  std::vector<std::string> ops() const override { return known_ops(); }
  const TrainKernels* train_kernels() const override { return &cpu_train_kernels(); }

 private:
  mutable std::mutex mu_;
  mutable std::map<std::string, BackendKernel> cache_;
};

std::map<std::string, std::unique_ptr<Backend>>& registry() {
  static std::map<std::string, std::unique_ptr<Backend>> r = [] {
    std::map<std::string, std::unique_ptr<Backend>> m;
    m["cpu"] = std::make_unique<CpuBackend>();
    return m;
  }();
  return r;
}

}  // namespace

void register_backend(std::unique_ptr<Backend> b) {
  const std::string name = b->name();
  registry()[name] = std::move(b);
}

Backend* find_backend(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second.get();
}

Backend& backend_for(const std::string& name) {
  Backend* b = find_backend(name);
  if (!b) {
    WXE_CHECK(name == "cuda", "unknown device '", name, "' (expected cpu or cuda)");
    fail("device 'cuda' is not available: this wxe was built without CUDA (-DWXE_CUDA=OFF)");
  }
  std::string why;
  WXE_CHECK(b->available(&why), "device '", name, "' is not available: ", why);
  return *b;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (auto& kv : registry()) r.push_back(kv.first);
  return r;
}

}  // namespace wxe
