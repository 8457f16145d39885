#include "parallel/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace wxe {
namespace {

bool g_we_initialized = false;
bool g_finalize_registered = false;
int g_world_rank = 0;
int g_local_rank = 0;
int64_t g_max_count = INT_MAX;

// MPI_COMM_WORLD keeps MPI's default handler (errors are fatal and end the job, which
// cannot hang), so a failing call rarely returns; if a user installed MPI_ERRORS_RETURN
// the code still becomes a wxe::Error.
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(call, " failed: ", std::string(msg, len));
}
#define WXE_MPI(call) mpi_check((call), #call)

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I64: return MPI_INT64_T;
    case DType::I32: return MPI_INT32_T;
    default: fail("MPI: no sum for dtype ", dtype_name(t));
  }
}

bool is_half(DType t) { return t == DType::F16 || t == DType::BF16; }

// Calls f(offset, count) over [0, n) in pieces of at most g_max_count; at least one call,
// so both ends of a send/recv agree on the number of messages even for n = 0.
template <class F>
void chunked(int64_t n, F f) {
  int64_t off = 0;
  do {
    int64_t c = std::min(n - off, g_max_count);
    f(off, (int)c);
    off += c;
  } while (off < n);
}

}  // namespace

// ---- MpiRuntime

bool MpiRuntime::launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

bool MpiRuntime::active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

bool MpiRuntime::init() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return false;
  if (!init) {
    if (!launched()) return false;
    int provided = 0;
    WXE_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    g_we_initialized = true;
  }
  if (!g_finalize_registered) {
    g_finalize_registered = true;
    WXE_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank));
    // Node-local rank, computed once here where every rank is known to take part.
    MPI_Comm node;
    WXE_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_world_rank,
                                MPI_INFO_NULL, &node));
    WXE_MPI(MPI_Comm_rank(node, &g_local_rank));
    MPI_Comm_free(&node);
    std::atexit([] { MpiRuntime::finalize(); });
  }
  return true;
}

void MpiRuntime::finalize() {
  if (!g_we_initialized) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

int MpiRuntime::world_rank() { return active() ? g_world_rank : 0; }
int MpiRuntime::local_rank() { return active() ? g_local_rank : 0; }

[[noreturn]] void abort_job(const std::string& message, int code) {
  bool mpi = MpiRuntime::active();
  int rank = 0;
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fflush(stdout);
  std::fprintf(stderr, "wxe: error (rank %d): %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // no MPI, or MPI_Abort returned (it should not)
}

std::unique_ptr<Communicator> world_comm() {
  if (!MpiRuntime::init()) return std::make_unique<LocalComm>();
  // A private copy of the world, so our messages never match anyone else's.
  MPI_Comm dup;
  WXE_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiComm>(dup, true);
}

// ---- MpiComm

void MpiComm::set_max_count(int64_t n) {
  WXE_CHECK(n >= 1 && n <= INT_MAX, "MpiComm::set_max_count: ", n, " is not in [1, INT_MAX]");
  g_max_count = n;
}
int64_t MpiComm::max_count() { return g_max_count; }

MpiComm::MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  WXE_CHECK(MpiRuntime::active(), "MpiComm: MPI is not initialized");
  WXE_MPI(MPI_Comm_rank(comm_, &rank_));
  WXE_MPI(MPI_Comm_size(comm_, &size_));
}

MpiComm::~MpiComm() {
  // After MPI_Finalize (at exit) freeing is not allowed and not needed.
  if (owned_ && MpiRuntime::active()) MPI_Comm_free(&comm_);
}

void MpiComm::all_reduce_sum(Tensor& t) {
  comm_check::all_reduce(t);
  if (is_half(t.dtype)) {  // MPI has no 16-bit float sum: sum in f32
    Tensor f = t.to_f32();
    all_reduce_sum(f);
    convert(f, t);
    return;
  }
  MPI_Datatype type = mpi_type(t.dtype);
  size_t es = dtype_size(t.dtype);
  uint8_t* p = static_cast<uint8_t*>(t.raw());
  chunked(t.numel(), [&](int64_t off, int c) {
    WXE_MPI(MPI_Allreduce(MPI_IN_PLACE, p + off * es, c, type, MPI_SUM, comm_));
  });
}

void MpiComm::all_gather(const Tensor& in, Tensor& out) {
  comm_check::all_gather(in, out, size_);
  int64_t bytes = (int64_t)in.nbytes();
  auto* dst = static_cast<uint8_t*>(out.raw());
  if (bytes <= g_max_count) {
    WXE_MPI(MPI_Allgather(in.raw(), (int)bytes, MPI_BYTE, dst, (int)bytes, MPI_BYTE, comm_));
    return;
  }
  // Blocks too big for one count: each rank broadcasts its block in pieces.
  for (int r = 0; r < size_; ++r) {
    uint8_t* block = dst + r * bytes;
    if (r == rank_) std::memcpy(block, in.raw(), bytes);
    bcast_bytes(block, bytes, r);
  }
}

namespace {

struct MpiPending : PendingCollective {
  MPI_Request req = MPI_REQUEST_NULL;
  void wait() override { WXE_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE)); }
  ~MpiPending() override {
    if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);  // never left running over freed buffers
  }
};

}  // namespace

