// MPI communicators for CPU ranks, and the process-wide MPI state.
//
// A process started by an MPI launcher (mpirun/mpiexec/srun: the launcher leaves
// OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or PMIX_RANK in the environment) uses MPI.
// A process started without one is a world of one and never touches MPI: no singleton
// MPI_Init, whose behaviour depends on the MPI build, the container and the user (root).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "parallel/comm.h"

namespace wxe {

class MpiRuntime {
 public:
  // Starts MPI (MPI_Init_thread, FUNNELED: only the main thread calls MPI) when the process
  // was started by a launcher and MPI is not up yet; registers finalize() at exit. Safe to
  // call many times. Collective over the world the first time. Returns active().
  static bool init();
  // MPI is initialized (by us or by someone else) and not finalized.
  static bool active();
  // MPI_Finalize if init() started MPI; idempotent. Collective: every rank must get here
  // (return from main or call it), otherwise end the job with abort_job().
  static void finalize();
  // The environment shows an MPI launcher.
  static bool launched();
  // This process's rank in the world and among the ranks on its node (for picking a GPU);
  // 0 without MPI.
  static int world_rank();
  static int local_rank();
};

class MpiComm : public Communicator {
 public:
  // Wraps `comm`; MPI_Comm_free on destruction when `owned`.
  MpiComm(MPI_Comm comm, bool owned);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void send(const Tensor& t, int dst) override;
  void recv(Tensor& t, int src) override;
  // Color must be >= 0.
  std::unique_ptr<Communicator> split(int color, int key) override;
  [[noreturn]] void abort(const std::string& message, int code = 1) override;

  MPI_Comm handle() const { return comm_; }

  // The most elements (reductions) or bytes (copies) one MPI call moves; MPI counts are
  // int, so larger transfers go in pieces. Default INT_MAX. Tests lower it to exercise the
  // chunked paths with small tensors. Set it to the same value on every rank.
  static void set_max_count(int64_t n);
  static int64_t max_count();

 private:
  void bcast_bytes(uint8_t* p, size_t n, int root);
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

// The world: an MpiComm over a duplicate of MPI_COMM_WORLD when running under a launcher
// (calls MpiRuntime::init()), a LocalComm otherwise.
std::unique_ptr<Communicator> world_comm();

}  // namespace wxe
