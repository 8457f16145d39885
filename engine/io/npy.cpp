#include "engine/io/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace wxe {

namespace {

struct NpyType {
  const char* descr;
  DType dtype;
};
const NpyType kTypes[] = {{"<f4", DType::F32}, {"<f8", DType::F64}, {"<f2", DType::F16},
                          {"<i8", DType::I64}, {"<i4", DType::I32}, {"|i1", DType::I8},
                          {"|u1", DType::U8},  {"|b1", DType::Bool}};

// value of 'key' in the header dict, as raw text up to the next ',' at depth 0 or '}'
std::string dict_field(const std::string& h, const std::string& key, const std::string& path) {
  size_t p = h.find("'" + key + "'");
  WXE_CHECK(p != std::string::npos, path, ": .npy header has no '", key, "'");
  p = h.find(':', p);
  WXE_CHECK(p != std::string::npos, path, ": malformed .npy header");
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  size_t e = p;
  int depth = 0;
  while (e < h.size() && !(depth == 0 && (h[e] == ',' || h[e] == '}'))) {
    if (h[e] == '(') ++depth;
    if (h[e] == ')') --depth;
    ++e;
  }
  return h.substr(p, e - p);
}

// Reads the magic and header of an open .npy stream, leaving it at the first data byte.
NpyHeader read_header(std::ifstream& f, const std::string& path) {
  WXE_CHECK(f.good(), path, ": cannot open file");
  char magic[8];
  f.read(magic, 8);
  WXE_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, path, ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t l;
    f.read((char*)&l, 2);
    hlen = l;
  } else {
    f.read((char*)&hlen, 4);
  }
  WXE_CHECK(f.good() && hlen < (1u << 20), path, ": malformed .npy header");
  std::string h(hlen, '\0');
  f.read(&h[0], hlen);
  WXE_CHECK(f.good(), path, ": truncated .npy header");
  std::string descr = dict_field(h, "descr", path);
  std::string order = dict_field(h, "fortran_order", path);
  std::string shp = dict_field(h, "shape", path);
  WXE_CHECK(order == "False", path, ": Fortran-ordered arrays are not supported");
  descr = descr.substr(1, descr.size() >= 2 ? descr.size() - 2 : 0);  // strip quotes
  const NpyType* type = nullptr;
  for (auto& t : kTypes)
    if (descr == t.descr) type = &t;
  WXE_CHECK(type, path, ": unsupported .npy dtype '", descr, "'");
  Shape shape;
  WXE_CHECK(shp.size() >= 2 && shp.front() == '(' && shp.back() == ')', path,
            ": malformed .npy shape ", shp);
  std::string body = shp.substr(1, shp.size() - 2);
  size_t p = 0;
  while (p < body.size()) {
    while (p < body.size() && (body[p] == ' ' || body[p] == ',')) ++p;
    if (p >= body.size()) break;
    size_t e = p;
    while (e < body.size() && body[e] != ',') ++e;
    try {
      shape.push_back(std::stoll(body.substr(p, e - p)));
    } catch (...) {
      fail(path, ": malformed .npy shape ", shp);
    }
    p = e;
  }
  for (int64_t d : shape) WXE_CHECK(d >= 0, path, ": negative dimension in .npy shape ", shp);
  try {
    tensor_bytes(type->dtype, shape);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  return {type->dtype, shape};
}

}  // namespace

// check_regular_file before the stream opens the path: opening a FIFO blocks until a writer comes
NpyHeader read_npy_header(const std::string& path) {
  check_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  return read_header(f, path);
}

Tensor read_npy(const std::string& path) {
  check_regular_file(path);
  std::ifstream f(path, std::ios::binary);
  NpyHeader h = read_header(f, path);
  const std::streamoff data_at = f.tellg();
  f.seekg(0, std::ios::end);
  const std::streamoff have = f.tellg() - data_at;
  f.seekg(data_at);
  const size_t need = tensor_bytes(h.dtype, h.shape);
  WXE_CHECK(have >= 0 && (uint64_t)have >= need, path, ": truncated .npy data (expected ", need, " bytes for ",
            dtype_name(h.dtype), " ", shape_str(h.shape), ", found ", have, ")");  // before allocating
  Tensor t(h.dtype, h.shape);
  f.read((char*)t.raw(), (std::streamsize)t.nbytes());
  WXE_CHECK((size_t)f.gcount() == t.nbytes(), path, ": truncated .npy data (expected ",
            t.nbytes(), " bytes for ", dtype_name(h.dtype), " ", shape_str(h.shape), ", found ", f.gcount(), ")");
  return t;
}

void write_npy(const std::string& path, const Tensor& t) {
  const char* descr = nullptr;
  for (auto& k : kTypes)
    if (k.dtype == t.dtype) descr = k.descr;
  WXE_CHECK(descr, path, ": cannot write dtype ", dtype_name(t.dtype), " to .npy");
  std::string shp = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) shp += std::to_string(t.shape[i]) + ", ";
  if (t.shape.size() > 1) shp.resize(shp.size() - 2);
  if (t.shape.size() == 1) shp.resize(shp.size() - 1);
  shp += ")";
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shp + ", }";
  size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  uint16_t hl = (uint16_t)h.size();
  bytes.append((const char*)&hl, 2);
  bytes += h;
  bytes.append((const char*)t.raw(), t.nbytes());
  write_file_atomic(path, bytes);
}

}  // namespace wxe
