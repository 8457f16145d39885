// What a command needs of the parallel layer, set up in one call (tools/wxe.cpp): the
// collective ops in the op table, the dp x tp x domain mesh over the world (mesh.h), the
// collectives in the GPU backends' tables, and on a GPU the ranks' devices and communicators.
#pragma once
#include <string>
#include <vector>

#include "parallel/mesh.h"

namespace wxe {

struct MeshSession {
  bool mesh = false;           // make the mesh over the world (infer, finetune, forecast); else a world of one
  int tp = 1, domain = 1;      // its --tp and --domain
  std::string device = "cpu";  // the backend the command runs on
  bool dp_nccl = false;        // finetune: the data-parallel group on the device too (ZeRO)
  // the command's options, which every rank must be given alike: compared first (mesh.h
  // check_options_agree)
  std::vector<RankOption> same_options;
};

// Registers the collective ops (collective_ops.h), compares `same_options` over the world (a
// difference is the same Error on every rank, before any other communication), makes the mesh (make_mesh: a bad --tp or
// --domain throws the same wxe::Error on every rank, before any communication, so each can
// print it and exit without the others hanging), registers the GPU backends and their
// collective kernels, and for a device other than "cpu" binds the ranks to devices:
// each binds the GPU of its node-local rank (MPI_Comm_split_type; the CUDA backend reads
// WXE_LOCAL_RANK at its first use) and the tensor-parallel collectives go through NCCL on the
// device buffers (its unique id broadcast over the MPI tp group). With `dp_nccl` the
// data-parallel group does too: ZeRO's gradient reduce-scatter and parameter all-gather then
// run on the device's buffers; otherwise it stays on MPI (host tensors: the dp output gather of
// infer). A build without NCCL says (rank 0) that collectives go through the host. An error
// after the mesh is made ends the whole job (abort_job) when the world has several ranks.
// Calls register_gpu_backends(): the program links a kernel library, as every program does.
Mesh start_mesh(const MeshSession& s);

}  // namespace wxe
