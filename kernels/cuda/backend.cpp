// The CUDA backend: one GPU per process (the node-local rank's, modulo the GPUs visible), one
// stream, memory from cudaMalloc, the kernel table of kernels/cuda, and its own graph
// preparation.
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "engine/passes/fuse.h"
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

// Asked once per process (the collectives ask on every call, parallel/collective_ops.cpp
// backend_of): the answer, and why not.
bool device_present(std::string* why) {
  static const std::string absent = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return std::string("no CUDA GPU found (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
    }
    return count == 0 ? std::string("no CUDA GPU found") : std::string();
  }();
  if (why && !absent.empty()) *why = absent;
  return absent.empty();
}

// Stream-ordered: freed after the kernels queued so far (every kernel, copy and library call
// of the backend runs on its one stream). At exit the context may be gone: errors ignored.
void free_device(void* p) { cudaFreeAsync(p, ctx().stream); }

// The node-local rank: WXE_LOCAL_RANK (set by wxe from MPI_Comm_split_type under mpirun), else
// the launcher's variable, else 0.
int local_rank() {
  for (const char* v : {"WXE_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) {
      char* end = nullptr;
      const long r = std::strtol(s, &end, 10);
      if (end != s && r >= 0) return (int)r;
    }
  return 0;
}  // at exit the context may be gone: ignore errors

struct Workspace {
  void* p = nullptr;
  size_t cap = 0;
};
Workspace& ws() {
  static Workspace w;
  return w;
}

cudaMemPool_t pool() {
  cudaMemPool_t p;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&p, ctx().device));
  return p;
}

size_t pool_bytes(cudaMemPoolAttr a) {
  uint64_t v = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool(), a, &v));
  return (size_t)v;
}

class CudaBackend : public TableBackend {
 public:
  const char* name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::CUDA; }
  bool available(std::string* why) const override { return device_present(why); }
  std::shared_ptr<Storage> allocate(size_t nbytes) override {
    ctx();
    void* p = nullptr;
    CUDA_CHECK(cudaMallocAsync(&p, nbytes ? nbytes : 256, ctx().stream));  // from the device's pool
    return std::make_shared<Storage>(p, nbytes, DeviceKind::CUDA, free_device);
  }
  void copy_to_device(void* dst, const void* src, size_t n) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ctx().stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx().stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
  }
  void copy_on_device(void* dst, const void* src, size_t n) override {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ctx().stream));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(ctx().stream)); }
  const TrainKernels* train_kernels() const override { return &cuda::train_kernels(); }
  // Stream-ordered allocations (tensors, Scratch) come from the device's default pool, which
  // counts what is in use and its high-water mark; the grow-only workspace is added.
  size_t bytes_in_use() const override { return pool_bytes(cudaMemPoolAttrUsedMemCurrent) + ws().cap; }
  size_t bytes_peak() const override {
    return std::max(pool_bytes(cudaMemPoolAttrUsedMemHigh), pool_bytes(cudaMemPoolAttrUsedMemCurrent)) + ws().cap;
  }
  void reset_peak() override {
    uint64_t zero = 0;  // the pool restarts its mark from what is in use now
    CUDA_CHECK(cudaMemPoolSetAttribute(pool(), cudaMemPoolAttrUsedMemHigh, &zero));
  }
  // The CPU fusions whose products have CUDA kernels: fewer launches, same numbers up to
  // float rounding. No layout passes (cuDNN runs NCHW).
  void prepare(Graph& g, Precision precision) override {
    remove_identity_ops(g);
    fuse_gelu(g);
    fuse_channel_layernorm(g);
    fuse_linear_gelu(g);
    fuse_window_attention(g);
    if (precision == Precision::BF16) use_bf16(g);  // Linear: bf16 products; Conv: TF32 (linalg.cpp)
  }
  // GELU, the channel LayerNorm and Linear+GELU have CUDA backward kernels (backward.cu,
  // linalg.cpp); the window attention trains unfused (its backward is the CPU's only).
  void prepare_training(Graph& g) override {
    remove_identity_ops(g);
    fuse_gelu(g);
    fuse_channel_layernorm(g);
    fuse_linear_gelu(g);
  }
};

}  // namespace

Context& ctx() {
  static Context c = [] {
    std::string why;
    WXE_CHECK(device_present(&why), "device 'cuda' is not available: ", why);
    Context r;
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    r.device = local_rank() % count;
    CUDA_CHECK(cudaSetDevice(r.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    // the pool keeps freed memory for the next allocation (training allocates every value of
    // every step) instead of returning it to the driver at each synchronization
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r.device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CUBLAS_CHECK(cublas().create(&r.blas));
    CUBLAS_CHECK(cublas().set_stream(r.blas, r.stream));
    // exact float32 products (no TF32), as the CPU reference computes them
    CUBLAS_CHECK(cublas().set_math_mode(r.blas, CUBLAS_PEDANTIC_MATH));
    CUDNN_CHECK(cudnnCreate(&r.dnn));
    CUDNN_CHECK(cudnnSetStream(r.dnn, r.stream));
    return r;
  }();
  return c;
}

void* workspace(size_t bytes) {
  Workspace& w = ws();
  if (bytes > w.cap) {
    if (w.p) {
      CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
      CUDA_CHECK(cudaFree(w.p));
    }
    w.p = nullptr;
    w.cap = 0;
    CUDA_CHECK(cudaMalloc(&w.p, bytes));
    w.cap = bytes;
  }
  return w.p;
}

void require_f32(const Node& n, const Ins& in) {
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i])
      NCHECK(in[i]->dtype == DType::F32, "input ", i, " is ", dtype_name(in[i]->dtype),
             ", the cuda kernel supports float32 only");
}

}  // namespace wxe::cuda

namespace wxe {

void register_gpu_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto b = std::make_unique<cuda::CudaBackend>();
    cuda::register_pointwise(*b);
    cuda::register_norm(*b);
    cuda::register_linalg(*b);
    cuda::register_backward_kernels(*b);
    cuda::register_spectral_norm(*b);
    cuda::register_gather(*b);
    register_backend(std::move(b));
  });
}

}  // namespace wxe
