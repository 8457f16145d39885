#include "engine/ops.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe::cpu {
void register_conv_ops() {}
}  // namespace wxe::cpu
