// A thin RAII wrapper over libnetcdf's C API for netCDF-3/4 files (zarr stores go through
// data/zarr.h: Debian's libnetcdf reads only uncompressed zarr and trusts its metadata).
// Errors name the file and the variable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/data_file.h"

namespace wxe {

class NcFile : public DataFile {
 public:
  // `path`: a .nc file, or a libnetcdf URL as is.
  explicit NcFile(const std::string& path);
  ~NcFile() override;
  NcFile(const NcFile&) = delete;
  NcFile& operator=(const NcFile&) = delete;
  const std::string& path() const override { return path_; }
  bool has(const std::string& var) const override;
  std::vector<std::string> dims(const std::string& var) const override;
  std::vector<int64_t> shape(const std::string& var) const override;
  std::vector<double> read(const std::string& var) const override;  // the whole variable, as double
  // A hyperslab as float32 (converted from the stored type).
  std::vector<float> read_f32(const std::string& var, const std::vector<size_t>& start,
                              const std::vector<size_t>& count) const override;
  std::string attr(const std::string& var, const std::string& name) const override;  // text attribute; "" if absent
  std::vector<std::string> variables() const;  // every variable's name, in the file's order

 private:
  int var_id(const std::string& var) const;
  std::string path_;
  int id_ = -1;
};

}  // namespace wxe
