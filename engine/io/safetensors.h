// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header size N, N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// (padded with spaces to a multiple of 8), then the tensor bytes (little-endian, C order).
// Dtypes: F32, F16, BF16, F64, I64, I32, I8, U8, BOOL.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

// Writes atomically (write_file_atomic); tensors in the given order; loadable by
// safetensors.torch.load_file. Names must be unique, valid UTF-8 and not "__metadata__".
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor, in the order of the header. The header is parsed by a strict JSON
// parser; offsets must lie within the data, be contiguous and non-overlapping and cover it
// exactly, and each tensor's byte size must equal numel * dtype size. Errors are wxe::Error
// naming the file (and the tensor).
//
// With `slices`, a listed tensor is read only in part: block `index` of `parts` equal blocks
// along `axis`; it comes back at full shape with the other blocks zero (a tensor-parallel
// rank reads only the rows or columns it keeps). With `groups` G > 1 the axis is G equal
// groups and the slice is block `index` of `parts` within each group (a fused to_qkv weight
// (3I, D, 1, 1) sharded by heads: G = 3, rank r keeps head block r of each of q, k and v);
// such a slice is the plain block of axis + 1 of the tensor viewed with `axis` split in
// (G, n / G).
struct TensorSlice {
  int axis = 0, parts = 1, index = 0, groups = 1;
};
std::vector<std::pair<std::string, Tensor>> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
    const std::map<std::string, TensorSlice>* slices = nullptr);

// The header alone, validated as read_safetensors validates it, without reading the data:
// each tensor's dtype, shape and where its bytes lie in the file (absolute byte offset).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0, nbytes = 0;
};
std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                     std::map<std::string, std::string>* metadata = nullptr);

// The safetensors name of a dtype ("F32"; nullptr where it has none), and back (false if unknown).
const char* safetensors_dtype_name(DType t);
bool safetensors_dtype(const std::string& name, DType* t);

}  // namespace wxe
