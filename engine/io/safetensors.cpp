#include "engine/io/safetensors.h"

#include "engine/io/json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>
#include <stdexcept>

#include "engine/io/npy.h"

namespace wxe {

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // as the reference implementation
constexpr size_t kMaxDims = 64;

struct StType {
  const char* name;
  DType dtype;
};
const StType kStTypes[] = {{"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
                           {"F64", DType::F64}, {"I64", DType::I64}, {"I32", DType::I32},
                           {"I8", DType::I8},   {"U8", DType::U8},   {"BOOL", DType::Bool}};

const char* st_name(DType t) {
  for (auto& s : kStTypes)
    if (s.dtype == t) return s.name;
  return nullptr;
}

class File {
 public:
  explicit File(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO opens, then fstat refuses it
    WXE_CHECK(fd_ >= 0, path, ": cannot open (", std::strerror(errno), ")");
    struct stat st;
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path, ": not a regular file");
    }
    size_ = (uint64_t)st.st_size;
  }
  ~File() { ::close(fd_); }
  uint64_t size() const { return size_; }
  void read(uint64_t off, void* dst, uint64_t n) const {
    WXE_CHECK(off <= size_ && n <= size_ - off, path_, ": truncated safetensors file");
    uint8_t* d = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, d, (size_t)std::min<uint64_t>(n, 1u << 30), (off_t)off);
      if (r < 0 && errno == EINTR) continue;
      WXE_CHECK(r > 0, path_, ": read error: ", r < 0 ? std::strerror(errno) : "unexpected end of file");
      d += r;
      off += (uint64_t)r;
      n -= (uint64_t)r;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct Pending {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// The validated header: its entries (offsets relative to the data) and where the data starts.
struct Header {
  std::vector<Pending> pend;
  uint64_t data_start = 0;
};

Header read_header(const File& f, const std::string& path, std::map<std::string, std::string>* metadata) {
  WXE_CHECK(f.size() >= 8, path, ": not a safetensors file (", f.size(), " bytes)");
  uint8_t hb[8];
  f.read(0, hb, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | hb[i];
  WXE_CHECK(n <= f.size() - 8, path, ": safetensors header size ", n,
            " runs past the end of the file (truncated or not a safetensors file)");
  WXE_CHECK(n <= kMaxHeader, path, ": safetensors header of ", n, " bytes is too large");
  std::string text(n, '\0');
  f.read(8, &text[0], n);
  Json root = parse_json(text, path, "safetensors header");
  WXE_CHECK(root.type == Json::Obj, path, ": safetensors header is not a JSON object");
  uint64_t data_size = f.size() - 8 - n;

  if (metadata) metadata->clear();
  std::vector<Pending> pend;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    const Json& v = root.items[i];
    if (name == "__metadata__") {
      WXE_CHECK(v.type == Json::Obj, path, ": __metadata__ is not an object");
      for (size_t k = 0; k < v.keys.size(); ++k) {
        WXE_CHECK(v.items[k].type == Json::Str, path, ": __metadata__ value of '",
                  printable(v.keys[k]), "' is not a string");
        if (metadata) (*metadata)[v.keys[k]] = v.items[k].s;
      }
      continue;
    }
    std::string tn = "tensor '" + printable(name) + "'";
    WXE_CHECK(v.type == Json::Obj, path, ": ", tn, ": header entry is not an object");
    const Json* dt = v.get("dtype");
    const Json* shp = v.get("shape");
    const Json* off = v.get("data_offsets");
    WXE_CHECK(dt && dt->type == Json::Str, path, ": ", tn, ": missing or bad \"dtype\"");
    WXE_CHECK(shp && shp->type == Json::Arr, path, ": ", tn, ": missing or bad \"shape\"");
    WXE_CHECK(off && off->type == Json::Arr && off->items.size() == 2, path, ": ", tn,
              ": missing or bad \"data_offsets\"");
    Pending p;
    p.name = name;
    const StType* st = nullptr;
    for (auto& s : kStTypes)
      if (dt->s == s.name) st = &s;
    WXE_CHECK(st, path, ": ", tn, ": unsupported dtype '", printable(dt->s), "'");
    p.dtype = st->dtype;
    WXE_CHECK(shp->items.size() <= kMaxDims, path, ": ", tn, ": too many dimensions");
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : shp->items) {
      int64_t x = checked_index(d);
      WXE_CHECK(x >= 0, path, ": ", tn, ": shape entries must be non-negative integers");
      p.shape.push_back(x);
      overflow |= __builtin_mul_overflow(numel, (uint64_t)x, &numel);
    }
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)dtype_size(p.dtype), &nbytes);
    WXE_CHECK(!overflow && numel <= (uint64_t)INT64_MAX, path, ": ", tn, ": shape ",
              shape_str(p.shape), " is too large");
    int64_t b = checked_index(off->items[0]), e = checked_index(off->items[1]);
    WXE_CHECK(b >= 0 && e >= 0, path, ": ", tn, ": data_offsets must be non-negative integers");
    p.begin = (uint64_t)b;
    p.end = (uint64_t)e;
    WXE_CHECK(p.begin <= p.end && p.end <= data_size, path, ": ", tn, ": data_offsets [", b, ", ",
              e, "] lie outside the data (", data_size, " bytes)");
    WXE_CHECK(p.end - p.begin == nbytes, path, ": ", tn, ": data_offsets [", b, ", ", e,
              "] hold ", p.end - p.begin, " bytes but ", dt->s, " ", shape_str(p.shape), " needs ",
              nbytes);
    pend.push_back(std::move(p));
  }
  // Offsets: contiguous, non-overlapping, covering the data exactly.
  std::vector<size_t> idx(pend.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return pend[a].begin != pend[b].begin ? pend[a].begin < pend[b].begin : pend[a].end < pend[b].end;
  });
  uint64_t at = 0;
  for (size_t i : idx) {
    WXE_CHECK(pend[i].begin == at, path, ": tensor '", printable(pend[i].name), "': data_offsets [",
              pend[i].begin, ", ", pend[i].end, "] ",
              pend[i].begin < at ? "overlap another tensor" : "leave a gap", " (expected begin ", at, ")");
    at = pend[i].end;
  }
  WXE_CHECK(at == data_size, path, ": the tensors cover ", at, " of the ", data_size,
            " data bytes (truncated or corrupt file)");
  return {std::move(pend), 8 + n};
}

