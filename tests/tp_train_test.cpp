// Tensor-parallel training graphs (Megatron style) with the tp ranks inside this process
// (coroutines on one thread, tests/rank_group.h): the conjugate collectives (CopyToTP,
// AllReduceTP) forward and backward against a hand computation, and whole CrossFormer training
// graphs sharded at tp 2 and 4 against tp 1: same outputs, sharded parameters get the slice of
// the tp-1 gradient, replicated ones the whole tp-1 gradient on every rank.
#include <gtest/gtest.h>

#include "engine/exec/autograd.h"
#include "engine/passes/layout_rules.h"
#include "engine/io/npy.h"
#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "parallel/collective_ops.h"
#include "parallel/bands.h"
#include "parallel/shard.h"
#include "tests/rank_group.h"
#include "tests/test_util.h"

namespace wxe::test {
namespace {

// ---- the collectives on a tiny graph ----------------------------------------------------

// y = AllReduceTP(CopyToTP(x * w) * v): x a runtime input, w and v each rank's own parameters.
Graph collective_graph(const Tensor& w, const Tensor& v) {
  Graph g;
  auto runtime = [&](const std::string& name) {
    Value val;
    val.name = name;
    val.shape = w.shape;
    val.shape_known = true;
    return g.add_value(val);
  };
  int x = runtime("x"), a = runtime("a"), c = runtime("c"), d = runtime("d"), y = runtime("y");
  int wi = g.add_constant("w", w.clone(), true), vi = g.add_constant("v", v.clone(), true);
  g.inputs = {x};
  g.outputs = {y};
  auto node = [&](const std::string& op, std::vector<int> in, int out) {
    Node n;
    n.op = op;
    n.name = "/" + op;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.nodes.push_back(n);
  };
  node("Mul", {x, wi}, a);
  node("CopyToTP", {a}, c);
  node("Mul", {c, vi}, d);
  node("AllReduceTP", {d}, y);
  return g;
}

struct StepResult {
  Tensor y, gw, gv;
};

// One forward and backward of collective_graph with output gradient gy.
StepResult collective_step(const Tensor& x, const Tensor& w, const Tensor& v, const Tensor& gy) {
  Graph g = collective_graph(w, v);
  GradExecutor ex(g, trainable_parameters(g), {1, KernelKind::Reference});
  StepResult r;
  r.y = ex.forward({{"x", x}})[0];
  ex.backward({gy});
  for (size_t p = 0; p < ex.trainable().size(); ++p)
    (g.values[ex.trainable()[p]].name == "w" ? r.gw : r.gv) = ex.grads()[p];
  return r;
}

Tensor fill(Shape s, const std::function<float(int64_t)>& f) {
  Tensor t(DType::F32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = f(i);
  return t;
}

// ---- whole models -----------------------------------------------------------------------

Graph training_graph(const std::string& model, const Tensor& x) {
  register_cpu_kernels();
  register_collective_ops();
  Graph g = import_onnx(data_path(model));
  prepare_training_graph(g, {{"x", {x.dtype, x.shape}}});
  return g;
}

struct RankStep {
  ShardStats stats;
  std::map<std::string, TensorSlice> slices;
  Tensor y;
  std::map<std::string, Tensor> grads;  // trainable parameter -> gradient
  std::map<std::string, Tensor> sn_buffers;  // weight_u / weight_v after the step (power iteration)
  int all_reduces = 0;                  // collectives this rank took part in
  SequenceParallelStats sp;             // with sequence parallelism
  std::map<std::string, int> ops;       // collective nodes of the graph it ran, by op
  size_t kept = 0;                      // bytes the forward kept for the backward
};

// Shards `full` for every rank of `tp` (coroutines, tests/rank_group.h) and runs one forward and
// backward with output gradient gy, on the fast kernels the trainer runs; with `fused`, on the
// sharded graph with its norms and GELU fused, as the trainer runs it (fuse_for_training).
// With `sp`, sequence parallelism as the trainer runs it (parallel/bands.h), the
// gathers recomputed in the backward.
std::vector<RankStep> train_step(const Graph& full, const Tensor& x, const Tensor& gy, int tp, bool fused = false,
                                 bool sp = false, bool fit = false) {
  TpPlan plan = fit ? fit_plan(full, discover_plan(full), tp, true) : discover_plan(full);
  std::vector<RankStep> steps(tp);
  std::vector<std::string> errors = RankGroup::run(tp, [&](int r, RankComm& comm) {
    Graph g = full;
    own_parameters(g);
    RankStep& s = steps[r];
    s.slices = parameter_slices(plan, full, tp, r);
    s.stats = shard_training_graph(g, plan, tp, r);
    if (sp) s.sp = sequence_parallel(g, tp);
    if (fused) fuse_for_training(g);
    for (const Node& n : g.nodes) {
      if (ends_with(n.op, "TP") || n.op == "WindowAttention" || n.op == "Softmax") ++s.ops[n.op];
    }
    ExecOptions opt{0, KernelKind::Fast};
    if (sp) add_recompute_segments(g, opt.segments);
    GradExecutor ex(g, trainable_parameters(g), opt);
    s.y = ex.forward({{"x", x}})[0];
    s.kept = ex.kept_bytes();
    ex.backward({gy});
    for (size_t p = 0; p < ex.trainable().size(); ++p) s.grads[g.values[ex.trainable()[p]].name] = ex.grads()[p];
    for (const Value& v : g.values)
      if (v.is_param && v.is_const() && v.name.size() > 9 &&
          (v.name.compare(v.name.size() - 9, 9, ".weight_u") == 0 || v.name.compare(v.name.size() - 9, 9, ".weight_v") == 0))
        s.sn_buffers[v.name] = v.constant->clone();
    s.all_reduces = comm.calls;
  });
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return steps;
}

// Block s.index of s.parts along s.axis, of each of s.groups groups (written here, not
// shard.cpp's, to be an oracle).
Tensor block_of(const Tensor& t, const TensorSlice& s) {
  Shape shape = t.shape;
  int64_t n = shape[s.axis] / s.groups, part = n / s.parts, outer = s.groups, inner = 1;
  shape[s.axis] = part * s.groups;
  for (int d = 0; d < s.axis; ++d) outer *= t.shape[d];
  for (int d = s.axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  Tensor b(DType::F32, shape);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < part; ++k)
      for (int64_t i = 0; i < inner; ++i)
        b.data<float>()[(o * part + k) * inner + i] = t.data<float>()[(o * n + s.index * part + k) * inner + i];
  return b;
}

double norm(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += (double)t.data<float>()[i] * t.data<float>()[i];
  return std::sqrt(s);
}

// Relative L2 error against the tp-1 gradient; gradients far smaller than the largest are
// compared against that scale instead (a relative error of float noise would be meaningless).
double grad_error(const Tensor& got, const Tensor& ref, double scale) {
  double n = norm(ref);
  return rel_l2(got, ref) * n / std::max(n, 1e-3 * scale);
}

// Rank step s against tp 1's: the output, every gradient (a sharded parameter's: the block of
// tp 1's); rank 0's output bit for bit.
void expect_same_step(const RankStep& s, const RankStep& one, const RankStep& rank0) {
  double scale = 0;
  for (auto& [name, g] : one.grads) scale = std::max(scale, norm(g));
  EXPECT_LE(max_abs_diff(s.y, one.y), 1e-5);
  EXPECT_LE(rel_l2(s.y, one.y), 1e-5);
  EXPECT_EQ(max_abs_diff(s.y, rank0.y), 0) << "ranks disagree";
  ASSERT_EQ(s.grads.size(), one.grads.size());
  int sharded = 0;
  for (auto& [name, ref] : one.grads) {
    ASSERT_TRUE(s.grads.count(name)) << name;
    const Tensor& got = s.grads.at(name);
    auto sl = s.slices.find(name);
    if (sl == s.slices.end()) {
      ASSERT_EQ(got.shape, ref.shape) << name;
      // 2e-5: the position-bias MLP's first weight sums many cancelling terms; its tp-2
      // gradient differs from tp 1's by 3.1e-6 with oneDNN's first-layer conv and by 1.0e-5
      // with conv_small_oc's (as exact: tests/grad_conv_test.cpp), every other one by < 4e-6
      EXPECT_LE(grad_error(got, ref, scale), 2e-5) << "replicated " << name;
    } else {
      ++sharded;
      Tensor want = block_of(ref, sl->second);
      ASSERT_EQ(got.shape, want.shape) << name;
      EXPECT_LE(grad_error(got, want, scale), 1e-5) << "sharded " << name;
    }
  }
  EXPECT_EQ(sharded, (int)s.slices.size());  // every listed parameter is trainable
}

// tp ranks against tp 1 on one model: outputs, every parameter's gradient.
// qkv_layers: column-parallel layers per attention block (3: to_q/to_k/to_v; 1: a fused
// spectral-norm to_qkv).
// fused: the tp ranks run the fused graph, tp 1 the exported one.
// sp: the tp ranks with sequence parallelism (and, for the memory check, without).
void expect_tp_matches_one(const std::string& model, const std::string& input, int tp, int attention_blocks,
                           int ff_blocks, int qkv_layers = 3, bool fused = false, bool sp = false) {
  SCOPED_TRACE(model + " tp " + std::to_string(tp) + (fused ? " fused" : "") + (sp ? " sequence-parallel" : ""));
  Tensor x = read_npy(data_path(input));
  Graph full = training_graph(model, x);
  Tensor gy = randn(full.values[full.outputs[0]].shape, 7);
  static std::map<std::string, RankStep> tp1;  // per model, shared by its tp 2 and tp 4 tests
  if (!tp1.count(model)) tp1[model] = train_step(full, x, gy, 1)[0];
  const RankStep& one = tp1[model];
  std::vector<RankStep> ranks = train_step(full, x, gy, tp, fused, sp);
  std::vector<RankStep> whole;  // the same without sequence parallelism: keeps more
  if (sp) whole = train_step(full, x, gy, tp, fused);
  double scale = 0;
  for (auto& [name, g] : one.grads) scale = std::max(scale, norm(g));
  TpPlan plan = discover_plan(full);
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankStep& s = ranks[r];
    // structure: q/k/v share one CopyToTP, one more per position bias and per feed-forward
    EXPECT_EQ(s.stats.copies, 2 * attention_blocks + ff_blocks);
    EXPECT_EQ(s.stats.all_reduces, attention_blocks + ff_blocks);
    EXPECT_EQ(s.stats.column, qkv_layers * attention_blocks + ff_blocks);
    EXPECT_EQ(s.stats.row, attention_blocks + ff_blocks);
    // every collective in the forward pass and its conjugate in the backward pass; a
    // SpectralNormTP (one power iteration) sums 2 times forward (sigma reuses the iteration's
    // W_mat v), 2 times backward
    EXPECT_EQ(s.stats.spectral_norms, qkv_layers == 1 ? s.stats.column + s.stats.row : 0);
    // fused: every attention block one WindowAttention of the rank's heads (its collectives
    // outside; with sequence parallelism the windows made from the gathered image)
    EXPECT_EQ(s.ops.count("WindowAttention") ? s.ops.at("WindowAttention") : 0, fused ? attention_blocks : 0);
    EXPECT_EQ(s.ops.count("Softmax") ? s.ops.at("Softmax") : 0, fused ? 0 : attention_blocks);
    if (!sp) {
      EXPECT_EQ(s.all_reduces, s.stats.all_reduces + s.stats.copies + 4 * s.stats.spectral_norms);
    } else {
      std::map<std::string, int> ops = s.ops;
      // every row-parallel layer's sum is a reduce-scatter, every column-parallel group's copy a gather
      EXPECT_EQ(s.sp.reduce_scatters, s.stats.row) << "row-parallel layers left with an all-reduce";
      // the decoder's GroupNorms on bands: two sums each (mean, variance) over the group
      EXPECT_EQ(s.sp.group_norms, 6);
      EXPECT_EQ(ops["AllReduceTP"], s.stats.all_reduces - s.sp.reduce_scatters + 2 * s.sp.group_norms);
      EXPECT_EQ(ops["ReduceScatterTP"], s.sp.reduce_scatters);
      // bands start at stage 0's cross-embedding (the input cut to bands, a halo for each of
      // its four kernels), so every block reads a band; the later stages' cross-embedding
      // convolutions run on bands (a halo for each kernel taller than its stride), and so do
      // the decoder's first three up-sampling blocks (ConvTranspose with kernel = stride, then
      // two 3x3 convolutions with a halo each, GroupNorms on bands)
      EXPECT_EQ(s.sp.gathers, attention_blocks + ff_blocks);
      EXPECT_EQ(s.sp.halos, 4 + 3 + 6);
      EXPECT_EQ(ops["HaloTP"], s.sp.halos);

      EXPECT_EQ(ops["AllGatherTP"], s.sp.gathers + s.sp.replicated_gathers);
      EXPECT_GT(s.sp.copies, 0);  // norm gains and biases on bands
      EXPECT_EQ(ops["CopyToTP"], s.stats.copies - s.sp.gathers + s.sp.copies);
      // forward and backward of each: a reduce-scatter and its gather; a gather for the layers,
      // again in the backward, and its reduce-scatter; a gather before replicated ops (the
      // backward slices); a scatter's gather in the backward; a halo's exchange both ways and
      // again in the backward (add_recompute_segments); all-reduces as before, the GroupNorms'
      // sums again in the backward. The input takes no gradient: its scatter and the four halos
      // of stage 0's cross-embedding have no backward.
      EXPECT_EQ(s.all_reduces, ops["AllReduceTP"] + 2 * s.sp.group_norms + ops["CopyToTP"] + 4 * s.stats.spectral_norms +
                                   2 * s.sp.reduce_scatters + 3 * s.sp.gathers + s.sp.replicated_gathers +
                                   s.sp.scatters - 1 + 3 * s.sp.halos - 4);
      EXPECT_LT(s.kept, whole[r].kept) << "sequence parallelism keeps as much as tp alone";
    }
    // u and v: whole on every rank, as the one process updated them
    ASSERT_EQ(s.sn_buffers.size(), one.sn_buffers.size());
    for (auto& [name, ref] : one.sn_buffers) {
      ASSERT_TRUE(s.sn_buffers.count(name)) << name;
      EXPECT_LE(max_abs_diff(s.sn_buffers.at(name), ref), 1e-6) << name;
    }
    for (auto& [w, split] : plan.by_weight) EXPECT_EQ(s.slices.count(w), 1u) << w;
    expect_same_step(s, one, ranks[0]);
  }
}

}  // namespace

// Forward: CopyToTP is the identity, AllReduceTP sums over the ranks. Backward: AllReduceTP
// passes the gradient through, CopyToTP sums it over the ranks. Checked on 2 ranks against
// y = sum_r x w_r v_r, dv_r = gy x w_r, dw_r = x sum_r' gy v_r'.
TEST(TpCollectives, ConjugatePairAtTp2) {
  register_cpu_kernels();
  register_collective_ops();
  const Shape shape{2, 3};
  Tensor x = randn(shape, 1), gy = randn(shape, 2);
  std::vector<Tensor> w = {randn(shape, 3), randn(shape, 4)}, v = {randn(shape, 5), randn(shape, 6)};
  std::vector<StepResult> got(2);
  std::vector<int> calls(2);
  std::vector<std::string> errors = RankGroup::run(2, [&](int r, RankComm& comm) {
    got[r] = collective_step(x, w[r], v[r], gy);
    calls[r] = comm.calls;
  });
  const float* X = x.data<float>();
  const float* G = gy.data<float>();
  auto at = [](const Tensor& t, int64_t i) { return t.data<float>()[i]; };
  Tensor y = fill(shape, [&](int64_t i) { return X[i] * (at(w[0], i) * at(v[0], i) + at(w[1], i) * at(v[1], i)); });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(errors[r], "");
    EXPECT_EQ(calls[r], 2);  // one all-reduce forward (AllReduceTP), one backward (CopyToTP)
    expect_close(got[r].y, y);
    expect_close(got[r].gv, fill(shape, [&](int64_t i) { return G[i] * X[i] * at(w[r], i); }));
    expect_close(got[r].gw, fill(shape, [&](int64_t i) { return X[i] * (G[i] * at(v[0], i) + G[i] * at(v[1], i)); }));
  }
}

