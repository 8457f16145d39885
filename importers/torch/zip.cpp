#include "importers/torch/zip.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/ir/error.h"

namespace wxe::torch_zip {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEocdSig = 0x06054b50,
                   kEocd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;
// DEFLATE cannot expand by more than ~1032:1; anything claiming more is corrupt (and would
// make us allocate memory out of proportion to the file).
constexpr uint64_t kMaxDeflateRatio = 1032;

uint16_t u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) { return (uint32_t)u16(p) | ((uint32_t)u16(p + 2) << 16); }
uint64_t u64(const uint8_t* p) { return (uint64_t)u32(p) | ((uint64_t)u32(p + 4) << 32); }

// Names in messages: printable ASCII only, bounded, so that the message stays one line.
std::string printable(const std::string& s) {
  std::string r;
  for (char c : s.substr(0, 200)) r += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 200) r += "...";
  return r;
}

}  // namespace

uint32_t crc32(const uint8_t* p, size_t n, uint32_t crc) {
  while (n > 0) {
    uInt chunk = (uInt)std::min<size_t>(n, 1u << 30);
    crc = (uint32_t)::crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return crc;
}

Reader::Reader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  WXE_CHECK(fd_ >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(path, ": not a regular file");
  }
  size_ = (uint64_t)st.st_size;
  try {
    uint8_t head[4] = {0, 0, 0, 0};
    if (size_ >= 4) pread_exact(0, head, 4, "file header");
    if (size_ < 22 || u32(head) != kLocalSig) {
      if (size_ >= 2 && head[0] == 0x80 && head[1] <= 5)
        fail(path, ": legacy (pre-1.6, non-zip) torch.save format is not supported; re-save it "
             "with torch>=1.6 (torch.save(torch.load(f), f))");
      fail(path, ": not a zip archive (torch.save >= 1.6 writes a zip)");
    }
    // End of central directory: 22 bytes + up to 65535 bytes of comment, at the end.
    uint64_t tail_len = std::min<uint64_t>(size_, 22 + 65535);
    std::vector<uint8_t> tail(tail_len);
    pread_exact(size_ - tail_len, tail.data(), tail_len, "end of central directory");
    int64_t eocd = -1;
    for (int64_t i = (int64_t)tail_len - 22; i >= 0; --i) {
      if (u32(&tail[i]) == kEocdSig && (uint64_t)i + 22 + u16(&tail[i + 20]) == tail_len) {
        eocd = i;
        break;
      }
    }
    WXE_CHECK(eocd >= 0, path, ": truncated or corrupt zip (no end of central directory)");
    const uint8_t* e = &tail[eocd];
    uint64_t eocd_pos = size_ - tail_len + (uint64_t)eocd;
    uint64_t disk = u16(e + 4), cd_disk = u16(e + 6), n_disk = u16(e + 8), n_total = u16(e + 10);
    uint64_t cd_size = u32(e + 12), cd_off = u32(e + 16);
    uint64_t cd_end_limit = eocd_pos;
    bool have64 = false;
    // ZIP64: a locator right before the EOCD points at the ZIP64 EOCD record.
    if (eocd_pos >= 20) {
      uint8_t loc[20];
      pread_exact(eocd_pos - 20, loc, 20, "zip64 locator");
      if (u32(loc) == kLocator64Sig) {
        uint64_t off64 = u64(loc + 8);
        WXE_CHECK(u32(loc + 4) == 0 && u32(loc + 16) <= 1, path, ": multi-disk zip archives are not supported");
        WXE_CHECK(off64 <= eocd_pos - 20 && eocd_pos - 20 - off64 >= 56, path,
                  ": corrupt zip64 end of central directory locator");
        uint8_t r[56];
        pread_exact(off64, r, 56, "zip64 end of central directory");
        WXE_CHECK(u32(r) == kEocd64Sig, path, ": corrupt zip64 end of central directory");
        disk = u32(r + 16);
        cd_disk = u32(r + 20);
        n_disk = u64(r + 24);
        n_total = u64(r + 32);
        cd_size = u64(r + 40);
        cd_off = u64(r + 48);
        cd_end_limit = off64;
        have64 = true;
      }
    }
    WXE_CHECK(have64 || (cd_size != 0xffffffffu && cd_off != 0xffffffffu), path,
              ": zip needs zip64 records but has none (truncated or corrupt)");
    WXE_CHECK(disk == 0 && cd_disk == 0 && n_disk == n_total, path,
              ": multi-disk zip archives are not supported");
    WXE_CHECK(cd_off <= cd_end_limit && cd_size <= cd_end_limit - cd_off, path,
              ": corrupt zip (central directory at ", cd_off, "+", cd_size,
              " lies outside the file)");
    WXE_CHECK(n_total <= cd_size / 46, path, ": corrupt zip (", n_total,
              " entries cannot fit a central directory of ", cd_size, " bytes)");
    cd_offset_ = cd_off;
    std::vector<uint8_t> cd(cd_size);
    pread_exact(cd_off, cd.data(), cd_size, "central directory");
    entries_.reserve(n_total);
    size_t p = 0;
    for (uint64_t k = 0; k < n_total; ++k) {
      WXE_CHECK(cd_size - p >= 46 && u32(&cd[p]) == kCentralSig, path,
                ": corrupt zip central directory (entry ", k, ")");
      const uint8_t* c = &cd[p];
      Entry en;
      en.flags = u16(c + 8);
      en.method = u16(c + 10);
      en.crc32 = u32(c + 16);
      en.csize = u32(c + 20);
      en.usize = u32(c + 24);
      size_t nlen = u16(c + 28), xlen = u16(c + 30), clen = u16(c + 32);
      uint32_t edisk = u16(c + 34);
      en.local_offset = u32(c + 42);
      WXE_CHECK(cd_size - p - 46 >= nlen + xlen + clen, path,
                ": corrupt zip central directory (entry ", k, " overruns it)");
      en.name.assign((const char*)c + 46, nlen);
      // ZIP64 extended information: the fields whose 32-bit value is 0xffffffff, in order.
      bool need_u = en.usize == 0xffffffffu, need_c = en.csize == 0xffffffffu,
           need_o = en.local_offset == 0xffffffffu, need_d = edisk == 0xffff;
      const uint8_t* x = c + 46 + nlen;
      size_t xp = 0;
      while (xp + 4 <= xlen) {
        uint16_t id = u16(x + xp), sz = u16(x + xp + 2);
        WXE_CHECK(xp + 4 + sz <= xlen, path, ": corrupt zip extra field in entry '",
                  printable(en.name), "'");
        if (id == 0x0001) {
          const uint8_t* f = x + xp + 4;
          size_t fp = 0;
          auto take = [&](uint64_t& v) {
            WXE_CHECK(fp + 8 <= sz, path, ": corrupt zip64 extra field in entry '",
                      printable(en.name), "'");
            v = u64(f + fp);
            fp += 8;
          };
          if (need_u) { take(en.usize); need_u = false; }
          if (need_c) { take(en.csize); need_c = false; }
          if (need_o) { take(en.local_offset); need_o = false; }
          if (need_d && fp + 4 <= sz) { edisk = u32(f + fp); need_d = false; }
        }
        xp += 4 + sz;
      }
      WXE_CHECK(!need_u && !need_c && !need_o, path, ": zip entry '", printable(en.name),
                "' lacks its zip64 sizes");
      WXE_CHECK(edisk == 0 || edisk == 0xffff, path, ": multi-disk zip archives are not supported");
      WXE_CHECK(!(en.flags & 1), path, ": zip entry '", printable(en.name), "' is encrypted");
      WXE_CHECK(en.method == 0 || en.method == 8, path, ": zip entry '", printable(en.name),
                "' uses compression method ", en.method, " (only STORED and DEFLATE)");
      WXE_CHECK(en.method != 0 || en.csize == en.usize, path, ": zip entry '",
                printable(en.name), "' is STORED but its sizes differ");
      WXE_CHECK(en.csize <= cd_off && en.local_offset <= cd_off - en.csize, path,
                ": zip entry '", printable(en.name), "' lies outside the file");
      WXE_CHECK(en.method == 0 || en.usize <= en.csize * kMaxDeflateRatio + 1024, path,
                ": zip entry '", printable(en.name), "' claims an impossible size ", en.usize);
      WXE_CHECK(by_name_.emplace(en.name, entries_.size()).second, path,
                ": duplicate zip entry '", printable(en.name), "'");
      entries_.push_back(std::move(en));
      p += 46 + nlen + xlen + clen;
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const Entry* Reader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void Reader::pread_exact(uint64_t off, void* dst, uint64_t n, const char* what) const {
  WXE_CHECK(off <= size_ && n <= size_ - off, path_, ": truncated zip (", what, " at ", off,
            "+", n, " past the end of the ", size_, "-byte file)");
  uint8_t* d = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd_, d, (size_t)std::min<uint64_t>(n, 1u << 30), (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    WXE_CHECK(r > 0, path_, ": read error (", what, "): ",
              r < 0 ? std::strerror(errno) : "unexpected end of file");
    d += r;
    off += (uint64_t)r;
    n -= (uint64_t)r;
  }
}

uint64_t Reader::data_offset(const Entry& e) const {
  uint8_t h[30];
  pread_exact(e.local_offset, h, 30, "local file header");
  WXE_CHECK(u32(h) == kLocalSig, path_, ": corrupt zip (bad local header for '",
            printable(e.name), "')");
  uint64_t off = e.local_offset + 30 + u16(h + 26) + u16(h + 28);
  WXE_CHECK(off <= cd_offset_ && e.csize <= cd_offset_ - off, path_, ": zip entry '",
            printable(e.name), "' data lies outside the file");
  return off;
}

void Reader::read(const Entry& e, uint8_t* dst) const {
  uint64_t off = data_offset(e);
  if (e.method == 0) {
    pread_exact(off, dst, e.usize, "entry data");
  } else {
    z_stream zs;
    std::memset(&zs, 0, sizeof zs);
    WXE_CHECK(inflateInit2(&zs, -MAX_WBITS) == Z_OK, path_, ": zlib init failed");
    std::vector<uint8_t> in(std::min<uint64_t>(e.csize, 1 << 20));
    uint64_t in_left = e.csize, out_done = 0;
    int rc = Z_OK;
    try {
      while (rc != Z_STREAM_END) {
        if (zs.avail_in == 0 && in_left > 0) {
          uint64_t n = std::min<uint64_t>(in_left, in.size());
          pread_exact(off, in.data(), n, "entry data");
          off += n;
          in_left -= n;
          zs.next_in = in.data();
          zs.avail_in = (uInt)n;
        }
        uint64_t room = e.usize - out_done;
        zs.next_out = dst + out_done;
        zs.avail_out = (uInt)std::min<uint64_t>(room, 1u << 30);
        uInt before = zs.avail_out;
        rc = inflate(&zs, Z_NO_FLUSH);  // Z_OK implies progress; Z_BUF_ERROR means none possible
        out_done += before - zs.avail_out;
        WXE_CHECK(rc == Z_OK || rc == Z_STREAM_END, path_, ": corrupt DEFLATE data in zip entry '",
                  printable(e.name), "'", rc == Z_BUF_ERROR ? " (size mismatch)" : "");
      }
    } catch (...) {
      inflateEnd(&zs);
      throw;
    }
    inflateEnd(&zs);
    WXE_CHECK(out_done == e.usize, path_, ": corrupt DEFLATE data in zip entry '",
              printable(e.name), "' (size mismatch)");
  }
  WXE_CHECK(crc32(dst, e.usize) == e.crc32, path_, ": CRC mismatch in zip entry '",
            printable(e.name), "' (corrupt file)");
}

std::string Reader::read(const Entry& e) const {
  std::string s(e.usize, '\0');
  read(e, reinterpret_cast<uint8_t*>(&s[0]));
  return s;
}

}  // namespace wxe::torch_zip
