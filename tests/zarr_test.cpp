// wxe's zarr v2 reader (data/zarr.h) against stores written by the zarr Python package with
// each codec (tests/data/zarr, models/make_zarr_fixture.py; the values as .npy written by
// numpy), an ERA5 store written by xarray with blosc against the same fields uncompressed, and
// every malformed case an error naming the file (never a crash, a hang or fill values).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <iomanip>

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
