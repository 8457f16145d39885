// The CPU kernel paths beyond the baseline and the choice among them (see cpu_isa.h).
#include "kernels/cpu/cpu_isa.h"

#include <oneapi/dnnl/dnnl.hpp>

namespace wxe::cpu {

namespace {

using isa = dnnl::cpu_isa;

// oneDNN's ISA values are bit sets, each holding the bits of those it extends.
bool has(isa want) {
  static const unsigned have = (unsigned)dnnl::get_effective_cpu_isa();
  return (have & (unsigned)want) == (unsigned)want;
}

}  // namespace

const char* isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx2_vnni: return "avx2_vnni";
    case isa::avx512_mic: return "avx512_mic";
    case isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

bool winograd_isa() { return has(isa::avx512_core); }
bool native_bf16() { return has(isa::avx512_core_bf16); }

bool runs_bf16(const Node& n) { return n.s("precision", "") == "bf16" && native_bf16(); }

std::vector<std::string> isa_path_lines() {
  return {std::string("winograd 3x3 conv (needs avx512_core): ") +
              (winograd_isa() ? "runs" : "not here, oneDNN's direct kernel runs"),
          std::string("bf16 Conv/Linear products (need avx512_core_bf16 or amx): ") +
              (native_bf16() ? "run" : "not here, --precision bf16 runs float32")};
}

}  // namespace wxe::cpu
