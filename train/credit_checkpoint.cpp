#include "train/credit_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/ir/error.h"
#include "engine/passes/layout_rules.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "train/finetune.h"
#include "train/optim.h"
#include "importers/torch/torch_checkpoint.h"
#include "importers/torch/torch_save.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

bool is_buffer(const std::string& n) {
  auto ends = [&](const char* s) { return n.size() >= strlen(s) && n.compare(n.size() - strlen(s), strlen(s), s) == 0; };
  return ends(".weight_u") || ends(".weight_v");
}

// "exp_avg.NAME" tensors of an optimizer file, by NAME, in the legacy layout
std::map<std::string, Tensor> legacy_moments(const NamedTensors& opt, const std::string& prefix) {
  NamedTensors m;
  for (auto& [n, t] : opt)
    if (n.rfind(prefix, 0) == 0) m.push_back({n.substr(prefix.size()), t});
  std::map<std::string, Tensor> r;
  for (auto& [n, t] : layout::to_legacy_state_dict(m)) r[n] = t;
  return r;
}

Shape squeezed(const Shape& s) {
  Shape r;
  for (int64_t d : s)
    if (d != 1) r.push_back(d);
  return r;
}

}  // namespace

PyValue credit_scheduler_state(const std::map<std::string, std::string>& meta, int64_t step) {
  auto get = [&](const char* k) { return meta.count(k) ? meta.at(k) : std::string(); };
  if (get("schedule").empty() || get("schedule") == "constant" || get("lr").empty()) return PyValue::none();
  const Schedule s = schedule_from_metadata(meta, "checkpoint");
  // Each scheduler's state_dict(): the instance's attributes but the optimizer, in their order,
  // as CREDIT's trainer leaves them after `step` optimizer steps (per-batch kinds: the batches
  // done; per-epoch kinds: the epochs done, lambda stepped twice per epoch)
  PyValue d = PyValue::dict();
  auto set = [&](const char* k, PyValue v) { d.set(PyValue::str(k), std::move(v)); };
  auto one = [](double x) { return PyValue::list({PyValue::real(x)}); };
  const int64_t batches = s.schedule_step(step), epochs = s.epoch_of(step);
  auto tail = [&](int64_t last, bool in_step_flag) {
    set("last_epoch", PyValue::integer(last));
    set("_step_count", PyValue::integer(last + 1));
    set("_is_initial", PyValue::boolean(false));
    if (in_step_flag) set("_get_lr_called_within_step", PyValue::boolean(false));
  };
  switch (s.kind) {
    case ScheduleKind::LinearWarmupCosine:
      set("warmup_steps", PyValue::integer(s.warmup_steps));
      set("total_steps", PyValue::integer(s.total_steps));
      set("min_lr", PyValue::real(s.min_lr));
      set("base_lrs", one(s.lr));
      tail(batches, true);
      set("_last_lr", one(s.lr_at(step)));
      break;
    case ScheduleKind::CosineAnnealing:
      set("T_max", PyValue::integer(s.t_max));
      set("eta_min", PyValue::real(s.eta_min));
      set("base_lrs", one(s.lr));
      tail(epochs, true);
      set("_last_lr", one(s.lr_at(step)));
      break;
    case ScheduleKind::CosineRestarts: {
      const Schedule::Restarts r = s.restarts_at(batches);
      set("first_cycle_steps", PyValue::integer(s.first_cycle_steps));
      set("cycle_mult", PyValue::real(s.cycle_mult));
      set("base_max_lr", PyValue::real(s.max_lr));
      set("max_lr", PyValue::real(r.max_lr));
      set("min_lr", PyValue::real(s.min_lr));
      set("warmup_steps", PyValue::integer(s.warmup_steps));
      set("gamma", PyValue::real(s.gamma));
      set("cur_cycle_steps", PyValue::integer(r.cur_cycle_steps));
      set("cycle", PyValue::integer(r.cycle));
      set("step_in_cycle", PyValue::integer(r.step_in_cycle));
      set("base_lrs", one(s.min_lr));
      set("last_epoch", PyValue::integer(batches));
      set("_step_count", PyValue::integer(0));  // its own step() never counts
      set("_is_initial", PyValue::boolean(false));
      break;
    }
    case ScheduleKind::Lambda: {
      set("base_lrs", one(s.lr));
      tail(2 * epochs, true);
      set("_last_lr", one(s.lr * credit_lambda_phase1(2 * epochs)));  // after the end-of-epoch step
      set("lr_lambdas", PyValue::list({PyValue::none()}));
      break;
    }
    case ScheduleKind::Plateau: {
      const Schedule::Plateau p = s.plateau_after(epochs);
      set("factor", PyValue::real(s.factor));
      set("default_min_lr", PyValue::real(s.min_lr));
      set("min_lrs", one(s.min_lr));
      set("patience", PyValue::integer(s.patience));
      set("cooldown", PyValue::integer(s.cooldown));
      set("eps", PyValue::real(s.plateau_eps));
      set("last_epoch", PyValue::integer(epochs));
      set("_last_lr", one(p.lr));
      set("mode_worse", PyValue::real(s.plateau_max ? -INFINITY : INFINITY));
      set("mode", PyValue::str(s.plateau_max ? "max" : "min"));
      set("threshold", PyValue::real(s.threshold));
      set("threshold_mode", PyValue::str(s.plateau_abs ? "abs" : "rel"));
      set("best", PyValue::real(p.best));
      set("cooldown_counter", PyValue::integer(p.cooldown_counter));
      set("num_bad_epochs", PyValue::integer(p.num_bad_epochs));
      break;
    }
    case ScheduleKind::Constant:
      return PyValue::none();
  }
  return d;
}

