// parallel/sharded_checkpoint: pieces of N simulated ranks written from one process
// (write_sharded), read back as blocks of other meshes and compared element by element with
// the original (an index computation independent of the library's box copy); uneven ZeRO
// splits; corruption, gaps and unfinished saves detected; the directory swap; convert round
// trip bit for bit.
#include "parallel/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/io/safetensors.h"
#include "tests/test_util.h"

namespace wxe {
namespace {

namespace fs = std::filesystem;
using namespace wxe::test;

// A checkpoint directory in the test temp folder, removed (with DIR.tmp) at the end.
struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) : path(tmp_path(name)) { clear(); }
  ~TmpDir() { clear(); }
  void clear() const {
    std::error_code ec;
    fs::remove_all(path, ec);
    fs::remove_all(path + ".tmp", ec);
    fs::remove_all(path + ".old", ec);
  }
  std::string operator/(const std::string& f) const { return path + "/" + f; }
};

// Restores the default chunk size when a test that changed it ends.
struct ChunkBytes {
  uint64_t saved = sharded_chunk_bytes();
  explicit ChunkBytes(uint64_t b) { set_sharded_chunk_bytes(b); }
  ~ChunkBytes() { set_sharded_chunk_bytes(saved); }
};

// got must be block s of orig under the rule [i*c, min(n, (i+1)*c)), c = ceil(n / parts):
// checked per element from its multi-index, by hand.
void expect_block(const Tensor& orig, const TensorSlice& s, const Tensor& got) {
  ASSERT_EQ(got.dtype, orig.dtype);
  ASSERT_EQ((int)got.shape.size(), orig.rank());
  int64_t begin = 0, len = 0;
  if (s.parts > 1) {
    int64_t n = orig.shape[s.axis], c = (n + s.parts - 1) / s.parts;
    begin = std::min(n, s.index * c);
    len = std::min(n, (s.index + 1) * c) - begin;
  }
  for (int d = 0; d < orig.rank(); ++d)
    ASSERT_EQ(got.shape[d], s.parts > 1 && d == s.axis ? len : orig.shape[d]) << "dim " << d;
  const size_t es = dtype_size(orig.dtype);
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    int64_t rest = i, src = 0, mul = 1;  // the element's index in orig
    for (int d = got.rank() - 1; d >= 0; --d) {
      int64_t x = rest % got.shape[d];
      rest /= got.shape[d];
      if (s.parts > 1 && d == s.axis) x += begin;
      src += x * mul;
      mul *= orig.shape[d];
    }
    if (std::memcmp((const uint8_t*)got.raw() + i * es, (const uint8_t*)orig.raw() + src * es, es) != 0) {
      ADD_FAILURE() << "element " << i << " of block " << s.index << "/" << s.parts << " along " << s.axis;
      ++bad;
    }
  }
}

