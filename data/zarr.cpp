#include "data/zarr.h"

#include <blosc.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "data/netcdf.h"
#include "engine/ir/error.h"
#include "engine/ir/tensor.h"

namespace fs = std::filesystem;

namespace wxe {

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: a FIFO opens at once and is then refused by fstat
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  WXE_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is not a regular file (a FIFO, socket or device)");
  }
  if ((uint64_t)st.st_size > max_bytes) {
    ::close(fd);
    fail(path, ": ", st.st_size, " bytes, more than the ", max_bytes, " expected");
  }
  std::string out((size_t)st.st_size, '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(fd, &out[done], out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += (size_t)r;
  }
  ::close(fd);
  WXE_CHECK(done == out.size(), path, ": read ", done, " of ", out.size(), " bytes");
  return out;
}

namespace {

constexpr size_t kMaxMeta = 1 << 20;  // a .zarray / .zattrs / .zgroup of more than 1 MiB is not metadata

Json read_meta(const std::string& path, const char* what) {
  Json j = parse_json(read_regular_file(path, kMaxMeta), path, what);
  if (j.type != Json::Obj) fail(path, ": malformed ", what, ": not a JSON object");
  return j;
}

int64_t dim_value(const Json& j, const std::string& path, const char* key, int64_t min) {
  const int64_t v = checked_index(j);
  if (v < min) fail(path, ": ", key, ": '", j.type == Json::Num || j.type == Json::Lit ? j.s : "not a number",
                    "' is not an integer >= ", min);
  return v;
}

bool plain_name(const std::string& v) {
  return !v.empty() && v != "." && v != ".." && v.find('/') == std::string::npos && v.find('\0') == std::string::npos &&
         v[0] != '.';
}

// `n` bytes for `what`, or an Error naming it (a bare std::bad_alloc names nothing).
void allocate(std::string& out, size_t n, const std::string& what) {
  try {
    out.assign(n, '\0');
  } catch (const std::bad_alloc&) {
    fail(what, ": cannot allocate ", n, " bytes (out of memory)");
  }
}

// Decompresses a chunk file's bytes into exactly `want` bytes. What the chunk can hold is
// checked before the `want` bytes are allocated: a 16-byte file declaring 3 GiB is refused, not
// allocated.
void decode_chunk(const std::string& comp, const std::string& src, size_t want, std::string& out, const std::string& file) {
  if (comp.empty()) {
    if (src.size() != want) fail(file, ": chunk is ", src.size(), " bytes, expected ", want, " (uncompressed)");
    out = src;
    return;
  }
  if (comp == "blosc") {
    size_t nbytes = 0;
    if (src.size() < BLOSC_MIN_HEADER_LENGTH || blosc_cbuffer_validate(src.data(), src.size(), &nbytes) != 0)
      fail(file, ": not a valid blosc chunk (", src.size(), " bytes)");
    if (nbytes != want) fail(file, ": blosc chunk holds ", nbytes, " bytes, expected ", want);
    allocate(out, want, file);
    const int r = want ? blosc_decompress_ctx(src.data(), &out[0], want, 1) : 0;
    if (r < 0 || (size_t)r != want) fail(file, ": corrupt blosc chunk");
    return;
  }
  if (comp == "zstd") {
    // the frame's declared size, or (not declared) the most its blocks can hold: an RLE block of
    // 4 bytes makes at most 128 KiB
    const unsigned long long declared = ZSTD_getFrameContentSize(src.data(), src.size());
    if (declared == ZSTD_CONTENTSIZE_ERROR) fail(file, ": corrupt zstd chunk (no zstd frame)");
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != want)
      fail(file, ": zstd chunk holds ", declared, " bytes, expected ", want);
    if (declared == ZSTD_CONTENTSIZE_UNKNOWN && want / 32768 > src.size())
      fail(file, ": a zstd chunk of ", src.size(), " bytes cannot hold the ", want, " bytes expected");
    allocate(out, want, file);
    const size_t r = ZSTD_decompress(&out[0], want, src.data(), src.size());
    if (ZSTD_isError(r)) fail(file, ": corrupt zstd chunk (", ZSTD_getErrorName(r), ")");
    if (r != want) fail(file, ": zstd chunk holds ", r, " bytes, expected ", want);
    return;
  }
  // zlib (numcodecs Zlib: a zlib stream) or gzip (numcodecs GZip: one or more gzip members, as
  // Python's gzip.decompress reads them). Deflate expands at most 1032:1.
  if (src.size() > std::numeric_limits<uInt>::max() || want > std::numeric_limits<uInt>::max())
    fail(file, ": chunk too large for zlib");
  if (want / 1032 > src.size()) fail(file, ": a ", comp, " chunk of ", src.size(), " bytes cannot hold the ", want, " bytes expected");
  allocate(out, want, file);
  z_stream z{};
  if (inflateInit2(&z, comp == "gzip" ? 15 + 16 : 15) != Z_OK) fail(file, ": zlib cannot start");
  z.next_in = (Bytef*)src.data();
  z.avail_in = (uInt)src.size();
  z.next_out = (Bytef*)&out[0];
  z.avail_out = (uInt)want;
  int r = inflate(&z, Z_FINISH);
  while (comp == "gzip" && r == Z_STREAM_END && z.avail_in != 0 && inflateReset(&z) == Z_OK)
    r = inflate(&z, Z_FINISH);  // the next gzip member
  const size_t got = want - z.avail_out;
  const bool rest = z.avail_in != 0;
  inflateEnd(&z);
  if (r == Z_BUF_ERROR && got == want) fail(file, ": ", comp, " chunk holds more than the ", want, " bytes expected");
  if (r != Z_STREAM_END) fail(file, ": corrupt or truncated ", comp, " chunk");
  if (got != want) fail(file, ": ", comp, " chunk holds ", got, " bytes, expected ", want);
  if (rest) fail(file, ": trailing bytes after the ", comp, " stream");
}

