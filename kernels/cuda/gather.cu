// Gather (opset 13, one axis) on the CUDA backend, forward and backward. The indices are read
// on the host (host input 1: small), checked and made non-negative as the CPU kernel does, and
// copied to the device; the index math is index_math.h's gather_source / gather_grad (the
// backward sums every copy of an element in a fixed order: deterministic, no atomics).
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_util.h"

namespace wxe::cuda {

namespace {

template <class T>
__global__ void gather_kernel(GatherIndex g, const int64_t* idx, const T* x, T* y, int64_t total) {
  GRID_LOOP(i, total) y[i] = x[gather_source(g, idx, i)];
}

__global__ void gather_grad_kernel(GatherIndex g, const int64_t* idx, const float* gy, float* gx, int64_t total) {
  GRID_LOOP(e, total) gx[e] = gather_grad(g, idx, gy, e);
}

// The geometry; *idx = the checked, non-negative indices.
GatherIndex gather_index(const Node& n, const Shape& data, const Tensor& indices, std::vector<int64_t>* idx) {
  const int64_t axis = norm_axis(n.i("axis", 0), (int64_t)data.size(), n);
  GatherIndex g;
  g.dim = data[axis];
  for (int64_t d = axis + 1; d < (int64_t)data.size(); ++d) g.inner *= data[d];
  *idx = indices.to_i64();
  for (auto& v : *idx) {
    NCHECK(v >= -g.dim && v < g.dim, "index ", v, " out of range for axis ", axis, " of size ", g.dim);
    if (v < 0) v += g.dim;
  }
  g.ni = (int64_t)idx->size();
  return g;
}

// The indices in device memory (freed in stream order).
struct DeviceIndices {
  Scratch s;
  explicit DeviceIndices(const std::vector<int64_t>& h) : s(h.size() * sizeof(int64_t)) {
    if (!h.empty())
      CUDA_CHECK(cudaMemcpyAsync(s.p, h.data(), h.size() * sizeof(int64_t), cudaMemcpyHostToDevice, ctx().stream));
  }
  const int64_t* get() const { return (const int64_t*)s.p; }
};

void gather_op(const Node& n, const Ins& in, const Outs& out) {
  std::vector<int64_t> h;
  const GatherIndex g = gather_index(n, in[0]->shape, *in[1], &h);
  const int64_t total = out[0]->numel();
  if (total == 0) return;
  DeviceIndices idx(h);
  const int64_t* ip = idx.get();
  const unsigned blocks = blocks_for(total);
  switch (dtype_size(in[0]->dtype)) {
    case 1: gather_kernel<<<blocks, kThreads, 0, ctx().stream>>>(g, ip, in[0]->data<uint8_t>(), out[0]->data<uint8_t>(), total); break;
    case 2: gather_kernel<<<blocks, kThreads, 0, ctx().stream>>>(g, ip, in[0]->data<uint16_t>(), out[0]->data<uint16_t>(), total); break;
    case 4: gather_kernel<<<blocks, kThreads, 0, ctx().stream>>>(g, ip, in[0]->data<uint32_t>(), out[0]->data<uint32_t>(), total); break;
    case 8: gather_kernel<<<blocks, kThreads, 0, ctx().stream>>>(g, ip, in[0]->data<uint64_t>(), out[0]->data<uint64_t>(), total); break;
    default: fail("node ", n.name, " (", n.op, "): unsupported dtype ", dtype_name(in[0]->dtype));
  }
  CUDA_LAUNCHED();
}

void gather_bw(const Node& n, const Ins& in, const Ins&, const Ins& gout, const Outs& gin) {
  Tensor* gx = gin.empty() ? nullptr : gin[0];
  if (!gx) return;
  if (!gout[0]) return launch_zero(gx);
  NCHECK(in[0]->dtype == DType::F32, "the cuda backward supports float32 data only");
  std::vector<int64_t> h;
  const GatherIndex g = gather_index(n, in[0]->shape, *in[1], &h);
  const int64_t total = gx->numel();
  if (total == 0) return;
  DeviceIndices idx(h);
  gather_grad_kernel<<<blocks_for(total), kThreads, 0, ctx().stream>>>(g, idx.get(),
                                                                       gout[0]->data<float>(), gx->data<float>(), total);
  CUDA_LAUNCHED();
}

}  // namespace

void register_gather(TableBackend& b) {
  b.register_kernel("Gather", gather_op, 0b10);
  b.register_backward("Gather", gather_bw);
}

}  // namespace wxe::cuda
