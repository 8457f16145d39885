#include "importers/torch/torch_save.h"

#include <zlib.h>

#include <cstring>

#include "engine/io/npy.h"

namespace wxe {

PyValue PyValue::boolean(bool v) {
  PyValue p;
  p.kind = Bool;
  p.b = v;
  return p;
}
PyValue PyValue::integer(int64_t v) {
  PyValue p;
  p.kind = Int;
  p.i = v;
  return p;
}
PyValue PyValue::real(double v) {
  PyValue p;
  p.kind = Float;
  p.f = v;
  return p;
}
PyValue PyValue::str(const std::string& v) {
  PyValue p;
  p.kind = Str;
  p.s = v;
  return p;
}
PyValue PyValue::tensor(const Tensor& v) {
  PyValue p;
  p.kind = TensorV;
  p.t = v;
  return p;
}
PyValue PyValue::tuple(std::vector<PyValue> v) {
  PyValue p;
  p.kind = Tuple;
  p.items = std::move(v);
  return p;
}
PyValue PyValue::list(std::vector<PyValue> v) {
  PyValue p;
  p.kind = List;
  p.items = std::move(v);
  return p;
}
PyValue PyValue::dict(bool ordered) {
  PyValue p;
  p.kind = ordered ? OrderedDict : Dict;
  return p;
}
PyValue& PyValue::set(PyValue key, PyValue value) {
  kv.push_back({std::move(key), std::move(value)});
  return *this;
}

namespace {

const char* storage_type(DType t) {
  switch (t) {
    case DType::F32: return "FloatStorage";
    case DType::F64: return "DoubleStorage";
    case DType::F16: return "HalfStorage";
    case DType::BF16: return "BFloat16Storage";
    case DType::I64: return "LongStorage";
    case DType::I32: return "IntStorage";
    case DType::I8: return "CharStorage";
    case DType::U8: return "ByteStorage";
    case DType::Bool: return "BoolStorage";
  }
  return "FloatStorage";
}

// Pickle protocol 2, no memo (every value is written where it occurs).
class Pickler {
 public:
  std::string out;
  std::vector<Tensor> storages;  // data/0, data/1, ...

  void value(const PyValue& v) {
    switch (v.kind) {
      case PyValue::None: op('N'); break;
      case PyValue::Bool: op(v.b ? '\x88' : '\x89'); break;
      case PyValue::Int: integer(v.i); break;
      case PyValue::Float: {
        op('G');
        uint64_t bits;
        std::memcpy(&bits, &v.f, 8);
        for (int k = 7; k >= 0; --k) out.push_back((char)(bits >> (8 * k)));  // big-endian
        break;
      }
      case PyValue::Str: string(v.s); break;
      case PyValue::Tuple: tuple(v.items); break;
      case PyValue::List:
        op(']');
        if (!v.items.empty()) {
          op('(');
          for (auto& x : v.items) value(x);
          op('e');  // APPENDS
        }
        break;
      case PyValue::Dict:
      case PyValue::OrderedDict:
        if (v.kind == PyValue::OrderedDict) {
          global("collections", "OrderedDict");
          op(')');
          op('R');
        } else {
          op('}');
        }
        if (!v.kv.empty()) {
          op('(');
          for (auto& [k, x] : v.kv) {
            value(k);
            value(x);
          }
          op('u');  // SETITEMS
        }
        break;
      case PyValue::TensorV: tensor(v.t); break;
    }
  }