// An integer fill_value; an unsigned one may reach 2^64 - 1 (numpy's uint64 maximum), past int64.
double integer_fill(const std::string& text, bool is_unsigned, const std::string& what) {
  if (is_unsigned && !text.empty() && std::isdigit((unsigned char)text[0])) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (end == text.c_str() + text.size() && errno != ERANGE) return (double)v;
  }
  return (double)parse_int64(text, what);
}

// An Error unless `path` (which need not exist) resolves, symlinks followed, to a path inside
// the store's folder `root` (itself resolved): a chunk or an array folder linked elsewhere is
// not read.
void check_inside(const std::string& root, const std::string& path) {
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(path, ec);
  if (ec) fail(path, ": cannot resolve (", ec.message(), ")");
  const fs::path rel = real.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..")
    fail(path, ": resolves to ", real.string(), ", outside the zarr store ", root, " (a symlink out of the store)");
}

// Element i of a decoded chunk as double.
double element(const ZarrStore::Array& a, const char* p) {
  unsigned char b[8];
  std::memcpy(b, p, (size_t)a.itemsize);
  if (a.big_endian)
    for (int i = 0; i < a.itemsize / 2; ++i) std::swap(b[i], b[a.itemsize - 1 - i]);
  switch (a.kind) {
    case 'f':
      if (a.itemsize == 4) {
        float f;
        std::memcpy(&f, b, 4);
        return f;
      } else {
        double d;
        std::memcpy(&d, b, 8);
        return d;
      }
    case 'b':
      return b[0] ? 1.0 : 0.0;
    case 'u': {
      uint64_t u = 0;
      std::memcpy(&u, b, (size_t)a.itemsize);  // little-endian host
      return (double)u;
    }
    default: {
      int64_t v = 0;
      std::memcpy(&v, b, (size_t)a.itemsize);
      const int shift = 64 - 8 * a.itemsize;
      if (shift) v = (int64_t)((uint64_t)v << shift) >> shift;  // sign-extend
      return (double)v;
    }
  }
}

}  // namespace

ZarrStore::ZarrStore(const std::string& dir) : dir_(dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  std::error_code ec;
  WXE_CHECK(fs::is_directory(dir_, ec), dir_, ": no such zarr store (a directory)");
  root_ = fs::canonical(dir_, ec).string();
  WXE_CHECK(!ec, dir_, ": cannot resolve the zarr store (", ec.message(), ")");
  if (!fs::exists(dir_ + "/.zgroup") && fs::exists(dir_ + "/zarr.json"))
    fail(dir_, "/zarr.json: zarr format 3 is not supported (wxe reads zarr v2 stores)");
  const std::string zg = dir_ + "/.zgroup";
  check_inside(root_, zg);
  check_inside(root_, dir_ + "/.zattrs");
  Json g = read_meta(zg, "zarr .zgroup");
  const Json* f = g.get("zarr_format");
  if (!f || f->type != Json::Num || f->s != "2") fail(zg, ": zarr_format ", f ? f->s : "missing", " is not supported (zarr v2)");
  if (fs::exists(dir_ + "/.zattrs")) attrs_ = read_meta(dir_ + "/.zattrs", "zarr .zattrs");
}

