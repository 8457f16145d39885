// Layer: engine/passes, over engine/ir and engine/io.
// Graph -> Graph passes. Each can run and be tested alone; simplify() runs them in order.
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>

#include "engine/ir/graph.h"
#include "engine/passes/layout_rules.h"

namespace wxe {

struct InputSpec {
  DType dtype = DType::F32;
  Shape shape;
};

// Fixes each runtime input's shape to the one given (checking dtype, rank and the graph's
// static dims, with an error that names the expected shape). Inputs not in `given` must
// already be fully static.
void bind_inputs(Graph& g, const std::map<std::string, InputSpec>& given);

// Ops whose kernel updates buffers among its inputs in place (SpectralNorm's u and v): the
// passes never evaluate them at graph-build time (infer_shapes, fold_constants), which would
// advance the buffers (and, for a collective, communicate). Registered by the op's kernel file.
void register_updates_inputs(const std::string& op);
bool op_updates_inputs(const std::string& op);

// Inlines every If whose condition is known once the input shapes are bound (a shape test, as
// torch.onnx.export writes for `squeeze(dim)` on a dim it cannot see): the taken branch's nodes
// replace the If. An If whose condition depends on input values becomes Where(cond, then
// output, else output) per output: both branches run and the condition picks at run time
// (the executor runs one static graph with its memory planned ahead). That needs branches of
// one type and shape; others are refused, naming the node. Run after bind_inputs
// (prepare_graph does).
void fold_if(Graph& g);

// Runs every node's shape rule in order; all value shapes become known. Nodes whose inputs
// are known are evaluated (their outputs' values become known) but stay in the graph; ops that
// update their inputs in place (engine/ir/ops.h op_updates_inputs) never are.
void infer_shapes(Graph& g);

// Evaluates every node whose inputs are all constants (and Shape/Size of any value whose
// shape is known), replacing it by constant outputs. Shapes are inferred along the way. With
// keep_params, values computed from parameters stay in the graph (so that loading other
// weights later still changes them; the position-bias MLP, for example).
void fold_constants(Graph& g, bool keep_params = false);

// Spectral norm: each `X.weight_orig / sigma(u, v)` subgraph, recognised by the Div whose
// dividend is the `X.weight_orig` parameter, is evaluated into one parameter `X.weight`.
void fold_spectral_norm(Graph& g);

// Training: each `X.weight_orig / sigma(u, v)` subgraph (as fold_spectral_norm recognises it)
// becomes one SpectralNorm node (weight_orig, X.weight_u, X.weight_v) -> X's weight, with
// `power_iterations` = 1 (PyTorch's train mode: one power iteration per forward, u and v
// updated in place) and `dim` 1 where the weight feeds a ConvTranspose, else 0.
void spectral_norm_to_op(Graph& g, int power_iterations = 1);

// Identity nodes removed, readers rewired to the Identity's input.
void remove_identities(Graph& g);

// Nodes whose outputs nothing reads are dropped, and unreferenced values with them.
void eliminate_dead_nodes(Graph& g);

// The 1x1 convolutions of attention and feed-forward blocks (layout_rules.h) become Linear
// nodes over the channel axis with 2-D weights; a fused to_qkv becomes three Linear nodes
// (to_q, to_k, to_v) whose outputs are concatenated where the fused output was read, and
// slices of that concatenation that take exactly one part read the part directly.
void rewrite_linear_layout(Graph& g);

// Slice nodes that take exactly one input of a Concat, and Split nodes that take it apart into
// its inputs, are read through: their readers read the Concat's inputs instead.
void remove_slices_of_concat(Graph& g);

// Which checkpoint tensor each parameter the graph uses takes: the one of its name, else the
// one of its alt_names (Value) whose shape fits. Parameters named from the graph's structure
// are described with their initializer and the node that reads them. The match points into
// `weights` (tensors): it is valid while they are.
struct WeightMatch {
  std::vector<std::pair<int, std::string>> matched;  // value id -> checkpoint name
  std::vector<std::string> missing, mismatched, ambiguous;  // one description each
  std::set<std::string> used;
  std::vector<std::string> unused;  // checkpoint names no parameter takes
  int by_structure = 0;  // matched parameters whose name the graph's structure gave
  std::map<std::string, const Tensor*> tensors;  // the checkpoint's tensors by name
};
WeightMatch match_weights(const Graph& g, const NamedTensors& weights);

// A bias the export dropped (the exporter's optimizer removes the Add of a bias that was zero
// when it ran): each of m.unused named M.bias (its tensor: m.tensors) goes back, as a new
// parameter, on M's only Conv/ConvTranspose/Linear/Gemm node without one when its size is that
// node's output channels; it leaves m.unused and counts in m.by_structure. Returns how many
// went back.
int restore_dropped_biases(Graph& g, WeightMatch& m);

// Replaces every parameter the graph uses by its tensor in `weights` (match_weights; converted
// to the graph's dtype). Parameters missing from `weights`, shapes that differ and parameters
// that fit more than one tensor are one error. Returns the names in `weights` the graph does
// not use; `by_structure` gets how many parameters were matched by a name from the graph's
// structure (name_params_by_scope) rather than the export's own.
std::vector<std::string> load_weights(Graph& g, const NamedTensors& weights, const std::string& source,
                                      int* by_structure = nullptr);

// Module path of a torch.onnx.export node name: "/layers.0.1/layers.0.1/layers/layers.0/Mul"
// -> "layers.0.1.layers.0.1.layers.0". "" for names not in that form.
std::string scope_module(const std::string& node_name);

// Gives every parameter the name of the module that reads it, from the reader's scope
// (TorchScript node names; the dynamo exporter's namespace / name_scopes metadata, which the
// importer puts in front of its node names): the exporter shares one initializer between modules whose
// values are equal (LayerNorm gains at initialization, say) and names its own copies
// "onnx::Mul_123" (GroupNorm's affine parameters); the dynamo exporter folds the spectral norm
// of small layers into anonymous constants ("div_12"). An anonymous constant read where a
// parameter goes (Conv/ConvTranspose/Gemm weight and bias, a norm's scale and bias, Mul/Add
// with a non-scalar constant) becomes "<module>.weight"/".bias"; a spectral-norm layer's then
// takes the checkpoint's folded X.weight. Anonymous constants read only where literals go
// (eps, scales, shapes) stop being parameters. The position-bias MLP's first Linear, which the
// dynamo exporter folds with its constant grid, is put back (Gemm on the grid, parameters fitted
// to the constant). A Gemm's anonymous weight read with transB=0 (K, N) is transposed to the
// (N, K) a checkpoint holds and read with transB=1. A parameter read in a module called twice
// ("level_embedding_1", TorchScript's name for the second call) gets the first call's name as
// an alternative (Value::alt_names).
void name_params_by_scope(Graph& g);

// Shapes equal once dimensions of size 1 are dropped ((C,) fits (C, 1, 1)).
bool shapes_fit(const Shape& checkpoint, const Shape& graph);

// The structural part of simplify(): bind_inputs, fold_spectral_norm, name_params_by_scope,
// fold_constants keeping
// parameter-derived values, remove_identities, eliminate_dead_nodes, rewrite_linear_layout.
// Afterwards every parameter carries its Linear-layout name (weights can be loaded).
void prepare_graph(Graph& g, const std::map<std::string, InputSpec>& given = {});
// The rest: fold_constants (now through parameters too), remove_identities, eliminate_dead_nodes.
void finalize_graph(Graph& g);
// The training graph: like prepare_graph, but spectral norm stays an op
// (spectral_norm_to_op) and parameters stay named leaves, each with its own storage. Layers
// with spectral norm keep CREDIT's legacy parameters (X.weight_orig, X.weight_u, X.weight_v,
// 1x1 convolutions stay Conv); the others take the Linear layout. The position-bias MLP stays
// live. Nothing is folded that a parameter feeds.
void prepare_training_graph(Graph& g, const std::map<std::string, InputSpec>& given = {});

// The parameters an optimizer updates: every float32 parameter the graph reads except the
// spectral-norm buffers (names ending in weight_u / weight_v) and CREDIT's noise_factor
// (crossformer-ensemble's StochasticDecompositionLayer holds it with requires_grad=False). Value ids.
std::vector<int> trainable_parameters(const Graph& g);

// prepare_graph, load_weights when `weights` is given, finalize_graph.
void simplify(Graph& g, const std::map<std::string, InputSpec>& given = {},
              const NamedTensors* weights = nullptr, std::vector<std::string>* unused_weights = nullptr);

// The parameters the graph reads, by name (after prepare_graph: the names a checkpoint needs).
NamedTensors graph_parameters(const Graph& g);

// Activation checkpointing's segments (ExecOptions::segments): per node, the attention or
// feed-forward block it belongs to (-1: none), as CREDIT applies torch.utils.checkpoint to each.
// A block is the parent of a module with a projection role (module_roles.h: "a.to_qkv" -> "a",
// "f.layers.1" -> "f"), the scope of a fused WindowAttention node, or a module the table's
// recomputed_modules names (CREDIT's UpBlock convolution stacks); a node belongs to the
// innermost block its scope (scope_module) lies in.
// Nodes that update their inputs (op_updates_inputs) and those `exclude` names (collectives)
// belong to none.
std::vector<int> checkpoint_segments(const Graph& g, const std::function<bool(const Node&)>& exclude = {});

// Segments (as above) that make a value again in the backward instead of keeping it: for each
// node `seed` picks outside any segment, one segment of it, the Reshape/Transpose nodes after it
// and the nodes reading their result, so that its output is an inner value (dropped when the
// forward leaves the segment). The backward runs only the nodes that make inner values again
// (the seed and the layouts); the readers' outputs are kept as they would be. A seed whose
// result reaches a node in another segment or one that updates its inputs gets none.
// `segments` empty: none yet.
void add_recompute_segments(const Graph& g, std::vector<int>& segments, const std::function<bool(const Node&)>& seed);

}  // namespace wxe
