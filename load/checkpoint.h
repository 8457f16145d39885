// Reading checkpoints into a model: a legacy CREDIT .pt or a .safetensors (through the layout
// rule table, engine/passes/layout_rules.h), and wxe's fine-tuning checkpoints (SAVE/step_NNNNNN)
// of either layout: one process's model/optimizer/ema.safetensors or a sharded directory
// (parallel/sharded_checkpoint.h). train/ writes them.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/passes/layout_rules.h"

namespace wxe {

// A fine-tuning checkpoint (SAVE/step_NNNNNN) of either layout, as one set of tensors:
// the parameters under their names, "exp_avg.P" / "exp_avg_sq.P" (AdamW moments of P),
// "ema.P" (EMA shadow). get(name, slice) reads block `slice` (whole: parts 1) of one, from a
// sharded checkpoint reading only the bytes of that block. Errors name the directory.
struct TrainCheckpoint {
  std::vector<std::string> names;
  std::map<std::string, std::string> meta;  // step, adam_step, hyper-parameters
  std::function<Tensor(const std::string&, const TensorSlice&)> get;
  bool has(const std::string& name) const { return std::find(names.begin(), names.end(), name) != names.end(); }
  // The model's own tensors: names without the optimizer's and the EMA's prefixes.
  std::vector<std::string> parameter_names() const;
  static bool is_moment(const std::string& name) { return name.rfind("exp_avg", 0) == 0; }
};
TrainCheckpoint open_train_checkpoint(const std::string& dir);

// The checkpoint SAVE/latest names, as a path (SAVE/step_NNNNNN), or "" when `save` has no
// latest. Only a plain step_NNNNNN name of a directory inside `save` is taken: a path, "..",
// a name that is no step directory, or a latest that is not a regular file (a FIFO) is an error
// naming the file.
std::string latest_checkpoint(const std::string& save);
// A step directory's number: "step_000012" -> 12; -1 for any other name.
int64_t step_number(const std::string& name);
bool is_train_checkpoint(const std::string& dir);

// A checkpoint in the Linear layout: safetensors as is, a legacy .pt through the rule table, a
// fine-tuning step directory's parameters. With `slices`, a .safetensors or step directory is
// read only in the parts this rank keeps. With keep_spectral_norm (training), spectral-norm
// layers keep weight_orig/u/v.
NamedTensors read_weights(const std::string& path, layout::ConvertReport* report = nullptr,
                          const std::map<std::string, TensorSlice>* slices = nullptr,
                          bool keep_spectral_norm = false);

// A checkpoint's tensors as stored, before the rule table (with `slices`, only those parts).
NamedTensors read_checkpoint(const std::string& path, const std::map<std::string, TensorSlice>* slices = nullptr);

// The rule table applied (layout::convert_state_dict); errors name the checkpoint `path`.
NamedTensors to_linear_layout(const NamedTensors& raw, const std::string& path, layout::ConvertReport* report,
                              bool keep_spectral_norm);

}  // namespace wxe
