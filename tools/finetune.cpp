#include "tools/finetune.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "engine/glob.h"
#include "engine/json.h"
#include "engine/npy.h"
#include "engine/safetensors.h"
#include "importers/onnx/onnx_import.h"
#include "parallel/collective_ops.h"
#include "parallel/shard.h"
#include "parallel/sharded_checkpoint.h"
#include "tools/model.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double peak_rss_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

std::string step_dir_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%06lld", (long long)step);
  return b;
}

std::string fmt_time(double s) {
  char b[32];
  int64_t t = (int64_t)std::llround(std::max(0.0, s));
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else
    std::snprintf(b, sizeof b, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return b;
}

// One fixed input and a zero target (wxe bench --train).
class FixedSource : public SampleSource {
 public:
  FixedSource(Tensor x, Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return 1; }
  Sample get(int64_t) const override { return {x_, {y_}, {x_}}; }
  std::string describe() const override { return "one fixed input, zero target"; }

 private:
  Tensor x_, y_;
};

}  // namespace

Trainer::Trainer(const FinetuneConfig& cfg, std::unique_ptr<SampleSource> data, Mesh* mesh)
    : cfg_(cfg), data_(std::move(data)), mesh_(mesh), adam_(cfg.adam) {
  if (mesh_) {
    dp_ = mesh_->dp;
    dp_rank_ = mesh_->dp_rank;
    tp_ = mesh_->tp;
    tp_rank_ = mesh_->tp_rank;
  }
  WXE_CHECK(cfg.accum >= 1, "--accum must be at least 1");
  WXE_CHECK(cfg.accum % dp_ == 0, "--accum ", cfg.accum, " micro-batches cannot be divided over ", dp_,
            " data-parallel groups; make it a multiple of ", dp_);
  WXE_CHECK(cfg.forecast_len >= 1, "--forecast-len must be at least 1");
  WXE_CHECK(data_ && data_->size() > 0, "no training samples");
  graph_ = import_onnx(cfg.model);
  WXE_CHECK(graph_.inputs.size() == 1, cfg.model, ": fine-tuning needs a model with one input, it has ",
            graph_.inputs.size());
  input_name_ = graph_.values[graph_.inputs[0]].name;
  Sample first = data_->get(0);
  LoadOptions lo;
  lo.weights = cfg.weights;
  lo.training = true;
  prepare_model(graph_, {{input_name_, {first.input.dtype, first.input.shape}}}, lo);
  WXE_CHECK(graph_.outputs.size() >= 1, cfg.model, ": the model has no output");
  const Shape out_shape = graph_.values[graph_.outputs[0]].shape;
  WXE_CHECK(first.targets.size() == (size_t)cfg.forecast_len, cfg.data, ": a sample has ", first.targets.size(),
            " target steps, the rollout has forecast_len ", cfg.forecast_len);
  WXE_CHECK(first.targets[0].shape == out_shape, cfg.data, ": targets are ", shape_str(first.targets[0].shape),
            ", the model's output is ", shape_str(out_shape));
  if (tp_ > 1) {  // Megatron: this rank's heads and feed-forward columns; CopyToTP / AllReduceTP at the seams
    TpPlan plan = plan_for(graph_, cfg.plan, tp_, true);
    slices_ = parameter_slices(plan, graph_, tp_, tp_rank_);
    tp_stats_ = shard_training_graph(graph_, plan, tp_, tp_rank_);
    set_tp_communicator(mesh_->tp_comm.get());
  }
  for (int v : trainable_parameters(graph_)) {
    const std::string& name = graph_.values[v].name;
    bool frozen = std::any_of(cfg.freeze.begin(), cfg.freeze.end(), [&](const std::string& p) { return glob_match(p, name); });
    if (!frozen) trainable_.push_back(v);
  }
  for (const std::string& p : cfg.freeze) {
    bool any = false;
    for (int v : trainable_parameters(graph_)) any = any || glob_match(p, graph_.values[v].name);
    WXE_CHECK(any, "--freeze '", p, "' matches no parameter of ", cfg.model);
  }
  WXE_CHECK(!trainable_.empty(), cfg.model, ": every parameter is frozen; nothing to train");
  for (int v : trainable_) {
    const int64_t n = graph_.values[v].constant->numel(), c = (n + dp_ - 1) / dp_;
    zn_.push_back(n);
    zc_.push_back(c);
    zoff_.push_back(zS_);
    zS_ += c;
  }
  if (mesh_ && mesh_->world > 1) check_same_plan();
  ExecOptions opt;
  opt.threads = cfg.threads;
  opt.kernels = cfg.reference ? KernelKind::Reference : KernelKind::Fast;
  opt.optimize = false;
  opt.device = cfg.device;
  opt.profile = cfg.device == "cpu";  // on a device, timing per op would wait for every kernel
  exec_ = std::make_unique<GradExecutor>(graph_, trainable_, opt);
  if (cfg.device != "cpu") dev_ = &backend_for(cfg.device);
  if (!exec_->host_nodes().empty()) {
    std::map<std::string, int> by_op;  // "Op, pass" -> nodes
    for (const std::string& s : exec_->host_nodes()) ++by_op[s.substr(s.rfind('(') + 1, s.size() - s.rfind('(') - 2)];
    std::string list;
    for (auto& [k, c] : by_op) list += str(list.empty() ? "" : ", ", k, " x", c);
    note("wxe: --device %s: %zu kernels run on the host (no %s kernel yet): %s\n", cfg.device.c_str(),
         exec_->host_nodes().size(), cfg.device.c_str(), list.c_str());
  }
  if (!cfg.plain_mse) {
    NpyDirInfo info;
    if (!cfg.data.empty() && !cfg.open_data) info = read_npy_dir_info(cfg.data);
    if (!cfg.lat.empty()) info.lat = cfg.lat;
    if (!cfg.channel_weights.empty()) info.channel_weights = cfg.channel_weights;
    const int64_t h = out_shape.size() >= 2 ? out_shape[out_shape.size() - 2] : 1;
    if (info.lat.empty()) info.lat = regular_latitudes(h);
    WXE_CHECK((int64_t)info.lat.size() == h, cfg.data, "/lat.npy: ", info.lat.size(), " latitudes, the output has ", h,
              " rows");
    loss_w_.lat_weights = latitude_weights(info.lat);
    loss_w_.channel_weights = info.channel_weights;
  }
  if (cfg.ema) {
    std::vector<const Tensor*> ps;
    for (int v : trainable_) ps.push_back(graph_.values[v].constant.get());
    ema_ = std::make_unique<Ema>(cfg.ema_decay, ps);
  }
  if (cfg.resume && !cfg.save.empty()) {
    fs::path latest = fs::path(cfg.save) / "latest";
    if (fs::exists(latest)) {
      std::ifstream f(latest);
      std::string name;
      f >> name;
      load_checkpoint((fs::path(cfg.save) / name).string());
    } else {
      note("wxe: --resume: no checkpoint in %s yet; starting at step 0\n", cfg.save.c_str());
    }
  }
}

