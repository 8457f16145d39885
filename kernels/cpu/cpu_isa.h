// The CPU kernel paths that need more than the build's baseline, and the choice among them,
// made once per process from the instruction set oneDNN may use: the CPU's own, or less where
// ONEDNN_MAX_CPU_ISA caps it (ONEDNN_MAX_CPU_ISA=AVX2 on an AVX-512 machine runs the paths of
// an AVX2-only one, e.g. AMD EPYC Milan; tests/CMakeLists' isa_avx2 test does). The baseline
// is the build's -march=x86-64-v2 -mavx -mfma -mf16c: wxe's own AVX loops (conv_small_oc,
// conv_fft, transpose) and oneDNN's direct convolution and matmul kernels run on every CPU
// that starts wxe. Beyond it:
//   - winograd: 3x3 stride-1 float32 Conv on oneDNN 2.6's Winograd kernel (conv_winograd.h)
//     needs avx512_core; otherwise oneDNN's direct kernel runs (the same sums, as accurate).
//   - bf16: Conv and Linear with precision = "bf16" (forward and backward) need native
//     bfloat16 dot products (avx512_core_bf16: avx512_bf16, or AMX); otherwise they multiply in
//     float32 (oneDNN 2.6 has no AVX2 bfloat16 kernels, and on AVX-512 without avx512_bf16
//     emulates them at more cost than float32), so --precision bf16 is float32 there.
#pragma once
#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace wxe::cpu {

// oneDNN's effective ISA, as its enum reads: "avx2", "avx512_core", "avx512_core_bf16", ...
const char* isa_name();
bool winograd_isa();  // avx512_core or more
bool native_bf16();   // avx512_core_bf16 or more (AMX included)

// The node asks for bfloat16 products (precision = "bf16") and this CPU has them.
bool runs_bf16(const Node& n);

// One line per path above: "winograd 3x3 conv (needs avx512_core): runs" / "... : not here,
// oneDNN's direct kernel runs".
std::vector<std::string> isa_path_lines();

// The forward path a Conv, ConvTranspose, ConvChannelsLast or Linear takes on these input
// shapes: "winograd", "fft", "onednn direct brg:avx512_core", "onednn matmul brg:avx2 bf16",
// ...; "" for other ops (dnnl.cpp).
std::string kernel_path_of(const Node& n, const std::vector<Shape>& in);

}  // namespace wxe::cpu
