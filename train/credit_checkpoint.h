// Back to PyTorch: a CREDIT trainer checkpoint (torch.save zip) from a wxe checkpoint.
#pragma once
#include <string>

namespace wxe {

// `input`: a fine-tune checkpoint directory (model.safetensors, optimizer.safetensors) or a
// .safetensors file. Writes `output` as CREDIT's trainer saves it: {"epoch", "model_state_dict"
// (legacy names and shapes: fused to_qkv, 1x1 conv weights, spectral norm's weight_orig/u/v as
// trained), "optimizer_state_dict" (AdamW: state per parameter index, param_groups)}.
// With `like` (the CREDIT checkpoint the fine-tune started from) the tensors come in its order
// with its shapes, tensors the graph did not use (e.g. an unused cube_embedding) are copied from
// it, every name and size is checked against it (one error listing the mismatches, nothing
// written), and the optimizer state is included with CREDIT's parameter indices
// (model.parameters() order: the state dict without the spectral-norm buffers). Without
// `like`: sorted names, no optimizer state. Returns a one-line summary.
std::string export_credit_checkpoint(const std::string& input, const std::string& output, const std::string& like);

}  // namespace wxe
