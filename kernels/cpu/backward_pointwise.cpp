// Backward kernels (pointwise). See engine/ops.h (BackwardFn) for the contract.
#include "engine/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {

void register_pointwise_backward() {}

}  // namespace wxe::cpu