bool ZarrStore::has(const std::string& var) const {
  if (arrays_.count(var)) return true;
  std::error_code ec;
  return plain_name(var) && fs::exists(dir_ + "/" + var + "/.zarray", ec);
}

const ZarrStore::Array& ZarrStore::array(const std::string& var) const {
  auto it = arrays_.find(var);
  if (it != arrays_.end()) return *it->second;
  if (!has(var)) fail(dir_, ": no variable '", var, "'");
  auto a = std::make_unique<Array>();
  a->name = var;
  a->dir = dir_ + "/" + var;
  const std::string za = a->dir + "/.zarray";
  check_inside(root_, za);  // the array's folder (or its .zarray) may not be a link out of the store
  Json j = read_meta(za, "zarr .zarray");
  auto key = [&](const char* k) -> const Json& {
    const Json* v = j.get(k);
    if (!v) fail(za, ": no '", k, "'");
    return *v;
  };
  if (key("zarr_format").type != Json::Num || key("zarr_format").s != "2") fail(za, ": zarr_format ", key("zarr_format").s, " is not supported (zarr v2)");
  const Json& shape = key("shape");
  const Json& chunks = key("chunks");
  if (shape.type != Json::Arr || chunks.type != Json::Arr || shape.items.size() != chunks.items.size() ||
      shape.items.size() > 32)
    fail(za, ": shape and chunks must be lists of the same length");
  for (const Json& d : shape.items) a->shape.push_back(dim_value(d, za, "shape", 0));
  int64_t values = 1;  // the whole array's count must be a number: a read of it must not wrap
  for (int64_t d : a->shape)
    if (__builtin_mul_overflow(values, d, &values) || values > (std::numeric_limits<int64_t>::max() >> 4))
      fail(za, ": shape ", shape_str(a->shape), " holds more values than any store can");
  for (const Json& d : chunks.items) a->chunks.push_back(dim_value(d, za, "chunks", 1));
  // dtype: "<f4", ">i8", "|u1", "|b1"
  const Json& dt = key("dtype");
  const std::string t = dt.type == Json::Str ? dt.s : "";
  const bool ok_t = t.size() == 3 && (t[0] == '<' || t[0] == '>' || t[0] == '|') && std::strchr("fiub", t[1]) &&
                    std::strchr("1248", t[2]) && (t[1] != 'f' || t[2] == '4' || t[2] == '8') && (t[1] != 'b' || t[2] == '1');
  if (!ok_t) fail(za, ": dtype ", dt.type == Json::Str ? "'" + printable(t) + "'" : std::string("(not a string)"),
                  " is not supported (float32/64, integers, bool)");
  a->kind = t[1];
  a->itemsize = t[2] - '0';
  a->big_endian = t[0] == '>';
  // the chunk's decoded size, checked before any chunk is read
  int64_t n = 1;
  for (int64_t c : a->chunks) {
    if (n > (int64_t)(max_alloc_bytes() / (size_t)a->itemsize) / c)
      fail(za, ": chunks ", shape_str(a->chunks), " of ", t, " are larger than this machine's memory");
    n *= c;
  }
  const Json& order = key("order");
  if (order.s != "C") fail(za, ": order '", printable(order.s), "' is not supported (C)");
  const Json* filters = j.get("filters");
  if (filters && !(filters->type == Json::Lit && filters->s == "null") &&
      !(filters->type == Json::Arr && filters->items.empty())) {
    const Json* id = filters->type == Json::Arr && filters->items[0].type == Json::Obj ? filters->items[0].get("id") : nullptr;
    fail(za, ": filter '", id ? printable(id->s) : std::string("?"), "' is not supported (no filters)");
  }
  const Json& comp = key("compressor");
  if (!(comp.type == Json::Lit && comp.s == "null")) {
    const Json* id = comp.type == Json::Obj ? comp.get("id") : nullptr;
    if (!id || id->type != Json::Str) fail(za, ": compressor has no id");
    if (id->s != "blosc" && id->s != "zstd" && id->s != "zlib" && id->s != "gzip")
      fail(za, ": compressor '", printable(id->s), "' is not supported (blosc, zstd, zlib, gzip)");
    a->compressor = id->s;
  }
  if (const Json* sep = j.get("dimension_separator")) {
    if (sep->type != Json::Str || (sep->s != "." && sep->s != "/"))
      fail(za, ": dimension_separator '", printable(sep->s), "' is not '.' or '/'");
    a->separator = sep->s;
  }
  const Json& fv = key("fill_value");
  if (fv.type == Json::Num) {
    a->has_fill = true;
    a->fill = a->kind == 'f' ? parse_double(fv.s, za + ": fill_value") : integer_fill(fv.s, a->kind == 'u', za + ": fill_value");
    if (a->kind == 'f' && a->itemsize == 4) a->fill = (double)(float)a->fill;  // compared in the array's dtype
  } else if (fv.type == Json::Str && a->kind == 'f' && (fv.s == "NaN" || fv.s == "Infinity" || fv.s == "-Infinity")) {
    a->has_fill = true;
    a->fill = fv.s == "NaN" ? std::nan("") : fv.s == "Infinity" ? INFINITY : -INFINITY;
  } else if (fv.type == Json::Lit && (fv.s == "null" || (a->kind == 'b' && (fv.s == "true" || fv.s == "false")))) {
  } else {
    fail(za, ": fill_value '", printable(fv.s), "' does not fit dtype ", t);
  }
  // attributes and xarray's dimension names
  const std::string zt = a->dir + "/.zattrs";
  check_inside(root_, zt);
  if (fs::exists(zt)) a->attrs = read_meta(zt, "zarr .zattrs");
  else a->attrs.type = Json::Obj;
  const Json* dims = a->attrs.get("_ARRAY_DIMENSIONS");
  if (!dims) fail(zt, ": no _ARRAY_DIMENSIONS (the dimension names xarray writes)");
  if (dims->type != Json::Arr || dims->items.size() != a->shape.size())
    fail(zt, ": _ARRAY_DIMENSIONS must list ", a->shape.size(), " dimension names (the rank of ", var, "'s shape)");
  for (const Json& d : dims->items) {
    if (d.type != Json::Str || d.s.empty()) fail(zt, ": _ARRAY_DIMENSIONS holds a name that is not a string");
    a->dims.push_back(d.s);
  }
  return *arrays_.emplace(var, std::move(a)).first->second;
}