std::unique_ptr<PendingCollective> MpiComm::start_all_gather(const Tensor& in, Tensor& out) {
  comm_check::all_gather(in, out, size_);
  const int64_t bytes = (int64_t)in.nbytes();
  if (bytes > g_max_count) return Communicator::start_all_gather(in, out);  // in pieces, at once
  auto p = std::make_unique<MpiPending>();
  WXE_MPI(MPI_Iallgather(in.raw(), (int)bytes, MPI_BYTE, out.raw(), (int)bytes, MPI_BYTE, comm_, &p->req));
  return p;
}

void MpiComm::reduce_scatter_sum(const Tensor& in, Tensor& out) {
  comm_check::reduce_scatter(in, out, size_);
  if (is_half(in.dtype)) {
    Tensor fin = in.to_f32(), fout(DType::F32, out.shape);
    reduce_scatter_sum(fin, fout);
    convert(fout, out);
    return;
  }
  MPI_Datatype type = mpi_type(in.dtype);
  size_t es = dtype_size(in.dtype);
  int64_t n = out.numel();
  auto* src = static_cast<const uint8_t*>(in.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  if (n <= g_max_count) {
    WXE_MPI(MPI_Reduce_scatter_block(src, dst, (int)n, type, MPI_SUM, comm_));
    return;
  }
  // Blocks too big for one count: block r is reduced onto rank r in pieces.
  for (int r = 0; r < size_; ++r) {
    chunked(n, [&](int64_t off, int c) {
      WXE_MPI(MPI_Reduce(src + (r * n + off) * es, r == rank_ ? dst + off * es : nullptr, c,
                         type, MPI_SUM, r, comm_));
    });
  }
}

void MpiComm::bcast_bytes(uint8_t* p, size_t n, int root) {
  chunked((int64_t)n, [&](int64_t off, int c) {
    WXE_MPI(MPI_Bcast(p + off, c, MPI_BYTE, root, comm_));
  });
}

void MpiComm::broadcast(Tensor& t, int root) {
  WXE_CHECK(t.defined(), "broadcast: tensor has no storage");
  comm_check::root("broadcast", root, size_);
  bcast_bytes(static_cast<uint8_t*>(t.raw()), t.nbytes(), root);
}

void MpiComm::barrier() { WXE_MPI(MPI_Barrier(comm_)); }

// Messages between two ranks on one communicator and tag arrive in order (MPI's
// non-overtaking rule), so the pieces of a large tensor need no sequence numbers.
void MpiComm::send(const Tensor& t, int dst) {
  WXE_CHECK(t.defined(), "send: tensor has no storage");
  comm_check::peer("send", dst, rank_, size_);
  auto* p = static_cast<const uint8_t*>(t.raw());
  chunked((int64_t)t.nbytes(), [&](int64_t off, int c) {
    WXE_MPI(MPI_Send(p + off, c, MPI_BYTE, dst, 0, comm_));
  });
}

void MpiComm::recv(Tensor& t, int src) {
  WXE_CHECK(t.defined(), "recv: tensor has no storage");
  comm_check::peer("recv", src, rank_, size_);
  auto* p = static_cast<uint8_t*>(t.raw());
  chunked((int64_t)t.nbytes(), [&](int64_t off, int c) {
    MPI_Status st;
    WXE_MPI(MPI_Recv(p + off, c, MPI_BYTE, src, 0, comm_, &st));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    WXE_CHECK(got == c, "recv from rank ", src, ": got ", got, " bytes, expected ", c,
              " (tensor ", dtype_name(t.dtype), " ", shape_str(t.shape), ")");
  });
}

std::unique_ptr<Communicator> MpiComm::split(int color, int key) {
  WXE_CHECK(color >= 0, "split: color ", color, " must be >= 0");
  MPI_Comm sub;
  WXE_MPI(MPI_Comm_split(comm_, color, key, &sub));
  return std::make_unique<MpiComm>(sub, true);
}

void MpiComm::abort(const std::string& message, int code) { abort_job(message, code); }

}  // namespace wxe
