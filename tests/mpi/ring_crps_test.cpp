// ring-crps (train/ensemble_loss.h ring_crps) on K MPI ranks, one ensemble member each, against
// CREDIT's RingCRPSLoss run on K torch.distributed ranks over the same members (tests/data/crps,
// models/make_crps_fixture.py; K = 2 and 3): each rank's value and d value / d member, and with
// latitude and channel weights the weighted mean of CREDIT's elementwise contribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/io/json.h"
#include "engine/io/npy.h"
#include "tests/mpi/mpi_main.h"
#include "tests/test_util.h"
#include "train/ensemble_loss.h"

namespace wxe::test {
namespace {

const std::string kCrps = data_path("tests/data/crps/");

Tensor row(const Tensor& t, int64_t r) {
  Shape s = t.shape;
  s[0] = 1;
  Tensor out(DType::F32, s);
  std::memcpy(out.raw(), t.data<float>() + r * out.numel(), out.nbytes());
  return out;
}

TEST(RingCrps, MatchesCredit) {
  std::unique_ptr<Communicator> world = world_comm();
  const int K = world->size(), r = world->rank();
  if (K != 2 && K != 3) GTEST_SKIP() << "CREDIT's references are for 2 and 3 ranks";
  const Json ref = parse_json(slurp(kCrps + "crps.json"), "crps.json");
  const Json* run = nullptr;
  for (const Json& j : ref.get("ring")->items)
    if (j.get("K")->s == std::to_string(K)) run = &j;
  ASSERT_NE(run, nullptr);
  const Tensor members = read_npy(kCrps + run->get("pred")->s), target = read_npy(kCrps + "ring_target.npy");
  const Tensor pred = row(members, r);
  Tensor g;
  const double got = ring_crps(pred, target, {}, world.get(), &g);
  const double want = parse_double(run->get("values")->items[r].s, "json");
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want) + 1e-7);
  const std::string tag = "_K" + std::to_string(K) + "_r" + std::to_string(r) + ".npy";
  EXPECT_LE(rel_l2(g, read_npy(kCrps + "ring_grad" + tag)), 1e-5);
  // weighted (BaseLoss's per-variable weights and latitude weights): the weighted mean of
  // CREDIT's elementwise contribution; its gradient the weights times the unweighted one
  LossWeights w;
  std::vector<double> lat;
  for (const Json& v : ref.get("lat")->items) lat.push_back(parse_double(v.s, "json"));
  w.lat_weights = latitude_weights(lat);
  w.channel_weights = {1.0, 2.0, 0.5, 0.25, 3.0};
  const Tensor elem = read_npy(kCrps + "ring_elem" + tag);
  const int64_t C = elem.dim(1), H = elem.dim(-2), W = elem.dim(-1);
  double sum = 0;
  for (int64_t e = 0; e < elem.numel(); ++e)
    sum += (double)elem.data<float>()[e] * w.lat_weights[(e / W) % H] * w.channel_weights[(e / (H * W)) % C];
  Tensor gw;
  const double wgot = ring_crps(pred, target, w, world.get(), &gw);
  EXPECT_NEAR(wgot, sum / (double)elem.numel(), 1e-5 * std::fabs(sum / (double)elem.numel()) + 1e-7);
  for (int64_t e = 0; e < g.numel(); ++e) {
    const double want_g = g.data<float>()[e] * w.lat_weights[(e / W) % H] * w.channel_weights[(e / (H * W)) % C];
    EXPECT_NEAR(gw.data<float>()[e], want_g, 1e-6 * std::fabs(want_g) + 1e-12);  // float32 rounding
  }
}

}  // namespace
}  // namespace wxe::test

int main(int argc, char** argv) { return wxe::test::run_mpi_gtest(argc, argv); }
