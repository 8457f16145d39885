// Writing PyTorch checkpoints (the torch.save zip format) without Python: a small pickle
// (protocol 2) writer for the values a checkpoint holds, and the zip archive around it, so
// that torch.load(path, weights_only=True) reads the result.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

// A pickled value: None, bool, int, float, str, tensor, tuple, list, dict (insertion order,
// str or int keys) or OrderedDict.
struct PyValue {
  enum Kind { None, Bool, Int, Float, Str, TensorV, Tuple, List, Dict, OrderedDict } kind = None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  Tensor t;
  std::vector<PyValue> items;                   // Tuple, List
  std::vector<std::pair<PyValue, PyValue>> kv;  // Dict, OrderedDict

  static PyValue none() { return {}; }
  static PyValue boolean(bool v);
  static PyValue integer(int64_t v);
  static PyValue real(double v);
  static PyValue str(const std::string& v);
  static PyValue tensor(const Tensor& v);
  static PyValue tuple(std::vector<PyValue> v);
  static PyValue list(std::vector<PyValue> v);
  static PyValue dict(bool ordered = false);
  PyValue& set(PyValue key, PyValue value);  // Dict / OrderedDict: appends, returns *this
};

// Writes `top` as torch.save would (archive/data.pkl, archive/data/N storages 64-byte aligned,
// archive/byteorder, archive/version), atomically (temp file in the same directory, fsync,
// rename). Errors name the file.
void write_torch_checkpoint(const std::string& path, const PyValue& top);

}  // namespace wxe