 private:
  void op(char c) { out.push_back(c); }
  void u32(uint32_t x) {
    for (int k = 0; k < 4; ++k) out.push_back((char)(x >> (8 * k)));
  }
  void integer(int64_t x) {
    if (x >= INT32_MIN && x <= INT32_MAX) {
      op('J');
      u32((uint32_t)(int32_t)x);
    } else {  // LONG1: 8 little-endian two's-complement bytes
      op('\x8a');
      out.push_back(8);
      for (int k = 0; k < 8; ++k) out.push_back((char)((uint64_t)x >> (8 * k)));
    }
  }
  void string(const std::string& s) {
    op('X');
    u32((uint32_t)s.size());
    out += s;
  }
  void global(const std::string& module, const std::string& name) {
    op('c');
    out += module + "\n" + name + "\n";
  }
  void tuple(const std::vector<PyValue>& items) {
    if (items.empty()) return op(')');
    op('(');
    for (auto& x : items) value(x);
    op('t');
  }
  void ints_tuple(const std::vector<int64_t>& v) {
    std::vector<PyValue> items;
    for (int64_t x : v) items.push_back(PyValue::integer(x));
    tuple(items);
  }
  // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)
  void tensor(const Tensor& t) {
    const std::string key = std::to_string(storages.size());
    storages.push_back(t);
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    // persistent id ('storage', torch.<T>Storage, key, 'cpu', numel)
    op('(');
    string("storage");
    global("torch", storage_type(t.dtype));
    string(key);
    string("cpu");
    integer(t.numel());
    op('t');
    op('Q');  // BINPERSID
    integer(0);
    ints_tuple(t.shape);
    ints_tuple(strides_of(t.shape));
    op('\x89');  // requires_grad False
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }
};

// A stored (uncompressed) zip archive; entry data aligned to 64 bytes with the local header's
// extra field, as torch.save does.
class ZipWriter {
 public:
  std::string bytes;
  void add(const std::string& name, const void* data, size_t n) {
    WXE_CHECK(n < 0xffffffffull && bytes.size() < 0xffffffffull, "zip entry '", name,
              "' is 4 GiB or more (ZIP64 writing is not supported)");
    const uint32_t crc = (uint32_t)crc32_of(data, n);
    const size_t header_end = bytes.size() + 30 + name.size();
    size_t extra = (64 - (header_end + 4) % 64) % 64 + 4;  // a 4-byte extra-field header plus padding
    Entry e{name, crc, (uint32_t)n, (uint32_t)bytes.size()};
    u32(0x04034b50);
    u16(20);  // version needed
    u16(0);   // flags
    u16(0);   // stored
    u16(0);
    u16(0x21);  // time/date: any fixed value
    u32(crc);
    u32((uint32_t)n);
    u32((uint32_t)n);
    u16((uint16_t)name.size());
    u16((uint16_t)extra);
    bytes += name;
    u16(0x6a61);  // private extra-field id, padding only
    u16((uint16_t)(extra - 4));
    bytes.append(extra - 4, '\0');
    bytes.append((const char*)data, n);
    entries_.push_back(e);
  }
  void finish() {
    const uint32_t cd_start = (uint32_t)bytes.size();
    for (const Entry& e : entries_) {
      u32(0x02014b50);
      u16(20);
      u16(20);
      u16(0);
      u16(0);
      u16(0);
      u16(0x21);
      u32(e.crc);
      u32(e.size);
      u32(e.size);
      u16((uint16_t)e.name.size());
      u16(0);
      u16(0);
      u16(0);
      u16(0);
      u32(0);
      u32(e.offset);
      bytes += e.name;
    }
    const uint32_t cd_size = (uint32_t)bytes.size() - cd_start;
    u32(0x06054b50);
    u16(0);
    u16(0);
    u16((uint16_t)entries_.size());
    u16((uint16_t)entries_.size());
    u32(cd_size);
    u32(cd_start);
    u16(0);
  }

 private:
  struct Entry {
    std::string name;
    uint32_t crc, size, offset;
  };
  std::vector<Entry> entries_;
  static unsigned long crc32_of(const void* p, size_t n) {
    unsigned long c = ::crc32(0L, Z_NULL, 0);
    const Bytef* b = (const Bytef*)p;
    while (n) {
      uInt chunk = (uInt)std::min<size_t>(n, 1u << 30);
      c = ::crc32(c, b, chunk);
      b += chunk;
      n -= chunk;
    }
    return c;
  }
  void u16(uint16_t x) {
    bytes.push_back((char)(x & 255));
    bytes.push_back((char)(x >> 8));
  }
  void u32(uint32_t x) {
    for (int k = 0; k < 4; ++k) bytes.push_back((char)(x >> (8 * k)));
  }
};

}  // namespace

void write_torch_checkpoint(const std::string& path, const PyValue& top) {
  Pickler p;
  p.out = "\x80\x02";  // PROTO 2
  p.value(top);
  p.out.push_back('.');
  ZipWriter z;
  try {
    z.add("archive/data.pkl", p.out.data(), p.out.size());
    z.add("archive/byteorder", "little", 6);
    for (size_t k = 0; k < p.storages.size(); ++k)
      z.add("archive/data/" + std::to_string(k), p.storages[k].raw(), p.storages[k].nbytes());
    z.add("archive/version", "3\n", 2);
    z.finish();
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  write_file_atomic(path, z.bytes);
}

}  // namespace wxe
