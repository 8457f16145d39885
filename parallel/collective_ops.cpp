#include "parallel/collective_ops.h"

#include <cstring>

#include "engine/backend.h"
#include "engine/ops.h"

namespace wxe {

namespace {

thread_local Communicator* g_tp = nullptr;  // per thread: tests run ranks as threads

std::vector<TypeShape> same_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0], "node ", n.name, " (", n.op, "): needs one input");
  return {{in[0]->dtype, in[0]->shape}};
}

void copy_into(const Tensor& from, Tensor& to) {
  if (to.raw() != from.raw()) std::memcpy(to.raw(), from.raw(), from.nbytes());
}

// In place over the tp group; nothing to do for a group of one (or none: one process).
void sum_over_tp(Tensor& t) {
  if (g_tp && g_tp->size() > 1) g_tp->all_reduce_sum(t);
}

void all_reduce_tp(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  copy_into(*in[0], *out[0]);
  sum_over_tp(*out[0]);
}

void all_reduce_tp_backward(const Node&, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                            const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  if (gout[0])
    copy_into(*gout[0], *gin[0]);
  else
    std::memset(gin[0]->raw(), 0, gin[0]->nbytes());
}

void copy_to_tp(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  copy_into(*in[0], *out[0]);
}

// Every rank computes the same graph, so every rank reaches this collective (or none does).
void copy_to_tp_backward(const Node&, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                         const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  if (gout[0])
    copy_into(*gout[0], *gin[0]);
  else
    std::memset(gin[0]->raw(), 0, gin[0]->nbytes());
  sum_over_tp(*gin[0]);
}

// ---- on a device backend: the same pairs on device tensors. The copy is the backend's own
// Identity kernel; the sum goes to the communicator as it is when it takes device buffers
// (NCCL), else through a host copy.
Backend& backend_of(const Tensor& t) {
  for (const std::string& name : backend_names()) {
    Backend* b = find_backend(name);
    if (b->device() == t.device()) return *b;
  }
  fail("no backend holds ", device_name(t.device()), " memory");
}

void device_copy(const Tensor& from, Tensor& to) {
  if (to.raw() == from.raw() || !from.nbytes()) return;
  Backend& b = backend_of(from);
  const BackendKernel* k = b.kernel("Identity");
  WXE_CHECK(k, b.name(), " has no Identity kernel");
  Node n;
  n.op = "Identity";
  n.name = "collective copy";
  k->forward(n, {&from}, {&to});
}

void device_zero(Tensor& t) {
  Tensor z = Tensor::zeros(t.dtype, t.shape);
  if (t.nbytes()) backend_of(t).copy_to_device(t.raw(), z.raw(), t.nbytes());
}

void device_sum_over_tp(Tensor& t) {
  if (!g_tp || g_tp->size() <= 1) return;
  Backend& b = backend_of(t);
  b.synchronize();  // the kernels that wrote t
  if (g_tp->takes_device_buffers()) {
    g_tp->all_reduce_sum(t);
    return;
  }
  Tensor h = b.download(t);
  g_tp->all_reduce_sum(h);
  if (t.nbytes()) b.copy_to_device(t.raw(), h.raw(), t.nbytes());
}

void all_reduce_tp_dev(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  device_copy(*in[0], *out[0]);
  device_sum_over_tp(*out[0]);
}

void all_reduce_tp_backward_dev(const Node&, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                                const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  if (gout[0])
    device_copy(*gout[0], *gin[0]);
  else
    device_zero(*gin[0]);
}

void copy_to_tp_dev(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  device_copy(*in[0], *out[0]);
}

void copy_to_tp_backward_dev(const Node&, const std::vector<const Tensor*>&, const std::vector<const Tensor*>&,
                             const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  if (!gin[0]) return;
  if (gout[0])
    device_copy(*gout[0], *gin[0]);
  else
    device_zero(*gin[0]);
  device_sum_over_tp(*gin[0]);
}

}  // namespace

void register_collective_device_kernels() {
  for (const std::string& name : backend_names()) {
    auto* b = dynamic_cast<TableBackend*>(find_backend(name));
    if (!b || b->device() == DeviceKind::CPU || !b->kernel("Identity")) continue;
    b->register_kernel("AllReduceTP", all_reduce_tp_dev);
    b->register_backward("AllReduceTP", all_reduce_tp_backward_dev);
    b->register_kernel("CopyToTP", copy_to_tp_dev);
    b->register_backward("CopyToTP", copy_to_tp_backward_dev);
  }
}

void register_collective_ops() {
  register_op("AllReduceTP", same_shape, all_reduce_tp);
  register_backward("AllReduceTP", all_reduce_tp_backward);
  register_op("CopyToTP", same_shape, copy_to_tp);
  register_backward("CopyToTP", copy_to_tp_backward);
  register_spectral_norm_tp();
}

void set_tp_communicator(Communicator* tp) { g_tp = tp; }
Communicator* tp_communicator() { return g_tp; }

}  // namespace wxe
