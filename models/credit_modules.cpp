#include "models/credit_modules.h"

namespace wxe {

ModuleTable credit_module_table() {
  ModuleTable t;
  t.roles = {
      {"to_q", Role::Q},          {"to_k", Role::K},     {"to_v", Role::V},
      {"to_qkv", Role::Qkv},      {"to_out", Role::Out},
      {"layers.1", Role::FfnUp},  // FeedForward: Sequential(LayerNorm, Conv/Linear, GELU, Dropout, Conv/Linear)
      {"layers.4", Role::FfnDown},
  };
  t.param_leaves = {"weight", "bias", "g", "b"};
  // DynamicPositionBias: Sequential(Linear(2, D), LayerNorm, ReLU, ..., Linear(D, 1))
  t.position_bias_mlps = {"dpb"};
  t.position_bias_linear = "layers.0";
  t.position_bias_norm = "layers.1";
  // UpBlock / UpBlockPS: b = Sequential(Conv 3x3, GroupNorm, SiLU) x 2 at the decoder's
  // resolutions (on the 640 x 1280 CrossFormer nine 26 MB values per block; making them again
  // costs about 1.5 % of a step)
  t.recomputed_modules = {"*up_block*.b"};
  return t;
}

void register_credit_modules() { set_module_table(credit_module_table()); }

}  // namespace wxe
