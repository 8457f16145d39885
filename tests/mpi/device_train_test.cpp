// Data-parallel fine-tuning with the trainer's device state (parameters, gradients, AdamW
// moments, EMA in the device's memory; the dp reduce-scatter and all-gather on the device's
// buffers) on a host-memory backend, under 1 or 2 MPI ranks: 2 steps, a sharded save, a resume
// in a new trainer and 1 more step give the CPU trainer's losses, parameters and checkpoint
// bit for bit. With NCCL on GPUs the same code passes device pointers to the communicator.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/io/npy.h"
#include "engine/io/safetensors.h"
#include "models/credit_modules.h"
#include "parallel/collective_ops.h"
#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"
#include "tests/host_backend.h"
#include "tests/mpi/collective_checks.h"
#include "tests/mpi/mpi_main.h"
#include "tests/test_util.h"
#include "train/finetune.h"

namespace wxe::test {
namespace {

namespace fs = std::filesystem;

void ensure_host_backend() {
  static bool once = [] {
    register_cpu_kernels();
    register_collective_ops();
    register_credit_modules();
    auto b = std::make_unique<HostMemoryBackend>("hostdp");
    for (const char* op : {"Add", "Mul", "Conv", "Softmax", "Einsum"}) {
      b->register_kernel(op, kernel_for(op, KernelKind::Fast));
      b->register_backward(op, backward_kernel(op));
    }
    register_backend(std::move(b));
    return true;
  }();
  (void)once;
}

// n random samples of the tiny CrossFormer's shapes in dir (written by rank 0, seeds from seed), and
// a fine-tuning config of the model on them
FinetuneConfig tiny_run(const Mesh& mesh, const std::string& dir, int n, unsigned seed) {
  if (mesh.rank == 0) {
    fs::create_directories(dir);
    for (int i = 0; i < n; ++i) {
      const std::string k = "000" + std::to_string(i);
      write_npy(dir + "/x_" + k + ".npy", randn({1, 7, 1, 32, 64}, seed + 2 * i));
      write_npy(dir + "/y_" + k + ".npy", randn({1, 6, 1, 32, 64}, seed + 1 + 2 * i, 0.5f));
    }
  }
  mesh.world_comm->barrier();
  FinetuneConfig c;
  c.model = data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx");
  c.data = dir;
  return c;
}

TEST(DeviceTrain, DataParallelDeviceStateMatchesCpu) {
  ensure_host_backend();
  Mesh mesh = make_mesh(1);  // dp = world size
  SharedDir data(*mesh.world_comm, "devtrain_data"), cpu_dir(*mesh.world_comm, "devtrain_cpu"),
      dev_dir(*mesh.world_comm, "devtrain_dev");
  FinetuneConfig c = tiny_run(mesh, data.path, 4, 50);
  c.save = cpu_dir.path;
  c.accum = 2;  // one micro-batch per dp rank with 2 ranks
  c.schedule.lr = 3e-3;
  c.grad_max_norm = 0.05;
  c.ema = true;
  c.ema_decay = 0.9;
  c.progress = false;
  std::vector<double> ref;
  NamedTensors ref_params;
  std::string ref_ck;
  {
    Trainer cpu(c, open_npy_dir(data.path, 1), &mesh);
    for (int i = 0; i < 3; ++i) ref.push_back(cpu.step().loss);
    ref_params = cpu.parameters();
    ref_ck = cpu.save_checkpoint();
  }
  c.device = "hostdp";
  c.save = dev_dir.path;
  std::vector<double> got;
  {
    Trainer dev(c, open_npy_dir(data.path, 1), &mesh);
    for (int i = 0; i < 2; ++i) got.push_back(dev.step().loss);
    dev.save_checkpoint();
  }
  c.resume = true;
  Trainer resumed(c, open_npy_dir(data.path, 1), &mesh);
  got.push_back(resumed.step().loss);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], ref[i]) << "step " << i + 1;
  // EXPECT only from here: every rank must reach the collective save
  NamedTensors params = resumed.parameters();
  EXPECT_EQ(params.size(), ref_params.size());
  for (size_t i = 0; i < params.size() && i < ref_params.size(); ++i)
    EXPECT_EQ(max_abs_diff(params[i].second, ref_params[i].second), 0.0) << params[i].first;
  const std::string ck = resumed.save_checkpoint();
  TrainCheckpoint a = open_train_checkpoint(ck), b = open_train_checkpoint(ref_ck);
  EXPECT_EQ(a.names, b.names);
  for (const std::string& n : b.names)  // moments and EMA included
    if (a.has(n)) {
      EXPECT_EQ(max_abs_diff(a.get(n, TensorSlice{}), b.get(n, TensorSlice{})), 0.0) << n;
    }
}

// --domain with a device (every rank a domain rank): the bands in the device's memory (a fake
// device of host memory, tests/host_backend.h), the band collectives staged through host copies,
// ZeRO's blocks over the domain group through the host. 3 steps give the CPU trainer's losses and
// parameters at the same --domain, bit for bit (both unfused: the fake device runs the CPU kernels).
TEST(DeviceTrain, DomainOnADeviceMatchesCpu) {
  ensure_host_backend();
  static bool once = [] {
    auto b = std::make_unique<FakeDevice>("fakedomain");
    b->register_cpu_kernels_but_collectives();
    register_backend(std::move(b));
    register_collective_device_kernels();
    return true;
  }();
  (void)once;
  std::unique_ptr<Communicator> world = world_comm();
  const int ranks = world->size();
  Mesh mesh = make_mesh(std::move(world), 1, ranks);  // domain = world size
  SharedDir data(*mesh.world_comm, "devdomain_data"), cpu_dir(*mesh.world_comm, "devdomain_cpu"),
      dev_dir(*mesh.world_comm, "devdomain_dev");
  FinetuneConfig c = tiny_run(mesh, data.path, 2, 70);
  c.save = cpu_dir.path;
  c.schedule.lr = 3e-3;
  c.grad_max_norm = 0.05;
  c.progress = false;
  c.fuse = false;
  std::vector<double> ref, got;
  NamedTensors ref_params, params;
  {
    Trainer cpu(c, open_npy_dir(data.path, 1), &mesh);
    for (int i = 0; i < 3; ++i) ref.push_back(cpu.step().loss);
    ref_params = cpu.parameters();
  }
  c.device = "fakedomain";
  c.save = dev_dir.path;
  auto* fake = dynamic_cast<FakeDevice*>(find_backend("fakedomain"));
  const int downloads0 = fake->downloads;
  {
    Trainer dev(c, open_npy_dir(data.path, 1), &mesh);
    for (int i = 0; i < 3; ++i) got.push_back(dev.step().loss);
    params = dev.parameters();
  }
  EXPECT_GT(fake->downloads, downloads0);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], ref[i]) << "step " << i + 1;
  ASSERT_EQ(params.size(), ref_params.size());
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(max_abs_diff(params[i].second, ref_params[i].second), 0.0) << params[i].first;
}

}  // namespace
}  // namespace wxe::test

int main(int argc, char** argv) { return wxe::test::run_mpi_gtest(argc, argv); }
