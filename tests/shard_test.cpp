// Tensor-parallel sharding on one process: every shard equals the matching slice of the
// unsharded weight, and tp ranks run as threads (an in-process communicator) reproduce the
// unsharded model and the PyTorch output.
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "parallel/collective_ops.h"
#include "parallel/shard.h"
#include "tests/test_util.h"

using namespace wxe;
using namespace wxe::test;

namespace {

// Ranks as threads: all_reduce_sum through a shared buffer between two barriers.
struct Barrier {
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }
  int n_, count_ = 0, gen_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), sync(n) {}
  int size;
  Barrier sync;
  std::mutex mu;
  std::vector<double> acc;
};

class ThreadComm : public Communicator {
 public:
  ThreadComm(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  void all_reduce_sum(Tensor& t) override {
    WXE_CHECK(t.dtype == DType::F32, "ThreadComm: float32 only");
    if (rank_ == 0) g_.acc.assign(t.numel(), 0.0);
    g_.sync.arrive_and_wait();
    {
      std::lock_guard<std::mutex> lock(g_.mu);
      for (int64_t i = 0; i < t.numel(); ++i) g_.acc[i] += t.data<float>()[i];
    }
    g_.sync.arrive_and_wait();
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = (float)g_.acc[i];
    g_.sync.arrive_and_wait();
  }
  void all_gather(const Tensor&, Tensor&) override { fail("unused"); }
  void reduce_scatter_sum(const Tensor&, Tensor&) override { fail("unused"); }
  void broadcast(Tensor&, int) override { fail("unused"); }
  void barrier() override { g_.sync.arrive_and_wait(); }
  [[noreturn]] void abort(const std::string& m, int) override { fail(m); }

 private:
  ThreadGroup& g_;
  int rank_;
};

Graph simplified(const std::string& model, const Tensor& x) {
  Graph g = import_onnx(data_path(model));
  simplify(g, {{"x", {x.dtype, x.shape}}});
  return g;
}

const Value* param(const Graph& g, const std::string& name) {
  for (auto& v : g.values)
    if (v.name == name && v.is_const()) return &v;
  return nullptr;
}

// Runs the model at tp ranks as threads; returns rank 0's output. Reference kernels: the
// oneDNN fast path keeps one stream per process (MPI ranks are processes).
Tensor run_tp(const std::string& model, const Tensor& x, int tp) {
  register_collective_ops();
  Graph full = simplified(model, x);
  TpPlan plan = discover_plan(full);
  ThreadGroup group(tp);
  std::vector<Tensor> outs(tp);
  std::vector<std::string> errors(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        ThreadComm comm(group, r);
        set_tp_communicator(&comm);
        Graph g = full;
        shard_graph(g, plan, tp, r);
        outs[r] = Executor(g, {1, KernelKind::Reference}).run({{"x", x}})[0];
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (int r = 1; r < tp; ++r) EXPECT_EQ(max_abs_diff(outs[r], outs[0]), 0) << "ranks disagree";
  return outs[0];
}

}  // namespace

TEST(Shard, PlanFindsAttentionAndFeedForward) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  Graph g = simplified("tests/data/crossformer_tiny_snbaked_opset17.onnx", x);
  TpPlan plan = discover_plan(g);
  int col = 0, row = 0;
  for (auto& [w, s] : plan.by_weight) (s == TpSplit::Column ? col : row) += 1;
  EXPECT_EQ(col, 40);  // 10 blocks x (q, k, v) + 10 feed-forward up
  EXPECT_EQ(row, 20);  // 10 x to_out + 10 x feed-forward down
  EXPECT_EQ(plan.by_weight["layers.0.1.layers.0.0.to_k.weight"], TpSplit::Column);
  EXPECT_EQ(plan.by_weight["layers.0.1.layers.0.1.layers.4.weight"], TpSplit::Row);
}

TEST(Shard, EveryShardIsTheMatchingSliceOfTheFullWeight) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  register_collective_ops();
  Graph full = simplified("tests/data/crossformer_tiny_snbaked_opset17.onnx", x);
  TpPlan plan = discover_plan(full);
  for (int tp : {2}) {
    for (int r = 0; r < tp; ++r) {
      Graph g = full;
      ShardStats st = shard_graph(g, plan, tp, r);
      EXPECT_EQ(st.all_reduces, 20);
      EXPECT_LT(st.param_bytes_rank, st.param_bytes_full);
      for (auto& [name, split] : plan.by_weight) {
        const Value* f = param(full, name);
        const Value* s = param(g, name);
        ASSERT_TRUE(f && s) << name;
        const Tensor &F = *f->constant, &S = *s->constant;
        int64_t n = F.shape[0], k = F.shape[1];
        if (split == TpSplit::Column) {  // rows r*n/tp ..: whole heads of dim_head rows each
          ASSERT_EQ(S.shape, (Shape{n / tp, k})) << name;
          for (int64_t i = 0; i < n / tp; ++i)
            for (int64_t j = 0; j < k; ++j)
              ASSERT_EQ(S.data<float>()[i * k + j], F.data<float>()[(r * n / tp + i) * k + j]) << name;
        } else {
          ASSERT_EQ(S.shape, (Shape{n, k / tp})) << name;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < k / tp; ++j)
              ASSERT_EQ(S.data<float>()[i * (k / tp) + j], F.data<float>()[i * k + r * k / tp + j]) << name;
        }
      }
    }
  }
}