// Every rank must have built the same plan (same parameters, shapes and shards), or the
// collectives would pair up unrelated tensors: a hash, gathered and compared before the first one.
void Trainer::check_same_plan() {
  std::string text = str("tp", tp_, "dp", dp_);
  for (int v : trainable_) {
    const Value& x = graph_.values[v];
    text += x.name + shape_str(x.shape);
    auto it = slices_.find(x.name);
    if (it != slices_.end()) text += str("/", it->second.axis, "/", it->second.parts, "/", it->second.groups);
  }
  check_same_on_all_ranks(*mesh_, fingerprint(text), "training plan");  // parallel/mesh.h
}

int64_t Trainer::trainable_count() const {
  int64_t n = 0;
  for (int v : trainable_) n += graph_.values[v].constant->numel();
  return n;
}

size_t Trainer::optimizer_bytes() const { return 2 * (size_t)zS_ * sizeof(float); }  // exp_avg, exp_avg_sq

std::pair<int64_t, int64_t> Trainer::block_range(size_t p, int block) const {
  const int64_t a = std::min(zn_[p], block * zc_[p]);
  return {a, std::min(zn_[p], a + zc_[p])};
}

Tensor Trainer::pack_block(const std::vector<const Tensor*>& per_param, int block) const {
  Tensor flat = Tensor::zeros(DType::F32, {zS_});
  for (size_t p = 0; p < per_param.size(); ++p) {
    auto [a, b] = block_range(p, block);
    std::memcpy(flat.data<float>() + zoff_[p], per_param[p]->data<float>() + a, (b - a) * sizeof(float));
  }
  return flat;
}

void Trainer::unpack_block(const Tensor& flat, int block, const std::vector<Tensor*>& per_param) const {
  for (size_t p = 0; p < per_param.size(); ++p) {
    auto [a, b] = block_range(p, block);
    std::memcpy(per_param[p]->data<float>() + a, flat.data<float>() + zoff_[p], (b - a) * sizeof(float));
  }
}

Tensor Trainer::reduce_scatter_grads(const std::vector<const Tensor*>& grads) const {
  if (dp_ == 1) return pack_block(grads, 0);
  Tensor all(DType::F32, {dp_ * zS_}), shard(DType::F32, {zS_});
  for (int d = 0; d < dp_; ++d) {
    Tensor part = pack_block(grads, d);
    std::memcpy(all.data<float>() + d * zS_, part.raw(), part.nbytes());
  }
  mesh_->dp_comm->reduce_scatter_sum(all, shard);
  return shard;
}