// HaloTP on 3 ranks, each a band of 3 of 9 rows, 2 rows of halo above and 1 below: forward the
// band with its neighbours' rows (zeros past the edges), backward each halo row's gradient added
// into the row it came from; against the whole tensor, indexed by hand.
TEST(TpCollectives, HaloRowsAndTheirGradients) {
  register_cpu_kernels();
  register_collective_ops();
  const int T = 3, rows = 3, top = 2, bottom = 1, R = rows + top + bottom;
  const Shape full{1, 2, T * rows, 4}, band{1, 2, rows, 4}, out{1, 2, R, 4};
  Tensor f = randn(full, 11);
  std::vector<Tensor> gy = {randn(out, 12), randn(out, 13), randn(out, 14)};
  std::vector<Tensor> y(T), gx(T);
  std::vector<int> calls(T);
  auto slice_rows = [](const Tensor& t, int64_t from, int64_t n, const Shape& s) {  // zeros outside t
    return fill(s, [&](int64_t i) {
      const int64_t w = i % 4, h = (i / 4) % n, c = i / (4 * n), row = from + h;
      return row < 0 || row >= t.shape[2] ? 0.f : t.data<float>()[(c * t.shape[2] + row) * 4 + w];
    });
  };
  std::vector<std::string> errors = RankGroup::run(T, [&](int r, RankComm& comm) {
    Graph g;
    const int x = g.add_constant("x", slice_rows(f, r * rows, rows, band), true);
    Value o;
    o.name = "y";
    o.shape = out;
    o.shape_known = true;
    const int yv = g.add_value(o);
    Node n;
    n.op = "HaloTP";
    n.name = "/halo";
    n.inputs = {x};
    n.outputs = {yv};
    n.attrs["axis"] = attr_i(2);
    n.attrs["parts"] = attr_i(T);
    n.attrs["top"] = attr_i(top);
    n.attrs["bottom"] = attr_i(bottom);
    g.nodes.push_back(n);
    g.outputs = {yv};
    GradExecutor ex(g, {x}, {1, KernelKind::Reference});
    y[r] = ex.forward({})[0].clone();
    ex.backward({gy[r]});
    gx[r] = ex.grads()[0].clone();
    calls[r] = comm.calls;
  });
  // the whole gradient: every rank's output rows added into the rows they came from
  Tensor gfull = Tensor::zeros(DType::F32, full);
  for (int r = 0; r < T; ++r)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < R; ++h)
        for (int64_t w = 0; w < 4; ++w) {
          const int64_t row = r * rows - top + h;
          if (row >= 0 && row < T * rows)
            gfull.data<float>()[(c * T * rows + row) * 4 + w] += gy[r].data<float>()[(c * R + h) * 4 + w];
        }
  for (int r = 0; r < T; ++r) {
    SCOPED_TRACE(r);
    ASSERT_EQ(errors[r], "");
    EXPECT_EQ(calls[r], 2);  // one exchange forward, one backward
    EXPECT_EQ(max_abs_diff(y[r], slice_rows(f, r * rows - top, R, out)), 0);
    expect_close(gx[r], slice_rows(gfull, r * rows, rows, band));
  }
}

