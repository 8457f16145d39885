// Communicator: a group of processes (ranks) and the collectives the engine needs.
// One interface over MPI (CPU ranks), NCCL (GPU ranks) and LocalComm (a world of one).
//
// Rules every backend follows:
// - Collectives are blocking and must be called by every rank of the group in the same
//   order (the MPI rule). Tensors are host tensors, contiguous (engine/ir/tensor.h).
// - Each call checks locally that its tensors fit what it needs (dtype, shape, root) and
//   throws wxe::Error otherwise. Agreement between ranks is not checked: it would cost a
//   round trip per call.
// - An error that only some ranks see must end the job through abort(), never by
//   returning from main: the other ranks would wait forever in their next collective.
#pragma once
#include <memory>
#include <string>

#include "engine/ir/tensor.h"

namespace wxe {

// A collective started and not finished yet (Communicator::start_all_gather); wait() finishes
// it. Its tensors must stay alive and unread until then.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: t = sum of every rank's t. F32, F64, I64, I32, F16, BF16.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out = every rank's `in` concatenated along dim 0, in rank order. `out` is preallocated
  // with size() * in.shape[0] rows; `in` and `out` must not share memory.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // all_gather started, to finish at wait() while the caller computes (MPI: MPI_Iallgather);
  // the default runs it at once. Started in the same order on every rank, as any collective.
  virtual std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, Tensor& out);
  // in.shape[0] = size() * out.shape[0]; rank r gets the sum over ranks of block r of `in`.
  virtual void reduce_scatter_sum(const Tensor& in, Tensor& out) = 0;
  // In place: every rank's t gets root's t.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Point to point (blocking; e.g. gathering dp outputs to rank 0). recv checks that the
  // message has exactly t.nbytes().
  virtual void send(const Tensor& t, int dst);
  virtual void recv(Tensor& t, int src);
  // A sub-communicator of the ranks that pass the same color, ordered by key (MPI_Comm_split).
  // Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key);
  // Ends the whole job (every rank of every communicator) with "wxe: error (rank R): message"
  // on stderr from this rank and exit code `code`. Never returns.
  [[noreturn]] virtual void abort(const std::string& message, int code = 1) = 0;
  // Whether the collectives take tensors in GPU memory (NCCL) as well as host tensors; the
  // others take host tensors only.
  virtual bool takes_device_buffers() const { return false; }
};

// A world of one: no MPI involved. Collectives are copies or nothing.
class LocalComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int code = 1) override;
};

// Ends the process and, when MPI is running, the whole job: prints
// "wxe: error (rank R): message" (R = world rank) to stderr, flushes, MPI_Abort or _Exit.
// Defined in mpi_comm.cpp, the one place that knows whether MPI is up.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

// Local argument checks shared by the backends; each throws wxe::Error naming the call.
namespace comm_check {
bool sum_dtype_ok(DType t);  // F32, F64, I64, I32, F16, BF16
void all_reduce(const Tensor& t);
void all_gather(const Tensor& in, const Tensor& out, int size);
void reduce_scatter(const Tensor& in, const Tensor& out, int size);
void root(const char* call, int root, int size);
void peer(const char* call, int peer, int rank, int size);
}  // namespace comm_check

}  // namespace wxe
