// The loss curve of a fine-tuning run as a PNG, drawn by PLplot (Debian libplplot-dev,
// plplot-driver-cairo).
#pragma once
#include <string>
#include <vector>

namespace wxe {

// Training loss against step (and validation loss, if given) into `png_path`, written
// atomically (temporary file, rename). The y axis is logarithmic when the losses span more than
// a factor of 20. Throws wxe::Error naming the file if PLplot cannot draw it.
void plot_loss_curve(const std::string& png_path, const std::string& title, const std::vector<double>& steps,
                     const std::vector<double>& loss, const std::vector<double>& val_steps = {},
                     const std::vector<double>& val_loss = {});

}  // namespace wxe
