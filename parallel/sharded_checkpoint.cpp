#include "parallel/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "engine/io/json.h"
#include "engine/io/npy.h"

namespace wxe {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "wxe-sharded-1";
constexpr size_t kMaxDims = 64;
uint64_t g_chunk_bytes = uint64_t(4) << 20;

// ---- checksums: zlib's CRC-32 (what Python's zlib.crc32 computes)

uint32_t crc_of(const uint8_t* p, uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {  // crc32 takes a 32-bit length
    uInt k = (uInt)std::min<uint64_t>(n, 1u << 30);
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

std::string crc_hex(uint32_t c) {
  char b[9];
  std::snprintf(b, sizeof b, "%08x", c);
  return b;
}

// 8 lowercase or uppercase hex digits; false otherwise.
bool parse_hex(const std::string& s, uint32_t* out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char c : s) {
    int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (h < 0) return false;
    v = v * 16 + (uint32_t)h;
  }
  *out = v;
  return true;
}

// The CRC of a piece's bytes, and of each chunk when there is more than one.
void piece_crcs(const uint8_t* p, uint64_t n, uint64_t chunk, uint32_t* whole, std::vector<uint32_t>* chunks) {
  chunks->clear();
  if (n <= chunk) {
    *whole = crc_of(p, n);
    return;
  }
  uLong acc = 0;
  for (uint64_t b = 0; b < n; b += chunk) {
    uint64_t len = std::min(chunk, n - b);
    uint32_t c = crc_of(p + b, len);
    chunks->push_back(c);
    acc = b == 0 ? c : crc32_combine(acc, c, (z_off_t)len);
  }
  *whole = (uint32_t)acc;
}

// ---- blocks

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The box of block s of a tensor shaped `global`: [lo, hi) per dim.
void block_box(const Shape& global, const TensorSlice& s, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  lo.assign(global.size(), 0);
  hi.assign(global.begin(), global.end());
  if (s.parts > 1) std::tie(lo[s.axis], hi[s.axis]) = block_range(global[s.axis], s.parts, s.index);
}

std::string slice_str(const TensorSlice& s) {
  return s.parts <= 1 ? std::string("whole")
                      : str("block ", s.index, " of ", s.parts, " along axis ", s.axis,
                            s.groups > 1 ? str(" in each of ", s.groups, " groups") : std::string());
}

// Grouped slices (TensorSlice::groups > 1) are boxes of the tensor viewed with axis `ga` split
// in (G, n / G). The view's shape (the shape itself for G == 1).
Shape grouped_view(const Shape& s, int ga, int G) {
  if (G <= 1) return s;
  WXE_CHECK(ga >= 0 && ga < (int)s.size() && s[ga] % G == 0, "cannot split axis ", ga, " of ", shape_str(s), " in ",
            G, " groups");
  Shape v(s.begin(), s.begin() + ga);
  v.push_back(G);
  v.push_back(s[ga] / G);
  v.insert(v.end(), s.begin() + ga + 1, s.end());
  return v;
}

// s as a plain block of that view; false where it is not one (a plain block along the grouped
// axis, or a grouping of another axis or count).
bool in_view(const TensorSlice& s, int ga, int G, TensorSlice* out) {
  if (s.parts <= 1) {
    *out = {};
    return true;
  }
  if (G <= 1) {
    *out = s;
    return s.groups <= 1;
  }
  if (s.groups > 1) {
    *out = {ga + 1, s.parts, s.index};
    return s.axis == ga && s.groups == G;
  }
  *out = {s.axis > ga ? s.axis + 1 : s.axis, s.parts, s.index};
  return s.axis != ga;
}

// Checks that s names a block of a tensor of rank r; `what` leads the message.
void check_slice(const TensorSlice& s, int r, const std::string& what) {
  WXE_CHECK(s.parts >= 1 && s.index >= 0 && s.index < s.parts && s.groups >= 1, what, ": bad slice (index ", s.index,
            " of ", s.parts, " parts, ", s.groups, " groups)");
  WXE_CHECK(s.parts == 1 || (s.axis >= 0 && s.axis < r), what, ": cannot split a rank-", r, " tensor along axis ",
            s.axis);
}

// Copies the box [lo, hi) (global coordinates) from src (a block shaped sshape whose first
// element sits at global sorigin) to dst (shaped dshape, at dorigin). The trailing dims the
// box covers whole in both go in one memcpy per run. `src` holds the block's bytes from byte
// `src_skip` on (a read of part of it).
void copy_box(const uint8_t* src, const Shape& sshape, const std::vector<int64_t>& sorigin, uint8_t* dst,
              const Shape& dshape, const std::vector<int64_t>& dorigin, const std::vector<int64_t>& lo,
              const std::vector<int64_t>& hi, size_t es, uint64_t src_skip = 0) {
  const int r = (int)sshape.size();
  if (r == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  int k = r - 1;
  while (k > 0 && hi[k] - lo[k] == sshape[k] && hi[k] - lo[k] == dshape[k]) --k;
  std::vector<int64_t> ss = strides_of(sshape), ds = strides_of(dshape);
  const size_t run = (size_t)((hi[k] - lo[k]) * ss[k]) * es;  // ss[k] == ds[k]: the dims after k are whole
  std::vector<int64_t> at(lo.begin(), lo.begin() + k);
  for (;;) {
    int64_t so = (lo[k] - sorigin[k]) * ss[k], dof = (lo[k] - dorigin[k]) * ds[k];
    for (int d = 0; d < k; ++d) {
      so += (at[d] - sorigin[d]) * ss[d];
      dof += (at[d] - dorigin[d]) * ds[d];
    }
    std::memcpy(dst + dof * es, src + (so * es - src_skip), run);
    int d = k - 1;
    while (d >= 0 && ++at[d] == hi[d]) at[d] = lo[d], --d;
    if (d < 0) break;
  }
}

// ---- one piece as the index records it

struct Record {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;  // global
  TensorSlice slice;
  std::string file;
  int rank = 0;
  uint32_t crc = 0;
  std::vector<uint32_t> chunk_crc;
};

std::string rank_file(int r) {
  char b[40];
  std::snprintf(b, sizeof b, "rank_%05d.safetensors", r);
  return b;
}

std::string shape_json(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// {"file": ..., "axis": a, "parts": p, "index": i, "checksum": "crc32:…"[, "chunk_crc32": […]]}
std::string piece_json(const Record& p) {
  std::string j = "{\"file\": ";
  json_string(j, p.file);
  j += str(", \"axis\": ", p.slice.axis, ", \"parts\": ", p.slice.parts, ", \"index\": ", p.slice.index);
  if (p.slice.groups > 1) j += str(", \"groups\": ", p.slice.groups);  // absent: 1 (older checkpoints)
  j += str(", \"checksum\": \"crc32:", crc_hex(p.crc), "\"");
  if (!p.chunk_crc.empty()) {
    j += ", \"chunk_crc32\": [";
    for (size_t i = 0; i < p.chunk_crc.size(); ++i) j += (i ? ", \"" : "\"") + crc_hex(p.chunk_crc[i]) + "\"";
    j += "]";
  }
  return j + "}";
}

// A rank's records for rank 0: a JSON array of piece objects with name, dtype and shape added.
std::string records_json(const std::vector<Record>& rs) {
  std::string j = "[";
  for (const Record& r : rs) {
    if (j.size() > 1) j += ",\n";
    j += "{\"name\": ";
    json_string(j, r.name);
    j += str(", \"dtype\": \"", safetensors_dtype_name(r.dtype), "\", \"shape\": ", shape_json(r.shape),
             ", \"piece\": ", piece_json(r), "}");
  }
  return j + "]";
}

int64_t int_field(const Json& o, const char* key, const std::string& where) {
  const Json* v = o.get(key);
  int64_t x = v ? checked_index(*v) : -1;
  WXE_CHECK(x >= 0, where, ": missing or bad \"", key, "\" (a non-negative integer)");
  return x;
}

const Json& field(const Json& o, const char* key, Json::Type t, const std::string& where) {
  const Json* v = o.get(key);
  static const char* kType[] = {"a string", "a number", "an array", "an object"};
  WXE_CHECK(v && v->type == t, where, ": missing or bad \"", key, "\" (", kType[t], ")");
  return *v;
}

// A piece object of the index (or of a rank's records) into r.file, r.slice, r.crc, r.chunk_crc.
void parse_piece(const Json& p, const std::string& where, Record& r) {
  WXE_CHECK(p.type == Json::Obj, where, ": a piece is not an object");
  r.file = field(p, "file", Json::Str, where).s;
  // only the names save_sharded writes (rank_file): no path, no NUL, nothing else in the directory
  bool rank_name = r.file.size() == 22 && r.file.compare(0, 5, "rank_") == 0 &&
                   r.file.compare(10, 12, ".safetensors") == 0;
  for (size_t i = 5; rank_name && i < 10; ++i) rank_name = r.file[i] >= '0' && r.file[i] <= '9';
  WXE_CHECK(rank_name, where, ": piece file '", printable(r.file), "' is not a rank_NNNNN.safetensors name");
  int64_t axis = int_field(p, "axis", where), parts = int_field(p, "parts", where), index = int_field(p, "index", where);
  WXE_CHECK(axis < (int64_t)kMaxDims && parts >= 1 && parts <= INT32_MAX && index < parts, where, ": bad piece slice (axis ",
            axis, ", index ", index, " of ", parts, " parts)");
  int64_t groups = p.get("groups") ? int_field(p, "groups", where) : 1;
  WXE_CHECK(groups >= 1 && groups <= INT32_MAX, where, ": bad piece groups ", groups);
  r.slice = {(int)axis, (int)parts, (int)index, parts > 1 ? (int)groups : 1};
  const std::string& ck = field(p, "checksum", Json::Str, where).s;
  WXE_CHECK(ck.rfind("crc32:", 0) == 0 && parse_hex(ck.substr(6), &r.crc), where, ": bad checksum '", printable(ck),
            "' (expected crc32: and 8 hex digits)");
  r.chunk_crc.clear();
  if (const Json* cl = p.get("chunk_crc32")) {
    WXE_CHECK(cl->type == Json::Arr, where, ": \"chunk_crc32\" is not an array");
    for (const Json& c : cl->items) {
      uint32_t v = 0;
      WXE_CHECK(c.type == Json::Str && parse_hex(c.s, &v), where, ": bad entry in \"chunk_crc32\"");
      r.chunk_crc.push_back(v);
    }
  }
}

std::vector<Record> parse_records(const std::string& text, int rank) {
  const std::string where = str("piece list of rank ", rank);
  Json root = parse_json(text, where);
  WXE_CHECK(root.type == Json::Arr, where, ": not an array");
  std::vector<Record> rs;
  for (const Json& o : root.items) {
    Record r;
    r.rank = rank;
    WXE_CHECK(o.type == Json::Obj, where, ": an entry is not an object");
    r.name = field(o, "name", Json::Str, where).s;
    WXE_CHECK(safetensors_dtype(field(o, "dtype", Json::Str, where).s, &r.dtype), where, ": bad dtype");
    for (const Json& d : field(o, "shape", Json::Arr, where).items) r.shape.push_back(checked_index(d));
    parse_piece(field(o, "piece", Json::Obj, where), where, r);
    rs.push_back(std::move(r));
  }
  return rs;
}

// ---- writing

fs::path clean_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  WXE_CHECK(!p.empty() && p.filename() != "." && p.filename() != "..", "'", dir,
            "' cannot be a sharded checkpoint directory (give it a name)");
  return p;
}

fs::path tmp_of(const fs::path& dir) { return dir.string() + ".tmp"; }

void fsync_dir(const fs::path& d) {
  int fd = ::open(d.empty() ? "." : d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// DIR may be replaced only when absent, empty or a sharded checkpoint: never a user's folder.
// Clears DIR.tmp (what a killed save left) and creates it empty.
void prepare_tmp(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    WXE_CHECK(fs::is_directory(dir, ec), dir.string(), ": exists and is not a directory");
    WXE_CHECK(is_sharded_checkpoint(dir.string()) || fs::is_empty(dir, ec), dir.string(),
              ": exists and is not a sharded checkpoint (no index.json); refusing to replace it");
  }
  if (dir.has_parent_path()) {
    fs::create_directories(dir.parent_path(), ec);
    WXE_CHECK(!ec, dir.parent_path().string(), ": cannot create the directory: ", ec.message());
  }
  const fs::path tmp = tmp_of(dir);
  fs::remove_all(tmp, ec);
  WXE_CHECK(!ec, tmp.string(), ": cannot remove (left by an earlier save): ", ec.message());
  fs::create_directory(tmp, ec);
  WXE_CHECK(!ec, tmp.string(), ": cannot create: ", ec.message());
}

// Writes rank r's owned pieces to tmp/rank_RRRRR.safetensors; returns their records.
std::vector<Record> write_rank_file(const fs::path& tmp, int r, int world, const std::vector<ShardPiece>& pieces,
                                    uint64_t chunk) {
  const std::string file = rank_file(r), path = (tmp / file).string();
  std::vector<std::pair<std::string, Tensor>> named;
  std::vector<Record> recs;
  std::set<std::string> seen;
  for (const ShardPiece& p : pieces) {
    if (!p.owner) continue;
    const std::string what = str("rank ", r, ": tensor '", printable(p.name), "'");
    WXE_CHECK(!p.name.empty(), "rank ", r, ": a piece has no name");
    WXE_CHECK(seen.insert(p.name).second, what, ": this rank owns two pieces of it (one per rank)");
    WXE_CHECK(p.global_shape.size() <= kMaxDims, what, ": too many dimensions");
    for (int64_t d : p.global_shape) WXE_CHECK(d >= 0, what, ": negative dimension in ", shape_str(p.global_shape));
    check_slice(p.slice, (int)p.global_shape.size(), what);
    WXE_CHECK(safetensors_dtype_name(p.data.dtype), what, ": dtype ", dtype_name(p.data.dtype), " cannot be saved");
    const Shape bs = block_shape(p.global_shape, p.slice);
    WXE_CHECK(p.data.shape == bs, what, ": data is ", shape_str(p.data.shape), " but ", slice_str(p.slice), " of ",
              shape_str(p.global_shape), " is ", shape_str(bs));
    WXE_CHECK(p.data.defined() || p.data.numel() == 0, what, ": has no data");
    Record rec;
    rec.name = p.name;
    rec.dtype = p.data.dtype;
    rec.shape = p.global_shape;
    rec.slice = p.slice.parts > 1 ? p.slice : TensorSlice{};
    rec.file = file;
    rec.rank = r;
    piece_crcs(p.data.nbytes() ? (const uint8_t*)p.data.raw() : nullptr, p.data.nbytes(), chunk, &rec.crc,
               &rec.chunk_crc);
    recs.push_back(std::move(rec));
    named.push_back({p.name, p.data});
  }
  write_safetensors(path, named, {{"rank", std::to_string(r)}, {"world", std::to_string(world)}, {"index", "index.json"}});
  return recs;
}

// Rank 0's part: every rank's records (in rank order) checked for consistency and
// completeness, index.json written, DIR.tmp swapped into place.
void finish(const fs::path& dir, int world, const std::vector<Record>& all,
            const std::map<std::string, std::string>& metadata, uint64_t chunk) {
  struct Group {
    const Record* first;
    std::map<int, const Record*> by_index;
  };
  std::vector<std::string> order;
  std::map<std::string, Group> groups;
  for (const Record& r : all) {
    auto it = groups.find(r.name);
    if (it == groups.end()) {
      order.push_back(r.name);
      groups[r.name] = {&r, {{r.slice.index, &r}}};
      continue;
    }
    const Record& f = *it->second.first;
    WXE_CHECK(r.shape == f.shape && r.dtype == f.dtype && r.slice.axis == f.slice.axis && r.slice.parts == f.slice.parts &&
                  r.slice.groups == f.slice.groups,
              "tensor '", printable(r.name), "': rank ", r.rank, " has it ", dtype_name(r.dtype), " ", shape_str(r.shape),
              " ", slice_str(r.slice), ", rank ", f.rank, " ", dtype_name(f.dtype), " ", shape_str(f.shape), " ",
              slice_str(f.slice), " (one split per tensor)");
    auto [at, fresh] = it->second.by_index.emplace(r.slice.index, &r);
    WXE_CHECK(fresh, "tensor '", printable(r.name), "': ", slice_str(r.slice), " is owned by ranks ", at->second->rank,
              " and ", r.rank, " (owner must be true on exactly one rank)");
  }
  for (auto& [name, g] : groups) {
    const Record& f = *g.first;
    for (int i = 0; i < f.slice.parts; ++i) {
      TensorSlice s{f.slice.axis, f.slice.parts, i, f.slice.groups};
      bool empty = numel(block_shape(f.shape, s)) == 0 && f.slice.parts > 1;
      WXE_CHECK(g.by_index.count(i) || empty, "tensor '", printable(name), "' ", shape_str(f.shape), ": ",
                slice_str(s), " is owned by no rank");
    }
  }
  std::string j = str("{\"format\": \"", kFormat, "\", \"world\": ", world, ", \"chunk_bytes\": ", chunk,
                      ",\n \"metadata\": {");
  bool first = true;
  for (auto& [k, v] : metadata) {
    WXE_CHECK(valid_utf8(k) && valid_utf8(v), "metadata '", printable(k), "' is not valid UTF-8");
    j += first ? "" : ", ";
    first = false;
    json_string(j, k);
    j += ": ";
    json_string(j, v);
  }
  j += "},\n \"tensors\": {";
  for (size_t t = 0; t < order.size(); ++t) {
    const Group& g = groups[order[t]];
    j += t ? ",\n  " : "\n  ";
    json_string(j, order[t]);
    j += str(": {\"shape\": ", shape_json(g.first->shape), ", \"dtype\": \"", safetensors_dtype_name(g.first->dtype),
             "\", \"pieces\": [");
    bool fp = true;
    for (auto& [i, r] : g.by_index) {
      j += fp ? "\n    " : ",\n    ";
      fp = false;
      j += piece_json(*r);
    }
    j += "]}";
  }
  j += "}}\n";
  const fs::path tmp = tmp_of(dir);
  std::error_code ec;
  for (int r = 0; r < world; ++r)
    WXE_CHECK(fs::is_regular_file(tmp / rank_file(r), ec), (tmp / rank_file(r)).string(),
              ": missing (rank ", r, " wrote it; do the ranks share this filesystem?)");
  write_file_atomic((tmp / "index.json").string(), j);  // last: its presence makes the directory a checkpoint
  fsync_dir(tmp);

  // the swap; each step leaves either the old or the new checkpoint at DIR, except the
  // fallback's moment between its two renames (DIR.old then holds the old one)
  const fs::path parent = dir.parent_path();
  if (!fs::exists(dir, ec)) {
    WXE_CHECK(std::rename(tmp.c_str(), dir.c_str()) == 0, dir.string(), ": cannot move the checkpoint into place: ",
              std::strerror(errno));
    fsync_dir(parent);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(parent);
    fs::remove_all(tmp, ec);  // now the previous checkpoint
    fsync_dir(parent);
    return;
  }
  WXE_CHECK(errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP, dir.string(),
            ": cannot swap the checkpoint into place: ", std::strerror(errno));
  const fs::path old = dir.string() + ".old";
  fs::remove_all(old, ec);
  WXE_CHECK(std::rename(dir.c_str(), old.c_str()) == 0, dir.string(), ": cannot move the previous checkpoint away: ",
            std::strerror(errno));
  WXE_CHECK(std::rename(tmp.c_str(), dir.c_str()) == 0, dir.string(), ": cannot move the checkpoint into place: ",
            std::strerror(errno), " (the previous one is in ", old.string(), ")");
  fsync_dir(parent);
  fs::remove_all(old, ec);
  fsync_dir(parent);
}

// Every rank learns whether any rank failed (err non-empty); then all throw the first failing
// rank's message (messages name their rank where it matters). Collective: the same calls on
// every rank, failed or not.
void agree(Communicator& c, std::string err) {
  if (c.size() == 1) {
    if (!err.empty()) throw Error(err);
    return;
  }
  Tensor in = Tensor::zeros(DType::I64, {1}), all(DType::I64, {c.size()});
  in.data<int64_t>()[0] = (int64_t)err.size();
  c.all_gather(in, all);
  int who = -1;
  for (int r = 0; r < c.size() && who < 0; ++r)
    if (all.data<int64_t>()[r] > 0) who = r;
  if (who < 0) return;
  Tensor msg(DType::U8, {all.data<int64_t>()[who]});
  if (c.rank() == who) std::memcpy(msg.raw(), err.data(), err.size());
  c.broadcast(msg, who);
  throw Error(std::string((const char*)msg.raw(), msg.nbytes()));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return *e.what() ? e.what() : "unknown error";
  }
  return "";
}

// ---- reading

std::string slurp_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  WXE_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A piece file must be a regular file of the checkpoint directory itself: a symlink (which
// could lead outside it), a FIFO or a device is refused.
void check_piece_file(const std::string& path) {
  struct stat st;
  WXE_CHECK(::lstat(path.c_str(), &st) == 0, path, ": cannot open (", std::strerror(errno), ")");
  WXE_CHECK(!S_ISLNK(st.st_mode), path, ": is a symlink; a checkpoint's rank files must be its own regular files");
  WXE_CHECK(S_ISREG(st.st_mode), path, ": is not a regular file");
}

// n bytes at `off` of the file, in full.
void pread_all(const std::string& path, uint64_t off, uint8_t* dst, uint64_t n) {
  check_piece_file(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  WXE_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  while (n > 0) {
    ssize_t r = ::pread(fd, dst, (size_t)std::min<uint64_t>(n, 1u << 30), (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      fail(path, ": read error: ", r < 0 ? std::strerror(err) : "unexpected end of file (truncated?)");
    }
    dst += r;
    off += (uint64_t)r;
    n -= (uint64_t)r;
  }
  ::close(fd);
}

}  // namespace

std::pair<int64_t, int64_t> block_range(int64_t n, int parts, int index) {
  WXE_ASSERT(parts >= 1 && index >= 0 && index < parts && n >= 0);
  const int64_t c = ceil_div(n, parts);
  return {std::min(n, index * c), std::min(n, (index + 1) * c)};
}

Shape block_shape(const Shape& global, const TensorSlice& s) {
  if (s.parts <= 1) return global;
  WXE_CHECK(s.axis >= 0 && s.axis < (int)global.size() && s.index >= 0 && s.index < s.parts, "cannot take block ",
            s.index, " of ", s.parts, " along axis ", s.axis, " of ", shape_str(global));
  WXE_CHECK(s.groups >= 1 && global[s.axis] % s.groups == 0, "cannot split axis ", s.axis, " of ", shape_str(global),
            " in ", s.groups, " groups");
  Shape b = global;
  auto [lo, hi] = block_range(global[s.axis] / s.groups, s.parts, s.index);
  b[s.axis] = (hi - lo) * s.groups;
  return b;
}

Tensor take_block(const Tensor& whole, const TensorSlice& s) {
  if (s.parts <= 1) return whole;
  Tensor out(whole.dtype, block_shape(whole.shape, s));
  if (out.numel() == 0) return out;
  const Shape view = grouped_view(whole.shape, s.axis, s.groups);
  TensorSlice vs;
  in_view(s, s.axis, s.groups, &vs);
  std::vector<int64_t> lo, hi, zero(view.size(), 0);
  block_box(view, vs, lo, hi);
  copy_box((const uint8_t*)whole.raw(), view, zero, (uint8_t*)out.raw(), block_shape(view, vs), lo, lo, hi,
           dtype_size(whole.dtype));
  return out;
}

uint64_t sharded_chunk_bytes() { return g_chunk_bytes; }
void set_sharded_chunk_bytes(uint64_t bytes) { g_chunk_bytes = std::max<uint64_t>(bytes, 1); }

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "index.json", ec);
}

void write_sharded(const std::string& dir_arg, const std::vector<std::vector<ShardPiece>>& by_rank,
                   const std::map<std::string, std::string>& metadata) {
  WXE_CHECK(!by_rank.empty(), dir_arg, ": a sharded checkpoint needs at least one rank");
  const fs::path dir = clean_dir(dir_arg);
  const uint64_t chunk = g_chunk_bytes;
  prepare_tmp(dir);
  try {
    std::vector<Record> all;
    for (size_t r = 0; r < by_rank.size(); ++r)
      for (Record& rec : write_rank_file(tmp_of(dir), (int)r, (int)by_rank.size(), by_rank[r], chunk))
        all.push_back(std::move(rec));
    finish(dir, (int)by_rank.size(), all, metadata, chunk);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp_of(dir), ec);  // (a kill here instead leaves it to the next save)
    throw;
  }
}

void save_sharded(const std::string& dir_arg, const std::vector<ShardPiece>& mine, Communicator& world,
                  const std::map<std::string, std::string>& metadata) {
  const int rank = world.rank(), n = world.size();
  const uint64_t chunk = g_chunk_bytes;  // rank 0's goes into the index; ranks are one program
  fs::path dir;
  // agree, and on failure rank 0 removes DIR.tmp (after agree: nobody writes into it any more)
  auto agree_or_clean = [&](const std::string& e) {
    try {
      agree(world, e);
    } catch (...) {
      std::error_code ec;
      if (rank == 0 && !dir.empty()) fs::remove_all(tmp_of(dir), ec);
      throw;
    }
  };
  std::string err = error_of([&] {
    dir = clean_dir(dir_arg);
    if (rank == 0) prepare_tmp(dir);
  });
  agree_or_clean(err);  // DIR.tmp exists before anyone writes into it

  std::string mine_json;
  err = error_of([&] { mine_json = records_json(write_rank_file(tmp_of(dir), rank, n, mine, chunk)); });
  agree_or_clean(err);

  // rank 0 gathers every rank's piece list
  Tensor len = Tensor::zeros(DType::I64, {1}), lens(DType::I64, {n});
  len.data<int64_t>()[0] = (int64_t)mine_json.size();
  world.all_gather(len, lens);
  std::vector<Record> all;
  if (rank == 0) {
    std::vector<std::string> texts(n);
    texts[0] = mine_json;
    for (int r = 1; r < n; ++r) {
      Tensor t(DType::U8, {lens.data<int64_t>()[r]});
      world.recv(t, r);
      texts[r].assign((const char*)t.raw(), t.nbytes());
    }
    err = error_of([&] {
      for (int r = 0; r < n; ++r)
        for (Record& rec : parse_records(texts[r], r)) all.push_back(std::move(rec));
      for (Record& rec : all) rec.file = rank_file(rec.rank);
      finish(dir, n, all, metadata, chunk);
    });
  } else {
    Tensor t(DType::U8, {(int64_t)mine_json.size()});
    std::memcpy(t.raw(), mine_json.data(), mine_json.size());
    world.send(t, 0);
  }
  agree_or_clean(err);  // DIR is in place (or every rank throws rank 0's error)
}

// ---- ShardedCheckpoint

ShardedCheckpoint::ShardedCheckpoint(const std::string& dir) : dir_(dir) {
  const std::string path = (fs::path(dir) / "index.json").string();
  std::error_code ec;
  WXE_CHECK(fs::is_directory(dir, ec), dir, ": not a directory (a sharded checkpoint is one)");
  WXE_CHECK(fs::is_regular_file(path, ec), dir,
            ": not a sharded checkpoint: no index.json (a save that did not finish leaves none)");
  Json root = parse_json(slurp_file(path), path, "sharded checkpoint index");
  WXE_CHECK(root.type == Json::Obj, path, ": not a JSON object");
  const std::string& format = field(root, "format", Json::Str, path).s;
  WXE_CHECK(format == kFormat, path, ": format '", printable(format), "' is not ", kFormat);
  int64_t world = int_field(root, "world", path);
  WXE_CHECK(world >= 1 && world <= INT32_MAX, path, ": bad \"world\"");
  world_ = (int)world;
  chunk_bytes_ = (uint64_t)int_field(root, "chunk_bytes", path);
  WXE_CHECK(chunk_bytes_ >= 1, path, ": bad \"chunk_bytes\"");
  const Json& meta = field(root, "metadata", Json::Obj, path);
  for (size_t i = 0; i < meta.keys.size(); ++i) {
    WXE_CHECK(meta.items[i].type == Json::Str, path, ": metadata '", printable(meta.keys[i]), "' is not a string");
    metadata_[meta.keys[i]] = meta.items[i].s;
  }
  const Json& tensors = field(root, "tensors", Json::Obj, path);
  for (size_t t = 0; t < tensors.keys.size(); ++t) {
    const std::string& name = tensors.keys[t];
    const std::string where = str(path, ": tensor '", printable(name), "'");
    const Json& o = tensors.items[t];
    WXE_CHECK(o.type == Json::Obj, where, ": not an object");
    Entry e;
    const Json& shp = field(o, "shape", Json::Arr, where);
    WXE_CHECK(shp.items.size() <= kMaxDims, where, ": too many dimensions");
    for (const Json& d : shp.items) {
      int64_t x = checked_index(d);
      WXE_CHECK(x >= 0, where, ": shape entries must be non-negative integers");
      e.shape.push_back(x);
    }
    const std::string& dt = field(o, "dtype", Json::Str, where).s;
    WXE_CHECK(safetensors_dtype(dt, &e.dtype), where, ": unsupported dtype '", printable(dt), "'");
    const Json& pieces = field(o, "pieces", Json::Arr, where);
    WXE_CHECK(!pieces.items.empty(), where, ": no pieces");
    std::set<int> seen;
    for (size_t i = 0; i < pieces.items.size(); ++i) {
      Record r;
      parse_piece(pieces.items[i], where, r);
      if (i == 0) {
        e.axis = r.slice.axis;
        e.parts = r.slice.parts;
        e.groups = r.slice.groups;
        check_slice(r.slice, (int)e.shape.size(), where);
      }
      WXE_CHECK(r.slice.axis == e.axis && r.slice.parts == e.parts && r.slice.groups == e.groups, where,
                ": its pieces are split differently (", slice_str(r.slice), " and ",
                slice_str({e.axis, e.parts, 0, e.groups}), ")");
      WXE_CHECK(seen.insert(r.slice.index).second, where, ": two pieces hold ", slice_str(r.slice));
      // the chunk list must describe this piece's bytes and agree with its checksum
      const uint64_t bytes =
          (uint64_t)numel(block_shape(e.shape, r.slice)) * dtype_size(e.dtype), nchunks = (bytes + chunk_bytes_ - 1) / chunk_bytes_;
      WXE_CHECK(nchunks <= 1 ? r.chunk_crc.empty() : r.chunk_crc.size() == nchunks, where, ": ", slice_str(r.slice),
                " has ", r.chunk_crc.size(), " chunk checksums for ", bytes, " bytes in chunks of ", chunk_bytes_);
      if (!r.chunk_crc.empty()) {
        uLong acc = r.chunk_crc[0];
        for (size_t k = 1; k < r.chunk_crc.size(); ++k)
          acc = crc32_combine(acc, r.chunk_crc[k], (z_off_t)std::min<uint64_t>(chunk_bytes_, bytes - k * chunk_bytes_));
        WXE_CHECK((uint32_t)acc == r.crc, where, ": ", slice_str(r.slice), ": chunk checksums do not add up to its checksum");
      }
      e.pieces.push_back({r.file, r.slice.index, r.crc, std::move(r.chunk_crc)});
    }
    for (int i = 0; i < e.parts; ++i) {
      TensorSlice s{e.axis, e.parts, i, e.groups};
      WXE_CHECK(seen.count(i) || (e.parts > 1 && numel(block_shape(e.shape, s)) == 0), where, " ", shape_str(e.shape),
                ": no piece holds ", slice_str(s), " (a gap: the checkpoint is incomplete)");
    }
    order_.push_back(name);
    tensors_[name] = std::move(e);
  }
}

std::vector<std::string> ShardedCheckpoint::names() const { return order_; }

const ShardedCheckpoint::Entry& ShardedCheckpoint::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  WXE_CHECK(it != tensors_.end(), dir_, ": no tensor '", printable(name), "' in the sharded checkpoint");
  return it->second;
}

Shape ShardedCheckpoint::shape(const std::string& name) const { return entry(name).shape; }
DType ShardedCheckpoint::dtype(const std::string& name) const { return entry(name).dtype; }
TensorSlice ShardedCheckpoint::stored_split(const std::string& name) const {
  const Entry& e = entry(name);
  return {e.axis, e.parts, 0, e.groups};
}

const SafetensorsEntry& ShardedCheckpoint::stored(const std::string& file, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = headers_.find(file);
  if (it == headers_.end()) {
    std::map<std::string, SafetensorsEntry> h;
    check_piece_file((fs::path(dir_) / file).string());
    for (SafetensorsEntry& e : read_safetensors_header((fs::path(dir_) / file).string())) h[e.name] = e;
    it = headers_.emplace(file, std::move(h)).first;
  }
  auto t = it->second.find(name);
  WXE_CHECK(t != it->second.end(), (fs::path(dir_) / file).string(), ": no tensor '", printable(name),
            "' (index.json lists a piece of it in this file)");
  return t->second;
}

Tensor ShardedCheckpoint::read(const std::string& name, TensorSlice want) const {
  const Entry& e = entry(name);
  const int rank = (int)e.shape.size();
  check_slice(want, rank, str(dir_, ": reading tensor '", printable(name), "' ", shape_str(e.shape)));
  if (want.parts <= 1) want = {};
  const size_t es = dtype_size(e.dtype);
  Tensor out(e.dtype, block_shape(e.shape, want));
  if (out.numel() == 0) {  // nothing to copy, but the pieces the index lists must be there as it says
    for (const Piece& p : e.pieces) {
      const TensorSlice ps{e.axis, e.parts, p.index, e.groups};
      const SafetensorsEntry& st = stored(p.file, name);
      WXE_CHECK(st.dtype == e.dtype && st.shape == block_shape(e.shape, ps), (fs::path(dir_) / p.file).string(),
                ": tensor '", printable(name), "' ", slice_str(ps), ": the file has ", dtype_name(st.dtype), " ",
                shape_str(st.shape), ", the index says ", dtype_name(e.dtype), " ", shape_str(block_shape(e.shape, ps)));
    }
    return out;
  }
  // grouped slices: boxes of the view with the grouped axis split (the wanted one's grouping,
  // else the stored one's); where the stored and wanted blocks are not both boxes of one view,
  // the whole tensor is read and the block taken from it
  int ga = -1, G = 1;
  if (want.groups > 1) ga = want.axis, G = want.groups;
  else if (e.parts > 1 && e.groups > 1) ga = e.axis, G = e.groups;
  TensorSlice wv, pv;
  if (!in_view(want, ga, G, &wv) || !in_view({e.axis, e.parts, 0, e.groups}, ga, G, &pv))
    return take_block(read(name, {}), want);
  const Shape vshape = grouped_view(e.shape, ga, G), out_view = block_shape(vshape, wv);
  const int r = (int)vshape.size();
  std::vector<int64_t> wlo, whi, plo, phi, lo(r), hi(r);
  block_box(vshape, wv, wlo, whi);
  int64_t copied = 0;
  for (const Piece& p : e.pieces) {
    const TensorSlice ps{e.axis, e.parts, p.index, e.groups};
    const TensorSlice psv{pv.axis, pv.parts, p.index};
    block_box(vshape, psv, plo, phi);
    bool empty = false;
    for (int d = 0; d < r; ++d) {
      lo[d] = std::max(wlo[d], plo[d]);
      hi[d] = std::min(whi[d], phi[d]);
      empty |= lo[d] >= hi[d];
    }
    if (empty) continue;
    const std::string path = (fs::path(dir_) / p.file).string();
    const std::string what = str(path, ": tensor '", printable(name), "' ", slice_str(ps));
    const Shape pshape_real = block_shape(e.shape, ps), pshape = block_shape(vshape, psv);
    const SafetensorsEntry& st = stored(p.file, name);
    WXE_CHECK(st.dtype == e.dtype && st.shape == pshape_real, what, ": the file has ", dtype_name(st.dtype), " ",
              shape_str(st.shape), ", the index says ", dtype_name(e.dtype), " ", shape_str(pshape_real));
    // the bytes of the piece from the overlap's first element to its last, widened to whole
    // chunks so that each can be checked
    std::vector<int64_t> ps_str = strides_of(pshape);
    uint64_t first = 0, last = 0;
    for (int d = 0; d < r; ++d) {
      first += (uint64_t)((lo[d] - plo[d]) * ps_str[d]);
      last += (uint64_t)((hi[d] - 1 - plo[d]) * ps_str[d]);
    }
    const uint64_t size = st.nbytes, C = chunk_bytes_;
    uint64_t b = 0, end = size;
    if (!p.chunk_crc.empty()) {
      b = first * es / C * C;
      end = std::min(size, ((last + 1) * es + C - 1) / C * C);
    }
    std::vector<uint8_t> buf(end - b);
    pread_all(path, st.offset + b, buf.data(), end - b);
    if (p.chunk_crc.empty()) {
      uint32_t c = crc_of(buf.data(), size);
      WXE_CHECK(c == p.crc, what, ": checksum mismatch (crc32 ", crc_hex(c), ", index.json says ", crc_hex(p.crc),
                "): the file is corrupt");
    } else {
      for (uint64_t k = b / C; k * C < end; ++k) {
        uint64_t kb = k * C, ke = std::min(size, kb + C);
        uint32_t c = crc_of(buf.data() + (kb - b), ke - kb);
        WXE_CHECK(c == p.chunk_crc[k], what, ": checksum mismatch in bytes [", kb, ", ", ke, ") (crc32 ", crc_hex(c),
                  ", index.json says ", crc_hex(p.chunk_crc[k]), "): the file is corrupt");
      }
    }
    copy_box(buf.data(), pshape, plo, (uint8_t*)out.raw(), out_view, wlo, lo, hi, es, b);
    int64_t n = 1;
    for (int d = 0; d < r; ++d) n *= hi[d] - lo[d];
    copied += n;
  }
  // the index has no gaps (checked when it was parsed) and pieces do not overlap
  WXE_CHECK(copied == out.numel(), dir_, ": tensor '", printable(name), "': the pieces cover ", copied, " of the ",
            out.numel(), " elements of ", slice_str(want));
  return out;
}

// ---- wxe convert

std::string sharded_to_safetensors(const std::string& dir, const std::string& output) {
  ShardedCheckpoint ck(dir);
  std::vector<std::pair<std::string, Tensor>> ts;
  uint64_t bytes = 0;
  for (const std::string& name : ck.names()) {
    ts.push_back({name, ck.read(name)});
    bytes += ts.back().second.nbytes();
  }
  write_safetensors(output, ts, ck.metadata());
  return str("wrote ", output, ": ", ts.size(), " tensors (", bytes, " bytes) assembled from a sharded checkpoint of ",
             ck.world(), " ranks");
}

std::string safetensors_to_sharded(const std::string& input, const std::string& dir, int n) {
  WXE_CHECK(n >= 1, "--shard ", n, ": at least 1 piece");
  std::vector<std::pair<std::string, Tensor>> ts;
  std::map<std::string, std::string> meta;
  if (is_sharded_checkpoint(input)) {
    ShardedCheckpoint ck(input);
    for (const std::string& name : ck.names()) ts.push_back({name, ck.read(name)});
    meta = ck.metadata();
  } else {
    ts = read_safetensors(input, &meta);
  }
  std::vector<std::vector<ShardPiece>> by_rank(n);
  int split = 0;
  for (auto& [name, t] : ts) {
    if (t.rank() < 2 || n == 1) {
      by_rank[0].push_back({name, t.shape, TensorSlice{}, t, true});
      continue;
    }
    ++split;
    for (int r = 0; r < n; ++r) {
      TensorSlice s{0, n, r};
      by_rank[r].push_back({name, t.shape, s, take_block(t, s), true});
    }
  }
  write_sharded(dir, by_rank, meta);
  return str("wrote ", dir, ": ", ts.size(), " tensors in ", n, " files (", split, " split along axis 0, ",
             ts.size() - split, " whole in ", rank_file(0), ")");
}

}  // namespace wxe
