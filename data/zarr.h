// A zarr v2 store reader (a directory: .zgroup, one folder per array with .zarray, .zattrs
// and its chunk files), as xarray and the zarr package write ERA5 stores. Not libnetcdf:
// Debian's libnetcdf reads only uncompressed zarr, and crashes or reads garbage on malformed
// metadata or chunks.
//
// - Metadata (.zgroup, .zarray, .zattrs) is read through engine/io/json.h's strict parser; the
//   dimension names come from xarray's `_ARRAY_DIMENSIONS` attribute.
// - dtypes: little- or big-endian float (f4, f8), signed and unsigned integers (1 to 8 bytes),
//   bool; order "C"; no filters; compressor null, blosc, zstd, zlib or gzip (Debian's libblosc,
//   libzstd, zlib). Anything else is an error naming the file and the value.
// - Every chunk file must decompress to exactly the chunk's size (chunks x itemsize; edge
//   chunks are stored whole, as the spec says). A chunk larger than the machine's memory is
//   refused before it is read.
// - fill_value: elements equal to the array's fill_value read as NaN, as xarray (CREDIT's
//   reader) decodes them: they are missing values, which the data layer then refuses (zarr's
//   default fill_value 0 makes zeros missing, for xarray as here).
// - A missing chunk is an error naming its file. (The zarr spec reads a missing chunk as
//   fill_value; for model inputs that is a silent wrong answer, so wxe refuses it.)
// - Chunk files and metadata must be regular files: a FIFO is an error, not a hang. They and the
//   array folders must resolve inside the store (a symlink out of it is an error; the store's
//   own path may be a link). A chunk's decoded size is checked against what its compressed
//   bytes can hold before it is allocated, and a shape whose size overflows is refused.
// Every malformed case is an Error naming the file.
#pragma once
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/data_file.h"
#include "engine/io/json.h"

namespace wxe {

class ZarrStore : public DataFile {
 public:
  explicit ZarrStore(const std::string& dir);  // checks .zgroup and .zattrs
  const std::string& path() const override { return dir_; }
  bool has(const std::string& var) const override;
  std::vector<std::string> dims(const std::string& var) const override;
  std::vector<int64_t> shape(const std::string& var) const override;
  std::vector<double> read(const std::string& var) const override;
  std::vector<float> read_f32(const std::string& var, const std::vector<size_t>& start,
                              const std::vector<size_t>& count) const override;
  std::string attr(const std::string& var, const std::string& name) const override;

  struct Array {
    std::string name, dir;         // the array's folder
    std::vector<int64_t> shape, chunks;
    char kind = 'f';               // f, i, u, b
    int itemsize = 4;
    bool big_endian = false;
    bool has_fill = false;
    double fill = 0;               // float arrays: NaN fill matches NaN
    std::string compressor;        // "", blosc, zstd, zlib, gzip
    std::string separator = ".";   // dimension_separator
    std::vector<std::string> dims;
    Json attrs;
  };

 private:
  const Array& array(const std::string& var) const;
  // Reads the hyperslab (start, count) as doubles.
  std::vector<double> read_slab(const Array& a, const std::vector<size_t>& start, const std::vector<size_t>& count) const;
  std::string dir_;
  std::string root_;  // dir_ with symlinks resolved: no array folder or chunk is read from outside it
  Json attrs_;  // the group's .zattrs
  mutable std::map<std::string, std::unique_ptr<Array>> arrays_;
  // The chunks decoded last, most recent first (their files and bytes): at most
  // kChunkCacheBytes together, but always the last two, so that reading a variable level by level
  // between reads of its level coordinate decodes each chunk once.
  mutable std::list<std::pair<std::string, std::string>> chunks_;
  mutable size_t chunk_bytes_ = 0;
  mutable int64_t decoded_ = 0;  // chunks decoded, for tests (decoded_chunks)
  const std::string& chunk(const Array& a, const std::string& file, size_t bytes) const;

 public:
  static constexpr size_t kChunkCacheBytes = size_t(256) << 20;
  // How many chunks this store has decoded (each decode of one chunk file counts).
  int64_t decoded_chunks() const { return decoded_; }
};

// The bytes of a regular file, at most max_bytes (an Error naming the file otherwise: missing,
// not a regular file (opened non-blocking, so a FIFO never blocks), or too large).
std::string read_regular_file(const std::string& path, size_t max_bytes);

}  // namespace wxe