Tensor iota_i64(Shape s) {
  Tensor t(DType::I64, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = 1000000007LL * i + 3;
  return t;
}

// The pieces of `ranks` simulated ranks: each tensor split into `ranks` blocks along `axis`
// (scalars, 1-D tensors and those without that axis replicated: owned by rank 0, the other
// ranks hold non-owner copies).
std::vector<std::vector<ShardPiece>> split(const std::vector<std::pair<std::string, Tensor>>& ts, int ranks, int axis) {
  std::vector<std::vector<ShardPiece>> by_rank(ranks);
  for (auto& [name, t] : ts)
    for (int r = 0; r < ranks; ++r) {
      if (t.rank() < 2 || t.rank() <= axis) {
        by_rank[r].push_back({name, t.shape, TensorSlice{}, t, r == 0});
      } else {
        TensorSlice s{axis, ranks, r};
        by_rank[r].push_back({name, t.shape, s, take_block(t, s)});
      }
    }
  return by_rank;
}

std::vector<std::pair<std::string, Tensor>> model_tensors() {
  return {{"A.weight", randn({6, 8}, 1)},
          {"B.conv", randn({4, 3, 5, 6}, 2)},
          {"C.bias", randn({5}, 3)},
          {"D.steps", iota_i64({7, 3})},
          {"E.scalar", Tensor::scalar_f32(2.5f)}};
}

TEST(ShardedCheckpoint, BlockRule) {
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(block_range(8, 2, 1), P(4, 8));
  EXPECT_EQ(block_range(5, 4, 0), P(0, 2));
  EXPECT_EQ(block_range(5, 4, 2), P(4, 5));
  EXPECT_EQ(block_range(5, 4, 3), P(5, 5));  // empty
  EXPECT_EQ(block_range(10, 3, 2), P(8, 10));
  EXPECT_EQ(block_range(1, 2, 1), P(1, 1));
  EXPECT_EQ(block_shape({6, 8}, {1, 3, 2}), Shape({6, 2}));
  EXPECT_EQ(block_shape({6, 8}, {1, 1, 0}), Shape({6, 8}));
  Tensor t = randn({7, 5}, 4);
  for (int parts : {1, 2, 3, 4, 8})
    for (int axis : {0, 1})
      for (int i = 0; i < parts; ++i) expect_block(t, {axis, parts, i}, take_block(t, {axis, parts, i}));
}

// Saved at 2 ranks along axis 0, read at 1, 3, 4 parts along axis 0 and 2 parts along axis
// 1 (and other axes of the rank-4 tensor), with whole-piece reads and with 16-byte chunks
// (reads of partial pieces, each chunk verified).
TEST(ShardedCheckpoint, ReadsAnyBlockOfA2RankSave) {
  auto ts = model_tensors();
  for (uint64_t chunk : {uint64_t(4) << 20, uint64_t(16)}) {
    SCOPED_TRACE(chunk);
    ChunkBytes cb(chunk);
    TmpDir d("sc_2rank");
    write_sharded(d.path, split(ts, 2, 0), {{"step", "10"}, {"note", "tp2"}});
    ASSERT_TRUE(is_sharded_checkpoint(d.path));
    EXPECT_TRUE(fs::exists(d / "rank_00000.safetensors") && fs::exists(d / "rank_00001.safetensors"));
    EXPECT_FALSE(fs::exists(d.path + ".tmp"));
    ShardedCheckpoint ck(d.path);
    EXPECT_EQ(ck.world(), 2);
    EXPECT_EQ(ck.metadata().at("step"), "10");
    std::vector<std::string> names;
    for (auto& kv : ts) names.push_back(kv.first);
    EXPECT_EQ(ck.names(), names);
    EXPECT_EQ(ck.stored_split("A.weight").parts, 2);
    EXPECT_EQ(ck.stored_split("C.bias").parts, 1);
    EXPECT_EQ(ck.stored_split("D.steps").axis, 0);
    for (auto& [name, t] : ts) {
      SCOPED_TRACE(name);
      EXPECT_EQ(ck.shape(name), t.shape);
      EXPECT_EQ(ck.dtype(name), t.dtype);
      expect_block(t, {}, ck.read(name));
      for (int axis = 0; axis < t.rank(); ++axis)
        for (int parts : {1, 2, 3, 4})
          for (int i = 0; i < parts; ++i) expect_block(t, {axis, parts, i}, ck.read(name, {axis, parts, i}));
    }
  }
}

// Stored along one axis with uneven blocks, read along another.
TEST(ShardedCheckpoint, StoredAlongOtherAxis) {
  ChunkBytes cb(24);
  Tensor a = randn({7, 9}, 5), b = randn({3, 5, 2, 7}, 6);
  for (int stored_axis : {1, 3}) {
    SCOPED_TRACE(stored_axis);
    TmpDir d("sc_axis");
    std::vector<std::pair<std::string, Tensor>> ts = {{"b", b}};
    if (stored_axis == 1) ts.push_back({"a", a});
    write_sharded(d.path, split(ts, 3, stored_axis));
    ShardedCheckpoint ck(d.path);
    for (auto& [name, t] : ts)
      for (int axis = 0; axis < t.rank(); ++axis)
        for (int parts : {1, 2, 4})
          for (int i = 0; i < parts; ++i) expect_block(t, {axis, parts, i}, ck.read(name, {axis, parts, i}));
  }
}

// ZeRO-1 moments: flat tensors split into dp uneven blocks (empty ones too), read at other dp.
TEST(ShardedCheckpoint, ZeroFlatUnevenSplits) {
  ChunkBytes cb(8);
  for (int64_t n : {1, 10, 13}) {
    Tensor m = randn({n}, 7 + (unsigned)n);
    for (int dp_saved : {2, 4, 8}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " saved at dp " << dp_saved);
      TmpDir d("sc_zero");
      std::vector<std::vector<ShardPiece>> by_rank(dp_saved);
      for (int r = 0; r < dp_saved; ++r) by_rank[r].push_back({"exp_avg.w", {n}, {0, dp_saved, r}, take_block(m, {0, dp_saved, r})});
      write_sharded(d.path, by_rank);
      ShardedCheckpoint ck(d.path);
      for (int dp : {1, 2, 3, 4, 8})
        for (int i = 0; i < dp; ++i) expect_block(m, {0, dp, i}, ck.read("exp_avg.w", {0, dp, i}));
    }
  }
}

// The byte offset of a tensor's data in a rank file.
uint64_t data_offset(const std::string& file, const std::string& name) {
  for (auto& e : read_safetensors_header(file))
    if (e.name == name) return e.offset;
  ADD_FAILURE() << "no " << name << " in " << file;
  return 0;
}

