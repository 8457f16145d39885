// Sharded checkpoints saved collectively (save_sharded) by 1, 2 or 4 ranks, read back whole
// and as the blocks of other meshes on every rank; an error on one rank is thrown on all of
// them with that rank's message, and the previous checkpoint stays. Part of wxe_mpi_tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "parallel/mpi_comm.h"
#include "parallel/sharded_checkpoint.h"
#include "tests/mpi/collective_checks.h"

namespace wxe::test {
namespace {

namespace fs = std::filesystem;

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

struct Model {  // the same on every rank
  Tensor w = input(DType::F32, {8, 6}, 0, 1);
  Tensor bias = input(DType::F32, {5}, 0, 2);
  Tensor m = input(DType::F32, {50}, 0, 3);  // ZeRO flat: 13, 13, 13, 11 over 4 ranks
  Tensor steps = input(DType::I64, {3, 4}, 0, 4);

  // rank r of n: a tp-style block of w along 0, of steps along 1, a dp block of m, bias owned by rank 0
  std::vector<ShardPiece> pieces(int r, int n) const {
    return {{"w", w.shape, {0, n, r}, take_block(w, {0, n, r})},
            {"bias", bias.shape, {}, bias, r == 0},
            {"exp_avg.w", m.shape, {0, n, r}, take_block(m, {0, n, r})},
            {"steps", steps.shape, {1, n, r}, take_block(steps, {1, n, r})}};
  }
};

TEST(ShardedSave, EveryRankReadsWhatAllWrote) {
  auto c = world_comm();
  const int n = c->size(), r = c->rank();
  SharedDir d(*c, "sharded");
  Model mdl;
  save_sharded(d.path, mdl.pieces(r, n), *c, {{"step", "7"}});
  EXPECT_TRUE(is_sharded_checkpoint(d.path));
  ShardedCheckpoint ck(d.path);
  EXPECT_EQ(ck.world(), n);
  EXPECT_EQ(ck.metadata().at("step"), "7");
  EXPECT_TRUE(same(ck.read("w"), mdl.w));
  EXPECT_TRUE(same(ck.read("bias"), mdl.bias));
  EXPECT_TRUE(same(ck.read("exp_avg.w"), mdl.m));
  EXPECT_TRUE(same(ck.read("steps"), mdl.steps));
  for (int parts : {1, 2, 3, 4})  // other meshes
    for (int i = 0; i < parts; ++i) {
      EXPECT_TRUE(same(ck.read("w", {1, parts, i}), take_block(mdl.w, {1, parts, i})));
      EXPECT_TRUE(same(ck.read("exp_avg.w", {0, parts, i}), take_block(mdl.m, {0, parts, i})));
      EXPECT_TRUE(same(ck.read("steps", {0, parts, i}), take_block(mdl.steps, {0, parts, i})));
    }
}

TEST(ShardedSave, OneRankErrorIsThrownOnAll) {
  auto c = world_comm();
  const int n = c->size(), r = c->rank();
  SharedDir d(*c, "sharded_err");
  Model mdl;
  save_sharded(d.path, mdl.pieces(r, n), *c, {{"step", "1"}});
  // the last rank's block of w has the wrong shape: every rank throws that rank's message
  std::vector<ShardPiece> bad = mdl.pieces(r, n);
  if (r == n - 1) bad[0].data = input(DType::F32, {1, 5}, 0, 5);
  std::string e = message_of([&] { save_sharded(d.path, bad, *c, {{"step", "2"}}); });
  EXPECT_NE(e.find(str("rank ", n - 1, ": tensor 'w': data is (1, 5)")), std::string::npos) << e;
  if (n > 1) {  // rank 0's check: bias owned by two ranks
    bad = mdl.pieces(r, n);
    bad[1].owner = r <= 1;
    e = message_of([&] { save_sharded(d.path, bad, *c, {{"step", "3"}}); });
    EXPECT_NE(e.find("tensor 'bias': whole is owned by ranks 0 and 1"), std::string::npos) << e;
  }
  c->barrier();
  EXPECT_FALSE(fs::exists(d.path + ".tmp"));
  ShardedCheckpoint ck(d.path);  // still the first save
  EXPECT_EQ(ck.metadata().at("step"), "1");
  EXPECT_TRUE(same(ck.read("w"), mdl.w));
}

}  // namespace
}  // namespace wxe::test
