// wxe's zarr v2 reader (data/zarr.h) against stores written by the zarr Python package with
// each codec (tests/data/zarr, models/make_zarr_fixture.py; the values as .npy written by
// numpy), an ERA5 store written by xarray with blosc against the same fields uncompressed, and
// every malformed case an error naming the file (never a crash, a hang or fill values).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <iomanip>
#include <sstream>

#include "data/credit_config.h"
#include "data/era5.h"
#include "data/zarr.h"
#include "engine/io/npy.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace wxe;
using namespace wxe::test;

namespace {

const std::string kDir = data_path("tests/data/zarr");

std::vector<double> expected(const std::string& name) {
  Tensor t = read_npy(kDir + "/expected_" + name + ".npy");
  EXPECT_EQ(t.dtype, DType::F64);
  return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
}

void expect_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]";
    else EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
  }
}

// A copy of a fixture store in a fresh temp folder, to break.
std::string copy_store(const std::string& name, const std::string& tag) {
  const std::string dst = tmp_path("zarr_" + tag) + ".zarr";
  fs::remove_all(dst);
  fs::copy(kDir + "/" + name, dst, fs::copy_options::recursive);
  return dst;
}

// The error reading every array of a store (opening included), or "<no error>".
std::string read_error(const std::string& store, const std::string& var = "f") {
  return error_of([&] {
    ZarrStore z(store);
    z.read(var);
  });
}

// f() within 10 s; a FIFO it waits on is then opened for writing so it returns (the test fails).
std::string no_hang(const std::string& fifo, const std::function<std::string()>& f) {
  auto fut = std::async(std::launch::async, f);
  if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "hung on the FIFO " << fifo;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  return fut.get();
}

}  // namespace

TEST(Zarr, ReadsEveryCodecAsWritten) {
  for (const char* store : {"none", "blosc", "zstd", "zlib", "gzip"}) {
    SCOPED_TRACE(store);
    ZarrStore z(kDir + "/" + store + ".zarr");
    EXPECT_EQ(z.attr("", "title"), "wxe zarr fixture");
    for (const char* a : {"f", "d", "i", "u", "m"}) expect_same(z.read(a), expected(a), std::string(store) + " " + a);
    EXPECT_EQ(z.shape("f"), (std::vector<int64_t>{3, 5, 7}));
    EXPECT_EQ(z.dims("f"), (std::vector<std::string>{"time", "lat", "lon"}));
    EXPECT_EQ(z.attr("f", "units"), "K");
    EXPECT_FALSE(z.has("nope"));
    EXPECT_FALSE(z.has("../blosc.zarr/f"));
    // a hyperslab across chunk borders (chunks (2, 3, 4)), as float32
    const std::vector<double> f = expected("f");
    std::vector<float> s = z.read_f32("f", {1, 2, 3}, {2, 3, 4});
    ASSERT_EQ(s.size(), 24u);
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 0; c < 4; ++c)
          EXPECT_EQ(s[(a * 3 + b) * 4 + c], (float)f[((1 + a) * 5 + 2 + b) * 7 + 3 + c]) << a << b << c;
  }
  // '/' as the dimension separator (chunk files in folders)
  expect_same(ZarrStore(kDir + "/zstd.zarr").read("s"), expected("s"), "zstd s");
}

// The era5_tiny 2021 fields through a blosc-compressed store written by xarray read as the
// uncompressed NCZarr one (same config, the 2021 path swapped).
TEST(Zarr, CompressedEra5StoreReadsLikeTheUncompressedOne) {
  const std::string dir = data_path("tests/data/era5_tiny");
  CreditConfig a = read_credit_config(dir + "/config.yml");
  CreditConfig b = a;
  // 2021 from the blosc store: era5_%Y.* matches era5_2020.nc in era5_tiny, so the blosc store
  // gets a folder of its own with a link to the 2020 file
  const std::string d = tmp_path("era5_blosc_dir");
  fs::remove_all(d);
  fs::create_directories(d);
  fs::create_symlink(dir + "/era5_2020.nc", d + "/era5_2020.nc");
  fs::create_directory_symlink(kDir + "/era5_blosc.zarr", d + "/era5_2021.zarr");
  b.sources.at(0).prognostic.path = b.sources.at(0).diagnostic.path = d + "/era5_%Y.*";
  Era5Data da(a), db(b);
  const int64_t t = parse_datetime("2021-01-01T06", "t");
  Tensor xa = da.input(t), xb = db.input(t), ya = da.target(t), yb = db.target(t);
  ASSERT_EQ(xa.numel(), xb.numel());
  for (int64_t i = 0; i < xa.numel(); ++i) ASSERT_EQ(xa.data<float>()[i], xb.data<float>()[i]) << i;
  for (int64_t i = 0; i < ya.numel(); ++i) ASSERT_EQ(ya.data<float>()[i], yb.data<float>()[i]) << i;
  fs::remove_all(d);
}

