// NCCL communicators for GPU ranks (built only with WXE_CUDA; the define WXE_HAVE_NCCL
// tells the tools it is there). The header names no CUDA type, so including it needs no
// CUDA include path.
//
// Tensors in GPU memory (a CUDA backend's, Tensor::device() == CUDA) go to NCCL as they are;
// host tensors are staged through device buffers (copy in, NCCL on this communicator's
// stream, copy out). The caller makes sure the work that wrote a device tensor has finished
// (the backend's synchronize()); every collective returns after NCCL has finished.
#pragma once
#include <memory>

#include "parallel/comm.h"

namespace wxe {

class NcclComm : public Communicator {
 public:
  // Builds an NCCL communicator over the ranks of `bootstrap` (an MpiComm, or a LocalComm
  // for a single process): its rank 0 makes the NCCL unique id and broadcasts it over
  // `bootstrap`. Collective over `bootstrap`. Device = node-local rank % device count.
  explicit NcclComm(Communicator& bootstrap);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  void all_reduce_sum(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void send(const Tensor& t, int dst) override;
  void recv(Tensor& t, int src) override;
  [[noreturn]] void abort(const std::string& message, int code = 1) override;
  bool takes_device_buffers() const override { return true; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1, device_ = 0;
};

// Number of CUDA devices; 0 when the driver or runtime reports none or fails (no GPU).
int cuda_device_count();

}  // namespace wxe
