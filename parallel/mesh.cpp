#include "parallel/mesh.h"

#include <algorithm>
#include <cstring>

#include "engine/io/json.h"

#include "parallel/mpi_comm.h"

namespace wxe {

Mesh make_mesh(int tp, int domain) { return make_mesh(world_comm(), tp, domain); }

void check_mesh_sizes(int n, int tp, int domain) {
  WXE_CHECK(tp >= 1, "--tp must be at least 1 (got ", tp, ")");
  WXE_CHECK(domain >= 1, "--domain must be at least 1 (got ", domain, ")");
  WXE_CHECK(n % tp == 0, "world size ", n, " is not divisible by --tp ", tp);
  // as int64: tp x domain may not fit an int (an int product wraps to 0 or below, and divides)
  WXE_CHECK(n % ((int64_t)tp * domain) == 0, "world size ", n, " is not divisible by --tp ", tp, " x --domain ", domain);
}

Mesh make_mesh(std::unique_ptr<Communicator> world, int tp, int domain) {
  WXE_CHECK(world != nullptr, "make_mesh: no world communicator");
  int n = world->size();
  check_mesh_sizes(n, tp, domain);  // the same answer on every rank (see mesh.h): no rank is stranded
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

void check_options_agree(Communicator& world, const std::vector<RankOption>& options) {
  if (world.size() <= 1) return;
  // a fixed count of fingerprints (options past the last slot folded into it): ranks with
  // lists of other lengths (another command) still make the same collective
  constexpr int64_t kSlots = 64;
  const int64_t n = std::min<int64_t>((int64_t)options.size(), kSlots), size = world.size();
  Tensor mine = Tensor::zeros(DType::I64, {kSlots}), all(DType::I64, {size * kSlots});
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < options.size(); ++i) {
    h = i < (size_t)kSlots - 1 ? fingerprint(options[i].compared) : fingerprint(options[i].compared.data(), options[i].compared.size(), h);
    mine.data<int64_t>()[std::min<size_t>(i, kSlots - 1)] = (int64_t)(h >> 1);
  }
  world.all_gather(mine, all);
  const int64_t* fp = all.data<int64_t>();
  for (int64_t r = 1; r < size; ++r)
    for (int64_t i = 0; i < kSlots; ++i) {
      if (fp[r * kSlots + i] == fp[i]) continue;
      // every rank found the same (r, i): gather that option's text to name both values
      constexpr int64_t kWords = 32;  // 256 bytes: the value as printable() shortens it
      Tensor text = Tensor::zeros(DType::I64, {kWords}), texts(DType::I64, {size * kWords});
      const std::string v = i < n ? options[i].value : std::string("?");
      const std::string mine_text = v.empty() ? "(not given)" : "'" + printable(v, 120) + "'";
      std::memcpy(text.raw(), mine_text.data(), std::min<size_t>(mine_text.size(), kWords * 8 - 1));
      world.all_gather(text, texts);
      const char* t = (const char*)texts.raw();
      const std::string theirs(t + r * kWords * 8), first(t);
      fail("rank ", r, " was started with another ", i < n ? options[i].name : std::string("option"), " than rank 0 (", theirs, " on rank ", r, ", ", first,
           " on rank 0", theirs == first ? ": files of one name with other contents" : "",
           "): every rank must be given the same options");
    }
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
