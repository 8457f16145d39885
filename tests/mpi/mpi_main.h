// main() for the MPI test binaries: start MPI (or not, for a world of one), run the tests
// on every rank, let only rank 0 print gtest's report (other ranks print just their
// failures, tagged with the rank), and exit non-zero on every rank if any rank failed.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/mpi_comm.h"

namespace wxe::test {

// Reports failed assertions of a rank other than 0, which is otherwise silent.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

inline int run_mpi_gtest(int argc, char** argv) {
  MpiRuntime::init();
  testing::InitGoogleTest(&argc, argv);
  int rc;
  {
    std::unique_ptr<Communicator> world = world_comm();
    if (world->rank() != 0) {
      auto& ls = testing::UnitTest::GetInstance()->listeners();
      delete ls.Release(ls.default_result_printer());
      ls.Append(new RankFailurePrinter(world->rank()));
    }
    Tensor failed = Tensor::zeros(DType::I32, {1});
    failed.data<int32_t>()[0] = RUN_ALL_TESTS() != 0;
    world->all_reduce_sum(failed);
    int nfailed = failed.data<int32_t>()[0];
    if (nfailed && world->rank() == 0)
      std::fprintf(stderr, "%d of %d ranks had failures\n", nfailed, world->size());
    rc = nfailed ? 1 : 0;
  }
  MpiRuntime::finalize();
  return rc;
}

}  // namespace wxe::test
