#include "engine/ir/ops.h"

#include <map>

namespace wxe {

namespace {
struct OpEntry {
  ShapeFn shape = nullptr;
  KernelFn reference = nullptr;
  KernelFn fast = nullptr;
  BackwardFn backward = nullptr;
  BackwardReads reads;
  uint32_t passthrough = 0;
  uint32_t accumulation = 0;
  bool random = false;
};
std::map<std::string, OpEntry>& table() {
  static std::map<std::string, OpEntry> t;
  return t;
}
}  // namespace

void register_op(const std::string& op, ShapeFn shape, KernelFn reference) {
  auto& e = table()[op];
  e.shape = shape;
  e.reference = reference;
}

void register_fast_kernel(const std::string& op, KernelFn fast) { table()[op].fast = fast; }

void register_backward(const std::string& op, BackwardFn backward) { table()[op].backward = backward; }

void register_backward_reads(const std::string& op, BackwardReads reads) { table()[op].reads = reads; }

void register_random_op(const std::string& op) { table()[op].random = true; }
bool op_is_random(const std::string& op) {
  auto it = table().find(op);
  return it != table().end() && it->second.random;
}

BackwardReads backward_reads(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? BackwardReads{} : it->second.reads;
}

void register_gradient_passthrough(const std::string& op, uint32_t inputs) { table()[op].passthrough = inputs; }

void register_gradient_accumulation(const std::string& op, uint32_t inputs) { table()[op].accumulation = inputs; }

uint32_t gradient_accumulation(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? 0u : it->second.accumulation;
}

namespace {
thread_local uint32_t g_accumulates = 0;
}  // namespace

bool backward_accumulates(size_t i) { return i < 32 && (g_accumulates >> i & 1u); }
void set_backward_accumulates(uint32_t inputs) { g_accumulates = inputs; }

uint32_t gradient_passthrough(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? 0u : it->second.passthrough;
}

BackwardFn backward_kernel(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? nullptr : it->second.backward;
}

bool op_known(const std::string& op) {
  auto it = table().find(op);
  return it != table().end() && it->second.shape && it->second.reference;
}

ShapeFn shape_rule(const std::string& op) {
  WXE_CHECK(op_known(op), "unsupported op type ", op);
  return table()[op].shape;
}

KernelFn kernel_for(const std::string& op, KernelKind kind) {
  WXE_CHECK(op_known(op), "unsupported op type ", op);
  const OpEntry& e = table()[op];
  return kind == KernelKind::Fast && e.fast ? e.fast : e.reference;
}

std::vector<std::string> known_ops() {
  std::vector<std::string> r;
  for (auto& kv : table())
    if (kv.second.shape && kv.second.reference) r.push_back(kv.first);
  return r;
}

int64_t norm_axis(int64_t axis, int64_t rank, const Node& n) {
  WXE_CHECK(axis >= -rank && axis < std::max<int64_t>(rank, 1), "node ", n.name, " (", n.op,
            "): axis ", axis, " out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const Node& n) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    WXE_CHECK(da == db || da == 1 || db == 1, "node ", n.name, " (", n.op,
              "): shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> const_ints(const Node& n, const std::vector<const Value*>& in, size_t i) {
  WXE_CHECK(i < in.size() && in[i], "node ", n.name, " (", n.op, "): missing input ", i);
  WXE_CHECK(in[i]->is_const(), "node ", n.name, " (", n.op, "): input ", i, " ('", in[i]->name,
            "') must be known before running the graph");
  return in[i]->constant->to_i64();
}

namespace {
CpuKernelInfo& kernel_info() {
  static CpuKernelInfo info;
  return info;
}
}  // namespace

void register_cpu_kernel_info(const CpuKernelInfo& info) { kernel_info() = info; }
const CpuKernelInfo& cpu_kernel_info() { return kernel_info(); }

}  // namespace wxe
