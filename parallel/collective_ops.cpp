#include "parallel/collective_ops.h"

#include <cstring>

#include "engine/exec/backend.h"
#include "engine/ir/ops.h"

namespace wxe {

namespace {

thread_local Communicator* g_tp = nullptr;  // per thread: tests run ranks as threads

std::vector<TypeShape> same_shape(const Node& n, const std::vector<const Value*>& in) {
  WXE_CHECK(in.size() == 1 && in[0], "node ", n.name, " (", n.op, "): needs one input");
  return {{in[0]->dtype, in[0]->shape}};
}

Backend& backend_of(const Tensor& t) {
  for (const std::string& name : backend_names()) {
    Backend* b = find_backend(name);
    if (b->device() == t.device()) return *b;
  }
  fail("no backend holds ", device_name(t.device()), " memory");
}

// The three primitives of the collectives, in whichever memory the tensors live: host
// memory, or a device backend's (the copy is the backend's own Identity kernel; the sum goes
// to the communicator as it is when it takes device buffers (NCCL), else through a host copy).
void copy_into(const Tensor& from, Tensor& to) {
  if (to.raw() == from.raw() || !from.nbytes()) return;
  if (from.device() == DeviceKind::CPU) {
    std::memcpy(to.raw(), from.raw(), from.nbytes());
    return;
  }
  Backend& b = backend_of(from);
  const BackendKernel* k = b.kernel("Identity");
  WXE_CHECK(k, b.name(), " has no Identity kernel");
  Node n;
  n.op = "Identity";
  n.name = "collective copy";
  k->forward(n, {&from}, {&to});
}

void zero(Tensor& t) {
  if (t.device() == DeviceKind::CPU) {
    std::memset(t.raw(), 0, t.nbytes());
    return;
  }
  Tensor z = Tensor::zeros(t.dtype, t.shape);
  if (t.nbytes()) backend_of(t).copy_to_device(t.raw(), z.raw(), t.nbytes());
}

// In place over the tp group; nothing to do for a group of one (or none: one process).
void sum_over_tp(Tensor& t) {
  if (!g_tp || g_tp->size() <= 1) return;
  if (t.device() == DeviceKind::CPU || g_tp->takes_device_buffers()) {
    if (t.device() != DeviceKind::CPU) backend_of(t).synchronize();  // the kernels that wrote t
    g_tp->all_reduce_sum(t);
    return;
  }
  Backend& b = backend_of(t);
  b.synchronize();
  Tensor h = b.download(t);
  g_tp->all_reduce_sum(h);
  if (t.nbytes()) b.copy_to_device(t.raw(), h.raw(), t.nbytes());
}

// The pair of conjugate collectives, one kernel each for every backend:
//   AllReduceTP: forward sum over tp, backward identity;
//   CopyToTP: forward identity, backward sum over tp.
// Every rank computes the same graph, so every rank reaches each collective (or none does).
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
    zero(*gin[0]);
}

void copy_to_tp(const Node&, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  copy_into(*in[0], *out[0]);
}

void copy_to_tp_backward(const Node& n, const std::vector<const Tensor*>& in, const std::vector<const Tensor*>& outs,
                         const std::vector<const Tensor*>& gout, const std::vector<Tensor*>& gin) {
  all_reduce_tp_backward(n, in, outs, gout, gin);
  if (gin[0]) sum_over_tp(*gin[0]);
}

}  // namespace

void register_collective_device_kernels() {
  for (const std::string& name : backend_names()) {
    auto* b = dynamic_cast<TableBackend*>(find_backend(name));
    if (!b || b->device() == DeviceKind::CPU || !b->kernel("Identity")) continue;
    b->register_kernel("AllReduceTP", all_reduce_tp);
    b->register_backward("AllReduceTP", all_reduce_tp_backward);
    b->register_kernel("CopyToTP", copy_to_tp);
    b->register_backward("CopyToTP", copy_to_tp_backward);
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
