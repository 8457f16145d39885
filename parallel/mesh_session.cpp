#include "parallel/mesh_session.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "engine/exec/backend.h"
#include "parallel/collective_ops.h"
#include "parallel/mpi_comm.h"
#ifdef WXE_HAVE_NCCL
#include "parallel/nccl_comm.h"
#endif

namespace wxe {

namespace {

void use_device_mesh(Mesh& mesh, const std::string& device, bool dp_nccl) {
  if (mesh.world <= 1) return;
  setenv("WXE_LOCAL_RANK", std::to_string(MpiRuntime::local_rank()).c_str(), 1);
#ifdef WXE_HAVE_NCCL
  if (device == "cuda") {
    if (mesh.tp > 1) mesh.tp_comm = std::make_unique<NcclComm>(*mesh.tp_comm);
    if (dp_nccl && mesh.dp > 1) mesh.dp_comm = std::make_unique<NcclComm>(*mesh.dp_comm);
    return;
  }
#endif
  if ((mesh.tp > 1 || (dp_nccl && mesh.dp > 1)) && mesh.rank == 0)
    std::fprintf(stderr, "wxe: --device %s: collectives go through the host (MPI); this build has no NCCL\n",
                 device.c_str());
}

}  // namespace

Mesh start_mesh(const MeshSession& s) {
  register_collective_ops();
  Mesh mesh;
  if (s.mesh) {
    std::unique_ptr<Communicator> world = world_comm();
    check_options_agree(*world, s.same_options);  // before the mesh's own collectives (its splits)
    mesh = make_mesh(std::move(world), s.tp, s.domain);
  }
  try {
    register_gpu_backends();
    register_collective_device_kernels();
    if (s.device != "cpu") use_device_mesh(mesh, s.device, s.dp_nccl);
  } catch (const std::exception& e) {
    // with other ranks waiting in collectives, one rank's error ends the whole job
    if (mesh.world > 1) abort_job(e.what());
    throw;
  }
  return mesh;
}

}  // namespace wxe
