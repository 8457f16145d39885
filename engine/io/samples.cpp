#include "engine/io/samples.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/ir/error.h"
#include "engine/io/npy.h"

namespace wxe {

PrefetchSource::PrefetchSource(std::unique_ptr<SampleSource> inner, int depth)
    : inner_(std::move(inner)), depth_(std::max(1, depth)), thread_([this] { run(); }) {}

PrefetchSource::~PrefetchSource() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PrefetchSource::want(const std::vector<int64_t>& indices) {
  {
    std::lock_guard<std::mutex> l(m_);
    for (int64_t i : indices)
      if (!held_.count(i) && std::find(queue_.begin(), queue_.end(), i) == queue_.end()) queue_.push_back(i);
  }
  cv_.notify_all();
}

void PrefetchSource::run() {
  std::unique_lock<std::mutex> l(m_);
  for (;;) {
    // room for another read ahead, or the read a get() waits for
    cv_.wait(l, [&] {
      return stop_ || (!queue_.empty() && ((int64_t)held_.size() < depth_ || queue_.front() == demanded_));
    });
    if (stop_) return;
    const int64_t i = queue_.front();
    queue_.pop_front();
    held_[i];  // started
    l.unlock();
    Held h;
    try {
      std::lock_guard<std::mutex> io(io_);
      h.sample = inner_->get(i);
    } catch (...) {
      h.error = std::current_exception();
    }
    h.done = true;
    l.lock();
    auto it = held_.find(i);
    if (it != held_.end()) it->second = std::move(h);  // (not taken meanwhile: get() waits for a started one)
    cv_.notify_all();
  }
}

Sample PrefetchSource::get(int64_t index) const {
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = [&] { waited_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::unique_lock<std::mutex> l(m_);
  auto it = held_.find(index);
  if (it != held_.end()) {  // read ahead, or being read: wait for it
    cv_.wait(l, [&] { return held_.at(index).done; });
    Held h = std::move(held_.at(index));
    held_.erase(index);
    ++hits_;
    waited();
    l.unlock();
    cv_.notify_all();  // room for the next read ahead
    if (h.error) std::rethrow_exception(h.error);
    return std::move(h.sample);
  }
  // not read ahead: read on the background thread too, first, so that the caller's thread never
  // reads (what it allocates is the same whichever way the sample came: the trainer's step arena
  // replays a step's allocations)
  auto q = std::find(queue_.begin(), queue_.end(), index);
  if (q != queue_.end()) queue_.erase(q);
  queue_.push_front(index);
  demanded_ = index;
  cv_.notify_all();
  cv_.wait(l, [&] { return held_.count(index) && held_.at(index).done; });
  demanded_ = -1;
  Held h = std::move(held_.at(index));
  held_.erase(index);
  waited();
  l.unlock();
  cv_.notify_all();
  if (h.error) std::rethrow_exception(h.error);
  return std::move(h.sample);
}

double PrefetchSource::waited_seconds() const {
  std::lock_guard<std::mutex> l(m_);
  return waited_;
}

int64_t PrefetchSource::hits() const {
  std::lock_guard<std::mutex> l(m_);
  return hits_;
}


namespace fs = std::filesystem;

namespace {

struct SeriesFile {
  int64_t number;
  std::string name;  // x_0007.npy
};

// The files PREFIX_<digits>.npy in dir, sorted by number. Any other name starting with
// PREFIX_ and ending in .npy is an error (a typo would silently drop a sample otherwise).
std::vector<SeriesFile> list_series(const std::string& dir, const std::string& prefix) {
  std::vector<SeriesFile> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() + 4 || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 4, 4, ".npy") != 0)
      continue;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    WXE_CHECK(digits.size() <= 18 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }),
              dir, "/", name, ": expected ", prefix, "<number>.npy");
    files.push_back({std::stoll(digits), name});
  }
  std::sort(files.begin(), files.end(), [](const SeriesFile& a, const SeriesFile& b) { return a.number < b.number; });
  for (size_t i = 1; i < files.size(); ++i) {
    WXE_CHECK(files[i].number != files[i - 1].number, dir, ": ", files[i - 1].name, " and ", files[i].name,
              " have the same number");
    WXE_CHECK(files[i].number == files[i - 1].number + 1, dir, ": a gap in the numbering after ", files[i - 1].name,
              " (next is ", files[i].name, ")");
  }
  return files;
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

// The shape a sample file gets in a Sample: a leading batch dim of 1, added when missing.
Shape with_batch(Shape s) {
  if (s.empty() || s[0] != 1) s.insert(s.begin(), 1);
  return s;
}

