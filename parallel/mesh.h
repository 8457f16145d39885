// The process mesh: world = dp x tp x domain, in CREDIT's order (credit/domain_parallel: dp
// outermost, domain innermost), so with domain 1 the tp ranks are adjacent.
//   domain_rank = rank % domain, tp_rank = (rank / domain) % tp, dp_rank = rank / (tp * domain)
//   tp group: the ranks with the same dp_rank and domain_rank, ordered by tp_rank, so
//             tp_comm->rank() == tp_rank;
//   dp group: the ranks with the same tp_rank and domain_rank, ordered by dp_rank;
//   domain group: the ranks with the same dp_rank and tp_rank, ordered by domain_rank: rank d
//             holds latitude band d (parallel/bands.h domain_parallel).
// Adjacent ranks share a node under the usual block placement, so the chatty halo exchanges
// and tp collectives stay on the fast links.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace wxe {

struct Mesh {
  int world = 1, rank = 0, dp = 1, tp = 1, domain = 1, dp_rank = 0, tp_rank = 0, domain_rank = 0;
  std::unique_ptr<Communicator> world_comm, tp_comm, dp_comm, domain_comm;
};

// The mesh over world_comm() (MPI under a launcher, a world of one otherwise).
// Collective over the world.
//
// A tp or domain below 1, or tp x domain not dividing the world size, throws wxe::Error with
// one line, e.g. "world size 3 is not divisible by --tp 2". The check depends only on (world
// size, tp, domain), which every rank has the same, so every rank throws the same error before
// any communication: each can print it and exit non-zero without the others hanging.
Mesh make_mesh(int tp, int domain = 1);
// make_mesh's checks of (world size, tp, domain) alone, any ints (tp x domain past INT_MAX too).
void check_mesh_sizes(int world, int tp, int domain);
// The same over a given world (tests, or a world of one).
Mesh make_mesh(std::unique_ptr<Communicator> world, int tp, int domain = 1);

// FNV-1a of a text: a fingerprint of what a rank built (plan, parameter shapes, options).
uint64_t fingerprint(const std::string& text);
// The same over n bytes, continuing from h (chain several buffers).
uint64_t fingerprint(const void* data, size_t n, uint64_t h = 1469598103934665603ull);
// Every rank must have built the same plan, or the collectives would pair up unrelated
// tensors and corrupt memory: gathers each rank's fingerprint over the world (call it before
// the first collective that depends on the plan) and throws the same Error on every rank when
// one differs from rank 0's, naming the rank and `what`.
void check_same_on_all_ranks(const Mesh& m, uint64_t fp, const std::string& what);
// An option every rank of a job must be given alike: its name, its value as given, and what is
// compared (the value, or what stands for it: a file's contents rather than its path).
struct RankOption {
  std::string name, value, compared;
};
// Compares the options (the command first, so that the lists agree in their names) with one
// all_gather of 64 fingerprints over `world` (a fixed size: lists of other lengths still meet);
// call it before any other collective. A difference throws the
// same Error on every rank, naming the first option that differs and both values: "rank 1 was
// started with another --steps than rank 0 ('4' on rank 1, '3' on rank 0): ...". Then one more
// all_gather, of the values' text (only when they differ), so no rank waits for another.
void check_options_agree(Communicator& world, const std::vector<RankOption>& options);
// Every rank's `values` (the same count n on each) on every rank: all[r * n + i]. Collective
// over the world.
std::vector<uint64_t> gather_on_all_ranks(const Mesh& m, const std::vector<uint64_t>& values);

}  // namespace wxe
