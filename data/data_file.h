// A data file of named, dimensioned variables: a netCDF file (libnetcdf, data/netcdf.h) or a
// zarr v2 store (wxe's own reader, data/zarr.h). Errors name the file and the variable.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wxe {

class DataFile {
 public:
  virtual ~DataFile() = default;
  virtual const std::string& path() const = 0;
  virtual bool has(const std::string& var) const = 0;
  virtual std::vector<std::string> dims(const std::string& var) const = 0;
  virtual std::vector<int64_t> shape(const std::string& var) const = 0;
  virtual std::vector<double> read(const std::string& var) const = 0;  // the whole variable, as double
  // A hyperslab as float32 (converted from the stored type).
  virtual std::vector<float> read_f32(const std::string& var, const std::vector<size_t>& start,
                                      const std::vector<size_t>& count) const = 0;
  // A text attribute of a variable ("": of the file); "" if absent.
  virtual std::string attr(const std::string& var, const std::string& name) const = 0;
};

// A path ending in ".zarr" (a directory) opens with the zarr reader, anything else with
// libnetcdf.
std::unique_ptr<DataFile> open_data_file(const std::string& path);

}  // namespace wxe