std::vector<std::string> ZarrStore::dims(const std::string& var) const { return array(var).dims; }
std::vector<int64_t> ZarrStore::shape(const std::string& var) const { return array(var).shape; }

std::string ZarrStore::attr(const std::string& var, const std::string& name) const {
  const Json& at = var.empty() ? attrs_ : array(var).attrs;
  const Json* v = at.type == Json::Obj ? at.get(name) : nullptr;
  return v && v->type == Json::Str ? v->s : "";
}

std::vector<double> ZarrStore::read(const std::string& var) const {
  const Array& a = array(var);
  std::vector<size_t> start(a.shape.size(), 0), count;
  for (int64_t d : a.shape) count.push_back((size_t)d);
  return read_slab(a, start, count);
}

std::vector<float> ZarrStore::read_f32(const std::string& var, const std::vector<size_t>& start,
                                       const std::vector<size_t>& count) const {
  std::vector<double> d = read_slab(array(var), start, count);
  return std::vector<float>(d.begin(), d.end());
}

std::vector<double> ZarrStore::read_slab(const Array& a, const std::vector<size_t>& start,
                                         const std::vector<size_t>& count) const {
  const size_t rank = a.shape.size();
  WXE_CHECK(start.size() == rank && count.size() == rank, dir_, ": variable '", a.name, "': a read of rank ",
            start.size(), " from rank ", rank);
  size_t total = 1;
  bool wraps = false;
  for (size_t d = 0; d < rank; ++d) {
    WXE_CHECK(start[d] <= (size_t)a.shape[d] && count[d] <= (size_t)a.shape[d] - start[d], dir_, ": variable '", a.name,
              "': read outside its shape ", shape_str(a.shape));
    wraps |= __builtin_mul_overflow(total, count[d], &total);
  }
  WXE_CHECK(!wraps && total <= max_alloc_bytes() / sizeof(double), dir_, ": variable '", a.name, "': a read of ",
            shape_str(std::vector<int64_t>(count.begin(), count.end())), " values is larger than this machine's memory");
  std::vector<double> out;
  try {
    out.resize(total);
  } catch (const std::bad_alloc&) {
    fail(dir_, ": variable '", a.name, "': cannot allocate ", total, " values (out of memory)");
  }
  if (!total) return out;
  int64_t chunk_elems = 1;
  for (int64_t c : a.chunks) chunk_elems *= c;
  const size_t chunk_bytes = (size_t)chunk_elems * (size_t)a.itemsize;
  // the chunks the slab touches, in order: chunk index ranges per dim
  std::vector<int64_t> lo(rank), hi(rank), ci(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = (int64_t)start[d] / a.chunks[d];
    hi[d] = ((int64_t)(start[d] + count[d]) - 1) / a.chunks[d];
    ci[d] = lo[d];
  }
  // out strides
  std::vector<size_t> ostride(rank, 1), cstride(rank, 1);
  for (size_t d = rank; d-- > 1;) {
    ostride[d - 1] = ostride[d] * count[d];
    cstride[d - 1] = cstride[d] * (size_t)a.chunks[d];
  }
  const bool mask = a.has_fill && a.kind != 'b';
  for (;;) {
    std::string key;
    for (size_t d = 0; d < rank; ++d) key += (d ? a.separator : "") + std::to_string(ci[d]);
    if (rank == 0) key = "0";
    const std::string file = a.dir + "/" + key;
    const char* raw = chunk(a, file, chunk_bytes).data();
    // copy the intersection of this chunk with the slab, a run along the last dim at a time
    std::vector<int64_t> b(rank), e(rank), idx(rank);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t c0 = ci[d] * a.chunks[d];
      b[d] = std::max<int64_t>(c0, (int64_t)start[d]);
      e[d] = std::min<int64_t>(c0 + a.chunks[d], (int64_t)(start[d] + count[d]));
      idx[d] = b[d];
    }
    const int64_t run = rank ? e[rank - 1] - b[rank - 1] : 1;
    for (;;) {
      size_t o = 0, c = 0;
      for (size_t d = 0; d < rank; ++d) {
        o += (size_t)(idx[d] - (int64_t)start[d]) * ostride[d];
        c += (size_t)(idx[d] - ci[d] * a.chunks[d]) * cstride[d];
      }
      for (int64_t r = 0; r < run; ++r) {
        double v = element(a, raw + (c + (size_t)r) * (size_t)a.itemsize);
        if (mask && (v == a.fill || (std::isnan(a.fill) && std::isnan(v)))) v = std::nan("");
        out[o + (size_t)r] = v;
      }
      size_t d = rank ? rank - 1 : 0;  // the last dim is done by the run
      while (d-- > 0) {
        if (++idx[d] < e[d]) break;
        idx[d] = b[d];
      }
      if (d == (size_t)-1) break;
    }
    size_t d = rank;
    while (d-- > 0) {
      if (++ci[d] <= hi[d]) break;
      ci[d] = lo[d];
    }
    if (d == (size_t)-1) break;
  }
  return out;
}

