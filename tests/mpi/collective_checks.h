// Checks of each collective against the serial answer, shared by the MPI and NCCL test
// binaries. Every rank's input is a deterministic function of (rank, seed, index), so each
// rank computes the expected result of the whole group locally.
//
// Every rank must make the same sequence of collective calls even when a check fails, so
// checks use EXPECT (record and go on), never ASSERT between collectives: a rank that
// returned early would leave the others waiting until the ctest timeout.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "parallel/comm.h"

namespace wxe::test {

// One path for every rank (rank 0's pid), cleared before and after (with its ".tmp").
struct SharedDir {
  Communicator& c;
  std::string path;
  SharedDir(Communicator& comm, const std::string& name) : c(comm) {
    Tensor pid = Tensor::zeros(DType::I64, {1});
    pid.data<int64_t>()[0] = getpid();
    c.broadcast(pid, 0);
    path = testing::TempDir() + "wxe_mpi_" + std::to_string(pid.data<int64_t>()[0]) + "_" + name;
    clear();
  }
  ~SharedDir() { clear(); }
  void clear() {
    c.barrier();
    std::error_code ec;
    if (c.rank() == 0) std::filesystem::remove_all(path, ec), std::filesystem::remove_all(path + ".tmp", ec);
    c.barrier();
  }
};

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input for `seed`: floats in [-1, 1), int64 values beyond 32 bits.
inline Tensor input(DType dt, const Shape& s, int rank, uint64_t seed) {
  Tensor t(dt, s);
  for (int64_t i = 0; i < t.numel(); ++i) {
    uint64_t h = splitmix(seed * 0x100000001b3ull ^ ((uint64_t)rank << 40) ^ (uint64_t)i);
    double u = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    int64_t k = (int64_t)(h % 2000001) - 1000000 + ((int64_t)(rank + 1) << 33);
    switch (dt) {
      case DType::F32: t.data<float>()[i] = (float)u; break;
      case DType::F64: t.data<double>()[i] = u; break;
      case DType::I64: t.data<int64_t>()[i] = k; break;
      case DType::I32: t.data<int32_t>()[i] = (int32_t)(k >> 12); break;
      default: ADD_FAILURE() << "no test input for " << dtype_name(dt);
    }
  }
  return t;
}

inline double value(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::I64: return (double)t.data<int64_t>()[i];
    case DType::I32: return t.data<int32_t>()[i];
    default: return NAN;
  }
}

// Element-wise sum of tensors (serial reference), in double; exact for the int inputs.
inline void add_into(std::vector<double>& acc, const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) acc[i] += value(t, i);
}

inline void expect_values(const Tensor& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ((size_t)got.numel(), want.size()) << what;
  // Sums of a few values in [-1, 1): f32 rounding is ~1e-7 per add; the order of MPI's
  // additions is its own.
  double tol = got.dtype == DType::F32 ? 1e-5 : got.dtype == DType::F64 ? 1e-12 : 0.0;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    double g = value(got, (int64_t)i);
    if (!(std::fabs(g - want[i]) <= tol)) {
      ADD_FAILURE() << what << " " << dtype_name(got.dtype) << " element " << i << " of "
                    << want.size() << ": got " << g << ", expected " << want[i];
      ++bad;
    }
  }
}

inline void expect_bytes(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  EXPECT_TRUE(got.nbytes() == 0 || std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0)
      << what << " " << dtype_name(got.dtype) << " " << shape_str(got.shape)
      << ": bytes differ from the serial result";
}

inline void check_all_reduce(Communicator& c, DType dt, int64_t n, uint64_t seed) {
  Tensor t = input(dt, {n}, c.rank(), seed);
  c.all_reduce_sum(t);
  std::vector<double> want(n, 0.0);
  for (int r = 0; r < c.size(); ++r) add_into(want, input(dt, {n}, r, seed));
  expect_values(t, want, "all_reduce_sum");
}

// `rows` x `cols` per rank; cols > 1 checks that whole rows move.
// started: through start_all_gather, with another collective (an all-reduce) run before the wait
inline void check_all_gather(Communicator& c, DType dt, int64_t rows, int64_t cols,
                             uint64_t seed, bool started = false) {
  Tensor in = input(dt, {rows, cols}, c.rank(), seed);
  Tensor out(dt, {rows * c.size(), cols});
  if (started) {
    auto pending = c.start_all_gather(in, out);
    Tensor between = Tensor::from_i64({c.rank()});
    c.all_reduce_sum(between);
    pending->wait();
    EXPECT_EQ(between.data<int64_t>()[0], (int64_t)c.size() * (c.size() - 1) / 2);
  } else {
    c.all_gather(in, out);
  }
  Tensor want(dt, {rows * c.size(), cols});
  for (int r = 0; r < c.size(); ++r) {
    Tensor part = input(dt, {rows, cols}, r, seed);
    if (part.nbytes())
      std::memcpy(static_cast<uint8_t*>(want.raw()) + r * part.nbytes(), part.raw(),
                  part.nbytes());
  }
  expect_bytes(out, want, "all_gather");
}

inline void check_reduce_scatter(Communicator& c, DType dt, int64_t n, uint64_t seed) {
  Shape full{n * c.size()};
  Tensor in = input(dt, full, c.rank(), seed);
  Tensor out(dt, {n});
  c.reduce_scatter_sum(in, out);
  std::vector<double> sum(n * c.size(), 0.0);
  for (int r = 0; r < c.size(); ++r) add_into(sum, input(dt, full, r, seed));
  std::vector<double> want(sum.begin() + n * c.rank(), sum.begin() + n * (c.rank() + 1));
  expect_values(out, want, "reduce_scatter_sum");
}

inline void check_broadcast(Communicator& c, DType dt, int64_t n, uint64_t seed) {
  for (int root = 0; root < c.size(); ++root) {
    Tensor t = input(dt, {n}, c.rank(), seed + root);
    c.broadcast(t, root);
    expect_bytes(t, input(dt, {n}, root, seed + root), "broadcast");
  }
}

// Every rank sends its input to rank 0 (the "gather dp outputs" use).
inline void check_send_recv(Communicator& c, DType dt, int64_t n, uint64_t seed) {
  if (c.rank() != 0) {
    c.send(input(dt, {n}, c.rank(), seed), 0);
    return;
  }
  for (int r = 1; r < c.size(); ++r) {
    Tensor t(dt, {n});
    c.recv(t, r);
    expect_bytes(t, input(dt, {n}, r, seed), "recv");
  }
}

inline const std::vector<int64_t>& test_sizes() {
  static const std::vector<int64_t> s{0, 1, 7, 1000, 100003};
  return s;
}
inline const std::vector<DType>& test_dtypes() {
  static const std::vector<DType> d{DType::F32, DType::F64, DType::I64};
  return d;
}

// Every collective, every size and dtype.
inline void check_all_collectives(Communicator& c, uint64_t seed) {
  for (DType dt : test_dtypes()) {
    for (int64_t n : test_sizes()) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      check_all_reduce(c, dt, n, seed + 1);
      check_all_gather(c, dt, n, 1, seed + 2);
      check_reduce_scatter(c, dt, n, seed + 3);
      check_broadcast(c, dt, n, seed + 4);
      check_send_recv(c, dt, n, seed + 5);
    }
    check_all_gather(c, dt, 7, 3, seed + 6);
  }
  check_all_reduce(c, DType::I32, 1000, seed + 7);
  c.barrier();
}

}  // namespace wxe::test
