// The CPU kernel paths chosen from the ISA (kernels/cpu/cpu_isa.h) and the row-cropped Conv on
// every path. The isa_avx2 test (CMakeLists.txt) runs these with ONEDNN_MAX_CPU_ISA=AVX2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/exec/executor.h"
#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/test_util.h"

namespace wxe::test {
namespace {

using Attrs = std::map<std::string, Attr>;

// The cap is what the kernels see: under ONEDNN_MAX_CPU_ISA=AVX2 neither Winograd nor bfloat16
// runs; the engine's view (cpu_kernel_info, what finetune and bench report) is the kernels'.
TEST(CpuIsa, PathsFollowTheCap) {
  register_cpu_kernels();
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && std::string(cap) == "AVX2") {
    EXPECT_STREQ(cpu::isa_name(), "avx2");
    EXPECT_FALSE(cpu::winograd_isa());
    EXPECT_FALSE(cpu::native_bf16());
  }
  EXPECT_EQ(cpu_kernel_info().isa, cpu::isa_name());
  EXPECT_EQ(cpu_kernel_info().native_bf16, cpu::native_bf16());
  const std::string report = cpu_paths_report(Graph());
  EXPECT_NE(report.find(std::string("cpu: oneDNN ISA ") + cpu::isa_name()), std::string::npos) << report;
  EXPECT_NE(report.find(cpu::winograd_isa() ? "(needs avx512_core): runs" : "(needs avx512_core): not here"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find(cpu::native_bf16() ? "amx): run" : "amx): not here, --precision bf16 runs float32"),
            std::string::npos)
      << report;
}

// A Conv with the attribute rows (mark_needed_rows) computes those rows as the whole conv does
// and leaves the others zero on every path: Winograd's own bands where it runs, otherwise the
// conv of the input rows they read on whatever path that takes (here with Winograd off too, so
// that an AVX-512 machine checks the AVX2 machine's path): 3x3 pads 1 (the last rows, the first,
// a middle band), stride 2, a 5x5 kernel with dilation, a group conv, rows reading only padding.
TEST(CpuIsa, RowsOnEveryPath) {
  register_cpu_kernels();
  struct Case {
    std::string label;
    Shape x, w;
    Attrs attrs;
    int64_t lo, hi;
  };
  const std::vector<Case> cases = {
      {"3x3 pads 1, rows 7..30", {1, 32, 80, 96}, {32, 32, 3, 3}, {{"pads", attr_ints({1, 1, 1, 1})}}, 7, 30},
      {"3x3 pads 1, rows 0..5", {1, 32, 40, 48}, {32, 32, 3, 3}, {{"pads", attr_ints({1, 1, 1, 1})}}, 0, 5},
      {"3x3 pads 1, last rows", {2, 16, 30, 40}, {24, 16, 3, 3}, {{"pads", attr_ints({1, 1, 1, 1})}}, 21, 30},
      {"4x4 stride 2 pads 1", {1, 8, 40, 40}, {16, 8, 4, 4}, {{"pads", attr_ints({1, 1, 1, 1})}, {"strides", attr_ints({2, 2})}}, 3, 17},
      {"5x5 dilation 2 pads 4", {1, 8, 30, 32}, {8, 8, 5, 5}, {{"pads", attr_ints({4, 4, 4, 4})}, {"dilations", attr_ints({2, 2})}}, 1, 29},
      {"3x3 group 4", {1, 16, 20, 24}, {16, 4, 3, 3}, {{"pads", attr_ints({1, 1, 1, 1})}, {"group", attr_i(4)}}, 4, 12},
      {"rows of padding alone", {1, 8, 10, 12}, {8, 8, 3, 3}, {{"pads", attr_ints({3, 1, 3, 1})}}, 0, 1},
      {"no rows", {1, 8, 10, 12}, {8, 8, 3, 3}, {{"pads", attr_ints({1, 1, 1, 1})}}, 4, 4},
  };
  for (bool winograd : {true, false}) {
    cpu::set_winograd(winograd);
    for (const Case& c : cases) {
      Attrs a = c.attrs;
      const Tensor x = randn(c.x, 3), w = randn(c.w, 4), b = randn({c.w[0]}, 5);
      const Tensor whole = run_node(make_node("Conv", 3, 1, a), {&x, &w, &b})[0];
      a["rows"] = attr_ints({c.lo, c.hi});
      const Node n = make_node("Conv", 3, 1, a);
      const std::string path = cpu::kernel_path_of(n, {c.x, c.w, b.shape});
      SCOPED_TRACE(c.label + (winograd ? "" : ", winograd off") + ": " + path);
      const Tensor part = run_node(n, {&x, &w, &b}, KernelKind::Fast)[0];
      ASSERT_EQ(part.shape, whole.shape);
      const int64_t H = whole.shape[2], W = whole.shape[3], planes = whole.shape[0] * whole.shape[1];
      double inside = 0, norm = 0, outside = 0;
      for (int64_t p = 0; p < planes; ++p)
        for (int64_t i = 0; i < H * W; ++i) {
          const int64_t e = p * H * W + i, r = i / W;
          const double d = part.data<float>()[e] - whole.data<float>()[e];
          if (r >= c.lo && r < c.hi) {
            inside += d * d;
            norm += (double)whole.data<float>()[e] * whole.data<float>()[e];
          } else {
            outside = std::max(outside, std::abs((double)part.data<float>()[e]));
          }
        }
      if (c.lo < c.hi) {
        EXPECT_LT(std::sqrt(inside / norm), 2e-6);
      }
      EXPECT_EQ(outside, 0.0);
    }
  }
  cpu::set_winograd(true);
}

}  // namespace
}  // namespace wxe::test