const std::string& ZarrStore::chunk(const Array& a, const std::string& file, size_t chunk_bytes) const {
  for (auto it = chunks_.begin(); it != chunks_.end(); ++it)
    if (it->first == file) {
      chunks_.splice(chunks_.begin(), chunks_, it);  // most recent first
      return chunks_.front().second;
    }
  check_inside(root_, file);
  std::error_code ec;
  if (!fs::exists(file, ec))
    fail(file, ": missing chunk of variable '", a.name, "' (the zarr spec would read it as fill_value; wxe needs every chunk)");
  // a compressed chunk is at most a little larger than its data
  const std::string src = read_regular_file(file, chunk_bytes + chunk_bytes / 8 + 4096);
  std::string bytes;
  decode_chunk(a.compressor, src, chunk_bytes, bytes, file);
  ++decoded_;
  chunk_bytes_ += bytes.size();
  chunks_.emplace_front(file, std::move(bytes));
  while (chunks_.size() > 2 && chunk_bytes_ > kChunkCacheBytes) {  // the oldest go, the last two stay
    chunk_bytes_ -= chunks_.back().second.size();
    chunks_.pop_back();
  }
  return chunks_.front().second;
}

std::unique_ptr<DataFile> open_data_file(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  // a zarr store: named *.zarr, or any folder (ARCO-ERA5's stores are named *.zarr-v1, *.zarr-v3)
  if ((p.size() > 5 && p.compare(p.size() - 5, 5, ".zarr") == 0) || fs::is_directory(p)) return std::make_unique<ZarrStore>(p);
  return std::make_unique<NcFile>(path);
}

}  // namespace wxe
