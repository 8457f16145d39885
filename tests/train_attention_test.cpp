// The fused window attention of the training graph (engine/passes/fuse.h
// fuse_window_attention_training; backward kernels/cpu/backward_attention.cpp): gradient cases
// for the op against finite differences, and whole CREDIT graphs, fused against as exported.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "engine/exec/autograd.h"
#include "engine/io/npy.h"
#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "tests/grad_check.h"
#include "tests/test_util.h"

namespace wxe::test {

namespace {

GradCase attention_case(const std::string& label, std::vector<Tensor> in, int64_t heads, Shape window, bool strided,
                        float scale) {
  GradCase c = grad_case(label, "WindowAttention", std::move(in),
                         {{"heads", attr_i(heads)},
                          {"scale", attr_f(scale)},
                          {"window", attr_ints(window)},
                          {"strided", attr_i(strided ? 1 : 0)}});
  c.max_probes = 24;
  return c;
}

}  // namespace

// x (B, D, H, W), weights (I, D) or fused (3I, D[, 1, 1]), Wo (D, I), bo, bias, residual.
GRAD_CASES("WindowAttention") {
  const int64_t D = 6, I = 4;
  return {
      // three projections, a bias per head, bo and the residual; 2 x 2 windows of a 4 x 6 image
      attention_case("WindowAttention q/k/v, bias per head, bo, residual",
                     {randn({2, D, 4, 6}, 1), randn({I, D}, 2, 0.5f), randn({I, D}, 3, 0.5f), randn({I, D}, 4, 0.5f),
                      randn({D, I}, 5, 0.5f), randn({D}, 6), randn({2, 4, 4}, 7), randn({2, D, 4, 6}, 8)},
                     2, {2, 2}, false, 0.7f),
      // the training graph's form: a fused (3I, D, 1, 1) to_qkv, a (T, T) bias every head adds,
      // no bo; strided windows of 2 x 3 tokens
      attention_case("WindowAttention fused qkv, shared bias, strided",
                     {randn({1, D, 4, 6}, 11), randn({3 * I, D, 1, 1}, 12, 0.5f), Tensor(), Tensor(),
                      randn({D, I, 1, 1}, 15, 0.5f), Tensor(), randn({6, 6}, 17), Tensor()},
                     2, {2, 3}, true, 0.5f),
      // one head, windows of 8 tokens, fused qkv with bo
      attention_case("WindowAttention fused qkv, one head, 8-token windows",
                     {randn({1, D, 4, 4}, 21), randn({3 * I, D}, 22, 0.5f), Tensor(), Tensor(), randn({D, I}, 25, 0.5f),
                      randn({D}, 26), randn({1, 1, 8, 8}, 27), Tensor()},
                     1, {2, 4}, false, 0.5f),
  };
}

namespace {

// A fixture's training graph (spectral norm as an op), each constant its own copy (the power
// iteration updates u and v in place).
Graph training_graph_of(const std::string& onnx, const std::string& checkpoint, const Tensor& x) {
  register_cpu_kernels();
  Graph g = import_onnx(data_path(onnx));
  LoadOptions lo;
  lo.weights = checkpoint.empty() ? "" : data_path(checkpoint);
  lo.training = true;
  prepare_model(g, {{g.values[g.inputs[0]].name, {x.dtype, x.shape}}}, lo);
  for (Value& v : g.values)
    if (v.constant) v.constant = std::make_shared<Tensor>(v.constant->clone());
  return g;
}

int count_op(const Graph& g, const std::string& op) {
  const std::map<std::string, int> c = op_counts(g);
  return c.count(op) ? c.at(op) : 0;
}

struct GradRun {
  Tensor y;
  std::vector<Tensor> grads;
  std::vector<std::string> names;
};

GradRun run(const Graph& g, const Tensor& x, const Tensor& gy) {
  GradExecutor ex(g, trainable_parameters(g), {1, KernelKind::Fast});
  GradRun r;
  r.y = ex.forward({{g.values[g.inputs[0]].name, x}})[0];
  ex.backward({gy});
  for (size_t p = 0; p < ex.trainable().size(); ++p) {
    r.grads.push_back(ex.grads()[p].clone());
    r.names.push_back(g.values[ex.trainable()[p]].name);
  }
  return r;
}

struct Fixture {
  const char* onnx;
  const char* checkpoint;
  const char* x;
};

// Every CREDIT fixture's attention blocks fuse (short and long range; CrossFormer and WXFormer;
// spectral norm kept as an op or baked; TorchScript and dynamo exports), and the fused graph's
// output and parameter gradients equal the exported graph's: relative L2 1e-5 per parameter,
// with a floor at the tensor's share of the global gradient norm (a bias a softmax or a norm
// cancels has a zero gradient, rounding noise in both).
TEST(TrainAttention, FusedGraphsGiveTheExportedGradients) {
  for (const Fixture& f : {Fixture{"tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_checkpoint.pt",
                                   "tests/data/crossformer_tiny_x.npy"},
                           Fixture{"tests/data/crossformer_tiny_snbaked_opset17.onnx", "", "tests/data/crossformer_tiny_x.npy"},
                           Fixture{"models/wxformer_tiny/model.onnx", "", "models/wxformer_tiny/x.npy"},
                           Fixture{"tests/data/torch2_crossformer_tiny_dynamo.onnx", "", "tests/data/torch2_crossformer_tiny_x.npy"},
                           Fixture{"tests/data/torch2_wxformer_tiny_dynamo.onnx", "", "tests/data/torch2_wxformer_tiny_x.npy"}}) {
    SCOPED_TRACE(f.onnx);
    const Tensor x = read_npy(data_path(f.x));
    const Graph plain = training_graph_of(f.onnx, f.checkpoint, x);
    Graph fused = training_graph_of(f.onnx, f.checkpoint, x);
    fuse_for_training(fused);
    const int attention = count_op(plain, "Softmax");
    EXPECT_GT(attention, 0);
    EXPECT_EQ(count_op(fused, "WindowAttention"), attention);
    EXPECT_EQ(count_op(fused, "Softmax"), 0) << "an attention block left unfused";
    EXPECT_EQ(count_op(fused, "Einsum"), 0);
    const Tensor gy = randn(plain.values[plain.outputs[0]].shape, 5);
    const GradRun a = run(plain, x, gy), b = run(fused, x, gy);
    EXPECT_LE(rel_l2(b.y, a.y), 1e-6);
    ASSERT_EQ(a.names, b.names);
    double total2 = 0;
    int64_t total_n = 0;
    for (const Tensor& t : a.grads) {
      for (int64_t i = 0; i < t.numel(); ++i) total2 += (double)t.data<float>()[i] * t.data<float>()[i];
      total_n += t.numel();
    }
    const double rms = std::sqrt(total2 / total_n);
    double worst = 0;
    for (size_t p = 0; p < a.grads.size(); ++p) {
      const Tensor &u = b.grads[p], &w = a.grads[p];
      ASSERT_EQ(u.shape, w.shape) << a.names[p];
      double d2 = 0, r2 = 0;
      for (int64_t i = 0; i < w.numel(); ++i) {
        const double s = u.data<float>()[i], t = w.data<float>()[i];
        d2 += (s - t) * (s - t);
        r2 += t * t;
      }
      const double e = std::sqrt(d2) / std::max(std::sqrt(r2), rms * std::sqrt((double)w.numel()));
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << a.names[p];
    }
    std::printf("%s: %d attention blocks fused, %zu gradients, worst relative L2 %.2e\n", f.onnx, attention,
                a.grads.size(), worst);
  }
}

// A block whose intermediates something else reads stays as exported; the others still fuse.
TEST(TrainAttention, ABlockWithAnOutsideReaderStays) {
  const Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  Graph g = training_graph_of("tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_checkpoint.pt", x);
  const int attention = count_op(g, "Softmax");
  for (const Node& n : g.nodes)
    if (n.op == "Softmax") {
      g.outputs.push_back(n.outputs[0]);  // the first block's attention weights as an output
      break;
    }
  fuse_for_training(g);
  EXPECT_EQ(count_op(g, "Softmax"), 1);
  EXPECT_EQ(count_op(g, "WindowAttention"), attention - 1);
}

// The fused blocks stay activation-checkpointing segments: as many blocks as before the fusion.
TEST(TrainAttention, FusedBlocksAreCheckpointSegments) {
  const Tensor x = read_npy(data_path("models/wxformer_tiny/x.npy"));
  Graph g = training_graph_of("models/wxformer_tiny/model.onnx", "", x);
  auto blocks = [](const Graph& h) {
    int n = 0;
    for (int s : checkpoint_segments(h)) n = std::max(n, s + 1);
    return n;
  };
  const int before = blocks(g);
  fuse_for_training(g);
  EXPECT_EQ(blocks(g), before);
  const std::vector<int> seg = checkpoint_segments(g);
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (g.nodes[k].op == "WindowAttention") {
      EXPECT_GE(seg[k], 0) << g.nodes[k].name;
    }
}

}  // namespace
}  // namespace wxe::test
