// Tensor-parallel ranks inside one test process: each rank a coroutine (ucontext) on the
// calling thread, with a communicator whose collectives meet in memory. A rank runs until it
// waits in a collective, then the next one runs; the last to arrive completes the collective.
//
// Coroutines rather than threads: every rank then runs on the one thread, so the oneDNN fast
// path (forward and the registered backward kernels) can run, which is neither safe from
// several threads at once (one stream per process) nor from a thread other than the one that
// created a primitive (oneDNN 2.6 keeps a convolution backward's scratchpad with that thread).
// The thread's tp communicator (parallel/collective_ops.h) is switched with the rank.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "parallel/collective_ops.h"
#include "parallel/comm.h"

namespace wxe::test {

// A rank's copy of a graph gets its own parameters, as in its own process (the graph's copy
// shares them with the original otherwise).
inline void own_parameters(Graph& g) {
  for (Value& v : g.values)
    if (v.is_param && v.is_const()) v.constant = std::make_shared<Tensor>(v.constant->clone());
}

class RankGroup;

class RankComm : public Communicator {
 public:
  RankComm(RankGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce_sum(Tensor& t) override;  // float32 or float64; summed in double, in rank order
  // Through the one meeting point: zeros but this rank's block, summed (exact); the sum, this
  // rank's block of it. Each counts as one collective call (gathers / reduce_scatters too).
  void all_gather(const Tensor& in, Tensor& out) override;
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor&, int) override { fail("RankComm: broadcast unused"); }
  void barrier() override {
    Tensor none(DType::F32, {0});
    all_reduce_sum(none);
  }
  [[noreturn]] void abort(const std::string& m, int) override { fail(m); }
  int calls = 0;  // collectives this rank took part in
  int gathers = 0, reduce_scatters = 0;

 private:
  RankGroup& g_;
  int rank_;
};

class RankGroup {
 public:
  using Body = std::function<void(int rank, RankComm& comm)>;

  // Runs body for every rank of `n`; returns each rank's error ("" when it finished). Ranks
  // still waiting in a collective that another rank, finished or failed, never reaches are
  // abandoned with an error saying so (a hang under MPI).
  static std::vector<std::string> run(int n, const Body& body) {
    RankGroup g(n, body);
    g.schedule();
    std::vector<std::string> errors;
    for (auto& r : g.ranks_) errors.push_back(r.error);
    return errors;
  }

  int size() const { return (int)ranks_.size(); }

  void all_reduce(int r, Tensor& t) {
    WXE_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, "RankComm: float32 or float64 only");
    const bool f64 = t.dtype == DType::F64;
    if (arrived_ == 0) acc_.assign(t.numel(), 0.0);
    WXE_CHECK((int64_t)acc_.size() == t.numel(), "RankComm: rank ", r, " all-reduces ", t.numel(),
              " elements, another rank ", acc_.size());
    for (int64_t i = 0; i < t.numel(); ++i) acc_[i] += f64 ? t.data<double>()[i] : t.data<float>()[i];
    const int gen = gen_;
    if (++arrived_ == size()) {
      sum_.assign(acc_.begin(), acc_.end());
      arrived_ = 0;
      ++gen_;
    }
    while (gen_ == gen) yield(r);
    for (int64_t i = 0; i < t.numel(); ++i)  // before this rank's next collective
      if (f64) t.data<double>()[i] = sum_[i];
      else t.data<float>()[i] = (float)sum_[i];
  }

 private:
  struct Rank {
    ucontext_t ctx;
    void* stack = nullptr;
    bool done = false, waiting = false;
    std::string error;
    std::unique_ptr<RankComm> comm;
  };

  static constexpr size_t kStack = 64 << 20;  // reserved, touched on demand; a guard page below

  RankGroup(int n, const Body& body) : body_(body), ranks_(n) {
    for (int r = 0; r < n; ++r) ranks_[r].comm = std::make_unique<RankComm>(*this, r);
  }
  ~RankGroup() {
    for (auto& r : ranks_)
      if (r.stack) munmap(r.stack, kStack);
  }

  static RankGroup*& current() {
    static thread_local RankGroup* g = nullptr;
    return g;
  }
  static int& current_rank() {
    static thread_local int r = 0;
    return r;
  }

  static void entry() {
    RankGroup* g = current();
    int r = current_rank();
    try {
      g->body_(r, *g->ranks_[r].comm);
    } catch (const std::exception& e) {
      g->ranks_[r].error = e.what();
    }
    g->ranks_[r].done = true;
  }  // returns to the scheduler (uc_link)

  void yield(int r) {
    ranks_[r].waiting = true;
    swapcontext(&ranks_[r].ctx, &scheduler_);
  }

  void schedule() {
    const long page = sysconf(_SC_PAGESIZE);
    for (auto& r : ranks_) {
      r.stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      WXE_CHECK(r.stack != MAP_FAILED, "RankGroup: cannot map a stack");
      mprotect(r.stack, page, PROT_NONE);  // overflow faults instead of corrupting
      getcontext(&r.ctx);
      r.ctx.uc_stack.ss_sp = r.stack;
      r.ctx.uc_stack.ss_size = kStack;
      r.ctx.uc_link = &scheduler_;
      makecontext(&r.ctx, entry, 0);
    }
    RankGroup* outer = current();
    while (true) {
      bool live = false, progress = false;
      const int gen = gen_;
      for (int r = 0; r < size(); ++r) {
        if (ranks_[r].done) continue;
        live = true;
        ranks_[r].waiting = false;
        current() = this;
        current_rank() = r;
        set_tp_communicator(ranks_[r].comm.get());
        set_domain_communicator(ranks_[r].comm.get());  // a test mesh is one group: tp or domain
        swapcontext(&scheduler_, &ranks_[r].ctx);
        progress = progress || !ranks_[r].waiting;  // finished
      }
      set_tp_communicator(nullptr);
      set_domain_communicator(nullptr);
      if (!live) break;
      if (!progress && gen_ == gen) {  // every live rank waits for one that never comes
        for (auto& r : ranks_)
          if (!r.done) r.error = "waits in a collective that another rank never reaches";
        break;
      }
    }
    current() = outer;
  }

  Body body_;
  std::vector<Rank> ranks_;
  ucontext_t scheduler_;
  int arrived_ = 0, gen_ = 0;
  std::vector<double> acc_;
  std::vector<double> sum_;
};

inline int RankComm::size() const { return g_.size(); }
inline void RankComm::all_reduce_sum(Tensor& t) {
  ++calls;
  g_.all_reduce(rank_, t);
}
inline void RankComm::all_gather(const Tensor& in, Tensor& out) {
  WXE_CHECK(in.dtype == DType::F32 && out.numel() == in.numel() * size(), "RankComm: all_gather sizes");
  Tensor all = Tensor::zeros(DType::F32, {out.numel()});
  std::memcpy(all.data<float>() + rank_ * in.numel(), in.raw(), in.nbytes());
  g_.all_reduce(rank_, all);
  std::memcpy(out.raw(), all.raw(), out.nbytes());
  ++calls;
  ++gathers;
}
inline void RankComm::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  WXE_CHECK(in.dtype == DType::F32 && in.numel() == out.numel() * size(), "RankComm: reduce_scatter sizes");
  Tensor all = in.clone();
  g_.all_reduce(rank_, all);
  std::memcpy(out.raw(), all.data<float>() + rank_ * out.numel(), out.nbytes());
  ++calls;
  ++reduce_scatters;
}

}  // namespace wxe::test