bool Trainer::gather_blocks(const Tensor& shard, const std::vector<Tensor*>& per_param, bool lead_only) const {
  if (dp_ == 1) {
    unpack_block(shard, 0, per_param);
    return true;
  }
  Tensor all(DType::F32, {dp_ * zS_});
  mesh_->dp_comm->all_gather(shard, all);
  if (lead_only && dp_rank_ != 0) return false;
  for (int d = 0; d < dp_; ++d) {
    Tensor part(DType::F32, {zS_});
    std::memcpy(part.raw(), all.data<float>() + d * zS_, zS_ * sizeof(float));
    unpack_block(part, d, per_param);
  }
  return true;
}

std::vector<Tensor> Trainer::gather_moments(const Tensor& shard) {
  std::vector<Tensor> whole;
  std::vector<Tensor*> ptrs;
  for (int v : trainable_) whole.push_back(Tensor::zeros(DType::F32, graph_.values[v].shape));
  for (Tensor& t : whole) ptrs.push_back(&t);
  if (!gather_blocks(shard, ptrs, true)) return {};  // dp rank 0 writes the moments (save_checkpoint)
  return whole;
}

int64_t Trainer::sample_index(int64_t micro) {
  const int64_t n = data_->size(), epoch = micro / n;
  if (!cfg_.shuffle) return micro % n;
  if (epoch != perm_epoch_) {
    perm_.resize(n);
    std::iota(perm_.begin(), perm_.end(), 0);
    std::mt19937_64 rng(cfg_.seed * 1000003ull + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates, defined here so every platform agrees
      int64_t k = (int64_t)(rng() % (uint64_t)(i + 1));
      std::swap(perm_[i], perm_[k]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[micro % n];
}

Tensor Trainer::predict(const Tensor& x) {
  // PyTorch's eval forward: spectral norm divides by u . (W_mat v) with the stored u and v, no
  // power iteration (which would also move u and v, the training state)
  std::vector<std::pair<Attr*, int64_t>> saved;
  for (Node& n : graph_.nodes)
    if (n.op == "SpectralNorm" || n.op == "SpectralNormTP") {
      Attr& a = n.attrs["power_iterations"];
      saved.push_back({&a, a.i});
      a = attr_i(0);
    }
  Tensor y = exec_->forward({{input_name_, x}}).at(0).clone();
  for (auto& [a, iters] : saved) *a = attr_i(iters);
  return y;
}

StepLog Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  StepLog log;
  log.lr = cfg_.schedule.lr_at(step_);
  const int64_t channels_in = graph_.values[graph_.inputs[0]].shape[1];
  const int64_t channels_out = graph_.values[graph_.outputs[0]].shape[1];
  const int64_t prognostic = cfg_.prognostic >= 0 ? cfg_.prognostic : std::min(channels_in, channels_out);
  WXE_CHECK(prognostic <= std::min(channels_in, channels_out), "--prognostic ", prognostic, " exceeds the ",
            std::min(channels_in, channels_out), " channels input and output share");
  // this dp group's micro-batches: j = dp_rank, dp_rank + dp, ... of the step's `accum`
  double loss_sum = 0;
  for (int j = dp_rank_; j < cfg_.accum; j += dp_) {
    Sample s = data_->get(sample_index(step_ * cfg_.accum + j));
    Tensor x = s.input, pred;
    for (int k = 0; k < cfg_.forecast_len; ++k) {
      if (k > 0) {  // step k's input slid into the window, its prognostic channels the prediction (detached)
        x = slide_window(x, s.forcing[k]);
        feed_back(x, cfg_.to_input ? cfg_.to_input(pred) : pred, prognostic);
      }
      std::vector<Tensor> outs = exec_->forward({{input_name_, x}});
      pred = outs[0];
      std::vector<Tensor> gout(outs.size());
      gout[0] = Tensor(DType::F32, pred.shape);
      loss_sum += weighted_mse(pred, s.targets[k], loss_w_, &gout[0], 1.0 / cfg_.accum);
      exec_->backward(gout);
    }
    log.samples += (int)x.shape[0];
  }
  // ZeRO-1: the gradient summed over dp, each rank keeping its own block of every parameter
  Tensor gshard;
  if (dev_) {
    if (!dev_state_.ready) to_device();
    device_gradient_shard();
  } else {
    std::vector<const Tensor*> grads;
    for (const Tensor& g : exec_->grads()) grads.push_back(&g);
    gshard = reduce_scatter_grads(grads);
  }
  const TrainKernels& k = dev_ ? *dev_->train_kernels() : cpu_train_kernels();
  float* gflat = dev_ ? dev_state_.g.data<float>() : gshard.data<float>();
  // loss over every micro-batch and rollout step; global gradient norm with each parameter
  // counted once: tp-sharded ones summed over tp, replicated ones from tp rank 0
  std::vector<int64_t> bounds = zoff_;  // parameter p's block: [zoff_[p], zoff_[p] + zc_[p])
  bounds.push_back(zS_);
  std::vector<double> sq(trainable_.size());
  k.segment_sum_squares(gflat, bounds, sq.data());
  double sq_sharded = 0, sq_replicated = 0;
  for (size_t p = 0; p < trainable_.size(); ++p)
    (slices_.count(graph_.values[trainable_[p]].name) ? sq_sharded : sq_replicated) += sq[p];
  double total_sq = sq_sharded + sq_replicated;
  if (mesh_ && mesh_->world > 1) {
    Tensor v(DType::F64, {3});
    v.data<double>()[0] = sq_sharded;
    v.data<double>()[1] = tp_rank_ == 0 ? sq_replicated : 0.0;
    v.data<double>()[2] = tp_rank_ == 0 ? loss_sum : 0.0;  // tp ranks computed the same loss
    mesh_->world_comm->all_reduce_sum(v);
    total_sq = v.data<double>()[0] + v.data<double>()[1];
    loss_sum = v.data<double>()[2];
  }
  log.loss = loss_sum / (cfg_.accum * cfg_.forecast_len);
  log.grad_norm = std::sqrt(total_sq);
  if (!std::isfinite(log.loss) || !std::isfinite(log.grad_norm)) {
    exec_->zero_grad();
    throw NonFiniteLoss(str("step ", step_ + 1, ": the loss is ", log.loss, " and the gradient norm ", log.grad_norm,
                            "; stopped before updating the parameters"));
  }
  if (cfg_.grad_max_norm > 0) {  // torch.nn.utils.clip_grad_norm_
    const float factor = (float)cfg_.grad_max_norm / (float)(log.grad_norm + 1e-6);
    if (factor < 1.f) k.scale(gflat, zS_, factor);
  }
  if (dev_) {
    device_update(log.lr);
  } else {
    std::vector<Tensor*> params;
    std::vector<const Tensor*> cparams;
    for (int v : trainable_) {
      params.push_back(graph_.values[v].constant.get());
      cparams.push_back(graph_.values[v].constant.get());
    }
    Tensor pshard = pack_block(cparams, dp_rank_);
    adam_.step({&pshard}, {&gshard}, log.lr);
    gather_blocks(pshard, params, false);
    if (ema_) ema_->update(cparams);
  }
  exec_->zero_grad();
  if (dev_) dev_->synchronize();  // the step's time includes its queued kernels
  log.samples *= dp_;  // every dp group did as many
  log.step = ++step_;
  log.seconds = seconds_since(t0);
  return log;
}

Tensor Trainer::device_zeros(int64_t n) const {
  Tensor t = dev_->empty(DType::F32, {n});
  dev_->train_kernels()->fill(t.data<float>(), n, 0.f);
  return t;
}

void Trainer::to_device() {
  Backend& b = *dev_;
  DeviceState& d = dev_state_;
  d.p = device_zeros(zS_);
  d.g = device_zeros(zS_);
  for (size_t p = 0; p < trainable_.size(); ++p) {  // this rank's block of each parameter
    auto [a, e] = block_range(p, dp_rank_);
    b.copy_on_device(d.p.data<float>() + zoff_[p], exec_->device_param(p).data<float>() + a, (e - a) * sizeof(float));
  }
  if (adam_.exp_avg().empty()) {
    d.m = device_zeros(zS_);
    d.v = device_zeros(zS_);
  } else {
    d.m = b.upload(adam_.exp_avg()[0]);
    d.v = b.upload(adam_.exp_avg_sq()[0]);
  }
  d.ema.clear();
  if (ema_)
    for (const Tensor& s : ema_->shadow()) d.ema.push_back(b.upload(s));
  d.ready = true;
}

void Trainer::sync_to_host() {
  if (!dev_) return;
  exec_->params_to_host();  // also spectral norm's u and v, which a forward alone moves
  if (!dev_state_.ready) return;
  adam_.set_state(adam_.steps(), {dev_->download(dev_state_.m)}, {dev_->download(dev_state_.v)});
  if (ema_)
    for (size_t i = 0; i < dev_state_.ema.size(); ++i)
      ema_->shadow()[i] = dev_->download(dev_state_.ema[i]).reshaped(ema_->shadow()[i].shape);
}

bool Trainer::dp_on_device() const {
  return dp_ > 1 && (mesh_->dp_comm->takes_device_buffers() || dev_->device() == DeviceKind::CPU);
}

void Trainer::device_gradient_shard() {
  float* g = dev_state_.g.data<float>();
  if (dp_ == 1) {
    for (size_t p = 0; p < trainable_.size(); ++p)
      dev_->copy_on_device(g + zoff_[p], exec_->grads()[p].raw(), zn_[p] * sizeof(float));
    return;
  }
  if (dp_on_device()) {  // every dp rank's block of every gradient, then the reduce-scatter there
    Tensor all = device_zeros(dp_ * zS_);
    for (int b = 0; b < dp_; ++b)
      for (size_t p = 0; p < trainable_.size(); ++p) {
        auto [a, e] = block_range(p, b);
        dev_->copy_on_device(all.data<float>() + b * zS_ + zoff_[p], exec_->grads()[p].data<float>() + a,
                             (e - a) * sizeof(float));
      }
    dev_->synchronize();  // the communicator reads what the device's queue wrote
    mesh_->dp_comm->reduce_scatter_sum(all, dev_state_.g);
    return;
  }
  std::vector<Tensor> host;
  std::vector<const Tensor*> grads;
  for (const Tensor& t : exec_->grads()) host.push_back(dev_->download(t));
  for (const Tensor& t : host) grads.push_back(&t);
  Tensor shard = reduce_scatter_grads(grads);
  dev_->copy_to_device(g, shard.raw(), shard.nbytes());
}

void Trainer::device_update(double lr) {
  const TrainKernels& k = *dev_->train_kernels();
  DeviceState& d = dev_state_;
  k.adamw(adam_.next_step(lr), d.p.data<float>(), d.g.data<float>(), d.m.data<float>(), d.v.data<float>(), zS_);
  if (dp_ == 1) {
    for (size_t p = 0; p < trainable_.size(); ++p)
      dev_->copy_on_device(exec_->device_param(p).raw(), d.p.data<float>() + zoff_[p], zn_[p] * sizeof(float));
  } else if (dp_on_device()) {
    Tensor all = device_zeros(dp_ * zS_);
    dev_->synchronize();
    mesh_->dp_comm->all_gather(d.p, all);
    for (int b = 0; b < dp_; ++b)
      for (size_t p = 0; p < trainable_.size(); ++p) {
        auto [a, e] = block_range(p, b);
        dev_->copy_on_device(exec_->device_param(p).data<float>() + a, all.data<float>() + b * zS_ + zoff_[p],
                             (e - a) * sizeof(float));
      }
  } else {  // all-gather the blocks on the host, then each parameter to the device whole
    std::vector<Tensor*> params;
    for (int v : trainable_) params.push_back(graph_.values[v].constant.get());
    gather_blocks(dev_->download(d.p), params, false);
    for (size_t p = 0; p < trainable_.size(); ++p)
      dev_->copy_to_device(exec_->device_param(p).raw(), params[p]->raw(), params[p]->nbytes());
  }
  if (ema_) {
    const float decay = (float)ema_->decay(), w = (float)(1 - ema_->decay());
    for (size_t p = 0; p < trainable_.size(); ++p)
      k.ema(d.ema[p].data<float>(), exec_->device_param(p).data<float>(), zn_[p], decay, w);
  }
}

NamedTensors Trainer::parameters() {
  sync_to_host();
  return host_parameters();
}

NamedTensors Trainer::host_parameters() const {
  NamedTensors r;
  std::vector<int> uses = graph_.use_counts();
  for (size_t v = 0; v < graph_.values.size(); ++v) {
    const Value& x = graph_.values[v];
    if (x.is_param && x.is_const() && uses[v] && x.dtype == DType::F32) r.push_back({x.name, *x.constant});
  }
  return r;
}


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
  std::vector<Tensor> m = gather_moments(adam_.exp_avg().empty() ? Tensor::zeros(DType::F32, {zS_}) : adam_.exp_avg()[0]);
  std::vector<Tensor> v = gather_moments(adam_.exp_avg_sq().empty() ? Tensor::zeros(DType::F32, {zS_}) : adam_.exp_avg_sq()[0]);
  const AdamWConfig& c = adam_.config();
  std::map<std::string, std::string> meta = {
      {"step", step}, {"adam_step", std::to_string(adam_.steps())}, {"seed", std::to_string(cfg_.seed)},
      {"lr", str(cfg_.schedule.lr)}, {"beta1", str(c.beta1)}, {"beta2", str(c.beta2)}, {"eps", str(c.eps)},
      {"weight_decay", str(c.weight_decay)}, {"source", cfg_.model}, {"written_by", "wxe finetune"},
      {"accum", std::to_string(cfg_.accum)}, {"forecast_len", std::to_string(cfg_.forecast_len)}};
  NamedTensors opt, ema;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    const std::string& name = graph_.values[trainable_[i]].name;
    if (!m.empty()) {
      opt.push_back({"exp_avg." + name, m[i]});
      opt.push_back({"exp_avg_sq." + name, v[i]});
    }
    if (ema_) ema.push_back({"ema." + name, ema_->shadow()[i]});
  }
  if (sharded) {
    // every tensor once: a tp shard from dp rank 0 of its tp column, a replicated one from rank 0
    std::vector<ShardPiece> pieces;
    auto add = [&](const std::string& name, const std::string& param, const Tensor& t) {
      ShardPiece p{name, t.shape, {}, t, mesh_->rank == 0};
      auto it = slices_.find(param);
      if (it != slices_.end()) {
        p.slice = it->second;
        p.global_shape[p.slice.axis] *= p.slice.parts;
        p.owner = dp_rank_ == 0;
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
  }
  if (lead) {
    write_file_atomic((root / "latest").string(), step_dir_name(step_) + "\n");
    // keep the newest `keep` checkpoints; remove what saves killed mid-write left (step_N.tmp*:
    // this save's own is in place by now)
    std::vector<std::string> dirs;
    for (auto& e : fs::directory_iterator(root)) {
      std::string n = e.path().filename().string();
      if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
      if (n.find(".tmp") != std::string::npos) {
        note("wxe: removing %s, left by an interrupted save\n", (root / n).string().c_str());
        fs::remove_all(root / n, ec);
      } else if (n.find(".old") == std::string::npos) {
        dirs.push_back(n);
      }
    }
    std::sort(dirs.begin(), dirs.end());
    for (size_t i = 0; i + std::max(cfg_.keep, 1) < dirs.size(); ++i)
      if (dirs[i] != step_dir_name(step_)) fs::remove_all(root / dirs[i], ec);
  }
  if (mesh_ && mesh_->world > 1) mesh_->world_comm->barrier();
  return final_dir.string();
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

void Trainer::load_checkpoint(const std::string& dir) {
  TrainCheckpoint ck = open_train_checkpoint(dir);
  auto slice_of = [&](const std::string& param) {
    auto it = slices_.find(param);
    return it == slices_.end() ? TensorSlice{} : it->second;
  };
  for (auto& [name, t] : host_parameters()) {
    Tensor src = ck.get(name, slice_of(name));
    WXE_CHECK(src.numel() == t.numel() && src.dtype == t.dtype, dir, ": '", name, "' is ", shape_str(src.shape),
              ", the model's is ", shape_str(t.shape));
    std::memcpy(const_cast<Tensor&>(t).raw(), src.raw(), t.nbytes());  // in place: the executor shares it
  }
  std::vector<Tensor> m, v;
  std::vector<const Tensor*> pm, pv;
  for (int p : trainable_) {
    const std::string& name = graph_.values[p].name;
    m.push_back(ck.get("exp_avg." + name, slice_of(name)));
    v.push_back(ck.get("exp_avg_sq." + name, slice_of(name)));
    WXE_CHECK(m.back().numel() == graph_.values[p].constant->numel(), dir, ": optimizer state of '", name,
              "' does not fit the parameter");
  }
  for (size_t i = 0; i < m.size(); ++i) {
    pm.push_back(&m[i]);
    pv.push_back(&v[i]);
  }
  std::map<std::string, std::string>& meta = ck.meta;
  WXE_CHECK(meta.count("adam_step") || meta.count("step"), dir, ": no optimizer step in the metadata");
  const int64_t t = std::stoll(meta.count("adam_step") ? meta["adam_step"] : meta["step"]);
  adam_.set_state(t, {pack_block(pm, dp_rank_)}, {pack_block(pv, dp_rank_)});
  if (ema_)
    for (size_t i = 0; i < trainable_.size(); ++i) {
      const std::string& name = graph_.values[trainable_[i]].name;
      ema_->shadow()[i] = ck.get("ema." + name, slice_of(name)).clone().reshaped(graph_.values[trainable_[i]].shape);
    }
  WXE_CHECK(meta.count("step"), dir, ": no step in the metadata");
  step_ = std::stoll(meta["step"]);
  if (dev_) {  // the host's state is the newer now
    exec_->reload_constants();
    dev_state_.ready = false;
  }
  note("wxe: resumed from %s (step %lld)\n", dir.c_str(), (long long)step_);
}

namespace {

struct LogRow {
  int64_t step;
  double loss, lr, grad_norm, samples_per_s, seconds;
  std::string tail;  // validation columns: "" or ",v1,v2..." (FinetuneConfig::validate)
};

const char* kCsvHeader = "step,loss,lr,grad_norm,samples_per_s,step_seconds";

std::string csv_row(const LogRow& r) {
  char b[256];
  std::snprintf(b, sizeof b, "%lld,%.9g,%.9g,%.9g,%.4g,%.4g", (long long)r.step, r.loss, r.lr, r.grad_norm,
                r.samples_per_s, r.seconds);
  return b + r.tail;
}

// Rows of an existing log up to `upto` (a resumed run rewrites what came after its checkpoint).
std::vector<LogRow> read_log(const std::string& path, int64_t upto) {
  std::vector<LogRow> rows;
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    LogRow r{};
    if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf,%lf", (long long*)&r.step, &r.loss, &r.lr, &r.grad_norm,
                    &r.samples_per_s, &r.seconds) == 6 &&
        r.step <= upto) {
      size_t p = 0;
      for (int commas = 0; commas < 6 && p != std::string::npos; ++commas) p = line.find(',', p + (commas > 0));
      r.tail = p == std::string::npos ? "" : line.substr(p);
      rows.push_back(r);
    }
  }
  return rows;
}

void write_log(const std::string& path, const std::vector<LogRow>& rows, const std::vector<std::string>& extra) {
  std::string s = std::string(kCsvHeader);
  for (const std::string& c : extra) s += "," + c;
  s += "\n";
  for (auto& r : rows) s += csv_row(r) + "\n";
  write_file_atomic(path, s);
}

void plot(const FinetuneConfig& cfg, const std::vector<LogRow>& rows) {
  if (!cfg.plot) return;
  std::vector<double> steps, loss;
  for (auto& r : rows) {
    steps.push_back((double)r.step);
    loss.push_back(r.loss);
  }
  try {
    cfg.plot((fs::path(cfg.save) / "loss_curve.png").string(), "wxe finetune " + fs::path(cfg.model).filename().string(),
             steps, loss);
  } catch (const Error& e) {
    note("wxe: warning: loss curve not drawn: %s\n", e.what());
  }
}

}  // namespace

