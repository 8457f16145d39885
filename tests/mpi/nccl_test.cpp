// NcclComm: the same collective checks as comm_test, on GPUs. Built only with WXE_CUDA.
// Exits 77 (ctest: skipped) without a CUDA device, or with fewer devices than ranks
// (NCCL refuses two ranks on one GPU); every rank decides the same way.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/exec/backend.h"
#include "parallel/collective_ops.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"
#include "tests/mpi/collective_checks.h"
#include "tests/mpi/mpi_main.h"

namespace wxe::test {
namespace {

TEST(Nccl, Collectives) {
  auto world = world_comm();
  NcclComm c(*world);
  EXPECT_EQ(c.rank(), world->rank());
  EXPECT_EQ(c.size(), world->size());
  check_all_collectives(c, 700);
}

TEST(Nccl, HalfPrecisionSum) {
  auto world = world_comm();
  NcclComm c(*world);
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor f = Tensor::from_f32({4}, {0.5f, -1.f, 2.f, 8.f});
    Tensor t(dt, {4});
    convert(f, t);
    c.all_reduce_sum(t);
    Tensor got = t.to_f32();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.data<float>()[i], f.data<float>()[i] * c.size());
  }
}

// Tensors in GPU memory (the CUDA backend's) go to NCCL without host staging: the results
// equal the host-tensor results. Then the tensor-parallel collective nodes as the CUDA
// backend runs them (AllReduceTP forward, CopyToTP backward) on device tensors.
TEST(Nccl, DeviceBuffers) {
  auto world = world_comm();
  NcclComm c(*world);
  register_gpu_backends();
  Backend& b = backend_for("cuda");
  const int r = c.rank(), n = c.size();
  Tensor h = Tensor::from_f32({2, 3}, {1.f + r, 2.f, 3.f * r, -1.f, 0.5f, 7.f + r});
  Tensor d = b.upload(h);
  ASSERT_EQ(d.device(), DeviceKind::CUDA);
  c.all_reduce_sum(d);
  c.all_reduce_sum(h);
  Tensor got = b.download(d);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got.data<float>()[i], h.data<float>()[i]) << i;
  // all_gather / reduce_scatter / broadcast on device buffers
  Tensor part = b.upload(Tensor::from_f32({1, 2}, {10.f * r, 10.f * r + 1}));
  Tensor all = b.empty(DType::F32, {n, 2});
  c.all_gather(part, all);
  Tensor ga = b.download(all);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(ga.data<float>()[2 * k], 10.f * k);
    EXPECT_EQ(ga.data<float>()[2 * k + 1], 10.f * k + 1);
  }
  Tensor mine = b.empty(DType::F32, {1, 2});
  c.reduce_scatter_sum(all, mine);  // every rank contributed the same `all`
  Tensor rs = b.download(mine);
  EXPECT_EQ(rs.data<float>()[0], 10.f * r * n);
  Tensor bc = b.upload(Tensor::from_f32({2}, {(float)r, 5.f}));
  c.broadcast(bc, 0);
  EXPECT_EQ(b.download(bc).data<float>()[0], 0.f);
  // the collective nodes' CUDA kernels
  register_collective_ops();
  register_collective_device_kernels();
  set_tp_communicator(&c);
  const BackendKernel* ar = b.kernel("AllReduceTP");
  const BackendKernel* cp = b.kernel("CopyToTP");
  ASSERT_TRUE(ar && cp && ar->backward && cp->backward);
  Node node;
  node.op = "AllReduceTP";
  Tensor x = b.upload(Tensor::from_f32({3}, {1.f, 2.f, (float)r}));
  Tensor y = b.empty(DType::F32, {3});
  ar->forward(node, {&x}, {&y});
  Tensor yh = b.download(y);
  EXPECT_EQ(yh.data<float>()[0], 1.f * n);
  EXPECT_EQ(yh.data<float>()[2], (float)(n * (n - 1) / 2));
  Tensor gx = b.empty(DType::F32, {3});
  node.op = "CopyToTP";
  cp->backward(node, {&x}, {&y}, {&x}, {&gx});
  Tensor gh = b.download(gx);
  EXPECT_EQ(gh.data<float>()[1], 2.f * n);
  set_tp_communicator(nullptr);
}

}  // namespace
}  // namespace wxe::test

int main(int argc, char** argv) {
  int ndev = wxe::cuda_device_count();
  if (ndev == 0) {
    std::printf("no CUDA device: skipping the NCCL tests\n");
    return 77;
  }
  // Ranks on one node (the tests' case) must not outnumber the devices.
  wxe::MpiRuntime::init();
  int world = wxe::world_comm()->size();
  if (world > ndev) {
    std::printf("%d ranks but %d CUDA devices: skipping the NCCL tests\n", world, ndev);
    wxe::MpiRuntime::finalize();
    return 77;
  }
  return wxe::test::run_mpi_gtest(argc, argv);
}
