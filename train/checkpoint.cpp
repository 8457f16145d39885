// Fine-tuning checkpoints written and read back by the Trainer (train/trainer.h): one
// process writes model/optimizer/ema.safetensors and trainer_state.json into a temporary
// directory renamed into place; a mesh writes a sharded checkpoint (parallel/sharded_checkpoint.h).
// Reading either layout is load/checkpoint.h.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/io/file_util.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "load/checkpoint.h"
#include "load/model.h"
#include "parallel/sharded_checkpoint.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace wxe {

std::string step_dir_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%06lld", (long long)step);
  return b;
}

namespace {

int64_t count_non_finite(const Tensor& t) {
  const float* p = t.data<float>();
  return std::count_if(p, p + t.numel(), [](float x) { return !std::isfinite(x); });
}

std::string freeze_text(const std::vector<std::string>& patterns) {
  std::string r;
  for (const std::string& f : patterns) r += (r.empty() ? "" : " ") + f;
  return r;
}

}  // namespace

std::string Trainer::save_checkpoint() {
  WXE_CHECK(!cfg_.save.empty(), "no --save directory");
  const fs::path root(cfg_.save), final_dir = root / step_dir_name(step_);
  const bool lead = !mesh_ || mesh_->rank == 0, sharded = mesh_ && mesh_->world > 1;
  std::error_code ec;
  if (lead) {
    fs::create_directories(root, ec);
    WXE_CHECK(!ec, cfg_.save, ": cannot create the directory: ", ec.message());
  }
  const std::string step = std::to_string(step_);
  sync_to_host();
  whole_parameters(true);  // ZeRO-3: gathered for the save, freed after it
  struct Release {
    Trainer* t;
    ~Release() { t->whole_parameters(false); }
  } release{this};
  // a step that made parameters NaN or inf (NaN moments, an overflow) is never saved, so
  // `latest` stays on the last good checkpoint
  int64_t bad = 0;
  std::string first_bad;
  for (const auto& [n, t] : host_parameters()) {
    const int64_t k = t.dtype == DType::F32 ? count_non_finite(t) : 0;
    if (k && first_bad.empty()) first_bad = n;
    bad += k;
  }
  if (mesh_ && mesh_->world > 1) {  // every rank fails alike
    Tensor b = Tensor::from_i64({bad});
    mesh_->world_comm->all_reduce_sum(b);
    bad = b.data<int64_t>()[0];
  }
  if (bad) {
    std::string last;
    try {
      last = latest_checkpoint(cfg_.save);
    } catch (const Error&) {
    }
    throw NonFiniteLoss(str("step ", step_, ": ", bad, " parameter values are NaN or inf",
                            first_bad.empty() ? std::string() : " (in '" + first_bad + "')", "; not saved: ",
                            last.empty() ? std::string("no checkpoint of this run was written before")
                                         : "the last good checkpoint is " + last));
  }
  std::vector<Tensor> m = gather_moments(adam_.exp_avg().empty() ? Tensor::zeros(DType::F32, {zS_}) : adam_.exp_avg()[0]);
  std::vector<Tensor> v = gather_moments(adam_.exp_avg_sq().empty() ? Tensor::zeros(DType::F32, {zS_}) : adam_.exp_avg_sq()[0]);
  const AdamWConfig& c = adam_.config();
  std::map<std::string, std::string> meta = {
      {"step", step}, {"adam_step", std::to_string(adam_.steps())}, {"seed", std::to_string(cfg_.seed)},
      {"lr", str(cfg_.schedule.lr)}, {"beta1", str(c.beta1)}, {"beta2", str(c.beta2)}, {"eps", str(c.eps)},
      {"weight_decay", str(c.weight_decay)}, {"source", cfg_.model}, {"written_by", "wxe finetune"},
      {"accum", std::to_string(cfg_.accum)}, {"forecast_len", std::to_string(cfg_.forecast_len)},
      {"freeze", freeze_text(cfg_.freeze)}};
  // the learning-rate schedule, for resuming and CREDIT's scheduler_state_dict (train/credit_checkpoint.h)
  for (const auto& [k, v] : schedule_metadata(cfg_.schedule)) meta[k] = v;
  // ZeRO-3: the EMA is of this rank's blocks, gathered whole as the moments are
  std::vector<Tensor> e = ema_ && z3_ ? gather_moments(ema_->shadow()[0]) : ema_ ? ema_->shadow() : std::vector<Tensor>{};
  NamedTensors opt, ema;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    const std::string& name = graph_.values[trainable_[i]].name;
    if (!m.empty()) {
      opt.push_back({"exp_avg." + name, m[i]});
      opt.push_back({"exp_avg_sq." + name, v[i]});
    }
    if (!e.empty()) ema.push_back({"ema." + name, e[i]});
  }
  if (sharded) {
    // every tensor once: a tp shard from zrank 0 of its tp column (it gathered the whole
    // moments), a replicated one from rank 0
    std::vector<ShardPiece> pieces;
    auto add = [&](const std::string& name, const std::string& param, const Tensor& t) {
      ShardPiece p{name, t.shape, {}, t, mesh_->rank == 0};
      auto it = slices_.find(param);
      if (it != slices_.end()) {
        p.slice = it->second;
        p.global_shape[p.slice.axis] *= p.slice.parts;
        p.owner = zrank_ == 0;
      }
      pieces.push_back(p);
    };
    for (auto& [n, t] : host_parameters()) add(n, n, t);
    for (NamedTensors* list : {&opt, &ema})
      for (auto& [n, t] : *list) add(n, n.substr(n.find('.') + 1), t);
    if (lead && fs::exists(final_dir) && !is_sharded_checkpoint(final_dir.string()))
      fs::remove_all(final_dir, ec);  // the same step saved by one process before
    save_sharded(final_dir.string(), pieces, *mesh_->world_comm, meta);
  } else {
    const fs::path tmp = root / (step_dir_name(step_) + ".tmp" + std::to_string(getpid()));
    // SIGINT/SIGTERM/SIGHUP during the save remove the temporary directory (its files first)
    TempDirGuard on_signal(tmp.string(), {"model.safetensors", "optimizer.safetensors", "ema.safetensors", "trainer_state.json"});
    try {
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      WXE_CHECK(!ec, tmp.string(), ": cannot create: ", ec.message());
      write_safetensors((tmp / "model.safetensors").string(), host_parameters(),
                        {{"format", "pt"}, {"step", step}, {"source", cfg_.model}, {"written_by", "wxe finetune"}});
      write_safetensors((tmp / "optimizer.safetensors").string(), opt, meta);
      if (ema_) {
        for (auto& e : ema) e.first = e.first.substr(4);
        write_safetensors((tmp / "ema.safetensors").string(), ema, {{"format", "pt"}, {"step", step}});
      }
      std::string js = "{\"step\": " + step + ", \"seed\": " + std::to_string(cfg_.seed) + ", \"model\": ";
      json_string(js, cfg_.model);
      js += ", \"data\": ";
      json_string(js, cfg_.data);
      js += ", \"accum\": " + std::to_string(cfg_.accum) + ", \"forecast_len\": " + std::to_string(cfg_.forecast_len) + "}\n";
      write_file_atomic((tmp / "trainer_state.json").string(), js);
      fs::remove_all(final_dir, ec);
      fs::rename(tmp, final_dir, ec);
      WXE_CHECK(!ec, final_dir.string(), ": cannot move the checkpoint into place: ", ec.message());
    } catch (const std::exception& e) {  // nothing half-written stays; latest still names the last good one
      fs::remove_all(tmp, ec);
      std::string last;
      try {
        last = latest_checkpoint(cfg_.save);
      } catch (const Error&) {
      }
      fail("step ", step_, ": the checkpoint could not be written (", e.what(), "); ",
           last.empty() ? std::string("no checkpoint of this run was written before") : "the last good checkpoint is " + last);
    }
  }
  if (lead) {
    write_file_atomic((root / "latest").string(), step_dir_name(step_) + "\n");
    // keep the newest `keep` checkpoints; remove what saves killed mid-write left (step_N.tmp*:
    // this save's own is in place by now)
    std::vector<std::string> dirs;
    for (auto& e : fs::directory_iterator(root)) {
      std::string n = e.path().filename().string();
      if (n.rfind(".latest.", 0) == 0 && e.is_regular_file()) {  // a write of latest killed (kill -9) before its rename
        fs::remove(root / n, ec);
        continue;
      }
      if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
      if (n.find(".tmp") != std::string::npos) {
        note("wxe: removing %s, left by an interrupted save\n", (root / n).string().c_str());
        fs::remove_all(root / n, ec);
      } else if (step_number(n) >= 0) {
        dirs.push_back(n);
      }
    }
    // by step, not as text: step_1000000 is newer than step_999999
    std::sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) { return step_number(a) < step_number(b); });
    for (size_t i = 0; i + std::max(cfg_.keep, 1) < dirs.size(); ++i)
      if (dirs[i] != step_dir_name(step_)) fs::remove_all(root / dirs[i], ec);
  }
  if (mesh_ && mesh_->world > 1) mesh_->world_comm->barrier();
  return final_dir.string();
}

