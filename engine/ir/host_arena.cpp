// One block for a training step's host tensors: see host_arena.h.
#include "engine/ir/host_arena.h"

#include <cstring>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include <sys/mman.h>

#include "engine/ir/tensor.h"

namespace wxe {

std::vector<size_t> pack_lifetimes(const std::vector<Lifetime>& v, size_t* total) {
  auto rounded = [&](size_t i) { return (v[i].bytes + 63) / 64 * 64; };
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < v.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rounded(a) > rounded(b); });
  std::vector<size_t> offset(v.size(), 0), placed;
  *total = 0;
  std::vector<std::pair<size_t, size_t>> busy;
  for (size_t i : order) {
    // blocks of values alive at the same time, by offset; take the lowest gap that fits
    busy.clear();
    for (size_t p : placed)
      if (!(v[p].last < v[i].first || v[i].last < v[p].first)) busy.push_back({offset[p], offset[p] + rounded(p)});
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (auto& [b0, b1] : busy) {
      if (b0 >= at + rounded(i)) break;
      at = std::max(at, b1);
    }
    offset[i] = at;
    *total = std::max(*total, at + rounded(i));
    placed.push_back(i);
  }
  return offset;
}

struct HostArena::State {
  std::mutex mu;
  enum { Idle, Recording, Replaying } mode = Idle;
  bool planned = false, stale = false;
  int64_t event = 0;
  std::vector<Lifetime> rec;      // the recorded step's tensors in the order made; last -1: outlived it
  std::vector<int64_t> offset;    // in the block, -1: not in it (outlived its step)
  std::shared_ptr<uint8_t> block;
  size_t block_bytes = 0;
  int64_t generation = 0;         // of the plan: leases of an older one hold nothing in `live`
  size_t cursor = 0;              // the next tensor of the replayed step
  int64_t served = 0, served_last = 0;
  std::map<size_t, size_t> live;  // block regions held: offset -> end
};

struct ArenaLease {
  std::shared_ptr<HostArena::State> st;
  int64_t rec = -1;     // recording: the tensor's index in it
  int64_t region = -1;  // replay: the block region's offset
  int64_t generation = 0;
  std::shared_ptr<uint8_t> block;  // keeps the block while the tensor lives
  void* mapped = nullptr;          // recording: the tensor's own pages (mmap), unmapped when it goes
  size_t mapped_bytes = 0;
};

// A recorded tensor of this size or more gets pages of its own, given back when it goes: what the
// recorded step frees must not stay in the process beside the block made from it (glibc's heap
// keeps freed chunks resident).
constexpr size_t kMapBytes = 64 * 1024;

namespace {
thread_local std::shared_ptr<HostArena::State> t_step;  // the state of this thread's step, if any
}

void ArenaLeaseFree::operator()(ArenaLease* l) const {
  {
    std::lock_guard<std::mutex> lk(l->st->mu);
    HostArena::State& s = *l->st;
    if (l->rec >= 0 && l->generation == s.generation && s.mode == HostArena::State::Recording)
      s.rec[l->rec].last = s.event++;
    if (l->region >= 0 && l->generation == s.generation) s.live.erase((size_t)l->region);
  }
  if (l->mapped) munmap(l->mapped, l->mapped_bytes);
  delete l;
}

bool arena_owns(const ArenaLease& lease) { return lease.region >= 0 || lease.mapped; }

uint8_t* arena_take(size_t n, ArenaLeasePtr* lease) {
  if (!t_step) return nullptr;
  HostArena::State& s = *t_step;
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.mode == HostArena::State::Recording) {
    lease->reset(new ArenaLease{t_step, (int64_t)s.rec.size(), -1, s.generation, nullptr});
    s.rec.push_back({n, s.event++, -1});
    if (n < kMapBytes) return nullptr;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    (*lease)->mapped = p;
    (*lease)->mapped_bytes = n;
    return static_cast<uint8_t*>(p);
  }
  if (s.mode != HostArena::State::Replaying) return nullptr;
  const size_t k = s.cursor++;
  if (k >= s.rec.size() || s.rec[k].bytes != n) {  // not the recorded step: malloc from here on, record again
    s.mode = HostArena::State::Idle;
    s.stale = true;
    return nullptr;
  }
  if (s.offset[k] < 0) return nullptr;
  const size_t at = (size_t)s.offset[k], end = at + (n + 63) / 64 * 64;
  auto it = s.live.lower_bound(at);
  if (it != s.live.end() && it->first < end) return nullptr;  // still held by a tensor kept longer than recorded
  if (it != s.live.begin() && std::prev(it)->second > at) return nullptr;
  s.live.emplace(at, end);
  ++s.served;
  lease->reset(new ArenaLease{t_step, -1, (int64_t)at, s.generation, s.block});
  return s.block.get() + at;
}

HostArena::HostArena() : st_(std::make_shared<State>()) {}
HostArena::~HostArena() = default;

size_t HostArena::block_bytes() const {
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->block_bytes;
}

int64_t HostArena::served() const {
  std::lock_guard<std::mutex> lk(st_->mu);
  return st_->served_last;
}

HostArena::Step::Step(HostArena* a) : a_(a) {
  if (!a_) return;
  State& s = *a_->st_;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.planned || s.stale) {
      s.mode = State::Recording;
      s.rec.clear();
      s.event = 0;
      s.stale = false;
      s.planned = false;
      ++s.generation;  // regions the old block's tensors hold are theirs, not the new plan's
      s.live.clear();
      s.block.reset();
      s.block_bytes = 0;
    } else {
      s.mode = State::Replaying;
      s.cursor = 0;
    }
    s.served = 0;
  }
  t_step = a_->st_;
}

HostArena::Step::~Step() {
  if (!a_) return;
  t_step.reset();
  State& s = *a_->st_;
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.mode == State::Recording) {
    std::vector<Lifetime> inside;
    std::vector<size_t> index;
    for (size_t i = 0; i < s.rec.size(); ++i)
      if (s.rec[i].last >= 0) {
        inside.push_back(s.rec[i]);
        index.push_back(i);
      }
    size_t total = 0;
    const std::vector<size_t> at = pack_lifetimes(inside, &total);
    s.offset.assign(s.rec.size(), -1);
    for (size_t j = 0; j < index.size(); ++j) s.offset[index[j]] = (int64_t)at[j];
    void* q = total ? std::aligned_alloc(64, total) : nullptr;
    if (total && !q) fail("out of memory allocating the step's block of ", total, " bytes");
    // its pages touched now, at the end of the recording step, so that the first replay does
    // not fault them in one by one inside its kernels (measured: +40 % on that step)
    if (total) std::memset(q, 0, total);
    s.block = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(q), [](uint8_t* p) { std::free(p); });
    s.block_bytes = total;
    s.planned = true;
  }
  s.served_last = s.served;
  s.mode = State::Idle;
}

}  // namespace wxe
