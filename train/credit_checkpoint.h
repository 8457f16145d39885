// Back to PyTorch: a CREDIT trainer checkpoint (torch.save zip) from a wxe checkpoint.
#pragma once
#include <map>
#include <string>

#include "importers/torch/torch_save.h"

namespace wxe {

// `input`: a fine-tune checkpoint directory (model.safetensors, optimizer.safetensors) or a
// .safetensors file. Writes `output` as CREDIT's trainer saves it: {"epoch", "model_state_dict"
// (legacy names and shapes: fused to_qkv, 1x1 conv weights, spectral norm's weight_orig/u/v as
// trained), "optimizer_state_dict" (AdamW: state per parameter index, param_groups; with a
// scheduler, lr is the scheduled one and initial_lr the base), "scheduler_state_dict"
// (credit_scheduler_state), "scaler_state_dict" ({}: GradScaler's state without amp)}.
// With `like` (the CREDIT checkpoint the fine-tune started from) the tensors come in its order
// with its shapes, tensors the graph did not use (e.g. an unused cube_embedding) are copied from
// it, every name and size is checked against it (one error listing the mismatches, nothing
// written), and the optimizer state is included with CREDIT's parameter indices
// (model.parameters() order: the state dict without the spectral-norm buffers). Without
// `like`: sorted names, no optimizer state. Returns a one-line summary.
// CREDIT's LinearWarmupCosineScheduler.state_dict() after `step` scheduler steps, from a
// fine-tune checkpoint's metadata (lr, schedule, warmup_steps, total_steps, min_lr); None for a
// constant schedule or a checkpoint without them (CREDIT saves None when it runs no scheduler).
// wxe steps its schedule once per optimizer step, so last_epoch is the optimizer step.
PyValue credit_scheduler_state(const std::map<std::string, std::string>& meta, int64_t step);

std::string export_credit_checkpoint(const std::string& input, const std::string& output, const std::string& like);

}  // namespace wxe
