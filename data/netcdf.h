// A thin RAII wrapper over libnetcdf's C API: netCDF-3/4 files and zarr stores (NCZarr,
// through a file:// URL with mode=zarr). Errors name the file and the variable.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace wxe {

class NcFile {
 public:
  // `path`: a .nc file, a .zarr directory, or a libnetcdf URL as is.
  explicit NcFile(const std::string& path);
  ~NcFile();
  NcFile(const NcFile&) = delete;
  NcFile& operator=(const NcFile&) = delete;
  const std::string& path() const { return path_; }
  bool has(const std::string& var) const;
  std::vector<std::string> dims(const std::string& var) const;
  std::vector<int64_t> shape(const std::string& var) const;
  std::vector<double> read(const std::string& var) const;  // the whole variable, as double
  // A hyperslab as float32 (converted from the stored type).
  std::vector<float> read_f32(const std::string& var, const std::vector<size_t>& start,
                              const std::vector<size_t>& count) const;
  std::string attr(const std::string& var, const std::string& name) const;  // text attribute; "" if absent

 private:
  int var_id(const std::string& var) const;
  std::string path_;
  int id_ = -1;
};

// The libnetcdf path for a user path: a .zarr directory becomes file://ABS#mode=zarr,file.
std::string nc_open_path(const std::string& path);

}  // namespace wxe
