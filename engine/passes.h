// Graph -> Graph passes. Each can run and be tested alone; simplify() runs them in order.
#pragma once
#include <map>
#include <string>

#include "engine/graph.h"

namespace wxe {

struct InputSpec {
  DType dtype = DType::F32;
  Shape shape;
};

// Fixes each runtime input's shape to the one given (checking dtype, rank and the graph's
// static dims, with an error that names the expected shape). Inputs not in `given` must
// already be fully static.
void bind_inputs(Graph& g, const std::map<std::string, InputSpec>& given);

// Runs every node's shape rule in order; all value shapes become known. Nodes whose inputs
// are known are evaluated (their outputs' values become known) but stay in the graph.
void infer_shapes(Graph& g);

// Evaluates every node whose inputs are all constants (and Shape/Size of any value whose
// shape is known), replacing it by constant outputs. Shapes are inferred along the way.
// A folded value derived from exactly one spectral-norm `X.weight_orig` parameter, and still
// used afterwards, is named `X.weight` and marked a parameter: the spectral-norm fold.
void fold_constants(Graph& g);

// Marks the spectral-norm division `X.weight_orig / sigma` so fold_constants names the folded
// weight `X.weight`. (Run before fold_constants; a no-op on graphs without spectral norm.)
void mark_spectral_norm(Graph& g);

// Identity nodes removed, readers rewired to the Identity's input.
void remove_identities(Graph& g);

// Nodes whose outputs nothing reads are dropped, and unreferenced values with them.
void eliminate_dead_nodes(Graph& g);

// The standard pipeline for inference: bind_inputs, mark_spectral_norm, fold_constants,
// remove_identities, eliminate_dead_nodes.
void simplify(Graph& g, const std::map<std::string, InputSpec>& given = {});

}  // namespace wxe
