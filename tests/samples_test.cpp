// engine/samples: the .npy directory sample source (pairing, forecast_len windows, batch
// dims, dtype conversion, lat/channel weights, every error) and stack_batch.
#include "engine/io/samples.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/io/npy.h"
#include "tests/test_util.h"

namespace wxe {
namespace {

using namespace wxe::test;
namespace fs = std::filesystem;

// A fresh folder in the test temp folder, removed with everything in it at the end of the test.
struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) : path(tmp_path(name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return path + "/" + f; }
};

// Element j of x number i is 100 i + j, of y number i 1000 + 100 i + j: every value says
// which file it came from.
Tensor filled(Shape s, float base) {
  Tensor t(DType::F32, s);
  for (int64_t j = 0; j < t.numel(); ++j) t.data<float>()[j] = base + (float)j;
  return t;
}

const Shape kX = {2, 3, 4};        // stored without a batch dim
const Shape kY = {1, 1, 3, 4};     // stored with one

void write_series(const TmpDir& d, int first, int count, int width = 4) {
  for (int i = first; i < first + count; ++i) {
    std::string num = std::to_string(i);
    if ((int)num.size() < width) num = std::string(width - num.size(), '0') + num;
    write_npy(d / ("x_" + num + ".npy"), filled(kX, 100.f * i));
    write_npy(d / ("y_" + num + ".npy"), filled(kY, 1000.f + 100.f * i));
  }
}

void expect_file(const Tensor& t, const Shape& shape, float base) {
  ASSERT_EQ(shape_str(t.shape), shape_str(shape));
  ASSERT_EQ(t.dtype, DType::F32);
  for (int64_t j = 0; j < t.numel(); ++j) ASSERT_EQ(t.data<float>()[j], base + (float)j) << "element " << j;
}

TEST(Samples, PairsXAndYWithABatchDim) {
  TmpDir d("samples_pairs");
  write_series(d, 0, 4);
  auto src = open_npy_dir(d.path, 1);
  ASSERT_EQ(src->size(), 4);
  Sample s = src->get(2);
  expect_file(s.input, {1, 2, 3, 4}, 200.f);
  ASSERT_EQ(s.targets.size(), 1u);
  expect_file(s.targets[0], {1, 1, 3, 4}, 1200.f);
  ASSERT_EQ(s.forcing.size(), 1u);
  EXPECT_EQ(s.forcing[0].raw(), s.input.raw());  // forcing[0] is the input
  EXPECT_NE(src->describe().find("4 x/y files"), std::string::npos) << src->describe();
  EXPECT_NE(src->describe().find("4 samples"), std::string::npos) << src->describe();
}

TEST(Samples, ForecastLenWindowsInNumericOrder) {
  TmpDir d("samples_windows");
  write_series(d, 8, 4, 1);  // x_8, x_9, x_10, x_11: by name x_10 would sort first
  auto src = open_npy_dir(d.path, 3);
  ASSERT_EQ(src->size(), 2);
  for (int i = 0; i < 2; ++i) {
    Sample s = src->get(i);
    expect_file(s.input, {1, 2, 3, 4}, 100.f * (8 + i));
    ASSERT_EQ(s.targets.size(), 3u);
    ASSERT_EQ(s.forcing.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      expect_file(s.targets[k], {1, 1, 3, 4}, 1000.f + 100.f * (8 + i + k));
      expect_file(s.forcing[k], {1, 2, 3, 4}, 100.f * (8 + i + k));
    }
  }
  EXPECT_EQ(open_npy_dir(d.path, 4)->size(), 1);  // the whole series: one sample
}

TEST(Samples, OtherFloatTypesBecomeFloat32) {
  TmpDir d("samples_f64");
  Tensor x64(DType::F64, {3, 2}), y64(DType::F64, {1, 2});
  for (int j = 0; j < 6; ++j) x64.data<double>()[j] = 0.25 * j;
  for (int j = 0; j < 2; ++j) y64.data<double>()[j] = -j;
  write_npy(d / "x_0.npy", x64);
  write_npy(d / "y_0.npy", y64);
  Sample s = open_npy_dir(d.path, 1)->get(0);
  ASSERT_EQ(s.input.dtype, DType::F32);
  EXPECT_EQ(shape_str(s.input.shape), "(1, 3, 2)");
  EXPECT_EQ(s.input.data<float>()[5], 1.25f);
  EXPECT_EQ(shape_str(s.targets[0].shape), "(1, 2)");
  EXPECT_EQ(s.targets[0].data<float>()[1], -1.f);
}

TEST(Samples, ReadsLatitudesAndChannelWeights) {
  TmpDir d("samples_info");
  write_series(d, 0, 2);
  NpyDirInfo none = read_npy_dir_info(d.path);
  EXPECT_TRUE(none.lat.empty());
  EXPECT_TRUE(none.channel_weights.empty());
  Tensor lat(DType::F64, {3});
  lat.data<double>()[0] = 45.5;
  lat.data<double>()[1] = 0;
  lat.data<double>()[2] = -45.5;
  write_npy(d / "lat.npy", lat);
  write_npy(d / "channel_weights.npy", Tensor::from_f32({2}, {0.5f, 2.f}));
  NpyDirInfo info = read_npy_dir_info(d.path);
  EXPECT_EQ(info.lat, (std::vector<double>{45.5, 0, -45.5}));
  EXPECT_EQ(info.channel_weights, (std::vector<double>{0.5, 2.0}));
  EXPECT_EQ(open_npy_dir(d.path, 1)->size(), 2);  // the extra files are not samples
  write_npy(d / "lat.npy", Tensor::from_f32({1, 3}, {1.f, 2.f, 3.f}));
  EXPECT_NE(error_of([&] { read_npy_dir_info(d.path); }).find("lat.npy: shape (1, 3), expected a 1-D array"),
            std::string::npos);
}

// The error of opening dir, which must name `what`.
std::string open_error(const std::string& dir, int len = 1) {
  return error_of([&] { open_npy_dir(dir, len); });
}

TEST(Samples, ErrorsNameTheDirectoryOrFile) {
  EXPECT_NE(open_error("/nonexistent/wxe_data").find("/nonexistent/wxe_data: no such directory"), std::string::npos);
  EXPECT_NE(error_of([] { read_npy_dir_info("/nonexistent/wxe_data"); }).find("no such directory"), std::string::npos);
  {
    TmpDir d("samples_empty");
    EXPECT_NE(open_error(d.path).find(d.path + ": no x_*.npy files"), std::string::npos) << open_error(d.path);
  }
  {
    TmpDir d("samples_count");
    write_series(d, 0, 3);
    fs::remove(d / "x_0002.npy");
    EXPECT_NE(open_error(d.path).find("2 x_*.npy files but 3 y_*.npy files"), std::string::npos) << open_error(d.path);
  }
  {
    TmpDir d("samples_gap");
    write_series(d, 0, 4);
    fs::remove(d / "x_0002.npy");
    fs::remove(d / "y_0002.npy");
    EXPECT_NE(open_error(d.path).find("a gap in the numbering after x_0001.npy (next is x_0003.npy)"),
              std::string::npos)
        << open_error(d.path);
  }
  {
    TmpDir d("samples_mispaired");
    write_series(d, 0, 2);
    fs::rename(d / "y_0000.npy", d / "y_0002.npy");
    EXPECT_NE(open_error(d.path).find("x_0000.npy pairs with y_0001.npy"), std::string::npos) << open_error(d.path);
  }
  {
    TmpDir d("samples_shape");
    write_series(d, 0, 3);
    write_npy(d / "x_0001.npy", filled({2, 3, 5}, 0));
    EXPECT_NE(open_error(d.path).find("x_0001.npy: float32 (2, 3, 5) differs from x_0000.npy's float32 (2, 3, 4)"),
              std::string::npos)
        << open_error(d.path);
  }
  {
    TmpDir d("samples_len");
    write_series(d, 0, 3);
    EXPECT_NE(open_error(d.path, 4).find("forecast_len 4 is longer than the series of 3 x/y files"), std::string::npos)
        << open_error(d.path, 4);
    EXPECT_NE(open_error(d.path, 0).find("forecast_len 0 must be at least 1"), std::string::npos);
    auto src = open_npy_dir(d.path, 2);
    EXPECT_NE(error_of([&] { src->get(2); }).find("sample 2 out of range [0, 2)"), std::string::npos);
    write_npy(d / "x_extra.npy", filled(kX, 0));
    EXPECT_NE(open_error(d.path).find("x_extra.npy: expected x_<number>.npy"), std::string::npos) << open_error(d.path);
  }
  {
    TmpDir d("samples_int");
    write_npy(d / "x_0.npy", Tensor::from_i64({1, 2}));
    write_npy(d / "y_0.npy", Tensor::from_i64({1, 2}));
    EXPECT_NE(open_error(d.path).find("x_0.npy: dtype int64, expected a float type"), std::string::npos)
        << open_error(d.path);
  }
}

TEST(Samples, StackBatchConcatenatesAlongDimZero) {
  std::vector<Tensor> items = {filled({1, 2, 3}, 0), filled({1, 2, 3}, 10), filled({1, 2, 3}, 20)};
  Tensor b = stack_batch(items);
  ASSERT_EQ(shape_str(b.shape), "(3, 2, 3)");
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_EQ(b.data<float>()[i * 6 + j], 10.f * i + j);
  items.push_back(filled({1, 3, 2}, 0));
  EXPECT_NE(error_of([&] { stack_batch(items); }).find("sample 3 is float32 (1, 3, 2), sample 0 float32 (1, 2, 3)"),
            std::string::npos)
      << error_of([&] { stack_batch(items); });
  EXPECT_NE(error_of([] { stack_batch({}); }).find("no samples"), std::string::npos);
}

}  // namespace
}  // namespace wxe

