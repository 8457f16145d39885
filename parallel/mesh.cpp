#include "parallel/mesh.h"

#include <cstring>

#include "parallel/mpi_comm.h"

namespace wxe {

Mesh make_mesh(int tp, int domain) { return make_mesh(world_comm(), tp, domain); }

Mesh make_mesh(std::unique_ptr<Communicator> world, int tp, int domain) {
  WXE_CHECK(world != nullptr, "make_mesh: no world communicator");
  int n = world->size();
  // Same answer on every rank (see mesh.h), so throwing here cannot strand a rank.
  WXE_CHECK(tp >= 1, "--tp must be at least 1 (got ", tp, ")");
  WXE_CHECK(domain >= 1, "--domain must be at least 1 (got ", domain, ")");
  WXE_CHECK(n % tp == 0, "world size ", n, " is not divisible by --tp ", tp);
  WXE_CHECK(n % (tp * domain) == 0, "world size ", n, " is not divisible by --tp ", tp, " x --domain ", domain);
  Mesh m;
  m.world = n;
  m.rank = world->rank();
  m.tp = tp;
  m.domain = domain;
  m.dp = n / (tp * domain);
  m.domain_rank = m.rank % domain;
  m.tp_rank = (m.rank / domain) % tp;
  m.dp_rank = m.rank / (tp * domain);
  // split's colour: the coordinates the group shares; key: the rank within it
  m.tp_comm = world->split(m.dp_rank * domain + m.domain_rank, m.tp_rank);
  m.dp_comm = world->split(m.tp_rank * domain + m.domain_rank, m.dp_rank);
  m.domain_comm = world->split(m.dp_rank * tp + m.tp_rank, m.domain_rank);
  WXE_ASSERT(m.tp_comm->size() == m.tp && m.tp_comm->rank() == m.tp_rank);
  WXE_ASSERT(m.dp_comm->size() == m.dp && m.dp_comm->rank() == m.dp_rank);
  WXE_ASSERT(m.domain_comm->size() == m.domain && m.domain_comm->rank() == m.domain_rank);
  m.world_comm = std::move(world);
  return m;
}

uint64_t fingerprint(const void* data, size_t n, uint64_t h) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t fingerprint(const std::string& text) { return fingerprint(text.data(), text.size()); }

void check_same_on_all_ranks(const Mesh& m, uint64_t fp, const std::string& what) {
  if (m.world <= 1) return;
  Tensor mine = Tensor::from_i64({(int64_t)(fp >> 1)});
  Tensor all(DType::I64, {m.world});
  m.world_comm->all_gather(mine, all);
  for (int r = 1; r < m.world; ++r)
    WXE_CHECK(all.data<int64_t>()[r] == all.data<int64_t>()[0], "rank ", r, " built a different ", what,
              " than rank 0 (different model, plan file or options?)");
}

std::vector<uint64_t> gather_on_all_ranks(const Mesh& m, const std::vector<uint64_t>& values) {
  const int64_t n = (int64_t)values.size();
  if (m.world <= 1) return values;
  Tensor mine(DType::I64, {n}), all(DType::I64, {m.world * n});
  std::memcpy(mine.raw(), values.data(), n * sizeof(uint64_t));
  m.world_comm->all_gather(mine, all);
  std::vector<uint64_t> r(m.world * n);
  std::memcpy(r.data(), all.raw(), r.size() * sizeof(uint64_t));
  return r;
}

}  // namespace wxe