void flip_byte(const std::string& path, uint64_t off) {
  std::string bytes = slurp(path);
  bytes[off] ^= 0x40;
  spit(path, bytes);
}

TEST(ShardedCheckpoint, ChecksumMismatchNamesTheFile) {
  auto ts = model_tensors();
  {
    TmpDir d("sc_crc");
    write_sharded(d.path, split(ts, 2, 0));
    flip_byte(d / "rank_00001.safetensors", data_offset(d / "rank_00001.safetensors", "A.weight") + 5);
    ShardedCheckpoint ck(d.path);
    std::string e = error_of([&] { ck.read("A.weight"); });
    EXPECT_NE(e.find("rank_00001.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("'A.weight'"), std::string::npos) << e;
    EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
    EXPECT_EQ(error_of([&] { ck.read("A.weight", {0, 2, 0}); }), "<no error>");  // rank 0's piece is intact
    EXPECT_EQ(error_of([&] { ck.read("B.conv"); }), "<no error>");
  }
  {  // with chunks, a read verifies (and needs) only the chunks it touches
    ChunkBytes cb(16);
    TmpDir d("sc_crc_chunks");
    write_sharded(d.path, split(ts, 2, 0));
    // A.weight's piece 1 is rows 3..5 of 8 floats (96 bytes): corrupt a byte of row 5
    flip_byte(d / "rank_00001.safetensors", data_offset(d / "rank_00001.safetensors", "A.weight") + 2 * 32 + 4);
    ShardedCheckpoint ck(d.path);
    EXPECT_NE(error_of([&] { ck.read("A.weight"); }).find("checksum mismatch in bytes [64, 80)"), std::string::npos);
    EXPECT_NE(error_of([&] { ck.read("A.weight", {0, 3, 2}); }).find("rank_00001.safetensors"), std::string::npos);
    EXPECT_EQ(error_of([&] { ck.read("A.weight", {0, 6, 3}); }), "<no error>");  // row 3 only
    expect_block(ts[0].second, {0, 6, 3}, ck.read("A.weight", {0, 6, 3}));
  }
}

// Replaces the first occurrence of `from` in the index.
void edit_index(const TmpDir& d, const std::string& from, const std::string& to) {
  std::string idx = slurp(d / "index.json");
  size_t at = idx.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  spit(d / "index.json", idx.replace(at, from.size(), to));
}

TEST(ShardedCheckpoint, GapsAndMismatchesNamed) {
  Tensor a = randn({6, 8}, 8);
  auto pieces = split({{"A", a}}, 2, 0);
  {  // a piece removed from the index: a gap
    TmpDir d("sc_gap");
    write_sharded(d.path, pieces);
    std::string idx = slurp(d / "index.json");
    size_t b = idx.find(",\n    {\"file\": \"rank_00001.safetensors\"");
    ASSERT_NE(b, std::string::npos);
    idx.erase(b, idx.find('}', b) + 1 - b);
    spit(d / "index.json", idx);
    std::string e = error_of([&] { ShardedCheckpoint ck(d.path); });
    EXPECT_NE(e.find("index.json: tensor 'A'"), std::string::npos) << e;
    EXPECT_NE(e.find("no piece holds block 1 of 2 along axis 0 (a gap"), std::string::npos) << e;
  }
  {  // the index's shape differs from the file's
    TmpDir d("sc_shape");
    write_sharded(d.path, pieces);
    edit_index(d, "\"shape\": [6, 8]", "\"shape\": [6, 9]");
    ShardedCheckpoint ck(d.path);
    std::string e = error_of([&] { ck.read("A"); });
    EXPECT_NE(e.find("rank_00000.safetensors: tensor 'A'"), std::string::npos) << e;
    EXPECT_NE(e.find("the file has float32 (3, 8), the index says float32 (3, 9)"), std::string::npos) << e;
  }
  {  // a missing tensor, a missing rank file, a bad block request
    TmpDir d("sc_missing");
    write_sharded(d.path, pieces);
    ShardedCheckpoint ck(d.path);
    EXPECT_NE(error_of([&] { ck.read("B"); }).find("no tensor 'B'"), std::string::npos);
    EXPECT_NE(error_of([&] { ck.read("A", {2, 2, 0}); }).find("cannot split a rank-2 tensor along axis 2"), std::string::npos);
    fs::remove(d / "rank_00001.safetensors");
    EXPECT_EQ(error_of([&] { ck.read("A", {0, 2, 0}); }), "<no error>");
    EXPECT_NE(error_of([&] { ck.read("A"); }).find("rank_00001.safetensors: cannot open"), std::string::npos);
  }
}

TEST(ShardedCheckpoint, SaveChecksOwnershipAndShapes) {
  Tensor a = randn({6, 8}, 9);
  TmpDir d("sc_owners");
  auto twice = split({{"A", a}, {"b", randn({3}, 10)}}, 2, 0);
  twice[1][1].owner = true;  // "b" owned by both ranks
  std::string e = error_of([&] { write_sharded(d.path, twice); });
  EXPECT_NE(e.find("tensor 'b': whole is owned by ranks 0 and 1"), std::string::npos) << e;
  auto none = split({{"A", a}}, 2, 0);
  none[1][0].owner = false;
  e = error_of([&] { write_sharded(d.path, none); });
  EXPECT_NE(e.find("tensor 'A' (6, 8): block 1 of 2 along axis 0 is owned by no rank"), std::string::npos) << e;
  auto wrong = split({{"A", a}}, 2, 0);
  wrong[0][0].data = randn({2, 8}, 11);
  e = error_of([&] { write_sharded(d.path, wrong); });
  EXPECT_NE(e.find("rank 0: tensor 'A': data is (2, 8) but block 0 of 2 along axis 0 of (6, 8) is (3, 8)"),
            std::string::npos)
      << e;
  auto mixed = split({{"A", a}}, 2, 0);
  mixed[1][0] = {"A", {6, 8}, {1, 2, 1}, take_block(a, {1, 2, 1})};
  e = error_of([&] { write_sharded(d.path, mixed); });
  EXPECT_NE(e.find("one split per tensor"), std::string::npos) << e;
  EXPECT_FALSE(is_sharded_checkpoint(d.path));
}

// index.json is written last and the directory swapped in whole: rank files without an index
// are not a checkpoint, a killed save (DIR.tmp left behind) leaves DIR as it was, the next
// save replaces DIR; a directory that is not a checkpoint is never replaced.
TEST(ShardedCheckpoint, IndexLastAndAtomicReplace) {
  Tensor v1 = randn({4, 4}, 12), v2 = randn({4, 4}, 13);
  TmpDir d("sc_atomic");
  write_sharded(d.path, split({{"w", v1}}, 4, 0), {{"step", "1"}});
  // a killed save: its files in DIR.tmp, no index yet
  fs::create_directories(d.path + ".tmp");
  write_safetensors(d.path + ".tmp/rank_00000.safetensors", {{"w", take_block(v2, {0, 2, 0})}});
  EXPECT_FALSE(is_sharded_checkpoint(d.path + ".tmp"));
  std::string e = error_of([&] { ShardedCheckpoint ck(d.path + ".tmp"); });
  EXPECT_NE(e.find("no index.json"), std::string::npos) << e;
  {
    ShardedCheckpoint ck(d.path);
    EXPECT_EQ(ck.metadata().at("step"), "1");
    expect_block(v1, {}, ck.read("w"));
  }
  write_sharded(d.path, split({{"w", v2}}, 2, 0), {{"step", "2"}});
  {
    ShardedCheckpoint ck(d.path);
    EXPECT_EQ(ck.metadata().at("step"), "2");
    EXPECT_EQ(ck.world(), 2);
    expect_block(v2, {}, ck.read("w"));
  }
  EXPECT_FALSE(fs::exists(d.path + ".tmp"));
  EXPECT_FALSE(fs::exists(d.path + ".old"));
  EXPECT_FALSE(fs::exists(d / "rank_00002.safetensors"));  // nothing left of the 4-rank one
  // a user's directory
  TmpDir u("sc_user");
  fs::create_directories(u.path);
  spit(u / "precious.txt", "keep");
  e = error_of([&] { write_sharded(u.path, split({{"w", v1}}, 1, 0)); });
  EXPECT_NE(e.find("is not a sharded checkpoint (no index.json); refusing to replace it"), std::string::npos) << e;
  EXPECT_EQ(slurp(u / "precious.txt"), "keep");
}

TEST(ShardedCheckpoint, ConvertRoundTripBitExact) {
  std::string full = tmp_path("sc_full.safetensors"), back = tmp_path("sc_back.safetensors"),
              again = tmp_path("sc_again.safetensors");
  auto ts = model_tensors();
  write_safetensors(full, ts, {{"format", "pt"}, {"source", "test"}});
  TmpDir d3("sc_conv3"), d2("sc_conv2");
  EXPECT_NE(safetensors_to_sharded(full, d3.path, 3).find("3 split along axis 0"), std::string::npos);
  ShardedCheckpoint ck(d3.path);
  EXPECT_EQ(ck.world(), 3);
  EXPECT_EQ(ck.stored_split("B.conv").parts, 3);
  EXPECT_EQ(ck.stored_split("C.bias").parts, 1);
  sharded_to_safetensors(d3.path, back);
  EXPECT_EQ(slurp(back), slurp(full));
  safetensors_to_sharded(d3.path, d2.path, 2);  // reshard 3 -> 2
  sharded_to_safetensors(d2.path, again);
  EXPECT_EQ(slurp(again), slurp(full));
}

}  // namespace
}  // namespace wxe