TEST(Zarr, MalformedMetadataIsAnErrorNamingTheFile) {
  struct Case {
    const char* file;  // inside the store
    const char* text;
    const char* want;  // in the message
  };
  const Case cases[] = {
      {".zgroup", "", "malformed zarr .zgroup"},
      {".zgroup", "{\"zarr_form", "malformed zarr .zgroup"},
      {".zgroup", "[]", "not a JSON object"},
      {".zgroup", "{\"zarr_format\": 3}", "zarr_format 3 is not supported"},
      {".zattrs", "[1, 2]", "not a JSON object"},
      {"f/.zarray", "", "malformed zarr .zarray"},
      {"f/.zarray", "[1]", "not a JSON object"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [2, 3, 4], \"dtype\": \"<x9\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "dtype '<x9' is not supported"},
      {"f/.zarray", "{\"zarr_format\": 3, \"shape\": [3, 5, 7], \"chunks\": [2, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "zarr_format 3 is not supported"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [1000000000, 1000000, 4], \"dtype\": "
                    "\"<f4\", \"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "larger than this machine's memory"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [1e18, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "chunks: '1e18' is not an integer >= 1"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [0, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "chunks: '0' is not an integer >= 1"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5], \"chunks\": [2, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "shape and chunks must be lists of the same length"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [2, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": 0, \"order\": \"C\", \"compressor\": {\"id\": \"lzma\"}, \"filters\": null}",
       "compressor 'lzma' is not supported"},
      {"f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 5, 7], \"chunks\": [2, 3, 4], \"dtype\": \"<f4\", "
                    "\"fill_value\": \"x\", \"order\": \"C\", \"compressor\": null, \"filters\": null}",
       "fill_value 'x' does not fit dtype <f4"},
      {"f/.zattrs", "{\"_ARRAY_DIMENSIONS\": [\"lat\", \"lon\"]}", "_ARRAY_DIMENSIONS must list 3 dimension names"},
      {"f/.zattrs", "{\"units\": \"K\"}", "no _ARRAY_DIMENSIONS"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + ": " + c.text);
    const std::string s = copy_store("none.zarr", "meta");
    spit(s + "/" + c.file, c.text);
    const std::string e = read_error(s);
    EXPECT_NE(e.find(s + "/" + c.file), std::string::npos) << e;
    EXPECT_NE(e.find(c.want), std::string::npos) << e;
    fs::remove_all(s);
  }
  // v3 store, no store, a store that is a file
  const std::string s = copy_store("none.zarr", "v3");
  fs::remove(s + "/.zgroup");
  spit(s + "/zarr.json", "{}");
  EXPECT_NE(read_error(s).find("zarr format 3 is not supported"), std::string::npos);
  fs::remove_all(s);
  EXPECT_NE(read_error(tmp_path("nope.zarr")).find("no such zarr store"), std::string::npos);
}

TEST(Zarr, BadChunksAreErrorsNamingTheChunk) {
  // truncated, grown, garbage or missing chunks of every codec; a dtype that lies about them
  for (const char* store : {"none", "blosc", "zstd", "zlib", "gzip"}) {
    SCOPED_TRACE(store);
    const std::string s = copy_store(std::string(store) + ".zarr", "chunk");
    const std::string chunk = s + "/f/1.1.1";
    const std::string good = slurp(chunk);
    spit(chunk, good.substr(0, good.size() / 2));
    std::string e = read_error(s);
    EXPECT_NE(e.find(chunk), std::string::npos) << e;
    spit(chunk, good + good);
    e = read_error(s);
    EXPECT_NE(e.find(chunk), std::string::npos) << e;
    if (std::string(store) != "none") {  // garbage: a corrupt stream (uncompressed, it is just values)
      spit(chunk, std::string(good.size(), '\x5a'));
      e = read_error(s);
      EXPECT_NE(e.find(chunk), std::string::npos) << e;
    }
    fs::remove(chunk);
    e = read_error(s);
    EXPECT_NE(e.find(chunk + ": missing chunk of variable 'f'"), std::string::npos) << e;
    spit(chunk, good);
    EXPECT_EQ(read_error(s), "<no error>");
    // float64 declared, float32 stored: the chunks hold half the bytes the dtype needs
    std::string meta = slurp(s + "/f/.zarray");
    meta.replace(meta.find("<f4"), 3, "<f8");
    spit(s + "/f/.zarray", meta);
    e = read_error(s);
    EXPECT_NE(e.find(s + "/f/0.0.0"), std::string::npos) << e;
    fs::remove_all(s);
  }
}

TEST(Zarr, FifoChunkIsAnErrorNotAHang) {
  const std::string s = copy_store("blosc.zarr", "fifo");
  for (const char* f : {"f/0.0.0", "f/.zarray", ".zgroup"}) {
    const std::string p = s + "/" + f;
    const std::string keep = slurp(p);
    fs::remove(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    const std::string e = no_hang(p, [&] { return read_error(s); });
    EXPECT_NE(e.find(p + ": is not a regular file"), std::string::npos) << e;
    fs::remove(p);
    spit(p, keep);
  }
  fs::remove_all(s);
}

TEST(Zarr, FillValuesAreMissingDataNotNumbers) {
  // an era5 field whose chunk holds the fill value: an error naming the file, variable and time
  const std::string dir = data_path("tests/data/era5_tiny");
  const std::string d = tmp_path("era5_fill_dir");
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy(kDir + "/era5_blosc.zarr", d + "/era5_2021.zarr", fs::copy_options::recursive);
  fs::create_symlink(dir + "/era5_2020.nc", d + "/era5_2020.nc");
  std::string meta = slurp(d + "/era5_2021.zarr/SP/.zarray");
  const size_t p = meta.find("\"NaN\"");
  ASSERT_NE(p, std::string::npos);
  // SP's values are about 1e5 +- 500: declare one of them the fill value
  ZarrStore z(d + "/era5_2021.zarr");
  const double v = z.read("SP")[0];
  meta.replace(p, 5, str(std::setprecision(9), (float)v));
  spit(d + "/era5_2021.zarr/SP/.zarray", meta);
  CreditConfig c = read_credit_config(dir + "/config.yml");
  c.sources.at(0).prognostic.path = c.sources.at(0).diagnostic.path = d + "/era5_%Y.*";
  const std::string e = error_of([&] { Era5Data(c).input(parse_datetime("2021-01-01T00", "t")); });
  EXPECT_NE(e.find("era5_2021.zarr: variable 'SP' at 2021-01-01T00:00:00: 1 of 2048 values are missing"),
            std::string::npos)
      << e;
  fs::remove_all(d);
}

// Issue 41: hostile stores found by trying as an attacker would.
namespace {

// An uncompressed float64 1-D array `name` (dimension `dim`) holding `v`, replacing what the
// store had under that name.
void write_coord(const std::string& store, const std::string& name, const std::string& dim, const std::vector<double>& v) {
  const std::string d = store + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  spit(d + "/.zarray", str("{\"zarr_format\": 2, \"shape\": [", v.size(), "], \"chunks\": [", std::max<size_t>(v.size(), 1),
                           "], \"dtype\": \"<f8\", \"fill_value\": null, \"order\": \"C\", \"compressor\": null, "
                           "\"filters\": null}"));
  spit(d + "/.zattrs", "{\"_ARRAY_DIMENSIONS\": [\"" + dim + "\"]}");
  if (!v.empty()) spit(d + "/0", std::string((const char*)v.data(), v.size() * sizeof(double)));
}

// The era5_tiny config with its 2021 data from a copy of era5_blosc.zarr (in `dir`, beside a
// link to the 2020 netCDF file), to break.
CreditConfig era5_with_store(const std::string& dir) {
  const std::string tiny = data_path("tests/data/era5_tiny");
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kDir + "/era5_blosc.zarr", dir + "/era5_2021.zarr", fs::copy_options::recursive);
  fs::create_symlink(tiny + "/era5_2020.nc", dir + "/era5_2020.nc");
  CreditConfig c = read_credit_config(tiny + "/config.yml");
  c.sources.at(0).prognostic.path = c.sources.at(0).diagnostic.path = dir + "/era5_%Y.*";
  return c;
}

// f() with the address space limited to what the process has plus `extra` bytes: an allocation
// of more throws std::bad_alloc instead of taking the memory.
template <class F>
std::string with_address_space_limit(size_t extra, F f) {
  size_t vm_kb = 0;
  std::istringstream st(slurp("/proc/self/status"));
  for (std::string line; std::getline(st, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
  struct rlimit old, small;
  getrlimit(RLIMIT_AS, &old);
  small = old;
  small.rlim_cur = vm_kb * 1024 + extra;
  setrlimit(RLIMIT_AS, &small);
  std::string e;
  try {
    e = error_of(f);
  } catch (const std::exception& x) {
    e = std::string("<not a wxe::Error: ") + x.what() + ">";
  }
  setrlimit(RLIMIT_AS, &old);
  return e;
}

}  // namespace

// A coordinate longer or shorter than the data's grid, empty, or not monotonic: an error naming
// the file (was: a forecast file of the coordinate's length filled from past the model output).
TEST(Zarr, CoordinatesMustFitTheData) {
  const std::string dir = tmp_path("zarr_coords");
  const int64_t t = parse_datetime("2021-01-01T00", "t");
  const std::vector<double> lat = ZarrStore(kDir + "/era5_blosc.zarr").read("latitude");
  ASSERT_EQ(lat.size(), 32u);
  std::vector<double> longer = lat, shorter(lat.begin(), lat.end() - 1), bumpy = lat;
  for (int i = 0; i < 5; ++i) longer.push_back(lat.back());
  std::swap(bumpy[3], bumpy[4]);
  struct Case {
    const char* name;
    std::vector<double> lat;
    const char* want;
  };
  for (const Case& k : {Case{"longer", longer, "do not fit variable"}, Case{"shorter", shorter, "do not fit variable"},
                        Case{"empty", {}, "do not fit variable"}, Case{"bumpy", bumpy, "not strictly monotonic"}}) {
    SCOPED_TRACE(k.name);
    CreditConfig c = era5_with_store(dir);
    write_coord(dir + "/era5_2021.zarr", "latitude", "latitude", k.lat);
    const std::string e = error_of([&] { Era5Data(c).input(t); });
    EXPECT_NE(e.find(dir + "/era5_2021.zarr: "), std::string::npos) << e;
    EXPECT_NE(e.find(k.want), std::string::npos) << e;
  }
  // the longitude too
  CreditConfig c = era5_with_store(dir);
  write_coord(dir + "/era5_2021.zarr", "longitude", "longitude", std::vector<double>(4096, 1.0));
  const std::string e = error_of([&] { Era5Data(c).input(t); });
  EXPECT_NE(e.find("'longitude' (4096)"), std::string::npos) << e;
  fs::remove_all(dir);
}

// Files whose latitudes run in opposite directions are not combined row by row (was: exit 0,
// temperature off by 22.6 K): an error naming both files.
TEST(Zarr, FlippedLatitudesAcrossFilesAreRefused) {
  const std::string dir = tmp_path("zarr_flipped");
  CreditConfig c = era5_with_store(dir);
  std::vector<double> lat = ZarrStore(kDir + "/era5_blosc.zarr").read("latitude");
  Era5Data same(c);
  same.input(parse_datetime("2020-12-31T18", "t"));
  EXPECT_EQ(error_of([&] { same.input(parse_datetime("2021-01-01T00", "t")); }), "<no error>");
  std::reverse(lat.begin(), lat.end());
  write_coord(dir + "/era5_2021.zarr", "latitude", "latitude", lat);
  Era5Data d(c);
  d.input(parse_datetime("2020-12-31T18", "t"));  // the grid from the 2020 netCDF file
  const std::string e = error_of([&] { d.input(parse_datetime("2021-01-01T00", "t")); });
  EXPECT_NE(e.find(dir + "/era5_2021.zarr: latitudes run"), std::string::npos) << e;
  EXPECT_NE(e.find(dir + "/era5_2020.nc"), std::string::npos) << e;
  fs::remove_all(dir);
}

// A shape whose size wraps a 64-bit count (3 x 6148914691236517206 x 7 "reads" 2 values): an
// error naming the .zarray (was: SIGSEGV in the slab copy).
TEST(Zarr, ShapeOverflowIsRefused) {
  const std::string s = copy_store("none.zarr", "shape_wrap");
  spit(s + "/f/.zarray", "{\"zarr_format\": 2, \"shape\": [3, 6148914691236517206, 7], \"chunks\": [2, 3, 4], "
                         "\"dtype\": \"<f4\", \"fill_value\": 0, \"order\": \"C\", \"compressor\": null, \"filters\": null}");
  const std::string e = read_error(s);
  EXPECT_NE(e.find(s + "/f/.zarray: shape (3, 6148914691236517206, 7) holds more values"), std::string::npos) << e;
  fs::remove_all(s);
}

// A 16-byte chunk declaring 3 GiB is refused before the 3 GiB are allocated, with every codec
// (was: 3.1 GB allocated, and under a memory limit a bare std::bad_alloc).
TEST(Zarr, SmallChunkDeclaringGiBsIsNotAllocated) {
  for (const char* store : {"none", "blosc", "zstd", "zlib", "gzip"}) {
    SCOPED_TRACE(store);
    const std::string s = copy_store(std::string(store) + ".zarr", "big_chunk");
    std::string meta = slurp(s + "/f/.zarray");
    const std::string chunks = "\"chunks\": [2, 3, 4]";
    const size_t at = meta.find("\"chunks\"");
    ASSERT_NE(at, std::string::npos);
    meta.replace(at, meta.find(']', at) + 1 - at, "\"chunks\": [1024, 1024, 768]");  // 3 GiB of float32
    spit(s + "/f/.zarray", meta);
    spit(s + "/f/0.0.0", slurp(s + "/f/0.0.0").substr(0, 16));
    const std::string e = with_address_space_limit(size_t(1) << 30, [&] { ZarrStore(s).read("f"); });
    EXPECT_NE(e.find(s + "/f/0.0.0: "), std::string::npos) << e;
    fs::remove_all(s);
  }
}

// An array folder or a chunk linked to outside the store is not read; a link inside it is.
TEST(Zarr, LinksOutOfTheStoreAreNotRead) {
  const std::string s = copy_store("none.zarr", "links"), out = tmp_path("zarr_links_outside");
  fs::remove_all(out);
  fs::create_directories(out);
  fs::copy(s + "/f", out + "/f", fs::copy_options::recursive);
  // the chunk
  fs::rename(s + "/f/0.0.0", s + "/f_0.0.0");
  fs::create_symlink(out + "/f/0.0.0", s + "/f/0.0.0");
  std::string e = read_error(s);
  EXPECT_NE(e.find(s + "/f/0.0.0: resolves to " + out + "/f/0.0.0, outside the zarr store"), std::string::npos) << e;
  fs::remove(s + "/f/0.0.0");
  fs::create_symlink("../f_0.0.0", s + "/f/0.0.0");  // inside: read
  EXPECT_EQ(read_error(s), "<no error>");
  // the variable's folder
  fs::remove_all(s + "/f");
  fs::create_directory_symlink(out + "/f", s + "/f");
  e = read_error(s);
  EXPECT_NE(e.find("outside the zarr store"), std::string::npos) << e;
  fs::remove_all(s);
  fs::remove_all(out);
}

// Legal stores that were refused: a uint64 fill_value of 2^64 - 1, a gzip chunk of two members.
TEST(Zarr, LegalEdgeCasesRead) {
  const std::string s = copy_store("none.zarr", "legal");
  fs::create_directories(s + "/q");
  spit(s + "/q/.zarray", "{\"zarr_format\": 2, \"shape\": [2], \"chunks\": [2], \"dtype\": \"<u8\", \"fill_value\": "
                         "18446744073709551615, \"order\": \"C\", \"compressor\": null, \"filters\": null}");
  spit(s + "/q/.zattrs", "{\"_ARRAY_DIMENSIONS\": [\"x\"]}");
  const uint64_t q[2] = {5, ~uint64_t(0)};
  spit(s + "/q/0", std::string((const char*)q, sizeof q));
  std::vector<double> v;
  EXPECT_EQ(error_of([&] { v = ZarrStore(s).read("q"); }), "<no error>");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0], 5);
  EXPECT_TRUE(std::isnan(v[1]));  // the fill value: missing
  fs::remove_all(s);
  // numcodecs GZip reads a chunk of two gzip members (gzip.decompress) as their concatenation
  const std::string g = copy_store("gzip.zarr", "gzip2");
  const std::string raw = slurp(kDir + "/none.zarr/f/0.0.0");
  auto gz = [](const std::string& b) {
    z_stream z{};
    deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    std::string out(deflateBound(&z, b.size()) + 64, '\0');
    z.next_in = (Bytef*)b.data();
    z.avail_in = (uInt)b.size();
    z.next_out = (Bytef*)&out[0];
    z.avail_out = (uInt)out.size();
    deflate(&z, Z_FINISH);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
  };
  spit(g + "/f/0.0.0", gz(raw.substr(0, 40)) + gz(raw.substr(40)));
  EXPECT_EQ(read_error(g), "<no error>");
  expect_same(ZarrStore(g).read("f"), expected("f"), "two gzip members");
  fs::remove_all(g);
}

// A forecast file that cannot be written for want of space says so (was: "NetCDF: HDF error"
// alone); here a file size limit stands for a full disk. The size is checked before the file
// is created: a limit inside the header (4 KiB) left HDF5 holding a broken file it crashed on at
// exit (this test's process then died after passing), one past it (64 KiB) failed the data's writes.
TEST(ForecastFile, AFullDiskIsNamed) {
  CreditConfig c = read_credit_config(data_path("tests/data/era5_tiny/config.yml"));
  Era5Data d(c);
  (void)d.input(parse_datetime("2020-12-31T18", "t"));
  Tensor out = Tensor::zeros(DType::F32, {1, (int64_t)d.target_channels().size(), 1, 32, 64});
  const std::string path = tmp_path("full_disk.nc");
  for (rlim_t limit : {(rlim_t)4096, (rlim_t)65536}) {
    struct rlimit old, small;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_IGN);
    small = old;
    small.rlim_cur = limit;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const std::string e = error_of([&] {
      ForecastWriter w(path, d, parse_datetime("2020-12-31T18", "t"), 4);
      for (int k = 0; k < 4; ++k) w.write(k, out);
      w.close();
    });
    setrlimit(RLIMIT_FSIZE, &old);
    EXPECT_NE(e.find("cannot write netCDF"), std::string::npos) << e;
    EXPECT_NE(e.find("(File too large)"), std::string::npos) << e;
    EXPECT_NE(e.find("the file size limit (ulimit -f) is " + std::to_string(limit) + " bytes"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(path));
  }
}

// Issue 42: a variable read level by level, its level coordinate read before each level (as
// Era5Data reads a 3D variable), decodes each chunk once: the chunk cache keeps more than the
// last chunk (before it: the coordinate's read evicted the data chunk, decoded again per level).
TEST(Zarr, EachChunkDecodedOncePerSample) {
  ZarrStore z(kDir + "/era5_blosc.zarr");  // T: one chunk (4, 3, 32, 64); level: one chunk
  std::vector<float> first;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t t = 0; t < 4; ++t)
      for (size_t l = 0; l < 3; ++l) {
        EXPECT_EQ(z.read("level").size(), 3u);
        const std::vector<float> v = z.read_f32("T", {t, l, 0, 0}, {1, 1, 32, 64});
        if (pass == 0 && t == 1 && l == 2) first = v;
        if (pass == 1 && t == 1 && l == 2) {
          EXPECT_EQ(v, first);  // the cached bytes read the same
        }
      }
  EXPECT_EQ(z.decoded_chunks(), 2);  // T's one chunk and level's (was 2 x 12 x 2)
}
