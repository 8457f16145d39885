// One block for a training step's host tensors, planned from the step before it.
//
// A training step makes the same host tensors in the same order every time (the graph, the
// memory plan and the shapes do not change), so the first step is recorded: each tensor's size,
// when it was made and when it went. The tensors made and gone within the step are then packed
// into one block (pack_lifetimes: two that live at the same time never share bytes), and the
// later steps take their tensors from it in the same order: no allocator calls, no pages freed
// and faulted in again, no fragmentation (glibc's heap kept about 150 MB more than the tensors
// held at a wxformer_v2026 step's peak). A tensor that outlives its step (a gradient
// accumulator, the parameters) is not in the block.
//
// Only the thread in a step uses it. A tensor of another size than the recorded one at that
// place ends the replay for the rest of the step (malloc) and the next step records again; a
// block region still held by a tensor (one kept longer than recorded) is never handed out
// twice: that tensor's successor comes from malloc. So a changed step costs speed, never
// correctness.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace wxe {

// A value alive from event `first` to event `last` (inclusive), `bytes` long.
struct Lifetime {
  size_t bytes = 0;
  int64_t first = 0, last = 0;
};
// Byte offsets, multiples of 64, such that two lifetimes that overlap in time never share bytes:
// the largest first, each at the lowest gap that fits. *total: the block's size. Shared with the
// inference executor's plan (engine/exec/executor.cpp).
std::vector<size_t> pack_lifetimes(const std::vector<Lifetime>& v, size_t* total);

struct ArenaLease;  // a tensor storage's hold on the recording or the block (host_arena.cpp)
struct ArenaLeaseFree {
  void operator()(ArenaLease* l) const;
};
using ArenaLeasePtr = std::unique_ptr<ArenaLease, ArenaLeaseFree>;

class HostArena {
 public:
  HostArena();
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // A step on this thread, from construction to destruction: the first records, the later ones
  // replay the plan made from the last recording.
  class Step {
   public:
    explicit Step(HostArena* a);  // null: nothing
    ~Step();
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    HostArena* a_;
  };

  size_t block_bytes() const;  // the plan's block (0: none yet)
  int64_t served() const;      // tensors the last step took from the block

  struct State;

 private:
  std::shared_ptr<State> st_;
};

// For Storage (engine/ir/tensor.cpp): host memory of n bytes from this thread's step (the block,
// or pages of its own while recording), or null (then the caller allocates it; *lease, when set,
// still records its lifetime).
uint8_t* arena_take(size_t n, ArenaLeasePtr* lease);
// Whether the lease owns the storage's bytes (the storage must not free them).
bool arena_owns(const ArenaLease& lease);

}  // namespace wxe
