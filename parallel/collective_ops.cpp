#include "parallel/collective_ops.h"

#include <cstring>

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

}  // namespace

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
