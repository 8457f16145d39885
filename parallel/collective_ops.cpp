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

void all_reduce_tp(const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor*>& out) {
  WXE_CHECK(g_tp, "node ", n.name, ": no tensor-parallel communicator");
  if (out[0]->raw() != in[0]->raw()) std::memcpy(out[0]->raw(), in[0]->raw(), in[0]->nbytes());
  g_tp->all_reduce_sum(*out[0]);
}

}  // namespace

void register_collective_ops() { register_op("AllReduceTP", same_shape, all_reduce_tp); }

void set_tp_communicator(Communicator* tp) { g_tp = tp; }

}  // namespace wxe
