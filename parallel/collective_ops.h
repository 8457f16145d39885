// Collectives as graph nodes, registered into the op table like any kernel.
//   AllReduceTP: forward all-reduce (sum) over the tensor-parallel group; its backward (for
//   fine-tuning) is the identity. Megatron's reduce_from_tp.
#pragma once
#include "parallel/comm.h"

namespace wxe {

void register_collective_ops();
// The tensor-parallel group the calling thread's collectives use (must outlive the runs).
// Per thread, so tests can run the ranks of a mesh as threads of one process.
void set_tp_communicator(Communicator* tp);

}  // namespace wxe