// crossformer_tp: the tiny CrossFormer with 4, 8, 16, 32 heads (models/make_tp_fixture.py)
TEST(Shard, TensorParallelMatchesUnshardedAndPyTorch) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tp_x.npy"));
  Tensor ref = read_npy(data_path("tests/data/crossformer_tp_y.npy"));
  const std::string model = "tests/data/crossformer_tp_snbaked.onnx";
  Tensor one = run_tp(model, x, 1);
  for (int tp : {2, 4}) {
    SCOPED_TRACE(tp);
    Tensor y = run_tp(model, x, tp);
    EXPECT_LE(max_abs_diff(y, one), 1e-5);
    EXPECT_LE(max_abs_diff(y, ref), 1e-4);
    EXPECT_LE(rel_l2(y, ref), 1e-5);
  }
}

TEST(Shard, WxformerTensorParallel) {
  Tensor x = read_npy(data_path("models/wxformer_tiny/x.npy"));
  Tensor ref = read_npy(data_path("models/wxformer_tiny/y.npy"));
  Tensor y = run_tp("models/wxformer_tiny/model.onnx", x, 2);
  EXPECT_LE(max_abs_diff(y, ref), 1e-4);
  EXPECT_LE(rel_l2(y, ref), 1e-5);
}

TEST(Shard, HeadsNotDivisibleNameTheBlock) {
  // stage 0 has 16 / 8 = 2 heads: tp 4 cannot give each rank whole heads
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  Graph g = simplified("tests/data/crossformer_tiny_snbaked_opset17.onnx", x);
  try {
    shard_graph(g, discover_plan(g), 4, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("block layers.0.1.layers.0.0"), std::string::npos) << m;
    EXPECT_NE(m.find("2 heads are not divisible by --tp 4"), std::string::npos) << m;
  }
}

TEST(Shard, PlanFileOverridesAndRejectsUnknownPatterns) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tp_x.npy"));
  Graph g = simplified("tests/data/crossformer_tp_snbaked.onnx", x);
  std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/plan.json") << R"({"*.layers.1.weight": "replicate", "*.layers.4.weight": "replicate"})";
  TpPlan plan = discover_plan(g);
  apply_plan_file(plan, g, dir + "/plan.json");
  EXPECT_EQ(plan.by_weight["layers.0.1.layers.0.1.layers.1.weight"], TpSplit::Replicate);
  Graph s = g;
  ShardStats st = shard_graph(s, plan, 2, 1);
  EXPECT_EQ(st.all_reduces, 10);  // attention only: feed-forward now replicated
  std::ofstream(dir + "/bad.json") << R"({"*.nothing.weight": "colwise"})";
  EXPECT_THROW(apply_plan_file(plan, g, dir + "/bad.json"), Error);
  std::ofstream(dir + "/bad2.json") << R"({"*.to_q.weight": "diagonal"})";
  EXPECT_THROW(apply_plan_file(plan, g, dir + "/bad2.json"), Error);
}

// A model that already has Linear q/k/v (CREDIT nextgen_wxformer; models/make_nextgen_fixture.py):
// the exporter's MatMul(x, W^T) become Linear layers named after their modules, the plan is
// the same, and tp 2 and 4 reproduce PyTorch.
TEST(Shard, NextgenLinearModel) {
  Tensor x = read_npy(data_path("tests/data/nextgen_block_x.npy"));
  Tensor ref = read_npy(data_path("tests/data/nextgen_block_y.npy"));
  Graph g = simplified("tests/data/nextgen_block.onnx", x);
  TpPlan plan = discover_plan(g);
  EXPECT_EQ(plan.by_weight["layers.0.0.to_v.weight"], TpSplit::Column);
  EXPECT_EQ(plan.by_weight["layers.0.2.to_out.weight"], TpSplit::Row);
  EXPECT_EQ(plan.by_weight["layers.0.3.layers.1.weight"], TpSplit::Column);
  EXPECT_EQ(plan.by_weight.size(), 12u);
  for (int tp : {2, 4}) {
    Tensor y = run_tp("tests/data/nextgen_block.onnx", x, tp);
    EXPECT_LE(max_abs_diff(y, ref), 1e-5) << "tp " << tp;
  }
}

// fit_plan's trials decide from shapes alone: on a graph whose float weights have no storage
// they replicate the blocks with fewer heads than tp (crossformer_tiny's stage 0: 2 heads at
// tp 4), and the fitted plan shards the real graph, in inference and training graphs.
TEST(Shard, FitPlanTrialsCopyNoWeight) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  register_collective_ops();
  for (bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "inference");
    Graph g = import_onnx(data_path("tests/data/crossformer_tiny_snbaked_opset17.onnx"));
    if (training)
      prepare_training_graph(g, {{"x", {x.dtype, x.shape}}});
    else
      simplify(g, {{"x", {x.dtype, x.shape}}});
    Graph shapes = g;
    int stripped = 0;
    for (Value& v : shapes.values)
      if (v.is_const() && v.dtype == DType::F32 && v.constant->numel() > 1) {
        v.constant = std::make_shared<Tensor>(v.constant->shape_only());
        ++stripped;
      }
    ASSERT_GT(stripped, 50);
    std::vector<std::string> replicated;
    TpPlan plan = fit_plan(shapes, discover_plan(g), 4, training, &replicated);
    EXPECT_EQ(replicated, (std::vector<std::string>{"layers.0.1.layers.0.0", "layers.0.1.layers.0.2"}));
    EXPECT_EQ(plan.by_weight["layers.0.1.layers.0.0.to_q.weight"], TpSplit::Replicate);
    EXPECT_EQ(plan.by_weight["layers.1.1.layers.0.0.to_q.weight"], TpSplit::Column);
    Graph s = g;
    ShardStats st = training ? shard_training_graph(s, plan, 4, 3) : shard_graph(s, plan, 4, 3);
    EXPECT_EQ(st.row, 20 - 2);  // stage 0's two attention blocks' to_out replicated (its feed-forwards shard)
  }
}
