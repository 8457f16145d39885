#include "engine/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {
void register_elementwise() {}
}  // namespace wxe::cpu
