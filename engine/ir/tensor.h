// Tensor: dtype, shape and a reference to storage on a device (host memory unless a backend
// allocated it: engine/exec/backend.h). Always contiguous, row-major.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/error.h"
#include "engine/ir/host_arena.h"

namespace wxe {

enum class DType : uint8_t { F32, F64, F16, BF16, I64, I32, I8, U8, Bool };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

using Shape = std::vector<int64_t>;

// Element count; an Error when it overflows int64 (a hostile shape such as (2^62, 4)).
// Unknown dims (-1) are not checked here.
int64_t numel(const Shape& s);
// Bytes of a tensor of this dtype and shape; an Error on overflow.
size_t tensor_bytes(DType t, const Shape& s);
// Allocations larger than this are an Error naming the size (default: the machine's physical
// memory), so a corrupt shape fails cleanly instead of faulting or being killed later.
size_t max_alloc_bytes();
void set_max_alloc_bytes(size_t n);
// Host tensor memory (storage this process allocated for tensors; not mapped files, not
// libraries' scratch): bytes held now and the most held since reset_host_peak().
size_t host_bytes_live();
size_t host_bytes_peak();
void reset_host_peak();
std::string shape_str(const Shape& s);          // "(1, 7, 32, 64)"
std::vector<int64_t> strides_of(const Shape& s);  // contiguous strides in elements

// Where a storage's bytes live. Host code may dereference only CPU storage.
enum class DeviceKind : uint8_t { CPU, CUDA };
const char* device_name(DeviceKind d);  // "cpu", "cuda"

// A block of bytes shared between tensors (views, reshapes). Host storage is 64-byte
// aligned; device storage comes from a backend with the deleter that frees it.
struct Storage {
  using FreeFn = void (*)(void*);
  explicit Storage(size_t nbytes);  // host memory
  // No bytes (data null), but counted as nbytes in host_bytes_live/peak while it lives: a memory
  // plan run without memory (Tensor::counted, ExecOptions::plan_only).
  struct CountOnly {};
  Storage(size_t nbytes, CountOnly);
  Storage(void* data, size_t nbytes, DeviceKind device, FreeFn free_fn);  // a backend's memory
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  uint8_t* data = nullptr;
  size_t nbytes = 0;
  DeviceKind device = DeviceKind::CPU;
  FreeFn free_fn = nullptr;  // nullptr: host memory from aligned_alloc (or a step's block: lease)
  ArenaLeasePtr lease;       // host memory made in a training step (engine/ir/host_arena.h)
};

struct Tensor {
  DType dtype = DType::F32;
  Shape shape;
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes into storage

  Tensor() = default;
  Tensor(DType t, Shape s);  // allocates, uninitialized
  static Tensor zeros(DType t, Shape s);
  // Its dtype and shape, storage that holds no bytes but counts as nbytes() in host_bytes_live()
  // and host_bytes_peak() (Storage::CountOnly): data() is null. clone() of one is another.
  static Tensor counted(DType t, Shape s);
  static Tensor scalar_f32(float v);
  static Tensor from_i64(const std::vector<int64_t>& v);  // 1-D int64
  static Tensor from_f32(Shape s, const std::vector<float>& v);

  int64_t numel() const { return wxe::numel(shape); }
  size_t nbytes() const { return tensor_bytes(dtype, shape); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int rank() const { return (int)shape.size(); }
  bool defined() const { return storage != nullptr; }
  DeviceKind device() const { return storage ? storage->device : DeviceKind::CPU; }

  void* raw() { return storage->data + offset; }
  const void* raw() const { return storage->data + offset; }
  template <class T> T* data() { return reinterpret_cast<T*>(raw()); }
  template <class T> const T* data() const { return reinterpret_cast<const T*>(raw()); }

  // Same storage, new shape (numel must match).
  Tensor reshaped(Shape s) const;
  // Deep copy.
  Tensor clone() const;
  // The dtype and shape without storage (what a backward kernel that reads no elements gets).
  Tensor shape_only() const {
    Tensor s;
    s.dtype = dtype;
    s.shape = shape;
    return s;
  }
  // Any integer tensor read as int64 values (for shape-carrying inputs).
  std::vector<int64_t> to_i64() const;
  // Any float tensor converted to float32 (copy).
  Tensor to_f32() const;
};

// float16 / bfloat16 <-> float32
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

// Element-wise conversion between dtypes into a preallocated tensor of the same numel.
void convert(const Tensor& src, Tensor& dst);

}  // namespace wxe
