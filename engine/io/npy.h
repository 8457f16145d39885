// Layer: engine/io (file formats), over engine/ir.
// .npy files (NumPy format 1.0/2.0/3.0), C order, little-endian.
#pragma once
#include <string>

#include "engine/io/file_util.h"  // write_file_atomic
#include "engine/ir/tensor.h"

namespace wxe {

// Reads any supported dtype (float32/64, float16, int64/32, int8, uint8, bool).
Tensor read_npy(const std::string& path);
// Only the header: dtype and shape, without reading the data (cheap checks over many files).
struct NpyHeader {
  DType dtype;
  Shape shape;
};
NpyHeader read_npy_header(const std::string& path);
// Writes atomically (temporary file, fsync, rename).
void write_npy(const std::string& path, const Tensor& t);

}  // namespace wxe
