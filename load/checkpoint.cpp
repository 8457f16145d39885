#include "load/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "engine/io/file_util.h"
#include "engine/io/json.h"
#include "importers/torch/torch_checkpoint.h"
#include "load/model.h"
#include "parallel/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace wxe {

int64_t step_number(const std::string& name) {
  if (name.size() <= 5 || name.size() > 24 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t n = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');  // at most 19 digits: no overflow
  }
  return n;
}

std::string latest_checkpoint(const std::string& save) {
  const fs::path latest = fs::path(save) / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(latest, ec))) return "";
  check_regular_file(latest.string());
  std::ifstream f(latest);
  std::string name(64, '\0');
  f.read(&name[0], (std::streamsize)name.size());
  name.resize((size_t)f.gcount());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  WXE_CHECK(step_number(name) >= 0, latest.string(), ": names '", printable(name),
            "', not a step_NNNNNN checkpoint directory of ", save);
  const fs::path dir = fs::path(save) / name;
  WXE_CHECK(fs::is_directory(fs::symlink_status(dir, ec)), latest.string(), ": names ", name, ", which is not a directory in ",
            save);
  return dir.string();
}

bool is_train_checkpoint(const std::string& dir) {
  return is_sharded_checkpoint(dir) || fs::exists(fs::path(dir) / "model.safetensors");
}

std::vector<std::string> TrainCheckpoint::parameter_names() const {
  std::vector<std::string> r;
  for (const std::string& n : names)
    if (!is_moment(n) && n.rfind("ema.", 0) != 0) r.push_back(n);
  return r;
}

TrainCheckpoint open_train_checkpoint(const std::string& dir) {
  TrainCheckpoint ck;
  if (is_sharded_checkpoint(dir)) {
    auto sc = std::make_shared<ShardedCheckpoint>(dir);
    ck.names = sc->names();
    ck.meta = sc->metadata();
    ck.get = [sc, dir](const std::string& name, const TensorSlice& s) {
      WXE_CHECK(sc->has(name), dir, ": no tensor '", name, "' (a checkpoint of another model, or saved with other options?)");
      return sc->read(name, s);
    };
    return ck;
  }
  WXE_CHECK(fs::exists(fs::path(dir) / "model.safetensors"), dir,
            ": not a wxe checkpoint (neither index.json nor model.safetensors in it)");
  auto whole = std::make_shared<std::map<std::string, Tensor>>();
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "ema.safetensors"}) {
    const std::string path = dir + "/" + f;
    if (!fs::exists(path)) continue;
    const std::string prefix = std::string(f) == "ema.safetensors" ? "ema." : "";
    std::map<std::string, std::string> m;
    for (auto& [n, t] : read_safetensors(path, &m)) {
      ck.names.push_back(prefix + n);
      (*whole)[prefix + n] = t;
    }
    if (std::string(f) == "optimizer.safetensors") ck.meta = m;
  }
  ck.get = [whole, dir](const std::string& name, const TensorSlice& s) {
    auto it = whole->find(name);
    WXE_CHECK(it != whole->end(), dir, ": no tensor '", name,
              "' (a checkpoint of another model, or saved with other options?)");
    return take_block(it->second, s);
  };
  return ck;
}


// A checkpoint's tensors as stored (with `slices`, only those parts of a .safetensors).
NamedTensors read_checkpoint(const std::string& path, const std::map<std::string, TensorSlice>* slices) {
  if (!is_train_checkpoint(path))
    return ends_with(path, ".safetensors") ? read_safetensors(path, nullptr, slices) : read_torch_state_dict(path).tensors;
  NamedTensors raw;  // a wxe finetune step directory: its parameters
  TrainCheckpoint ck = open_train_checkpoint(path);
  for (const std::string& n : ck.parameter_names()) {
    auto it = slices ? slices->find(n) : std::map<std::string, TensorSlice>::const_iterator();
    raw.push_back({n, ck.get(n, slices && it != slices->end() ? it->second : TensorSlice{})});
  }
  return raw;
}

// The rule table applied (layout::convert_state_dict); errors name the checkpoint.
NamedTensors to_linear_layout(const NamedTensors& raw, const std::string& path, layout::ConvertReport* report,
                              bool keep_spectral_norm) {
  try {
    return layout::convert_state_dict(raw, report, keep_spectral_norm);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

NamedTensors read_weights(const std::string& path, layout::ConvertReport* report,
                          const std::map<std::string, TensorSlice>* slices, bool keep_spectral_norm) {
  return to_linear_layout(read_checkpoint(path, slices), path, report, keep_spectral_norm);
}

}  // namespace wxe
