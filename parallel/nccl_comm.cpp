#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "parallel/mpi_comm.h"

// Every CUDA and NCCL call is checked: a failure is a wxe::Error naming the call, where it
// was made and the library's own explanation.
#define WXE_CUDA_CHECK(call)                                                          \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess)                                                            \
      ::wxe::fail(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                \
                  cudaGetErrorString(e_));                                            \
  } while (0)
#define WXE_NCCL_CHECK(call)                                                          \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess)                                                            \
      ::wxe::fail(#call, " failed at ", __FILE__, ":", __LINE__, ": ",                \
                  ncclGetErrorString(r_));                                            \
  } while (0)

namespace wxe {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I64: return ncclInt64;
    case DType::I32: return ncclInt32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    default: fail("NCCL: no sum for dtype ", dtype_name(t));
  }
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  // Two staging buffers (in and out), grown on demand and kept for the next call.
  void* buf[2] = {nullptr, nullptr};
  size_t cap[2] = {0, 0};

  void* staging(int i, size_t bytes) {
    if (bytes > cap[i]) {
      if (buf[i]) WXE_CUDA_CHECK(cudaFree(buf[i]));
      buf[i] = nullptr;
      cap[i] = 0;
      WXE_CUDA_CHECK(cudaMalloc(&buf[i], bytes));
      cap[i] = bytes;
    }
    return buf[i];
  }
  void to_device(void* dev, const void* host, size_t n) {
    if (n) WXE_CUDA_CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream));
  }
  void to_host(void* host, const void* dev, size_t n) {
    if (n) WXE_CUDA_CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream));
  }
  void sync() { WXE_CUDA_CHECK(cudaStreamSynchronize(stream)); }
};

NcclComm::NcclComm(Communicator& bootstrap) : impl_(std::make_unique<Impl>()) {
  rank_ = bootstrap.rank();
  size_ = bootstrap.size();
  int ndev = 0;
  WXE_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  WXE_CHECK(ndev > 0, "NcclComm: no CUDA device");
  device_ = MpiRuntime::local_rank() % ndev;
  WXE_CUDA_CHECK(cudaSetDevice(device_));

  ncclUniqueId id;
  Tensor idt(DType::U8, {(int64_t)sizeof(id)});
  if (rank_ == 0) {
    WXE_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(idt.raw(), &id, sizeof(id));
  }
  bootstrap.broadcast(idt, 0);
  std::memcpy(&id, idt.raw(), sizeof(id));

  WXE_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  WXE_NCCL_CHECK(ncclCommInitRank(&impl_->comm, size_, id, rank_));
}

NcclComm::~NcclComm() {
  // No throwing here: release what exists and ignore errors.
  cudaSetDevice(device_);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  for (void* b : impl_->buf)
    if (b) cudaFree(b);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

namespace {
bool on_gpu(const Tensor& t) { return t.device() == DeviceKind::CUDA; }
}  // namespace

void NcclComm::all_reduce_sum(Tensor& t) {
  comm_check::all_reduce(t);
  if (t.numel() == 0) return;  // every rank has the same size; NCCL gets no null buffers
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  if (on_gpu(t)) {  // in place on the device
    WXE_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), t.numel(), nccl_type(t.dtype), ncclSum, m.comm, m.stream));
    m.sync();
    return;
  }
  size_t n = t.nbytes();
  void* d = m.staging(0, n);
  m.to_device(d, t.raw(), n);
  WXE_NCCL_CHECK(ncclAllReduce(d, d, t.numel(), nccl_type(t.dtype), ncclSum, m.comm, m.stream));
  m.to_host(t.raw(), d, n);
  m.sync();
}

void NcclComm::all_gather(const Tensor& in, Tensor& out) {
  comm_check::all_gather(in, out, size_);
  if (in.numel() == 0) return;
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  if (on_gpu(in) && on_gpu(out)) {
    WXE_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, m.comm, m.stream));
    m.sync();
    return;
  }
  WXE_CHECK(!on_gpu(in) && !on_gpu(out), "all_gather: one tensor on the GPU and one on the host");
  void* din = m.staging(0, in.nbytes());
  void* dout = m.staging(1, out.nbytes());
  m.to_device(din, in.raw(), in.nbytes());
  WXE_NCCL_CHECK(ncclAllGather(din, dout, in.nbytes(), ncclUint8, m.comm, m.stream));
  m.to_host(out.raw(), dout, out.nbytes());
  m.sync();
}

void NcclComm::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  comm_check::reduce_scatter(in, out, size_);
  if (out.numel() == 0) return;
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  if (on_gpu(in) && on_gpu(out)) {
    WXE_NCCL_CHECK(ncclReduceScatter(in.raw(), out.raw(), out.numel(), nccl_type(in.dtype), ncclSum, m.comm, m.stream));
    m.sync();
    return;
  }
  WXE_CHECK(!on_gpu(in) && !on_gpu(out), "reduce_scatter: one tensor on the GPU and one on the host");
  void* din = m.staging(0, in.nbytes());
  void* dout = m.staging(1, out.nbytes());
  m.to_device(din, in.raw(), in.nbytes());
  WXE_NCCL_CHECK(ncclReduceScatter(din, dout, out.numel(), nccl_type(in.dtype), ncclSum, m.comm,
                                   m.stream));
  m.to_host(out.raw(), dout, out.nbytes());
  m.sync();
}

void NcclComm::broadcast(Tensor& t, int root) {
  WXE_CHECK(t.defined(), "broadcast: tensor has no storage");
  comm_check::root("broadcast", root, size_);
  if (t.numel() == 0) return;
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  size_t n = t.nbytes();
  if (on_gpu(t)) {
    WXE_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), n, ncclUint8, root, m.comm, m.stream));
    m.sync();
    return;
  }
  void* d = m.staging(0, n);
  if (rank_ == root) m.to_device(d, t.raw(), n);
  WXE_NCCL_CHECK(ncclBroadcast(d, d, n, ncclUint8, root, m.comm, m.stream));
  m.to_host(t.raw(), d, n);
  m.sync();
}

// NCCL has no barrier: a one-element all-reduce waits for every rank just the same.
void NcclComm::barrier() {
  Tensor t = Tensor::zeros(DType::I32, {1});
  all_reduce_sum(t);
}

void NcclComm::send(const Tensor& t, int dst) {
  WXE_CHECK(t.defined(), "send: tensor has no storage");
  comm_check::peer("send", dst, rank_, size_);
  if (t.numel() == 0) return;
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  void* d = m.staging(0, t.nbytes());
  m.to_device(d, t.raw(), t.nbytes());
  WXE_NCCL_CHECK(ncclSend(d, t.nbytes(), ncclUint8, dst, m.comm, m.stream));
  m.sync();
}

// NCCL cannot tell the receiver how many bytes came: sizes must match (caller's contract).
void NcclComm::recv(Tensor& t, int src) {
  WXE_CHECK(t.defined(), "recv: tensor has no storage");
  comm_check::peer("recv", src, rank_, size_);
  if (t.numel() == 0) return;
  WXE_CUDA_CHECK(cudaSetDevice(device_));
  Impl& m = *impl_;
  void* d = m.staging(0, t.nbytes());
  WXE_NCCL_CHECK(ncclRecv(d, t.nbytes(), ncclUint8, src, m.comm, m.stream));
  m.to_host(t.raw(), d, t.nbytes());
  m.sync();
}

// The job is launched by MPI, so ending it is MPI's business (ncclCommAbort would only
// free this rank's part; MPI_Abort ends every process).
void NcclComm::abort(const std::string& message, int code) { abort_job(message, code); }

}  // namespace wxe
