// Process-level checks of failure handling, run under mpiexec by tests/mpi/abort_test.sh.
//   abort: rank 1 fails while the others wait in a collective; its handler calls
//          comm.abort(), which must end the whole job with rank 1's message and a
//          non-zero exit instead of leaving the others waiting forever.
//   mesh:  --tp that does not divide the world: every rank raises the same error, prints
//          it and exits non-zero; nobody hangs.
#include <cstdio>
#include <cstring>

#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"

int main(int argc, char** argv) {
  using namespace wxe;
  const char* mode = argc > 1 ? argv[1] : "abort";
  if (!std::strcmp(mode, "abort")) {
    auto comm = world_comm();
    try {
      if (comm->rank() == 1) throw Error("injected failure on rank 1");
      Tensor t = Tensor::zeros(DType::F32, {16});
      comm->all_reduce_sum(t);  // rank 1 never joins: only the abort can end this
      comm->barrier();
    } catch (const std::exception& e) {
      comm->abort(e.what(), 3);
    }
    std::fprintf(stderr, "rank %d: returned from a collective rank 1 never joined\n",
                 comm->rank());
    return 0;
  }
  if (!std::strcmp(mode, "mesh")) {
    int tp = argc > 2 ? std::atoi(argv[2]) : 3;
    try {
      Mesh m = make_mesh(tp);
      std::printf("rank %d: mesh dp %d x tp %d\n", m.rank, m.dp, m.tp);
      return 0;
    } catch (const Error& e) {
      std::fprintf(stderr, "wxe: error (rank %d): %s\n", MpiRuntime::world_rank(), e.what());
      return 2;
    }
  }
  std::fprintf(stderr, "usage: %s abort|mesh [tp]\n", argv[0]);
  return 64;
}
