// Per-node profile of the forward pass: the slowest nodes with their shapes. A developer tool,
// not part of the build; compile against a build tree, e.g. (from the repo root):
//   B=build-perf; c++ -O2 -fopenmp -std=c++17 -I. bench/node_profile.cpp -o $B/node_profile \
//     $B/libwxe_onnx.a $B/libwxe_models.a $B/libwxe_cpu.a $B/libwxe_engine.a -lonnx -lonnx_proto -lprotobuf -ldnnl
//   $B/node_profile MODEL.onnx X.npy [threads] [runs] [top]
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/exec/executor.h"
#include "engine/io/npy.h"
#include "engine/passes/passes.h"
#include "importers/onnx/onnx_import.h"
#include "models/credit_modules.h"

using namespace wxe;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: node_profile MODEL.onnx X.npy [threads] [runs] [top]\n");
    return 2;
  }
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 3;
  const int top = argc > 5 ? std::atoi(argv[5]) : 40;
  register_cpu_kernels();
  register_credit_modules();
  Graph g = import_onnx(argv[1]);
  Tensor x = read_npy(argv[2]);
  const std::string in_name = g.values[g.inputs[0]].name;
  simplify(g, {{in_name, {x.dtype, x.shape}}});
  ExecOptions opt;
  opt.threads = threads;
  opt.profile = true;
  Executor ex(g, opt);
  ex.run({{in_name, x}});
  std::vector<double> warm = ex.node_profile();
  for (int r = 0; r < runs; ++r) ex.run({{in_name, x}});
  const Graph& eg = ex.graph();
  std::vector<std::pair<double, int>> t;
  double total = 0;
  for (size_t k = 0; k < eg.nodes.size(); ++k) {
    double ms = (ex.node_profile()[k] - warm[k]) / runs;
    t.push_back({ms, (int)k});
    total += ms;
  }
  std::sort(t.rbegin(), t.rend());
  std::printf("total %.1f ms/run over %zu nodes\n", total, eg.nodes.size());
  for (int i = 0; i < top && i < (int)t.size(); ++i) {
    std::printf("%8.2f ms  %s\n", t[i].first, node_signature(eg, eg.nodes[t[i].second]).c_str());
  }
  return 0;
}