// A rank that never reaches a collective the others wait in is an error, not a hang.
TEST(TpCollectives, RankGroupReportsAMissedCollective) {
  std::vector<std::string> errors = RankGroup::run(2, [&](int r, RankComm& comm) {
    Tensor t = Tensor::zeros(DType::F32, {3});
    if (r == 0) comm.all_reduce_sum(t);
  });
  EXPECT_NE(errors[0].find("never reaches"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

// With no communicator (one process) or a tp group of one both are identities both ways.
TEST(TpCollectives, IdentitiesWithoutAGroup) {
  register_cpu_kernels();
  register_collective_ops();
  const Shape shape{2, 3};
  Tensor x = randn(shape, 1), w = randn(shape, 3), v = randn(shape, 5), gy = randn(shape, 2);
  const float *X = x.data<float>(), *W = w.data<float>(), *V = v.data<float>(), *G = gy.data<float>();
  Tensor y = fill(shape, [&](int64_t i) { return X[i] * W[i] * V[i]; });
  Tensor gv = fill(shape, [&](int64_t i) { return G[i] * X[i] * W[i]; });
  Tensor gw = fill(shape, [&](int64_t i) { return G[i] * X[i] * V[i]; });
  set_tp_communicator(nullptr);
  StepResult alone = collective_step(x, w, v, gy);
  StepResult group_of_one;
  int calls = -1;
  std::vector<std::string> errors = RankGroup::run(1, [&](int, RankComm& comm) {
    group_of_one = collective_step(x, w, v, gy);
    calls = comm.calls;
  });
  ASSERT_EQ(errors[0], "");
  EXPECT_EQ(calls, 0);
  for (const StepResult* r : {&alone, &group_of_one}) {
    expect_close(r->y, y);
    expect_close(r->gv, gv);
    expect_close(r->gw, gw);
  }
}

// The training graph (parameters as leaves, live position-bias MLP) shards: the q/k/v of a
// block read one CopyToTP, every column-parallel layer reads a CopyToTP output, the position
// bias (one value per window offset, shared by the heads) enters through a CopyToTP and its
// MLP stays live, replicated parameters keep their shapes, sharded ones are listed by
// parameter_slices with the shapes of their blocks.
TEST(TpTrainingGraph, ShardedStructure) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tp_x.npy"));
  Graph full = training_graph("tests/data/crossformer_tp_snbaked.onnx", x);
  TpPlan plan = discover_plan(full);
  Graph g = full;
  ShardStats st = shard_training_graph(g, plan, 4, 3);
  std::map<std::string, TensorSlice> slices = parameter_slices(plan, full, 4, 3);
  EXPECT_EQ(st.copies, 30);  // 10 attention blocks x (q/k/v input, position bias) + 10 feed-forward
  EXPECT_EQ(slices.size(), 70u);  // 60 Linear weights + the 10 feed-forward up biases
  std::vector<int> prod = g.producers();
  std::map<std::string, int> block_input;  // attention block -> the value its q/k/v read
  int gemms = 0;
  for (const Node& n : g.nodes) {
    for (int o : n.outputs) EXPECT_FALSE(g.values[o].is_const()) << n.name << " was frozen";
    if (n.op == "Gemm" && g.values[n.inputs[1]].is_param) ++gemms;
    if (n.op != "Linear") continue;
    const std::string w = g.values[n.inputs[1]].name;
    auto split = plan.by_weight.find(w);
    if (split == plan.by_weight.end() || split->second != TpSplit::Column) continue;
    ASSERT_GE(prod[n.inputs[0]], 0);
    EXPECT_EQ(g.nodes[prod[n.inputs[0]]].op, "CopyToTP") << n.name;
    std::string m = layout::module_of(w);
    bool feed_forward = m.size() > 9 && m.compare(m.size() - 9, 9, ".layers.1") == 0;
    if (!feed_forward) {
      std::string block = m.substr(0, m.rfind('.'));
      if (block_input.count(block)) {
        EXPECT_EQ(block_input[block], n.inputs[0]) << block << ": q, k, v read different copies";
      }
      block_input[block] = n.inputs[0];
    }
  }
  EXPECT_EQ(block_input.size(), 10u);
  EXPECT_EQ(gemms, 40);  // 4 Linear layers of the position-bias MLP per attention block, live
  std::map<std::string, Shape> full_shapes, shapes;
  for (int v : trainable_parameters(full)) full_shapes[full.values[v].name] = full.values[v].shape;
  for (int v : trainable_parameters(g)) shapes[g.values[v].name] = g.values[v].shape;
  ASSERT_EQ(shapes.size(), full_shapes.size());
  for (auto& [name, s] : full_shapes) {
    ASSERT_TRUE(shapes.count(name)) << name;
    Shape want = s;
    auto sl = slices.find(name);
    if (sl != slices.end()) {
      EXPECT_EQ(sl->second.parts, 4);
      EXPECT_EQ(sl->second.index, 3);
      want[sl->second.axis] /= 4;
    }
    EXPECT_EQ(shapes[name], want) << name;
  }
  EXPECT_EQ(slices["layers.0.1.layers.0.0.to_q.weight"].axis, 0);
  EXPECT_EQ(slices["layers.0.1.layers.0.1.layers.1.bias"].axis, 0);
  EXPECT_EQ(slices["layers.0.1.layers.0.0.to_out.weight"].axis, 1);
  EXPECT_EQ(slices.count("layers.0.1.layers.0.0.to_out.bias"), 0u);  // added after the sum, whole
  EXPECT_TRUE(parameter_slices(plan, full, 1, 0).empty());
}

// An exporter's MatMul + Add bias on a column-parallel layer (nextgen_wxformer) is sharded with
// it and listed.
TEST(TpTrainingGraph, SeparateBiasAddIsShardedAndListed) {
  Tensor x = read_npy(data_path("tests/data/nextgen_block_x.npy"));
  Graph full = training_graph("tests/data/nextgen_block.onnx", x);
  TpPlan plan = discover_plan(full);
  std::map<std::string, TensorSlice> slices = parameter_slices(plan, full, 2, 1);
  ASSERT_EQ(slices.count("layers.0.1.layers.1.bias"), 1u);
  EXPECT_EQ(slices["layers.0.1.layers.1.bias"].axis, 0);
  EXPECT_EQ(slices.count("layers.0.1.layers.4.bias"), 0u);
  Graph g = full;
  shard_training_graph(g, plan, 2, 1);
  int held = 0;
  for (int v : trainable_parameters(g))
    if (g.values[v].name == "layers.0.1.layers.1.bias") {
      EXPECT_EQ(g.values[v].shape, (Shape{64}));  // of 128
      ++held;
    }
  EXPECT_EQ(held, 1);
}

// crossformer_tp: dim_head 4, 4/8/16/32 heads, batch 2 (models/make_tp_fixture.py).
TEST(TpTrainingGraph, CrossformerTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tp_snbaked.onnx", "tests/data/crossformer_tp_x.npy", 2, 10, 10);
}

TEST(TpTrainingGraph, CrossformerTp4MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tp_snbaked.onnx", "tests/data/crossformer_tp_x.npy", 4, 10, 10);
}

// Spectral norm kept (CREDIT's default): SpectralNorm + 1x1 Conv, one fused to_qkv per block,
// sharded with SpectralNormTP; weight_orig gradients are the blocks of tp 1's (the fused
// to_qkv's by heads), weight_u / weight_v equal tp 1's on every rank.
TEST(TpTrainingGraph, CrossformerTinySpectralNormTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_x.npy", 2, 10, 10, 1);
}

// The trainer's graph: sharded, then its norms and GELU fused (the feed-forward's column-parallel
// Linear takes the GELU; spectral norm kept), against tp 1 as exported.
TEST(TpTrainingGraph, CrossformerTinyFusedTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_x.npy", 2, 10, 10, 1,
                        true);
}

TEST(TpTrainingGraph, CrossformerTinyTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tiny_snbaked_opset17.onnx", "tests/data/crossformer_tiny_x.npy", 2,
                        10, 10);
}

