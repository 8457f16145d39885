#include "engine/ir/tensor.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace wxe {

void assert_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "wxe: internal error: %s (%s:%d)\n", cond, file, line);
  std::abort();
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: case DType::U8: case DType::Bool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "?";
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n)) fail("shape ", shape_str(s), " has too many elements (overflow)");
  return n;
}

size_t tensor_bytes(DType t, const Shape& s) {
  int64_t n = numel(s), b = 0;
  if (n < 0 || __builtin_mul_overflow(n, (int64_t)dtype_size(t), &b))
    fail("shape ", shape_str(s), " of ", dtype_name(t), " has no valid byte size");
  return (size_t)b;
}

namespace {
size_t g_max_alloc = 0;  // 0: physical memory, looked up once
}

size_t max_alloc_bytes() {
  if (!g_max_alloc) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    g_max_alloc = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : ((size_t)1 << 40);
  }
  return g_max_alloc;
}
void set_max_alloc_bytes(size_t n) { g_max_alloc = n; }

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {
std::atomic<size_t> g_host_live{0}, g_host_peak{0};
}  // namespace

size_t host_bytes_live() { return g_host_live.load(); }
size_t host_bytes_peak() { return g_host_peak.load(); }
void reset_host_peak() { g_host_peak.store(g_host_live.load()); }

Storage::Storage(size_t n) : nbytes(n) {
  WXE_CHECK(n <= max_alloc_bytes(), "cannot allocate ", n, " bytes (more than the ", max_alloc_bytes(),
            " bytes of memory this machine has; corrupt or hostile shape?)");
  data = arena_take(n, &lease);
  if (!data) {
    size_t rounded = (n + 63) / 64 * 64;
    data = static_cast<uint8_t*>(std::aligned_alloc(64, rounded ? rounded : 64));
    if (!data) fail("out of memory allocating ", n, " bytes");
  }
  const size_t live = g_host_live.fetch_add(n) + n;
  size_t peak = g_host_peak.load();
  while (live > peak && !g_host_peak.compare_exchange_weak(peak, live)) {
  }
}
Storage::Storage(size_t n, CountOnly) : nbytes(n) {
  const size_t live = g_host_live.fetch_add(n) + n;
  size_t peak = g_host_peak.load();
  while (live > peak && !g_host_peak.compare_exchange_weak(peak, live)) {
  }
}
Storage::Storage(void* p, size_t n, DeviceKind dev, FreeFn f)
    : data(static_cast<uint8_t*>(p)), nbytes(n), device(dev), free_fn(f) {}
Storage::~Storage() {
  if (free_fn) {
    free_fn(data);
  } else {
    if (!lease || !arena_owns(*lease)) std::free(data);
    lease.reset();
    g_host_live.fetch_sub(nbytes);
  }
}

const char* device_name(DeviceKind d) { return d == DeviceKind::CUDA ? "cuda" : "cpu"; }

Tensor::Tensor(DType t, Shape s) : dtype(t), shape(std::move(s)) {
  for (int64_t d : shape) WXE_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  size_t n = nbytes();
  WXE_CHECK(n <= max_alloc_bytes(), "a tensor of shape ", shape_str(shape), " ", dtype_name(dtype), " needs ", n,
            " bytes, more than the ", max_alloc_bytes(), " bytes of memory this machine has");
  storage = std::make_shared<Storage>(n);
}

Tensor Tensor::zeros(DType t, Shape s) {
  Tensor r(t, std::move(s));
  std::memset(r.raw(), 0, r.nbytes());
  return r;
}

Tensor Tensor::counted(DType t, Shape s) {
  Tensor r;
  r.dtype = t;
  r.shape = std::move(s);
  r.storage = std::make_shared<Storage>(r.nbytes(), Storage::CountOnly{});
  return r;
}

Tensor Tensor::scalar_f32(float v) {
  Tensor r(DType::F32, {});
  *r.data<float>() = v;
  return r;
}

Tensor Tensor::from_i64(const std::vector<int64_t>& v) {
  Tensor r(DType::I64, {(int64_t)v.size()});
  if (!v.empty()) std::memcpy(r.raw(), v.data(), v.size() * 8);
  return r;
}

