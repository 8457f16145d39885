// Minimal read-only zip reader for torch.save archives (internal to importers/torch; tests
// use it too). Entries are found through the central directory (ZIP64 aware); entries may be
// STORED or DEFLATE-compressed. Every offset and length is checked against the file size
// before it is used; every error is a wxe::Error whose one-line message names the file.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace wxe::torch_zip {

struct Entry {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;  // 0 = STORED, 8 = DEFLATE
  uint32_t crc32 = 0;
  uint64_t csize = 0;   // compressed size
  uint64_t usize = 0;   // uncompressed size
  uint64_t local_offset = 0;
};

class Reader {
 public:
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const std::vector<Entry>& entries() const { return entries_; }
  // nullptr if absent
  const Entry* find(const std::string& name) const;
  // The whole entry, decompressed and CRC-checked, into dst (e.usize bytes).
  void read(const Entry& e, uint8_t* dst) const;
  std::string read(const Entry& e) const;

 private:
  void pread_exact(uint64_t off, void* dst, uint64_t n, const char* what) const;
  uint64_t data_offset(const Entry& e) const;

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t cd_offset_ = 0;  // local data must end before the central directory
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc = 0);

}  // namespace wxe::torch_zip