// Sequence parallelism: the residual stream and norms in bands of latitudes between the sharded
// layers (reduce-scatter / all-gather), gathers recomputed in the backward; tp 1's outputs and
// gradients, fewer bytes kept than tensor parallelism alone.
TEST(TpTrainingGraph, CrossformerSequenceParallelTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tp_snbaked.onnx", "tests/data/crossformer_tp_x.npy", 2, 10, 10, 3,
                        false, true);
}

TEST(TpTrainingGraph, CrossformerSequenceParallelTp4MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tp_snbaked.onnx", "tests/data/crossformer_tp_x.npy", 4, 10, 10, 3,
                        false, true);
}

// Spectral norm kept, norms and GELU fused after the sequence-parallel rewrite, as the trainer runs it.
TEST(TpTrainingGraph, CrossformerTinyFusedSequenceParallelTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tiny_opset17.onnx", "tests/data/crossformer_tiny_x.npy", 2, 10, 10, 1,
                        true, true);
}

// Blocks tp 4 cannot shard (crossformer_tiny's stage 0: too few heads), run whole on every rank
// under tensor parallelism alone, run on bands of windows with sequence parallelism: the window
// layout carries the band (batch 1), each rank attends within its own windows; tp 1's output and
// gradients, and less kept.
TEST(TpTrainingGraph, CrossformerTinyReplicatedBlocksOnWindowBandsTp4) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  Graph full = training_graph("tests/data/crossformer_tiny_snbaked_opset17.onnx", x);
  Tensor gy = randn(full.values[full.outputs[0]].shape, 7);
  const RankStep one = train_step(full, x, gy, 1)[0];
  std::vector<RankStep> sp = train_step(full, x, gy, 4, false, true, true);
  std::vector<RankStep> tp = train_step(full, x, gy, 4, false, false, true);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_same_step(sp[r], one, sp[0]);
    expect_same_step(tp[r], one, tp[0]);
    EXPECT_EQ(sp[r].sp.reduce_scatters, 18);  // every row-parallel layer
    // gathered whole for replicated ops: the image for the long-distance attention of stage 0's
    // second block (its windows take rows from every band: shared out by window instead), its
    // output's layout back to the image, and the decoder's last ConvTranspose; the
    // short-distance attention and the decoder's GroupNorms stay on bands
    EXPECT_EQ(sp[r].sp.replicated_gathers, 3);
    EXPECT_EQ(sp[r].sp.group_norms, 6);
    EXPECT_LT(sp[r].kept, tp[r].kept * 0.85);
  }
}

}  // namespace wxe::test