std::vector<std::pair<std::string, Tensor>> read_impl(const std::string& path,
                                                      std::map<std::string, std::string>* metadata,
                                                      const std::map<std::string, TensorSlice>* slices) {
  File f(path);
  Header h = read_header(f, path, metadata);
  std::vector<Pending>& pend = h.pend;
  const uint64_t n = h.data_start - 8;
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(pend.size());
  for (Pending& p : pend) {
    auto sl = slices ? slices->find(p.name) : std::map<std::string, TensorSlice>::const_iterator();
    if (!slices || sl == slices->end()) {
      Tensor t(p.dtype, p.shape);
      f.read(8 + n + p.begin, t.raw(), p.end - p.begin);
      out.emplace_back(std::move(p.name), std::move(t));
      continue;
    }
    // only block `index` of `parts` along `axis`; the rest stays zero
    const TensorSlice& s = sl->second;
    WXE_CHECK(s.axis >= 0 && s.axis < (int)p.shape.size() && s.parts > 0 && s.groups > 0 &&
                  p.shape[s.axis] % ((int64_t)s.parts * s.groups) == 0,
              path, ": tensor '", printable(p.name), "' ", shape_str(p.shape), " cannot be split in ", s.parts,
              " along dim ", s.axis, s.groups > 1 ? str(" within ", s.groups, " groups") : std::string());
    Tensor t = Tensor::zeros(p.dtype, p.shape);
    // groups: the axis viewed as (groups, n / groups), the block taken in the second
    uint64_t es = dtype_size(p.dtype), inner = es, outer = (uint64_t)s.groups;
    for (int d = 0; d < s.axis; ++d) outer *= (uint64_t)p.shape[d];
    for (size_t d = s.axis + 1; d < p.shape.size(); ++d) inner *= (uint64_t)p.shape[d];
    uint64_t dim = (uint64_t)p.shape[s.axis] / s.groups, part = dim / s.parts;
    for (uint64_t o = 0; o < outer; ++o) {
      uint64_t off = (o * dim + (uint64_t)s.index * part) * inner;
      f.read(8 + n + p.begin + off, (uint8_t*)t.raw() + off, part * inner);
    }
    out.emplace_back(std::move(p.name), std::move(t));
  }
  return out;
}

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (auto& [k, v] : metadata) {
      WXE_CHECK(valid_utf8(k) && valid_utf8(v), path, ": metadata '", printable(k),
                "' is not valid UTF-8");
      if (h.back() != '{') h += ',';
      json_string(h, k);
      h += ':';
      json_string(h, v);
    }
    h += '}';
    first = false;
  }
  std::set<std::string> names;
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    WXE_CHECK(name != "__metadata__", path, ": a tensor cannot be named __metadata__");
    WXE_CHECK(valid_utf8(name), path, ": tensor name '", printable(name), "' is not valid UTF-8");
    WXE_CHECK(names.insert(name).second, path, ": duplicate tensor name '", printable(name), "'");
    const char* dt = st_name(t.dtype);
    WXE_CHECK(dt, path, ": tensor '", printable(name), "': dtype ", dtype_name(t.dtype),
              " cannot be written to safetensors");
    WXE_CHECK(t.defined() || t.numel() == 0, path, ": tensor '", printable(name), "' has no data");
    if (!first) h += ',';
    first = false;
    json_string(h, name);
    h += ":{\"dtype\":\"";
    h += dt;
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
    h += "],\"data_offsets\":[" + std::to_string(off) + ",";
    off += t.nbytes();
    h += std::to_string(off) + "]}";
  }
  h += '}';
  while (h.size() % 8) h += ' ';
  std::string bytes;
  bytes.reserve(8 + h.size() + off);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) bytes += (char)((n >> (8 * i)) & 0xff);
  bytes += h;
  for (auto& [name, t] : tensors)
    if (t.nbytes()) bytes.append(static_cast<const char*>(t.raw()), t.nbytes());
  write_file_atomic(path, bytes);
}

std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                     std::map<std::string, std::string>* metadata) {
  try {
    File f(path);
    Header h = read_header(f, path, metadata);
    std::vector<SafetensorsEntry> r;
    for (Pending& p : h.pend)
      r.push_back({std::move(p.name), p.dtype, std::move(p.shape), h.data_start + p.begin, p.end - p.begin});
    return r;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory reading the safetensors header");
  } catch (const std::length_error&) {
    fail(path, ": corrupt safetensors file (impossible size)");
  }
}

const char* safetensors_dtype_name(DType t) { return st_name(t); }

bool safetensors_dtype(const std::string& name, DType* t) {
  for (auto& s : kStTypes)
    if (name == s.name) {
      *t = s.dtype;
      return true;
    }
  return false;
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata,
    const std::map<std::string, TensorSlice>* slices) {
  try {
    return read_impl(path, metadata, slices);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(path, ": out of memory reading the safetensors file");
  } catch (const std::length_error&) {
    fail(path, ": corrupt safetensors file (impossible size)");
  }
}

}  // namespace wxe