int run_finetune(const FinetuneConfig& cfg, Mesh* mesh) {
  WXE_CHECK(cfg.steps >= 1, "--steps must be at least 1");
  WXE_CHECK(!cfg.save.empty(), "--save DIR is required");
  auto t_start = std::chrono::steady_clock::now();
  std::unique_ptr<SampleSource> data = cfg.open_data ? cfg.open_data() : open_npy_dir(cfg.data, cfg.forecast_len);
  note("wxe: data: %s\n", data->describe().c_str());
  Trainer t(cfg, std::move(data), mesh);
  const bool lead = !mesh || mesh->rank == 0;
  if (mesh && mesh->tp > 1)
    note("wxe: tensor parallel over %d ranks: %d column- and %d row-parallel layers, %d + %d all-reduces per "
         "forward + backward, %zu parameters sharded\n",
         mesh->tp, t.tp_stats().column, t.tp_stats().row, t.tp_stats().all_reduces, t.tp_stats().copies,
         t.tp_slices().size());
  if (mesh && mesh->world > 1)
    note("wxe: mesh dp %d x tp %d: %d micro-batches per step per data-parallel group; optimizer state %.1f MiB "
         "per rank\n",
         mesh->dp, mesh->tp, cfg.accum / mesh->dp, t.optimizer_bytes() / 1048576.0);
  note("wxe: training %lld parameters (%zu tensors); %zu nodes; accum %d, forecast_len %d\n",
       (long long)t.trainable_count(), t.executor().trainable().size(), t.graph().nodes.size(), cfg.accum,
       cfg.forecast_len);
  const std::string log_path = (fs::path(cfg.save) / "training_log.csv").string();
  std::vector<LogRow> rows = cfg.resume ? read_log(log_path, t.steps_done()) : std::vector<LogRow>{};
  if (lead) {
    fs::create_directories(cfg.save);
    write_log(log_path, rows, cfg.validate ? cfg.validate_columns : std::vector<std::string>{});
  }
  const bool had_checkpoint = fs::exists(fs::path(cfg.save) / "latest");
  const bool tty = isatty(fileno(stderr));
  const int64_t first = t.steps_done();
  double run_s = 0;
  std::string last_ckpt;
  if (first >= cfg.steps) note("wxe: already at step %lld of %lld\n", (long long)first, (long long)cfg.steps);
  while (t.steps_done() < cfg.steps) {
    StepLog s;
    try {
      s = t.step();
    } catch (const NonFiniteLoss& e) {  // every rank sees the same all-reduced loss: all stop here
      if (!lead) return 4;
      if (tty && cfg.progress) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "wxe: error: %s\n", e.what());
      fs::path latest = fs::path(cfg.save) / "latest";
      if (fs::exists(latest)) {
        std::ifstream f(latest);
        std::string n;
        f >> n;
        std::fprintf(stderr, "wxe: the last good checkpoint is %s\n", (fs::path(cfg.save) / n).c_str());
      } else {
        std::fprintf(stderr, "wxe: no checkpoint was written\n");
      }
      return 4;
    }
    run_s += s.seconds;
    rows.push_back({s.step, s.loss, s.lr, s.grad_norm, s.samples / s.seconds, s.seconds, ""});
    if (cfg.validate) {
      std::string& tail = rows.back().tail;
      if ((cfg.validate_every > 0 && s.step % cfg.validate_every == 0) || s.step == cfg.steps) {
        std::vector<double> v = cfg.validate([&](const Tensor& x) { return t.predict(x); });
        WXE_ASSERT(v.size() == cfg.validate_columns.size());
        for (double d : v) tail += str(",", d);
      } else {
        tail = std::string(cfg.validate_columns.size(), ',');
      }
    }
    if (lead) {
      std::ofstream f(log_path, std::ios::app);
      f << csv_row(rows.back()) << "\n";
    }
    const int64_t done = s.step - first, left = cfg.steps - s.step;
    const double eta = run_s / done * left;
    if (cfg.progress && !g_quiet) {
      if (tty) {
        const int width = 24, fill = (int)(width * s.step / cfg.steps);
        std::fprintf(stderr, "\r[%s%s] step %lld/%lld  loss %.4e  lr %.2e  %.2f samples/s  ETA %s   ",
                     std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), (long long)s.step,
                     (long long)cfg.steps, s.loss, s.lr, s.samples / s.seconds, fmt_time(eta).c_str());
        if (!left) std::fprintf(stderr, "\n");
      } else {
        std::fprintf(stderr, "wxe: step %lld/%lld loss %.6e lr %.3e grad_norm %.3e %.2f samples/s ETA %s\n",
                     (long long)s.step, (long long)cfg.steps, s.loss, s.lr, s.grad_norm, s.samples / s.seconds,
                     fmt_time(eta).c_str());
      }
    }
    if (cfg.save_every > 0 && s.step % cfg.save_every == 0 && left > 0) {
      last_ckpt = t.save_checkpoint();
      if (lead) plot(cfg, rows);
    }
  }
  if (t.steps_done() > first || !had_checkpoint) last_ckpt = t.save_checkpoint();
  if (!lead) return 0;
  plot(cfg, rows);
  std::printf("trained %lld steps in %.1f s; final loss %.6g; checkpoint %s; log %s; peak RSS %.0f MB\n",
              (long long)(t.steps_done() - first), seconds_since(t_start), rows.empty() ? NAN : rows.back().loss,
              last_ckpt.empty() ? "(unchanged)" : last_ckpt.c_str(), log_path.c_str(), peak_rss_mb());
  return 0;
}