// Checks every file's header against the first one's; returns that shape.
Shape common_shape(const std::string& dir, const std::vector<SeriesFile>& files) {
  NpyHeader first = read_npy_header(dir + "/" + files[0].name);
  WXE_CHECK(is_float(first.dtype), dir, "/", files[0].name, ": dtype ", dtype_name(first.dtype),
            ", expected a float type");
  for (size_t i = 1; i < files.size(); ++i) {
    NpyHeader h = read_npy_header(dir + "/" + files[i].name);
    WXE_CHECK(h.shape == first.shape && h.dtype == first.dtype, dir, "/", files[i].name, ": ", dtype_name(h.dtype), " ",
              shape_str(h.shape), " differs from ", files[0].name, "'s ", dtype_name(first.dtype), " ",
              shape_str(first.shape));
  }
  return first.shape;
}

class NpyDirSource : public SampleSource {
 public:
  NpyDirSource(const std::string& dir, int forecast_len) : dir_(dir), len_(forecast_len) {
    WXE_CHECK(fs::is_directory(dir), dir, ": no such directory");
    WXE_CHECK(forecast_len >= 1, dir, ": forecast_len ", forecast_len, " must be at least 1");
    x_ = list_series(dir, "x_");
    y_ = list_series(dir, "y_");
    WXE_CHECK(!x_.empty(), dir, ": no x_*.npy files");
    WXE_CHECK(x_.size() == y_.size(), dir, ": ", x_.size(), " x_*.npy files but ", y_.size(), " y_*.npy files");
    for (size_t i = 0; i < x_.size(); ++i)
      WXE_CHECK(x_[i].number == y_[i].number, dir, ": ", x_[i].name, " pairs with ", y_[i].name,
                " (the x and y numbers differ)");
    WXE_CHECK((int64_t)x_.size() >= forecast_len, dir, ": forecast_len ", forecast_len, " is longer than the series of ",
              x_.size(), " x/y files");
    x_shape_ = common_shape(dir, x_);
    y_shape_ = common_shape(dir, y_);
  }

  int64_t size() const override { return (int64_t)x_.size() - len_ + 1; }

  Sample get(int64_t index) const override {
    WXE_CHECK(index >= 0 && index < size(), dir_, ": sample ", index, " out of range [0, ", size(), ")");
    Sample s;
    for (int k = 0; k < len_; ++k) {
      s.forcing.push_back(load(x_[index + k].name, x_shape_));
      s.targets.push_back(load(y_[index + k].name, y_shape_));
    }
    s.input = s.forcing[0];
    return s;
  }

  std::string describe() const override {
    return str(dir_, ": ", x_.size(), " x/y files (", x_.front().name, " .. ", x_.back().name, "), x ",
               shape_str(with_batch(x_shape_)), ", y ", shape_str(with_batch(y_shape_)), ", forecast_len ", len_, ": ",
               size(), " samples");
  }

 private:
  // One file as float32 with a leading batch dim; the shape is checked again in case the file
  // changed since the directory was opened.
  Tensor load(const std::string& name, const Shape& shape) const {
    const std::string path = dir_ + "/" + name;
    Tensor t = read_npy(path);
    WXE_CHECK(t.shape == shape, path, ": shape ", shape_str(t.shape), ", expected ", shape_str(shape));
    if (t.dtype != DType::F32) t = t.to_f32();
    return t.reshaped(with_batch(shape));
  }

  std::string dir_;
  int len_;
  std::vector<SeriesFile> x_, y_;
  Shape x_shape_, y_shape_;  // as stored in the files
};

// A float .npy file as doubles (any shape, read flat).
std::vector<double> read_doubles(const std::string& path) {
  Tensor t = read_npy(path);
  WXE_CHECK(is_float(t.dtype), path, ": dtype ", dtype_name(t.dtype), ", expected a float type");
  WXE_CHECK(t.rank() == 1, path, ": shape ", shape_str(t.shape), ", expected a 1-D array");
  Tensor d(DType::F64, t.shape);
  convert(t, d);
  return std::vector<double>(d.data<double>(), d.data<double>() + d.numel());
}

}  // namespace

std::unique_ptr<SampleSource> open_npy_dir(const std::string& dir, int forecast_len) {
  return std::make_unique<NpyDirSource>(dir, forecast_len);
}

NpyDirInfo read_npy_dir_info(const std::string& dir) {
  WXE_CHECK(fs::is_directory(dir), dir, ": no such directory");
  NpyDirInfo info;
  // a file that is there must hold usable values: an empty or out-of-range one is an error,
  // not the default weights
  const std::string lat = dir + "/lat.npy", cw = dir + "/channel_weights.npy";
  if (fs::exists(lat) || fs::is_symlink(lat)) {
    info.lat = read_doubles(lat);
    WXE_CHECK(!info.lat.empty(), lat, ": empty (expected one latitude per row of the output)");
    for (double v : info.lat)
      WXE_CHECK(std::isfinite(v) && v >= -90 && v <= 90, lat, ": latitude ", v, " is not in [-90, 90]");
  }
  if (fs::exists(cw) || fs::is_symlink(cw)) {
    info.channel_weights = read_doubles(cw);
    WXE_CHECK(!info.channel_weights.empty(), cw, ": empty (expected one weight per output channel)");
    for (double v : info.channel_weights)
      WXE_CHECK(std::isfinite(v) && v >= 0, cw, ": weight ", v, " is not a finite number >= 0");
  }
  return info;
}