namespace wxe::test {

// The Linear layout (spectral norm baked: to_q, to_k, to_v column-parallel behind one CopyToTP),
// fused as the trainer runs it: each rank's WindowAttention on its heads, tp 1's gradients.
TEST(TpTrainingGraph, CrossformerFusedTp2MatchesTp1) {
  expect_tp_matches_one("tests/data/crossformer_tp_snbaked.onnx", "tests/data/crossformer_tp_x.npy", 2, 10, 10, 3, true);
}

}  // namespace wxe::test

namespace wxe::test {

// Fused as the trainer runs it, tp 4 with sequence parallelism (the blocks tp 4 cannot shard on
// bands of windows): tp 1's output and gradients with the blocks that fuse fused.
TEST(TpTrainingGraph, CrossformerTinyFusedBlocksOnWindowBandsTp4) {
  Tensor x = read_npy(data_path("tests/data/crossformer_tiny_x.npy"));
  Graph full = training_graph("tests/data/crossformer_tiny_snbaked_opset17.onnx", x);
  Tensor gy = randn(full.values[full.outputs[0]].shape, 7);
  const RankStep one = train_step(full, x, gy, 1)[0];
  std::vector<RankStep> sp = train_step(full, x, gy, 4, true, true, true);
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_same_step(sp[r], one, sp[0]);
    // the blocks whose windows stay whole fuse; those on window bands (AllGatherTP of windows) not yet
    EXPECT_GT(sp[r].ops.count("WindowAttention") ? sp[r].ops.at("WindowAttention") : 0, 0);
  }
}

}  // namespace wxe::test