// Issue 42: read ahead. Samples named by want() are read on the background thread, in order,
// at most `depth` held; get() returns what the wrapped source returns (read ahead or not); an
// error of a read ahead surfaces in the get() of that sample only.
namespace {
class CountingSource : public wxe::SampleSource {
 public:
  mutable std::atomic<int> reads{0};
  int64_t size() const override { return 10; }
  wxe::Sample get(int64_t i) const override {
    ++reads;
    if (i == 7) wxe::fail("sample_7.nc: unreadable");
    wxe::Tensor x(wxe::DType::F32, {1, 1});
    x.data<float>()[0] = (float)i;
    return {x, {x}, {x}};
  }
  std::string describe() const override { return "counting"; }
};
}  // namespace

TEST(Prefetch, ReadsAheadInOrderAndSurfacesErrorsWhereNeeded) {
  auto inner = std::make_unique<CountingSource>();
  CountingSource* c = inner.get();
  wxe::PrefetchSource p(std::move(inner), 2);
  p.want({3, 4, 7, 5});
  for (int spin = 0; spin < 2000 && c->reads < 2; ++spin) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c->reads.load(), 2);  // depth 2: 3 and 4 read ahead, no more until one is taken
  EXPECT_EQ(p.get(3).input.data<float>()[0], 3.0f);
  EXPECT_EQ(p.get(4).input.data<float>()[0], 4.0f);
  EXPECT_EQ(p.hits(), 2);
  std::string e;
  try {
    p.get(7);
  } catch (const wxe::Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("sample_7.nc: unreadable"), std::string::npos) << e;
  EXPECT_EQ(p.get(5).input.data<float>()[0], 5.0f);
  EXPECT_EQ(p.get(9).input.data<float>()[0], 9.0f);  // never wanted: read by get itself
  EXPECT_EQ(p.size(), 10);
  EXPECT_GE(p.waited_seconds(), 0.0);
}
