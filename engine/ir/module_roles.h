// What a module of the model is to the passes, the fusion and the tensor-parallel plan: its
// projection role in an attention or feed-forward block, read from the last components of its
// name, and the leaf names its parameters take. engine/ holds only the lookup; the one table of
// CREDIT's names is models/credit_modules.cpp, registered the way kernels register their ops:
// programs call register_credit_modules() (models/credit_modules.h) before loading a model.
// A lookup before any table is registered is an error, not a silent "no module has a role".
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace wxe {

// Projection roles. Under tensor parallelism Q, K, V, Qkv (the fused [q | k | v] projection)
// and FfnUp are column-parallel, Out and FfnDown row-parallel (parallel/shard.h).
enum class Role { None, Q, K, V, Qkv, Out, FfnUp, FfnDown };
const char* role_name(Role r);

struct ModuleTable {
  // module-name tail -> role. A module has the role of the first tail it equals or ends with
  // after a '.': "blk.to_q" and "to_q" match "to_q"; "blk.xto_q" does not.
  std::vector<std::pair<std::string, Role>> roles;
  // the leaf names a module's parameters have in the state dict ("weight", "bias", ...)
  std::vector<std::string> param_leaves;
  // module-name tails of position-bias MLPs run on the relative-position grid of a window
  // (layout::position_bias_grid), whose first Linear a dynamo export folds with that grid
  std::vector<std::string> position_bias_mlps;
  // the sub-modules of a position-bias MLP: its first Linear and the norm that reads its output
  // ("layers.0", "layers.1": "<mlp>.layers.0.weight" is that Linear's weight); left empty, no
  // folded Linear is put back (passes.h name_params_by_scope)
  std::string position_bias_linear, position_bias_norm;
  // module names (engine/io/glob.h patterns) that activation checkpointing recomputes whole,
  // beside the attention and feed-forward blocks: convolution stacks whose inner values are
  // large and cheap to make again (passes.h checkpoint_segments)
  std::vector<std::string> recomputed_modules;
};

// Replaces the registered table.
void set_module_table(ModuleTable t);
// Adds one tail to the registered table (a model whose modules are named otherwise).
void add_module_role(const std::string& tail, Role role);
// The registered table; an error when there is none.
const ModuleTable& module_table();

// The role of a module ("a.b.to_q" -> Q), None when no tail matches.
Role module_role(const std::string& module);
// The module of role `r` beside `module` (same parent, the first tail registered for r):
// "a.to_qkv", Q -> "a.to_q". `module` must have a role.
std::string sibling_module(const std::string& module, Role r);
// Whether `leaf` is a name a module's parameter has ("weight", CREDIT LayerNorm's "g").
bool is_param_leaf(const std::string& leaf);
// Whether `module` is a position-bias MLP ("a.dpb" with tail "dpb").
bool is_position_bias_mlp(const std::string& module);

}  // namespace wxe
