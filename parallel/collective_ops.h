// Collectives as graph nodes, registered into the op table like any kernel, each with the
// conjugate backward (Megatron's tensor_parallel/mappings.py pairs):
//   AllReduceTP (reduce_from_tp): forward all-reduce (sum) over tp, backward identity.
//   CopyToTP (copy_to_tp): forward identity, backward all-reduce (sum) over tp of the gradient.
//   SpectralNormTP (collective_spectral_norm.cpp): SpectralNorm on a rank's block of
//     weight_orig, sigma and the power iteration those of the whole matrix (sums over tp).
//   ReduceScatterTP, AllGatherTP, ScatterTP, HaloTP: bands of rows (parallel/bands.h).
// All use the calling thread's tp communicator (attribute group "domain": its domain one); with none set, or a tp group of one, each is
// the identity both ways (Megatron's world_size == 1 bypass; SpectralNormTP: SpectralNorm).
#pragma once
#include "parallel/comm.h"

namespace wxe {

void register_collective_ops();
// The same pairs in the table of every GPU backend registered so far (call after
// register_gpu_backends()): device tensors, the copy by the backend's Identity kernel, the sum
// on the device buffers when the tp communicator takes them (NCCL), else through the host.
void register_collective_device_kernels();
// The tensor-parallel group the calling thread's collectives use (must outlive the runs).
// Per thread, so tests can run the ranks of a mesh as threads of one process.
void set_tp_communicator(Communicator* tp);
Communicator* tp_communicator();  // the calling thread's (nullptr: none)
// The domain group (domain parallelism, parallel/bands.h): collective nodes with attribute
// group "domain" run over it; the same per-thread rules.
void set_domain_communicator(Communicator* domain);
Communicator* domain_communicator();
void register_spectral_norm_tp();  // called by register_collective_ops()

}  // namespace wxe