Tensor Tensor::from_f32(Shape s, const std::vector<float>& v) {
  Tensor r(DType::F32, std::move(s));
  WXE_ASSERT((int64_t)v.size() == r.numel());
  if (!v.empty()) std::memcpy(r.raw(), v.data(), v.size() * 4);
  return r;
}

Tensor Tensor::reshaped(Shape s) const {
  WXE_ASSERT(wxe::numel(s) == numel());
  Tensor r = *this;
  r.shape = std::move(s);
  return r;
}

Tensor Tensor::clone() const {
  if (storage && !storage->data && storage->device == DeviceKind::CPU) return counted(dtype, shape);
  Tensor r(dtype, shape);
  if (nbytes()) std::memcpy(r.raw(), raw(), nbytes());
  return r;
}

std::vector<int64_t> Tensor::to_i64() const {
  std::vector<int64_t> v((size_t)numel());
  Tensor dst(DType::I64, shape);
  convert(*this, dst);
  if (!v.empty()) std::memcpy(v.data(), dst.raw(), v.size() * 8);
  return v;
}

Tensor Tensor::to_f32() const {
  Tensor dst(DType::F32, shape);
  convert(*this, dst);
  return dst;
}

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | (uint32_t)exp << 10 | man >> 13;
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // round to nearest even
  return (uint16_t)half;
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

namespace {
double load(const Tensor& t, int64_t i) {
  const void* p = t.raw();
  switch (t.dtype) {
    case DType::F32: return ((const float*)p)[i];
    case DType::F64: return ((const double*)p)[i];
    case DType::F16: return half_to_float(((const uint16_t*)p)[i]);
    case DType::BF16: return bf16_to_float(((const uint16_t*)p)[i]);
    case DType::I64: return (double)((const int64_t*)p)[i];
    case DType::I32: return ((const int32_t*)p)[i];
    case DType::I8: return ((const int8_t*)p)[i];
    case DType::U8: return ((const uint8_t*)p)[i];
    case DType::Bool: return ((const uint8_t*)p)[i] ? 1 : 0;
  }
  return 0;
}
}  // namespace

void convert(const Tensor& src, Tensor& dst) {
  WXE_ASSERT(src.numel() == dst.numel());
  int64_t n = src.numel();
  if (src.dtype == dst.dtype) {
    if (n) std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  if (src.dtype == DType::I64 && dst.dtype != DType::F32 && dst.dtype != DType::F64) {
    // integer -> integer without going through double (keeps large int64 exact)
    const int64_t* s = src.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      switch (dst.dtype) {
        case DType::I32: dst.data<int32_t>()[i] = (int32_t)s[i]; break;
        case DType::I8: dst.data<int8_t>()[i] = (int8_t)s[i]; break;
        case DType::U8: dst.data<uint8_t>()[i] = (uint8_t)s[i]; break;
        case DType::Bool: dst.data<uint8_t>()[i] = s[i] != 0; break;
        case DType::F16: dst.data<uint16_t>()[i] = float_to_half((float)s[i]); break;
        case DType::BF16: dst.data<uint16_t>()[i] = float_to_bf16((float)s[i]); break;
        default: WXE_ASSERT(false);
      }
    }
    return;
  }
  void* d = dst.raw();
  for (int64_t i = 0; i < n; ++i) {
    double v = load(src, i);
    switch (dst.dtype) {
      case DType::F32: ((float*)d)[i] = (float)v; break;
      case DType::F64: ((double*)d)[i] = v; break;
      case DType::F16: ((uint16_t*)d)[i] = float_to_half((float)v); break;
      case DType::BF16: ((uint16_t*)d)[i] = float_to_bf16((float)v); break;
      case DType::I64:
        ((int64_t*)d)[i] = src.dtype == DType::I64 ? src.data<int64_t>()[i] : (int64_t)v;
        break;
      case DType::I32: ((int32_t*)d)[i] = (int32_t)v; break;
      case DType::I8: ((int8_t*)d)[i] = (int8_t)v; break;
      case DType::U8: ((uint8_t*)d)[i] = (uint8_t)v; break;
      case DType::Bool: ((uint8_t*)d)[i] = v != 0; break;
    }
  }
}

}  // namespace wxe
