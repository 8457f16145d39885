// A build without CUDA (-DWXE_CUDA=OFF): no GPU backend to register.
#include "engine/exec/backend.h"

namespace wxe {

void register_gpu_backends() {}

}  // namespace wxe
