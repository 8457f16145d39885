// Layer: models/ (model-family knowledge) registers into engine/ir/module_roles.h.
// CREDIT's module names: the one table the passes (engine/passes/passes.h), the checkpoint layout rules
// (engine/passes/layout_rules.h), the fusion and the tensor-parallel plan (parallel/shard.h) read,
// through engine/ir/module_roles.h.
#pragma once
#include "engine/ir/module_roles.h"

namespace wxe {

// The table (credit/models/crossformer.py, wxformer/, nextgen_wxformer):
//   attention  to_q, to_k, to_v (Linear layout), to_qkv (legacy fused 1x1 conv), to_out
//   feed-forward  layers.1 (up, D -> 4D), layers.4 (down, 4D -> D) of its Sequential
//   parameter leaves  weight, bias (nn.Module), g, b (CREDIT's channel LayerNorm)
//   position-bias MLP  dpb (DynamicPositionBias): layers.0 (its first Linear), layers.1 (LayerNorm)
ModuleTable credit_module_table();

// Registers credit_module_table() with engine/ (set_module_table). Programs call it once before
// loading a model, as register_cpu_kernels(); calling it again restores the table.
void register_credit_modules();

}  // namespace wxe
