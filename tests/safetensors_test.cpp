// engine/safetensors: round trip, a file written by the Python safetensors package
// (tests/data/pt/py_written.safetensors, made by models/make_pt_fixtures.py), strict header
// validation, truncation and random mutations.
#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/io/npy.h"
#include "tests/test_util.h"

namespace wxe {
namespace {

using namespace std::string_literals;
using namespace wxe::test;

std::string src(const std::string& rel) { return data_path(rel); }

// A file with the given header text and data bytes.
std::string st_file(const std::string& header, const std::string& data) {
  std::string r;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) r += (char)((n >> (8 * i)) & 0xff);
  return r + header + data;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> ts;
  std::mt19937 rng(7);
  auto fill = [&](Tensor t) {
    for (size_t i = 0; i < t.nbytes(); ++i) static_cast<uint8_t*>(t.raw())[i] = (uint8_t)rng();
    if (t.dtype == DType::Bool)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] &= 1;
    return t;
  };
  ts.emplace_back("layers.0.weight", fill(Tensor(DType::F32, {3, 4})));
  ts.emplace_back("b16", fill(Tensor(DType::BF16, {5})));
  ts.emplace_back("h", fill(Tensor(DType::F16, {2, 1, 3})));
  ts.emplace_back("mask", fill(Tensor(DType::Bool, {3})));  // 1-byte: misaligns what follows
  ts.emplace_back("d", fill(Tensor(DType::F64, {2})));
  ts.emplace_back("i64", fill(Tensor(DType::I64, {2, 2})));
  ts.emplace_back("i32", fill(Tensor(DType::I32, {1})));
  ts.emplace_back("i8", fill(Tensor(DType::I8, {4})));
  ts.emplace_back("u8", fill(Tensor(DType::U8, {2, 3})));
  ts.emplace_back("scalar", Tensor::scalar_f32(1.5f));
  ts.emplace_back("empty", Tensor(DType::F32, {0, 3}));
  ts.emplace_back("quote\"back\\slash\ttab \xc3\xa9\xf0\x9f\x8c\x8d", fill(Tensor(DType::F32, {2})));
  return ts;
}

TEST(Safetensors, RoundTrip) {
  auto ts = sample_tensors();
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"},
                                             {"note", "line\nbreak \"q\" \xe2\x82\xac"}};
  std::string path = tmp_path("st_rt.safetensors");
  write_safetensors(path, ts, meta);
  std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | (uint8_t)bytes[i];
  EXPECT_EQ((8 + n) % 8, 0u);
  std::map<std::string, std::string> got_meta;
  auto got = read_safetensors(path, &got_meta);
  ASSERT_EQ(got.size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(got[i].first, ts[i].first);
    EXPECT_TRUE(same(got[i].second, ts[i].second)) << ts[i].first;
  }
  EXPECT_EQ(got_meta, meta);
  // No tensors, no metadata.
  write_safetensors(path, {});
  EXPECT_TRUE(read_safetensors(path, &got_meta).empty());
  EXPECT_TRUE(got_meta.empty());
  std::remove(path.c_str());
}

TEST(Safetensors, ReadsFileWrittenByPythonSafetensors) {
  std::map<std::string, std::string> meta;
  auto got = read_safetensors(src("tests/data/pt/py_written.safetensors"), &meta);
  EXPECT_EQ(meta["format"], "pt");
  EXPECT_EQ(meta["source"], "make_pt_fixtures.py");
  // Same tensors as bare.pt; values from PyTorch (.npy, bf16 as float32).
  std::ifstream f(src("tests/data/pt/bare.expect.txt"));
  std::string line;
  size_t count = 0;
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string key, dtype, shape, npy;
    std::getline(ss, key, '\t');
    std::getline(ss, dtype, '\t');
    std::getline(ss, shape, '\t');
    std::getline(ss, npy, '\t');
    auto it = std::find_if(got.begin(), got.end(), [&](auto& p) { return p.first == key; });
    ASSERT_NE(it, got.end()) << key;
    EXPECT_EQ(dtype_name(it->second.dtype), dtype) << key;
    Tensor ref = read_npy(src("tests/data/pt/" + npy));
    Tensor t = it->second.dtype == DType::BF16 ? it->second.to_f32() : it->second;
    EXPECT_TRUE(same(t, ref)) << key;
    ++count;
  }
  EXPECT_EQ(count, got.size());
}