std::string export_credit_checkpoint(const std::string& input, const std::string& output, const std::string& like) {
  const bool dir = fs::is_directory(input);
  std::map<std::string, std::string> meta;
  NamedTensors params, opt;
  if (dir) {  // a fine-tuning checkpoint, one process's or sharded: every tensor whole
    TrainCheckpoint ck = open_train_checkpoint(input);
    meta = ck.meta;
    for (const std::string& n : ck.parameter_names()) params.push_back({n, ck.get(n, {})});
    for (const std::string& n : ck.names)
      if (TrainCheckpoint::is_moment(n)) opt.push_back({n, ck.get(n, {})});
  } else {
    params = read_safetensors(input);
  }
  NamedTensors model = layout::to_legacy_state_dict(params);
  std::map<std::string, Tensor> mine;
  for (auto& [n, t] : model) mine[n] = t;

  NamedTensors out;  // the model_state_dict, in order
  int copied = 0;
  if (!like.empty()) {
    StateDict orig = read_torch_state_dict(like);
    std::vector<std::string> bad;
    std::map<std::string, bool> seen;
    for (auto& [n, t] : orig.tensors) {
      seen[n] = true;
      auto it = mine.find(n);
      if (it == mine.end()) {  // not in the graph, so not trained: as it was
        out.push_back({n, t});
        ++copied;
        continue;
      }
      // the same sizes up to unit dims (a Linear-layout (O, I) against a legacy (O, I, 1, 1) that
      // the rule table does not know), never a transpose or another split of the same numel
      if (squeezed(it->second.shape) != squeezed(t.shape) || it->second.dtype != t.dtype) {
        bad.push_back(n + " " + shape_str(it->second.shape) + " " + dtype_name(it->second.dtype) + " vs " +
                      shape_str(t.shape) + " " + dtype_name(t.dtype));
        continue;
      }
      out.push_back({n, it->second.reshaped(t.shape)});
    }
    for (auto& [n, t] : mine)
      if (!seen.count(n)) bad.push_back(n + " is not in " + like);
    if (!bad.empty()) {
      std::string msg = input + " does not fit " + like + ": " + std::to_string(bad.size()) + " mismatches (";
      for (size_t i = 0; i < bad.size() && i < 8; ++i) msg += (i ? ", " : "") + bad[i];
      fail(msg, bad.size() > 8 ? ", ..." : "", "); nothing written");
    }
  } else {
    out = model;
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::fprintf(stderr,
                 "wxe: note: without --like ORIGINAL.pt the tensors are in sorted order and no optimizer state is "
                 "written (CREDIT's parameter indices come from the original checkpoint)\n");
  }
  PyValue sd = PyValue::dict(true);
  for (auto& [n, t] : out) sd.set(PyValue::str(n), PyValue::tensor(t));
  PyValue top = PyValue::dict();
  const int64_t step = meta.count("step") ? parse_int64(meta["step"], input + ": metadata 'step'") : 0;
  top.set(PyValue::str("epoch"), PyValue::integer(0));
  top.set(PyValue::str("model_state_dict"), sd);
  int moments = 0;
  const PyValue scheduler = credit_scheduler_state(meta, step);
  if (!like.empty() && !opt.empty()) {
    std::map<std::string, Tensor> m = legacy_moments(opt, "exp_avg."), v = legacy_moments(opt, "exp_avg_sq.");
    PyValue state = PyValue::dict();
    std::vector<PyValue> params;
    int64_t index = 0;
    const int64_t adam_step = meta.count("adam_step") ? parse_int64(meta["adam_step"], input + ": metadata 'adam_step'") : step;
    for (auto& [n, t] : out) {
      if (is_buffer(n)) continue;
      if (m.count(n) && v.count(n)) {
        PyValue s = PyValue::dict();
        s.set(PyValue::str("step"), PyValue::tensor(Tensor::scalar_f32((float)adam_step).reshaped({})));
        s.set(PyValue::str("exp_avg"), PyValue::tensor(m[n].reshaped(t.shape)));
        s.set(PyValue::str("exp_avg_sq"), PyValue::tensor(v[n].reshaped(t.shape)));
        state.set(PyValue::integer(index), s);
        ++moments;
      }
      params.push_back(PyValue::integer(index++));
    }
    auto num = [&](const char* k, double d) { return PyValue::real(meta.count(k) ? parse_double(meta[k], input + ": metadata '" + k + "'") : d); };
    PyValue group = PyValue::dict();
    // with a scheduler, the lr it set after the last step, and the base lr as initial_lr
    PyValue lr = num("lr", 1e-3);
    for (auto& [k, v] : scheduler.kv)
      if (k.s == "_last_lr") lr = v.items[0];
    group.set(PyValue::str("lr"), lr);
    group.set(PyValue::str("betas"), PyValue::tuple({num("beta1", 0.9), num("beta2", 0.95)}));
    group.set(PyValue::str("eps"), num("eps", 1e-8));
    group.set(PyValue::str("weight_decay"), num("weight_decay", 0.01));
    group.set(PyValue::str("amsgrad"), PyValue::boolean(false));
    group.set(PyValue::str("maximize"), PyValue::boolean(false));
    group.set(PyValue::str("foreach"), PyValue::none());
    group.set(PyValue::str("capturable"), PyValue::boolean(false));
    group.set(PyValue::str("differentiable"), PyValue::boolean(false));
    group.set(PyValue::str("fused"), PyValue::none());
    group.set(PyValue::str("decoupled_weight_decay"), PyValue::boolean(true));
    if (scheduler.kind == PyValue::Dict) group.set(PyValue::str("initial_lr"), num("lr", 1e-3));
    group.set(PyValue::str("params"), PyValue::list(params));
    PyValue optd = PyValue::dict();
    optd.set(PyValue::str("state"), state);
    optd.set(PyValue::str("param_groups"), PyValue::list({group}));
    top.set(PyValue::str("optimizer_state_dict"), optd);
  }
  // CREDIT's trainer resuming (reload_epoch) reads both: the scheduler's state (None where it
  // runs none) and the GradScaler's, which without amp (wxe trains in float32) is {}
  top.set(PyValue::str("scheduler_state_dict"), scheduler);
  top.set(PyValue::str("scaler_state_dict"), PyValue::dict());
  write_torch_checkpoint(output, top);
  return str("wrote ", output, ": ", out.size(), " tensors in CREDIT's layout", copied ? str(" (", copied, " untrained, copied from ", like, ")") : "",
             moments ? str("; AdamW state of ", moments, " parameters at step ", step) : "; no optimizer state");
}

}  // namespace wxe
