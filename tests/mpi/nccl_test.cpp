// NcclComm: the same collective checks as comm_test, on GPUs. Built only with WXE_CUDA.
// Exits 77 (ctest: skipped) without a CUDA device, or with fewer devices than ranks
// (NCCL refuses two ranks on one GPU); every rank decides the same way.
#include <gtest/gtest.h>

#include <cstdio>

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
