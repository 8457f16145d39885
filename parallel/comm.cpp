#include "parallel/comm.h"

#include <cstring>

namespace wxe {

void Communicator::send(const Tensor& t, int dst) {
  comm_check::peer("send", dst, rank(), size());
  fail("send: not supported by this communicator");
}

void Communicator::recv(Tensor& t, int src) {
  comm_check::peer("recv", src, rank(), size());
  fail("recv: not supported by this communicator");
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather(const Tensor& in, Tensor& out) {
  all_gather(in, out);
  return std::make_unique<PendingCollective>();
}

std::unique_ptr<Communicator> Communicator::split(int, int) {
  fail("split: not supported by this communicator");
}

// ---- LocalComm: with one rank every collective's result is its own input.

void LocalComm::all_reduce_sum(Tensor& t) { comm_check::all_reduce(t); }

void LocalComm::all_gather(const Tensor& in, Tensor& out) {
  comm_check::all_gather(in, out, 1);
  if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

void LocalComm::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  comm_check::reduce_scatter(in, out, 1);
  if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

void LocalComm::broadcast(Tensor& t, int root) {
  WXE_CHECK(t.defined(), "broadcast: tensor has no storage");
  comm_check::root("broadcast", root, 1);
}

std::unique_ptr<Communicator> LocalComm::split(int, int) { return std::make_unique<LocalComm>(); }

void LocalComm::abort(const std::string& message, int code) { abort_job(message, code); }

// ---- checks

namespace comm_check {
namespace {

void defined(const char* call, const char* what, const Tensor& t) {
  WXE_CHECK(t.defined(), call, ": ", what, " tensor has no storage");
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.storage != b.storage || a.nbytes() == 0 || b.nbytes() == 0) return false;
  return a.offset < b.offset + b.nbytes() && b.offset < a.offset + a.nbytes();
}

// `big` has `factor` times the rows of `small` and the same trailing dims and dtype.
void blocks(const char* call, const Tensor& big, const char* big_name, const Tensor& small,
            const char* small_name, int factor) {
  defined(call, big_name, big);
  defined(call, small_name, small);
  WXE_CHECK(big.dtype == small.dtype, call, ": ", small_name, " is ", dtype_name(small.dtype),
            " but ", big_name, " is ", dtype_name(big.dtype));
  WXE_CHECK(small.rank() >= 1 && big.rank() == small.rank(), call, ": ", small_name, " ",
            shape_str(small.shape), " and ", big_name, " ", shape_str(big.shape),
            " must have the same rank, at least 1");
  bool ok = big.shape[0] == small.shape[0] * factor;
  for (int i = 1; i < small.rank(); ++i) ok = ok && big.shape[i] == small.shape[i];
  WXE_CHECK(ok, call, ": ", big_name, " ", shape_str(big.shape), " must be ", small_name, " ",
            shape_str(small.shape), " with dim 0 times ", factor, " (the group size)");
  WXE_CHECK(!overlap(big, small), call, ": in and out share memory");
}

}  // namespace

bool sum_dtype_ok(DType t) {
  switch (t) {
    case DType::F32: case DType::F64: case DType::I64: case DType::I32:
    case DType::F16: case DType::BF16:
      return true;
    default:
      return false;
  }
}

void all_reduce(const Tensor& t) {
  defined("all_reduce_sum", "the", t);
  WXE_CHECK(sum_dtype_ok(t.dtype), "all_reduce_sum: dtype ", dtype_name(t.dtype),
            " is not supported (F32, F64, I64, I32, F16, BF16)");
}

void all_gather(const Tensor& in, const Tensor& out, int size) {
  blocks("all_gather", out, "out", in, "in", size);
}

void reduce_scatter(const Tensor& in, const Tensor& out, int size) {
  blocks("reduce_scatter_sum", in, "in", out, "out", size);
  WXE_CHECK(sum_dtype_ok(in.dtype), "reduce_scatter_sum: dtype ", dtype_name(in.dtype),
            " is not supported (F32, F64, I64, I32, F16, BF16)");
}

void root(const char* call, int root, int size) {
  WXE_CHECK(root >= 0 && root < size, call, ": root ", root, " is not a rank of a group of ",
            size);
}

void peer(const char* call, int peer, int rank, int size) {
  WXE_CHECK(peer >= 0 && peer < size, call, ": peer ", peer, " is not a rank of a group of ",
            size);
  WXE_CHECK(peer != rank, call, ": peer ", peer, " is this rank");
}

}  // namespace comm_check
}  // namespace wxe
