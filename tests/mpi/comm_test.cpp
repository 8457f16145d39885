// MPI communicator and mesh tests. Run by ctest with 1 (no launcher), 2 and 4 ranks; every
// test runs on every rank and makes the same collective calls there.
#include <gtest/gtest.h>

#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"
#include "tests/mpi/collective_checks.h"
#include "tests/mpi/mpi_main.h"

namespace wxe::test {
namespace {

TEST(Comm, Collectives) {
  auto c = world_comm();
  check_all_collectives(*c, 100);
}

// Pieces of at most 64 elements / bytes: the paths MPI's int counts force on tensors
// above INT_MAX, exercised without allocating gigabytes.
TEST(Comm, CollectivesInPieces) {
  auto c = world_comm();
  int64_t saved = MpiComm::max_count();
  MpiComm::set_max_count(64);
  for (DType dt : test_dtypes()) {
    for (int64_t n : {int64_t(0), int64_t(63), int64_t(1000), int64_t(100003)}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      check_all_reduce(*c, dt, n, 200);
      check_all_gather(*c, dt, n, 1, 201);
      check_reduce_scatter(*c, dt, n, 202);
      check_broadcast(*c, dt, n, 203);
      check_send_recv(*c, dt, n, 204);
    }
  }
  MpiComm::set_max_count(saved);
}

// A started all-gather (MPI_Iallgather; in pieces above the count limit: at once) gives the
// blocking one's bytes, with a blocking collective between its start and its wait.
TEST(Comm, StartedAllGather) {
  auto c = world_comm();
  for (int64_t n : {int64_t(0), int64_t(7), int64_t(100003)}) check_all_gather(*c, DType::F32, n, 3, 300, true);
  int64_t saved = MpiComm::max_count();
  MpiComm::set_max_count(64);
  check_all_gather(*c, DType::F32, 1000, 1, 301, true);
  MpiComm::set_max_count(saved);
}

TEST(Comm, HalfPrecisionSum) {
  auto c = world_comm();
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor t(dt, {5});
    Tensor f = Tensor::from_f32({5}, {0.5f, -1.f, 2.f, 0.25f, 8.f});
    convert(f, t);
    c->all_reduce_sum(t);
    Tensor got = t.to_f32();
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(got.data<float>()[i], f.data<float>()[i] * c->size()) << dtype_name(dt);
  }
}

// Local argument checks: each throws on its own rank before any communication.
TEST(Comm, BadArgumentsThrow) {
  auto c = world_comm();
  int n = c->size();
  Tensor a(DType::F32, {4, 3});
  Tensor wrong_rows(DType::F32, {4 * n + 1, 3});
  Tensor wrong_cols(DType::F32, {4 * n, 2});
  Tensor wrong_dtype(DType::F64, {4 * n, 3});
  EXPECT_THROW(c->all_gather(a, wrong_rows), Error);
  EXPECT_THROW(c->all_gather(a, wrong_cols), Error);
  EXPECT_THROW(c->all_gather(a, wrong_dtype), Error);
  EXPECT_THROW(c->all_gather(Tensor::scalar_f32(1.f), a), Error);  // no dim 0
  EXPECT_THROW(c->reduce_scatter_sum(wrong_rows, a), Error);
  Tensor u8(DType::U8, {4});
  EXPECT_THROW(c->all_reduce_sum(u8), Error);
  Tensor u8_out(DType::U8, {4 * n});
  EXPECT_THROW(c->reduce_scatter_sum(u8_out, u8), Error);
  EXPECT_THROW(c->broadcast(a, n), Error);
  EXPECT_THROW(c->broadcast(a, -1), Error);
  EXPECT_THROW(c->send(a, c->rank()), Error);
  EXPECT_THROW(c->recv(a, n), Error);
  Tensor undefined;
  EXPECT_THROW(c->all_reduce_sum(undefined), Error);
  // out overlapping in: a gather into its own input.
  Tensor big(DType::F32, {4 * n, 3});
  Tensor view = big.reshaped({4 * n, 3});
  view.shape = {4, 3};
  EXPECT_THROW(c->all_gather(view, big), Error);
  try {
    c->all_gather(a, wrong_rows);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
}

// Without a launcher the world is one process and MPI is never started.
TEST(Comm, WorldOfOneWithoutLauncher) {
  if (MpiRuntime::launched()) GTEST_SKIP() << "started by an MPI launcher";
  auto c = world_comm();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_FALSE(MpiRuntime::active());
  EXPECT_NE(dynamic_cast<LocalComm*>(c.get()), nullptr);
}

TEST(Comm, SplitEvenOdd) {
  auto c = world_comm();
  int color = c->rank() % 2;
  auto sub = c->split(color, c->rank());
  int members = (c->size() + 1 - color) / 2;
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->rank(), c->rank() / 2);
  Tensor t = Tensor::from_i64({c->rank()});
  sub->all_reduce_sum(t);
  int64_t want = 0;
  for (int r = color; r < c->size(); r += 2) want += r;
  EXPECT_EQ(t.data<int64_t>()[0], want);
  check_all_collectives(*sub, 300);
}

// Every tp that divides the world: ranks, group sizes and sums over each group.
TEST(Mesh, AllDivisors) {
  int world = world_comm()->size();
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp) continue;
    SCOPED_TRACE(testing::Message() << "tp=" << tp);
    Mesh m = make_mesh(tp);
    EXPECT_EQ(m.world, world);
    EXPECT_EQ(m.tp, tp);
    EXPECT_EQ(m.dp, world / tp);
    EXPECT_EQ(m.rank, m.world_comm->rank());
    EXPECT_EQ(m.tp_rank, m.rank % tp);
    EXPECT_EQ(m.dp_rank, m.rank / tp);
    EXPECT_EQ(m.tp_comm->size(), tp);
    EXPECT_EQ(m.tp_comm->rank(), m.tp_rank);
    EXPECT_EQ(m.dp_comm->size(), m.dp);
    EXPECT_EQ(m.dp_comm->rank(), m.dp_rank);

