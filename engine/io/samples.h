// Training data: the sample-source interface and a directory of .npy files. CREDIT's
// netCDF/zarr pipeline (ERA5 files per year, YAML config, scalers, forcing and static
// channels) implements the same interface.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe {

// One training sample: a model input and the targets of `forecast_len` consecutive steps,
// all float32 with a leading batch dim of 1: input (1, C, ...), targets[k] (1, C_out, ...).
// forcing[k] (k >= 1) is the input of step k as read from the data; during a rollout the
// first `prognostic` channels of it are replaced by the model's prediction of step k-1 (the
// rest, forcing and static channels, are kept) and it is slid into the input window
// (slide_window). forcing[0] == input (same storage).
struct Sample {
  Tensor input;
  std::vector<Tensor> targets;
  std::vector<Tensor> forcing;
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;             // number of samples for forecast_len
  virtual Sample get(int64_t index) const = 0;  // 0 <= index < size()
  virtual std::string describe() const = 0;     // one line for the log
};

// Reads ahead: the samples want() names are read on one background thread, at most `depth` of
// them held (read, or being read); get(i) takes a sample read ahead (waiting while it is being
// read), or has the thread read it next and waits: every read is on that thread. An error reading ahead surfaces in the get() of that sample, as its
// own read would have raised it. The wrapped source is read by one thread at a time.
class PrefetchSource : public SampleSource {
 public:
  PrefetchSource(std::unique_ptr<SampleSource> inner, int depth);
  ~PrefetchSource() override;
  int64_t size() const override { return inner_->size(); }
  Sample get(int64_t index) const override;
  std::string describe() const override { return inner_->describe(); }
  // The samples the next get()s will ask for, in order (already wanted or held: skipped).
  void want(const std::vector<int64_t>& indices);
  // Seconds get() has spent waiting for data (its own reads and reads ahead), in all.
  double waited_seconds() const;
  // Samples get() took from the reads ahead (for tests).
  int64_t hits() const;

 private:
  struct Held {
    bool done = false;
    Sample sample;
    std::exception_ptr error;
  };
  void run();
  std::unique_ptr<SampleSource> inner_;
  const int depth_;
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  mutable std::deque<int64_t> queue_;       // wanted, not started
  mutable std::map<int64_t, Held> held_;    // started or read
  mutable double waited_ = 0;
  mutable int64_t demanded_ = -1;  // the sample a get() waits for (read even with no room)
  mutable int64_t hits_ = 0;
  bool stop_ = false;
  mutable std::mutex io_;  // one read of inner_ at a time
  std::thread thread_;
};

// A directory of .npy files: x_NNNN.npy (model input at time t) and y_NNNN.npy (the target
// for the step from t), consecutive in time, numbered without gaps (from any start), the same
// numbers for x and y. Each file holds one sample shaped like the model input/output, with or
// without a leading batch dim of 1: a file whose first dim is 1 is taken to have it, any
// other gets one. Float files of another precision are converted to float32.
// With forecast_len L, sample i (0 <= i <= count - L) has input x_i, targets y_i..y_{i+L-1},
// forcing x_i..x_{i+L-1}; L = 1 makes it plain x/y pairs. Opening checks names, numbering and
// the headers (dtype, shape) of every file; get() reads the files of one sample.
std::unique_ptr<SampleSource> open_npy_dir(const std::string& dir, int forecast_len);

// Optional lat.npy (H latitudes, degrees) and channel_weights.npy (C_out) in the directory;
// each empty when its file is absent.
struct NpyDirInfo {
  std::vector<double> lat, channel_weights;
};
NpyDirInfo read_npy_dir_info(const std::string& dir);

// Rollouts. feed_back: x[:, :c] = pred[:, :c] over the trailing dims, which must agree.
// slide_window: the input of the next step: x (B, C, T, ...) without its oldest step, with
// `newest` (B, C, 1, ...) appended on dim 2 (CREDIT's history window); with T == 1, or no
// time dim, `newest` itself. `newest` may hold T steps (a whole window as read from .npy
// files): its last one is taken.
// last_step: the newest step of a window (B, C, 1, ...) (x itself without a time dim).
void feed_back(Tensor& x, const Tensor& pred, int64_t c);
// The same with a channel map: pred channel k goes to x channel map[k] (-1: not fed back).
void feed_back(Tensor& x, const Tensor& pred, const std::vector<int64_t>& map);
Tensor slide_window(const Tensor& x, const Tensor& newest);
Tensor last_step(const Tensor& x);

// Concatenates samples along dim 0: n items shaped (1, ...) make (n, ...). All items must
// have the same dtype and shape.
Tensor stack_batch(const std::vector<Tensor>& items);

}  // namespace wxe
