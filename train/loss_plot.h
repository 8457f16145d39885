// The loss curve of a fine-tuning run as a PNG, drawn by PLplot (Debian libplplot-dev,
// plplot-driver-cairo).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/io/file_util.h"

namespace wxe {

// One PNG drawn by PLplot's cairo driver, the setup every wxe plot shares: PLplot's global
// state locked for the object's life, a fresh stream writing a temporary file beside
// `png_path` (width x height pixels, white background, colour 1 black), initialised (plinit).
// finish() ends the stream and renames the file over png_path; without it (an error) the
// temporary file is removed. Throws wxe::Error naming the file when PLplot lacks the driver.
class PlotPng {
 public:
  PlotPng(const std::string& png_path, int width, int height);
  ~PlotPng();
  PlotPng(const PlotPng&) = delete;
  PlotPng& operator=(const PlotPng&) = delete;
  void finish();

 private:
  std::string path_;
  std::unique_lock<std::mutex> lock_;
  std::unique_ptr<TempFile> file_;
  bool open_ = false;
};

// Training loss against step (and validation loss, if given) into `png_path`, written
// atomically (temporary file, rename). The y axis is logarithmic when the losses span more than
// a factor of 20. Throws wxe::Error naming the file if PLplot cannot draw it.
void plot_loss_curve(const std::string& png_path, const std::string& title, const std::vector<double>& steps,
                     const std::vector<double>& loss, const std::vector<double>& val_steps = {},
                     const std::vector<double>& val_loss = {});

}  // namespace wxe