void Trainer::load_checkpoint(const std::string& dir) {
  TrainCheckpoint ck = open_train_checkpoint(dir);
  // Resumed state must be finite, and exp_avg_sq >= 0 (its square root divides the update): a
  // tampered or damaged tensor is refused naming its file and name, not trained into NaN.
  const bool sharded = is_sharded_checkpoint(dir);
  auto check_state = [&](const Tensor& t, const std::string& name) {
    if (t.dtype != DType::F32) return;
    const bool sq = name.rfind("exp_avg_sq.", 0) == 0;
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (std::isfinite(p[i]) && !(sq && p[i] < 0)) continue;
      const bool ema = name.rfind("ema.", 0) == 0;
      const std::string file = sharded ? dir
                               : dir + (TrainCheckpoint::is_moment(name) ? "/optimizer.safetensors"
                                        : ema                            ? "/ema.safetensors"
                                                                         : "/model.safetensors");
      fail(file, ": tensor '", sharded || !ema ? name : name.substr(4), "' holds ", p[i], " at ", i,
           sq ? " (exp_avg_sq must be finite and >= 0)" : " (not finite)",
           ": damaged or tampered state; resume from an earlier checkpoint");
    }
  };
  auto slice_of = [&](const std::string& param) {
    auto it = slices_.find(param);
    return it == slices_.end() ? TensorSlice{} : it->second;
  };
  for (auto& [name, t] : host_parameters()) {
    Tensor src = ck.get(name, slice_of(name));
    WXE_CHECK(src.shape == t.shape && src.dtype == t.dtype, dir, ": '", name, "' is ", shape_str(src.shape),
              ", the model's is ", shape_str(t.shape));
    check_state(src, name);
    std::memcpy(const_cast<Tensor&>(t).raw(), src.raw(), t.nbytes());  // in place: the executor shares it
  }
  std::vector<Tensor> m, v;
  std::vector<const Tensor*> pm, pv;
  for (int p : trainable_) {
    const std::string& name = graph_.values[p].name;
    m.push_back(ck.get("exp_avg." + name, slice_of(name)));
    v.push_back(ck.get("exp_avg_sq." + name, slice_of(name)));
    WXE_CHECK(m.back().shape == graph_.values[p].constant->shape && v.back().shape == m.back().shape, dir,
              ": optimizer state of '", name, "' is ", shape_str(m.back().shape), ", the parameter is ",
              shape_str(graph_.values[p].constant->shape));
    check_state(m.back(), "exp_avg." + name);
    check_state(v.back(), "exp_avg_sq." + name);
  }
  for (size_t i = 0; i < m.size(); ++i) {
    pm.push_back(&m[i]);
    pv.push_back(&v[i]);
  }
  std::map<std::string, std::string>& meta = ck.meta;
  WXE_CHECK(meta.count("adam_step") || meta.count("step"), dir, ": no optimizer step in the metadata");
  const char* step_key = meta.count("adam_step") ? "adam_step" : "step";
  const int64_t t = parse_int64(meta[step_key], str(dir, ": metadata '", step_key, "'"));
  WXE_CHECK(t >= 0 && t < (int64_t(1) << 53), dir, ": metadata '", step_key, "' is ", t, ", out of range");
  adam_.set_state(t, {pack_block(zall_, pm, zrank_)}, {pack_block(zall_, pv, zrank_)});
  if (ema_)
    for (size_t i = 0; i < trainable_.size(); ++i) {
      const std::string& name = graph_.values[trainable_[i]].name;
      ema_->shadow()[i] = ck.get("ema." + name, slice_of(name)).clone().reshaped(graph_.values[trainable_[i]].shape);
      check_state(ema_->shadow()[i], "ema." + name);
    }
  WXE_CHECK(meta.count("step"), dir, ": no step in the metadata");
  step_ = parse_int64(meta["step"], dir + ": metadata 'step'");
  WXE_CHECK(step_ >= 0 && step_ < (int64_t(1) << 53), dir, ": metadata 'step' is ", step_, ", out of range");
  if (ema_) ema_->set_updates(step_);  // one update per optimizer step since step 0
  if (cfg_.schedule.kind == ScheduleKind::Plateau)  // the metrics of the epochs before
    cfg_.schedule.epoch_metrics = schedule_from_metadata(meta, dir).epoch_metrics;
  if (dev_) {  // the host's state is the newer now
    exec_->reload_constants();
    dev_state_.ready = false;
  }
  note("wxe: resumed from %s (step %lld)\n", dir.c_str(), (long long)step_);
  // what this resume changes of the run, in one line (the checkpoint's own options otherwise
  // go unsaid: another --accum or --schedule trains something else from here)
  std::string changes;
  auto differs = [&](const std::string& what, const std::string& key, const std::string& now) {
    auto it = meta.find(key);
    if (it != meta.end() && it->second != now)
      changes += str(changes.empty() ? "" : ", ", what, " ", now.empty() ? "(none)" : now, " (the checkpoint's ",
                     it->second.empty() ? "(none)" : it->second, ")");
  };
  differs("--accum", "accum", std::to_string(cfg_.accum));
  differs("--forecast-len", "forecast_len", std::to_string(cfg_.forecast_len));
  differs("--freeze", "freeze", freeze_text(cfg_.freeze));
  for (const auto& [k, v] : schedule_metadata(cfg_.schedule))
    if (k != "epoch_metrics" && !(k == "total_steps" && cfg_.schedule.kind == ScheduleKind::Constant))
      differs(k == "schedule" ? "--schedule" : k == "lr" ? "--lr" : k == "warmup_steps" ? "--warmup-steps" : "the schedule's " + k, k, v);
  if (!ema_ && !trainable_.empty() && ck.has("ema." + graph_.values[trainable_[0]].name))
    changes += str(changes.empty() ? "" : ", ", "no --ema (the checkpoint's EMA of the weights is dropped)");
  if (!changes.empty()) note("wxe: warning: resuming %s with %s\n", dir.c_str(), changes.c_str());
}
}  // namespace wxe
