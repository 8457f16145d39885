// Layer: library (load/), over parallel/, importers/ and engine/; train/ and forecast/ build on it.
// Loading a model, shared by every command (infer, bench, finetune): import the ONNX file,
// bind the input shapes, rewrite to the Linear layout, load weights, and (inference) fold.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/exec/executor.h"
#include "engine/ir/graph.h"
#include "engine/passes/layout_rules.h"
#include "engine/passes/passes.h"
#include "engine/io/safetensors.h"
#include "load/checkpoint.h"
#include "parallel/bands.h"
#include "parallel/mesh.h"
#include "parallel/shard.h"

namespace wxe {

// Progress lines on stderr ("wxe: ..."); off on ranks other than 0.
extern bool g_quiet;
void note(const char* fmt, ...);

using SlicesOf = std::function<std::map<std::string, TensorSlice>(const Graph&)>;

struct LoadOptions {
  std::string weights;      // checkpoint to load ("" keeps the ONNX initializers)
  bool training = false;    // prepare_training_graph instead of prepare + finalize
  SlicesOf slices_of;       // inference under tp: the parts of each weight this rank reads
};

// Runs the passes on an imported graph for the given input shapes, loading weights.
void prepare_model(Graph& g, const std::map<std::string, InputSpec>& inputs, const LoadOptions& opt);

// Training, before step 1: the trainable parameters of a prepared training graph have distinct
// names and, with `weights` (the checkpoint in the graph's layout), each loads its own checkpoint
// tensor (a tensor loaded by two parameters would train as two and save twice) and their count
// equals that of the checkpoint tensors they read. One error naming the tensors otherwise.
void check_training_parameters(const Graph& g, const NamedTensors* weights, const std::string& source);

// Static-batch exports (the exporter traced the batch into every shape): the batch the graph
// was traced with when `inputs` differ from its declared input shapes in dim 0 alone (every
// input the same way), 0 when they fit as they are. Call before the passes bind the inputs.
int64_t traced_batch(const Graph& g, const std::map<std::string, Tensor>& inputs);
// The inputs' type and shape, dim 0 set to `batch` (0: as they are).
std::map<std::string, InputSpec> specs_at_batch(const std::map<std::string, Tensor>& inputs, int64_t batch = 0);
// One forward pass over inputs of any batch on a graph prepared at `batch` rows (0: one run,
// the inputs as they are): the rows in runs of `batch`, the last run padded with zeros, each
// output joined along dim 0 and cut to the inputs' rows. Inference samples are independent,
// so this is the answer a graph traced at the inputs' batch gives.
std::vector<Tensor> run_any_batch(Executor& ex, const std::map<std::string, Tensor>& inputs, int64_t batch);

// The tensor-parallel plan of a prepared graph for tp ranks: discovered (parallel/shard.h),
// the plan file's overrides, then fit_plan: blocks that cannot be split over tp (fewer heads
// than tp) replicated, listed once in a note. With tp > 1, a plan that shards nothing is an
// error unless a plan file asked for it.
TpPlan plan_for(const Graph& g, const std::string& plan_file, int tp, bool training = false);

// Loading a model for inference over the tp ranks of a mesh, shared by infer and forecast: the
// plan (plan_for, found once on the prepared graph), what this rank reads of each weight, and
// the sharding. Use: LoadOptions::slices_of = s.slices_of(weights); prepare_model; s.shard(g).
// With no mesh or tp 1 nothing is sharded.
class TpSharding {
 public:
  TpSharding(const Mesh* mesh, std::string plan_file) : mesh_(mesh), plan_file_(std::move(plan_file)) {}
  // For LoadOptions::slices_of: from a .safetensors checkpoint a rank reads only the parts it
  // keeps (parameter_slices); other checkpoints are read whole and cut by shard(). Null for tp 1.
  // Keeps a pointer to this object.
  SlicesOf slices_of(const std::string& weights);
  // The plan of the prepared graph, found on the first call.
  const TpPlan& plan(const Graph& g);
  // Every rank checks that it built the same plan and parameter shapes as rank 0
  // (check_same_on_all_ranks, collective over the world), then g becomes this rank's shard
  // (shard_graph) and the thread's tp communicator the mesh's. tp 1: nothing, stats zero.
  ShardStats shard(Graph& g);

 private:
  int tp() const { return mesh_ ? mesh_->tp : 1; }
  const Mesh* mesh_;
  std::string plan_file_;
  TpPlan plan_;
  bool have_plan_ = false;
};

// "1.5 MiB": bytes for a person to read.
std::string human_bytes(double bytes);

// Domain parallelism over the mesh's domain group, shared by infer, forecast and finetune: after
// the tp sharding, g becomes this rank's latitude bands (parallel/bands.h domain_parallel) and
// the thread's domain communicator the mesh's; one note says what runs on bands, the halo
// traffic and what is gathered whole. A model the pass cannot split at all (no convolution
// whose rows divide into the bands) is an error naming --domain. No mesh or domain 1: nothing.
BandStats shard_domain(Graph& g, const Mesh* mesh, bool training);
// The one-line account of a domain plan that shard_domain notes (and `wxe inspect --domain`
// prints): convolutions with halos and their traffic, GroupNorms, what is gathered whole.
std::string domain_summary(const BandStats& st, int domain, bool training);

}  // namespace wxe
