// Sharded checkpoints: a directory with one safetensors file per rank plus an index, written
// by the ranks of any mesh and read back, block by block, on any other.
//
//   DIR/rank_00000.safetensors ... rank_{N-1}  the pieces each rank owns, under their global
//                                              names, each at its block shape
//   DIR/index.json                             written last; its presence makes DIR a checkpoint
//
// index.json (strict JSON, engine/io/json.h):
//   {"format": "wxe-sharded-1", "world": N, "chunk_bytes": C,
//    "metadata": {"step": "10", ...},                         (strings only)
//    "tensors": {"NAME": {"shape": [4, 6], "dtype": "F32",
//                         "pieces": [{"file": "rank_00001.safetensors", "axis": 0, "parts": 2,
//                                     "index": 1, "checksum": "crc32:1a2b3c4d",
//                                     "chunk_crc32": ["…", …]}, …]}, …}}
// Tensors keep the order they were given in (rank 0's first). All pieces of one tensor share
// axis and parts, and every non-empty block 0..parts-1 is present exactly once. "checksum" is
// the CRC-32 (zlib's) of the piece's bytes as stored (C order of the block); "chunk_crc32"
// (only for pieces over C bytes) lists the CRC-32 of each C-byte run of those bytes, so a
// reader that needs part of a piece reads and verifies only the runs it touches.
//
// Blocks (the one rule used throughout this file, for any TensorSlice {axis, parts, index}):
// along `axis` of length n, block i covers [i*c, min(n, (i+1)*c)) with c = ceil(n / parts);
// the last blocks may be shorter or empty (n = 5, parts = 4: 2, 2, 1, 0). Where parts divides
// n this is engine/io/safetensors.h's equal blocks, whose reader still requires divisibility.
// parts == 1 means the whole tensor (axis ignored). With groups G > 1 (a piece's optional
// "groups" in index.json, absent meaning 1) the rule applies within each of the G equal groups
// of `axis` (n / G long): the piece holds block i of every group, in group order.
//
// Saving is collective (save_sharded) or from one process with every rank's pieces at once
// (write_sharded, for `wxe convert` and tests). Either way: the files go to DIR.tmp, index.json
// last, then DIR.tmp takes DIR's place (renameat2 RENAME_EXCHANGE where the filesystem has it,
// else rename DIR to DIR.old, DIR.tmp to DIR, remove DIR.old), and the parent is fsynced. A
// crash before the swap leaves the previous DIR as it was. DIR must be absent, empty, or a
// sharded checkpoint: any other directory is refused, never replaced. Ranks share a filesystem.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/ir/tensor.h"
#include "parallel/comm.h"

namespace wxe {

// [begin, end) of block `index` of `parts` along a dim of length n (the rule above).
std::pair<int64_t, int64_t> block_range(int64_t n, int parts, int index);
// The shape of block s of a tensor shaped `global` (the whole shape for parts == 1).
Shape block_shape(const Shape& global, const TensorSlice& s);
// Block s of a whole tensor, a copy (the tensor itself for parts == 1).
Tensor take_block(const Tensor& whole, const TensorSlice& s);

// One tensor as a rank holds it: the global name, the global shape, and the block this rank
// has (`slice`; parts == 1: whole), `data` shaped block_shape(global_shape, slice). Exactly one
// rank writes each block: pass owner = true on one rank per block (a replicated tensor, or a
// tp shard repeated over dp groups), false on the others, whose pieces are skipped.
struct ShardPiece {
  std::string name;
  Shape global_shape;
  TensorSlice slice;
  Tensor data;
  bool owner = true;
};

// Collective over `world` (every rank calls it with its own pieces): rank r writes
// DIR.tmp/rank_RRRRR.safetensors with its owned pieces; rank 0 gathers every rank's piece
// list (names, shapes, slices, checksums), checks that each tensor's blocks are consistent
// and complete, writes DIR.tmp/index.json and swaps the directory into place. Returns when
// DIR is in place on every rank. An error on any rank (bad piece, a block owned twice or by
// no rank, a failed write) is thrown on every rank with the same message, after the same
// collectives, so no rank is left waiting.
void save_sharded(const std::string& dir, const std::vector<ShardPiece>& mine, Communicator& world,
                  const std::map<std::string, std::string>& metadata = {});
// The same from one process: by_rank[r] are rank r's pieces; writes by_rank.size() files.
void write_sharded(const std::string& dir, const std::vector<std::vector<ShardPiece>>& by_rank,
                   const std::map<std::string, std::string>& metadata = {});

// A sharded checkpoint written on any mesh. Errors name the tensor and the file: a missing
// tensor, a gap (a block no piece holds), a piece whose stored dtype or shape differs from
// the index, a checksum mismatch, a truncated file.
class ShardedCheckpoint {
 public:
  // Parses and checks DIR/index.json (format, consistency, no gaps); reads no rank file.
  explicit ShardedCheckpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  int world() const { return world_; }
  // Tensor names in the index's order.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  Shape shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // How the tensor is stored: axis, parts and groups of its pieces (parts == 1: one whole piece).
  TensorSlice stored_split(const std::string& name) const;
  // Block `want` of the tensor (whole for want.parts == 1), at block_shape(shape, want):
  // assembled from the pieces that overlap it, reading only the byte runs (chunk_bytes
  // granularity) that hold the overlap, each verified against its checksum.
  Tensor read(const std::string& name, TensorSlice want = {}) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  struct Piece {
    std::string file;
    int index = 0;
    uint32_t crc = 0;
    std::vector<uint32_t> chunk_crc;  // empty when the piece is one chunk or less
  };

 private:
  struct Entry {
    Shape shape;
    DType dtype = DType::F32;
    int axis = 0, parts = 1, groups = 1;
    std::vector<Piece> pieces;
  };
  const Entry& entry(const std::string& name) const;
  const SafetensorsEntry& stored(const std::string& file, const std::string& name) const;

  std::string dir_;
  int world_ = 0;
  uint64_t chunk_bytes_ = 0;
  std::vector<std::string> order_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  // rank-file headers, parsed on first use
  mutable std::mutex mu_;
  mutable std::map<std::string, std::map<std::string, SafetensorsEntry>> headers_;
};

// A directory holding index.json.
bool is_sharded_checkpoint(const std::string& path);

// Granularity of the per-run checksums of new checkpoints (default 4 MiB; tests set it small).
uint64_t sharded_chunk_bytes();
void set_sharded_chunk_bytes(uint64_t bytes);

// `wxe convert`: a sharded checkpoint to one .safetensors, every tensor whole, the index's
// metadata as the file's, tensors in the index's order. Returns a one-line summary.
std::string sharded_to_safetensors(const std::string& dir, const std::string& output);
// `wxe convert --shard N`: a .safetensors file (or a sharded checkpoint) to a sharded checkpoint
// of N files: every tensor of rank >= 2 split along axis 0 into N blocks (block r in file r),
// the others whole in rank_00000; the input's metadata carried over. Returns a summary.
std::string safetensors_to_sharded(const std::string& input, const std::string& dir, int n);

}  // namespace wxe