TEST(Safetensors, WriteRejectsBadNames) {
  std::string path = tmp_path("st_bad.safetensors");
  Tensor t = Tensor::scalar_f32(1);
  EXPECT_THROW(write_safetensors(path, {{"a", t}, {"a", t}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_THROW(write_safetensors(path, {{"\xff", t}}), Error);
}

TEST(Safetensors, MalformedHeadersAreErrors) {
  const std::string f4(16, '\1');  // data for a F32 [4] tensor
  const std::string ok = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string path = tmp_path("st_m.safetensors");
  spit(path, st_file(ok, f4));
  ASSERT_EQ(read_safetensors(path).size(), 1u);
  const std::pair<std::string, std::string> cases[] = {
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", "'w'"},
      {R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", "'w'"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,20]}})", "outside"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", "overlap"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", "gap"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "cover"},
      {R"({"w":{"dtype":"F31","shape":[4],"data_offsets":[0,16]}})", "dtype"},
      {R"({"w":{"dtype":"I16","shape":[8],"data_offsets":[0,16]}})", "dtype"},
      {R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16.0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", "data_offsets"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", "too large"},
      {R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,16]}})", "shape"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "duplicate"},
      {R"({"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "__metadata__"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],}})", "malformed"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}} x)", "malformed"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"t":true})", "tensor 't': header entry is not an object"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"t":null})", "tensor 't': header entry is not an object"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"t":nul})", "malformed"},
      {R"({"w":{"dtype":"F32","shape":[04],"data_offsets":[0,16]}})", "malformed"},
      {R"({"w\q":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "malformed"},
      {R"({"w\ud800":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "malformed"},
      {"{\"w\x01\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "malformed"},
      {"{\"w\xff\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", "UTF-8"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})", "malformed"},
      {R"([1,2])", "not a JSON object"},
      {std::string(100, '[') + std::string(100, ']'), "deeply"},
      {"", "malformed"},
  };
  for (auto& [header, want] : cases) {
    spit(path, st_file(header, f4));
    std::string e = error_of([&] { read_safetensors(path); });
    EXPECT_NE(e.find(want), std::string::npos) << header << ": " << e;
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // Header size past the end of the file / huge.
  std::string bad = st_file(ok, f4);
  bad[0] = '\x7f';
  spit(path, bad);
  EXPECT_NE(error_of([&] { read_safetensors(path); }).find("header size"), std::string::npos);
  bad[7] = '\x7f';
  spit(path, bad);
  EXPECT_THROW(read_safetensors(path), Error);
  spit(path, "abc");
  EXPECT_THROW(read_safetensors(path), Error);
  EXPECT_THROW(read_safetensors(tmp_path("st_does_not_exist")), Error);
}

TEST(Safetensors, TruncatedFilesAreErrors) {
  std::string path = tmp_path("st_t.safetensors");
  write_safetensors(path, sample_tensors(), {{"format", "pt"}});
  for (const std::string& bytes : {slurp(path), slurp(src("tests/data/pt/py_written.safetensors"))})
    for (size_t n = 0; n < bytes.size(); ++n) {
      spit(path, bytes.substr(0, n));
      EXPECT_THROW(read_safetensors(path), Error) << "cut at " << n;
    }
}

TEST(Safetensors, MutationFuzzNeverCrashes) {
  auto t0 = std::chrono::steady_clock::now();
  std::string path = tmp_path("st_f.safetensors");
  write_safetensors(path, sample_tensors(), {{"format", "pt"}});
  std::vector<std::string> seeds = {slurp(path), slurp(src("tests/data/pt/py_written.safetensors"))};
  std::mt19937 rng(99);
  int ok = 0, errors = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string m = seeds[it % 2];
    int ops = 1 + rng() % 3;
    for (int k = 0; k < ops; ++k) {
      // Mostly hit the header (the data bytes are opaque).
      uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | (uint8_t)m[i];
      size_t span = (size_t)std::min<uint64_t>(m.size(), 8 + std::min<uint64_t>(n, m.size()));
      size_t at = rng() % 4 ? rng() % std::max<size_t>(span, 1) : rng() % m.size();
      switch (rng() % 4) {
        case 0: m[at] ^= (char)(1 << (rng() % 8)); break;
        case 1: m[at] = "{}[]\",:0123456789-.e\\u"[rng() % 23]; break;
        case 2: m.insert(m.begin() + at, (char)rng()); break;
        case 3: m.erase(at, 1 + rng() % 3); break;
      }
      if (m.empty()) m = "x";
    }
    spit(path, m);
    try {
      read_safetensors(path);
      ++ok;
    } catch (const Error& e) {
      ++errors;
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("safetensors mutation fuzz: %d loaded, %d errors, %.2f s\n", ok, errors, secs);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace wxe

namespace wxe {
namespace {

// A tensor-parallel rank reads only its block of a sharded tensor; the rest stays zero.
TEST(Safetensors, SlicedReadTakesOnlyTheBlock) {
  Tensor w = test::randn({4, 6}, 3);
  std::string path = tmp_path("st_sliced.safetensors");
  write_safetensors(path, {{"w", w}, {"b", test::randn({4}, 4)}});
  for (int axis : {0, 1})
    for (int index : {0, 1}) {
      std::map<std::string, TensorSlice> slices = {{"w", {axis, 2, index}}};
      auto got = read_safetensors(path, nullptr, &slices);
      const Tensor& t = got[0].first == "w" ? got[0].second : got[1].second;
      ASSERT_EQ(t.shape, w.shape);
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 6; ++c) {
          bool mine = (axis == 0 ? r / 2 : c / 3) == index;
          EXPECT_EQ(t.data<float>()[r * 6 + c], mine ? w.data<float>()[r * 6 + c] : 0.f) << axis << index;
        }
    }
  std::map<std::string, TensorSlice> bad = {{"w", {1, 4, 0}}};  // 6 columns do not split in 4
  EXPECT_NE(error_of([&] { read_safetensors(path, nullptr, &bad); }).find("cannot be split"), std::string::npos);
}

}  // namespace
}  // namespace wxe
