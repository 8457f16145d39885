// SpectralNormTP (parallel/collective_spectral_norm.cpp) on tp ranks in one process
// (tests/rank_group.h) against the unsharded SpectralNorm op: each rank's block of W and of
// dL/dweight_orig equals the block of the unsharded results, and every rank's u and v (updated
// in place) equal the unsharded op's. Row blocks (column-parallel), grouped row blocks (a fused
// to_qkv sharded by heads), column blocks (row-parallel), and dim 1 (ConvTranspose).
#include "parallel/collective_ops.h"
#include "parallel/sharded_checkpoint.h"
#include "tests/rank_group.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

struct Case {
  Shape shape;
  int dim;
  TensorSlice split;  // parts = tp; index set per rank
};

void check_case(const Case& c, int iters) {
  register_cpu_kernels();
  register_collective_ops();
  const int tp = c.split.parts;
  Tensor w = randn(c.shape, 11);
  const int64_t rows = c.shape[c.dim], cols = w.numel() / rows;
  const Tensor u0 = randn({rows}, 12), v0 = randn({cols}, 13), g = randn(c.shape, 14);
  // the oracle: the unsharded op
  Node sn = make_node("SpectralNorm", 3, 1, {{"dim", attr_i(c.dim)}, {"power_iterations", attr_i(iters)}});
  Tensor u = u0.clone(), v = v0.clone();
  Tensor y = run_node(sn, {&w, &u, &v})[0];
  Tensor gw(DType::F32, c.shape), gu(DType::F32, u.shape), gv(DType::F32, v.shape);
  backward_kernel("SpectralNorm")(sn, {&w, &u, &v}, {&y}, {&g}, {&gw, &gu, &gv});

  std::vector<Tensor> ys(tp), gws(tp), us(tp), vs(tp);
  std::vector<int> calls(tp);
  std::vector<std::string> errors = RankGroup::run(tp, [&](int r, RankComm& comm) {
    TensorSlice s = c.split;
    s.index = r;
    Node n = make_node("SpectralNormTP", 3, 1,
                       {{"dim", attr_i(c.dim)}, {"power_iterations", attr_i(iters)}, {"axis", attr_i(s.axis)},
                        {"parts", attr_i(s.parts)}, {"index", attr_i(r)}, {"groups", attr_i(s.groups)}});
    Tensor wb = take_block(w, s), gb = take_block(g, s);
    us[r] = u0.clone();
    vs[r] = v0.clone();
    ys[r] = run_node(n, {&wb, &us[r], &vs[r]})[0];
    gws[r] = Tensor(DType::F32, wb.shape);
    Tensor gur(DType::F32, u.shape), gvr(DType::F32, v.shape);
    backward_kernel("SpectralNormTP")(n, {&wb, &us[r], &vs[r]}, {&ys[r]}, {&gb}, {&gws[r], &gur, &gvr});
    calls[r] = comm.calls;
  });
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(errors[r], "");
    TensorSlice s = c.split;
    s.index = r;
    expect_close(ys[r], take_block(y, s), 1e-6, 1e-5);
    expect_close(gws[r], take_block(gw, s), 1e-6, 1e-5);
    expect_close(us[r], u, 1e-6, 1e-5);
    expect_close(vs[r], v, 1e-6, 1e-5);
    // each iteration's two products (sigma reuses the last W_mat v; without an iteration, its
    // own); backward: sigma, sum(g*W)
    EXPECT_EQ(calls[r], std::max<int64_t>(1, 2 * iters) + 2);
  }
}

TEST(SpectralNormTP, RowBlocksMatchUnsharded) { check_case({{8, 6, 1, 1}, 0, {0, 2, 0, 1}}, 2); }
TEST(SpectralNormTP, GroupedRowBlocksMatchUnsharded) { check_case({{12, 5, 1, 1}, 0, {0, 2, 0, 3}}, 2); }
TEST(SpectralNormTP, ThreeRanksGrouped) { check_case({{18, 4, 1, 1}, 0, {0, 3, 0, 3}}, 1); }
TEST(SpectralNormTP, ColumnBlocksMatchUnsharded) { check_case({{6, 8, 1, 1}, 0, {1, 2, 0, 1}}, 2); }
TEST(SpectralNormTP, Dim1ColumnBlocks) { check_case({{4, 6, 3}, 1, {0, 2, 0, 1}}, 1); }
TEST(SpectralNormTP, EvalModeNoIterations) { check_case({{12, 5, 1, 1}, 0, {0, 2, 0, 3}}, 0); }

// The grouped block of a tensor, by hand: 6 rows in 3 groups of 2, block 1 of 2 is rows 1, 3, 5.
TEST(SpectralNormTP, GroupedTakeBlockByHand) {
  Tensor t(DType::F32, {6, 2});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = (float)i;
  Tensor b = take_block(t, {0, 2, 1, 3});
  ASSERT_EQ(b.shape, (Shape{3, 2}));
  const float want[] = {2, 3, 6, 7, 10, 11};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.data<float>()[i], want[i]) << i;
  EXPECT_EQ(block_shape({6, 2}, {0, 2, 1, 3}), (Shape{3, 2}));
}

}  // namespace
