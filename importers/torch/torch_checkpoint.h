// PyTorch checkpoints (torch.save >= 1.6 zip archives) read without Python or libtorch.
//
// The archive's data.pkl is read by a restricted unpickler that executes nothing: only the
// globals a state dict needs resolve (collections.OrderedDict, torch._utils._rebuild_tensor_v2
// / _v3 / _rebuild_parameter(_with_state), torch.*Storage, torch.UntypedStorage, torch dtypes,
// builtins.set / frozenset, _codecs.encode); any other global (os.system, builtins.eval, ...)
// is an error at the GLOBAL opcode. Tensors are copied out of their storages (data/<key>)
// into contiguous wxe tensors; strided views and storages shared between tensors work.
// Every malformed input is a wxe::Error with a one-line message naming the file.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

struct StateDict {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
};

// Reads a torch.save zip. If the top-level object is a dict with "model_state_dict" (CREDIT
// trainer checkpoint), else "state_dict", else "model" whose value is a dict, that entry's
// tensors are returned; if it is a flat dict of tensors (bare state dict), those. Every value
// of the returned dict must be a tensor of a wxe dtype. `other_keys` receives the other
// top-level keys (epoch, optimizer_state_dict, ...) for messages; the rest of the pickle
// (optimizer state, scheduler, ...) is parsed and validated but not returned.
StateDict read_torch_state_dict(const std::string& path,
                                std::vector<std::string>* other_keys = nullptr);

}  // namespace wxe