    Tensor t = Tensor::from_i64({m.rank});
    m.tp_comm->all_reduce_sum(t);
    int64_t want = 0;
    for (int j = 0; j < tp; ++j) want += m.dp_rank * tp + j;
    EXPECT_EQ(t.data<int64_t>()[0], want);

    Tensor d = Tensor::from_i64({m.rank});
    m.dp_comm->all_reduce_sum(d);
    want = 0;
    for (int i = 0; i < m.dp; ++i) want += i * tp + m.tp_rank;
    EXPECT_EQ(d.data<int64_t>()[0], want);

    // The tp group is the tp adjacent ranks, in order.
    Tensor g(DType::I64, {tp});
    m.tp_comm->all_gather(Tensor::from_i64({m.rank}), g);
    for (int j = 0; j < tp; ++j) EXPECT_EQ(g.data<int64_t>()[j], m.dp_rank * tp + j);
  }
}

TEST(Mesh, Tp2InWorldOf4) {
  if (world_comm()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  Mesh m = make_mesh(2);
  EXPECT_EQ(m.tp_comm->size(), 2);
  EXPECT_EQ(m.dp_comm->size(), 2);
  EXPECT_EQ(m.tp_rank, m.rank % 2);
  // tp groups {0,1} {2,3}; dp groups {0,2} {1,3}.
  Tensor t = Tensor::from_i64({int64_t(1) << (4 * m.rank)});
  m.tp_comm->all_reduce_sum(t);
  EXPECT_EQ(t.data<int64_t>()[0], m.dp_rank == 0 ? 0x11 : 0x1100);
  Tensor d = Tensor::from_i64({int64_t(1) << (4 * m.rank)});
  m.dp_comm->all_reduce_sum(d);
  EXPECT_EQ(d.data<int64_t>()[0], m.tp_rank == 0 ? 0x101 : 0x1010);
  check_all_collectives(*m.tp_comm, 400);
  check_all_collectives(*m.dp_comm, 500);
}

// The same error on every rank, before any communication (so no rank is left waiting).
TEST(Mesh, IndivisibleThrowsEverywhere) {
  int world = world_comm()->size();
  auto expect_error = [](int tp, const std::string& msg) {
    try {
      make_mesh(tp);
      ADD_FAILURE() << "make_mesh(" << tp << ") did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), msg);
    }
  };
  expect_error(world + 1, str("world size ", world, " is not divisible by --tp ", world + 1));
  expect_error(0, "--tp must be at least 1 (got 0)");
  if (world == 4) expect_error(3, "world size 4 is not divisible by --tp 3");
  // Still in step afterwards.
  Tensor t = Tensor::from_i64({1});
  world_comm()->all_reduce_sum(t);
  EXPECT_EQ(t.data<int64_t>()[0], world);
}

TEST(Mesh, WorldOfOne) {
  Mesh m = make_mesh(std::make_unique<LocalComm>(), 1);
  EXPECT_EQ(m.world, 1);
  EXPECT_EQ(m.dp, 1);
  EXPECT_EQ(m.tp, 1);
  EXPECT_EQ(m.tp_comm->size(), 1);
  EXPECT_EQ(m.dp_comm->size(), 1);
  check_all_collectives(*m.world_comm, 600);
  check_all_collectives(*m.tp_comm, 601);
  try {
    make_mesh(std::make_unique<LocalComm>(), 2);
    ADD_FAILURE() << "make_mesh(LocalComm, 2) did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "world size 1 is not divisible by --tp 2");
  }
}

}  // namespace
}  // namespace wxe::test

int main(int argc, char** argv) { return wxe::test::run_mpi_gtest(argc, argv); }