int run_train_bench(const std::string& model, const std::string& input, const std::string& weights, int threads,
                    int runs, bool json, const std::string& device) {
  WXE_CHECK(runs >= 1, "--runs must be at least 1");
  Tensor x = read_npy(input);
  // the output shape comes from a throwaway import; the target is zeros of it
  Graph probe = import_onnx(model);
  WXE_CHECK(probe.inputs.size() == 1, model, ": bench --train needs a model with one input");
  prepare_graph(probe, {{probe.values[probe.inputs[0]].name, {x.dtype, x.shape}}});
  Tensor y = Tensor::zeros(DType::F32, probe.values[probe.outputs[0]].shape);
  FinetuneConfig cfg;
  cfg.model = model;
  cfg.weights = weights;
  cfg.threads = threads;
  cfg.schedule.lr = 1e-4;
  cfg.device = device;
  Trainer t(cfg, std::make_unique<FixedSource>(x, y));
  t.step();  // warm-up
  std::map<std::string, OpProfile> warm = t.executor().profile();
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) {
    StepLog s = t.step();
    ms.push_back(s.seconds * 1e3);
    std::fprintf(stderr, "wxe: training step %d/%d: %.1f ms (loss %.4g)\n", r + 1, runs, ms.back(), s.loss);
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  std::vector<std::pair<double, std::string>> by_op;
  for (auto& [op, p] : t.executor().profile()) by_op.push_back({(p.ms - warm[op].ms) / runs, op});
  std::sort(by_op.rbegin(), by_op.rend());
  if (!by_op.empty()) std::printf("%-36s %10s\n", "op type (forward / backward)", "ms/step");  // none on a device
  for (size_t i = 0; i < by_op.size() && i < 20; ++i) std::printf("%-36s %10.2f\n", by_op[i].second.c_str(), by_op[i].first);
  std::printf("training step over %d runs: min %.1f ms, median %.1f ms, max %.1f ms; peak RSS %.1f MB; threads %d; "
              "device %s; %lld trainable parameters\n",
              runs, sorted.front(), median, sorted.back(), peak_rss_mb(), threads, device.c_str(),
              (long long)t.trainable_count());
  if (json)
    std::printf("{\"model\": \"%s\", \"mode\": \"train\", \"device\": \"%s\", \"threads\": %d, \"runs\": %d, "
                "\"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, \"peak_rss_mb\": %.1f}\n",
                model.c_str(), device.c_str(), threads, runs, median, sorted.front(), sorted.back(), peak_rss_mb());
  return 0;
}

}  // namespace wxe