void feed_back(Tensor& x, const Tensor& pred, int64_t c) {
  std::vector<int64_t> map(c);
  for (int64_t k = 0; k < c; ++k) map[k] = k;
  feed_back(x, pred, map);
}

void feed_back(Tensor& x, const Tensor& pred, const std::vector<int64_t>& map) {
  auto bad = [&](const std::string& why) {
    fail("rollout: prediction ", shape_str(pred.shape), " cannot be fed back into input ", shape_str(x.shape), why);
  };
  if (x.rank() != pred.rank() || x.shape[0] != pred.shape[0] || (int64_t)map.size() > pred.shape[1]) bad("");
  for (int64_t to : map)
    if (to >= x.shape[1]) bad(str(" (channel ", to, ")"));
  // (B, C, T, ...) inputs take a one-step prediction into their newest step
  const bool last_step = x.rank() == 5 && pred.shape[2] == 1;
  const int64_t T = last_step ? x.shape[2] : 1;
  int64_t inner = 1;
  for (int d = last_step ? 3 : 2; d < x.rank(); ++d) {
    if (x.shape[d] != pred.shape[d]) bad(str(" (dim ", d, " differs)"));
    inner *= x.shape[d];
  }
  for (int64_t b = 0; b < x.shape[0]; ++b)
    for (int64_t ch = 0; ch < (int64_t)map.size(); ++ch)
      if (map[ch] >= 0)
        std::memcpy(x.data<float>() + ((b * x.shape[1] + map[ch]) * T + T - 1) * inner,
                    pred.data<float>() + (b * pred.shape[1] + ch) * inner, inner * sizeof(float));
}

Tensor slide_window(const Tensor& x, const Tensor& newest) {
  WXE_CHECK(x.rank() == newest.rank() && x.shape[0] == newest.shape[0] && x.shape[1] == newest.shape[1],
            "rollout: step input ", shape_str(newest.shape), " does not fit the input window ", shape_str(x.shape));
  if (x.rank() < 3) return newest.clone();
  const int64_t T = x.shape[2], Tn = newest.shape[2];
  int64_t inner = 1;
  for (int d = 3; d < x.rank(); ++d) {
    WXE_CHECK(x.shape[d] == newest.shape[d], "rollout: step input ", shape_str(newest.shape),
              " does not fit the input window ", shape_str(x.shape), " (dim ", d, " differs)");
    inner *= x.shape[d];
  }
  Tensor out(DType::F32, x.shape);
  const float *px = x.data<float>(), *pn = newest.data<float>();
  float* po = out.data<float>();
  for (int64_t bc = 0; bc < x.shape[0] * x.shape[1]; ++bc) {
    std::copy_n(px + (bc * T + 1) * inner, (T - 1) * inner, po + bc * T * inner);
    std::copy_n(pn + (bc * Tn + Tn - 1) * inner, inner, po + (bc * T + T - 1) * inner);
  }
  return out;
}

Tensor last_step(const Tensor& x) {
  if (x.rank() < 3) return x.clone();
  Shape s = x.shape;
  s[2] = 1;
  return slide_window(Tensor(DType::F32, s), x);  // a window of one step takes x's newest
}

Tensor stack_batch(const std::vector<Tensor>& items) {
  WXE_CHECK(!items.empty(), "stack_batch: no samples");
  const Tensor& first = items[0];
  WXE_CHECK(first.rank() >= 1, "stack_batch: sample 0 is a scalar, expected a leading batch dim");
  for (size_t i = 1; i < items.size(); ++i)
    WXE_CHECK(items[i].shape == first.shape && items[i].dtype == first.dtype, "stack_batch: sample ", i, " is ",
              dtype_name(items[i].dtype), " ", shape_str(items[i].shape), ", sample 0 ", dtype_name(first.dtype), " ",
              shape_str(first.shape));
  Shape s = first.shape;
  s[0] *= (int64_t)items.size();
  Tensor out(first.dtype, s);
  const size_t bytes = first.nbytes();
  for (size_t i = 0; i < items.size(); ++i)
    if (bytes) std::memcpy(static_cast<uint8_t*>(out.raw()) + i * bytes, items[i].raw(), bytes);
  return out;
}

}  // namespace wxe
