#include "engine/ir/ops.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_ops.h"

namespace wxe {

void register_cpu_kernels() {
  static bool done = false;
  if (done) return;
  done = true;
  cpu::register_elementwise();
  cpu::register_shape_ops();
  cpu::register_data_ops();
  cpu::register_norm_ops();
  cpu::register_linalg_ops();
  cpu::register_conv_ops();
  cpu::register_pool_ops();
  cpu::register_fused_ops();
  cpu::register_fast_kernels();
  cpu::register_dnnl_kernels();
  cpu::register_pointwise_backward();
  cpu::register_layer_backward();
  cpu::register_conv_backward();
  register_cpu_kernel_info({cpu::isa_name(), cpu::native_bf16(), cpu::isa_path_lines(), cpu::kernel_path_of});
}

}  // namespace wxe
