// The Trainer (train/trainer.h): building the training graph, one optimizer step (forward,
// backward, clipping, AdamW, EMA), evaluation, and the device-resident state. ZeRO's packing
// is train/zero.cpp, checkpoints train/checkpoint.cpp.
#include "train/trainer.h"

#include <chrono>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/exec/executor.h"
#include "engine/passes/fuse.h"
#include "importers/onnx/onnx_import.h"
#include "load/model.h"
#include "parallel/collective_ops.h"
#include "parallel/shard.h"

namespace fs = std::filesystem;

namespace wxe {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RankGraph rank_training_graph(Graph& g, const FinetuneConfig& cfg, const Mesh* mesh) {
  RankGraph r;
  const int tp = mesh ? mesh->tp : 1, tp_rank = mesh ? mesh->tp_rank : 0, domain = mesh ? mesh->domain : 1;
  if (tp > 1) {  // Megatron: this rank's heads and feed-forward columns; CopyToTP / AllReduceTP at the seams
    TpPlan plan = plan_for(g, cfg.plan, tp, true);
    r.slices = parameter_slices(plan, g, tp, tp_rank);
    r.tp = shard_training_graph(g, plan, tp, tp_rank);
    // the memory plan it serves is the CPU's (engine/exec/autograd.h)
    // (with --domain the bands are the domain's: parallel/bands.h)
    if (cfg.sequence_parallel && cfg.device == "cpu" && domain == 1) r.sp = sequence_parallel(g, tp);
  }
  // domain ranks: whole parameters, bands of the activations; the replicated parameters' band
  // gradients summed over the domain group in the backward (CopyToTP), so every domain rank
  // ends the backward with the same gradients and takes the same optimizer step
  r.domain = shard_domain(g, mesh, true);
  if (cfg.fuse && !cfg.reference) backend_for(cfg.device).prepare_training(g);
  WXE_CHECK(cfg.precision == "fp32" || cfg.precision == "bf16", "--precision must be fp32 or bf16, not '",
            cfg.precision, "'");
  if (cfg.precision == "bf16") {
    WXE_CHECK(!cfg.reference, "--precision bf16: the reference kernels compute in float32 only; drop --reference or "
              "--precision bf16");
    WXE_CHECK(backend_for(cfg.device).device() == DeviceKind::CPU, "--precision bf16 trains on the cpu only for now "
              "(--device ", cfg.device, " has no bfloat16 backward kernels yet); use --precision fp32");
    std::string why;
    if (cpu_precision(Precision::BF16, &why) == Precision::F32) {
      note("wxe: %s\n", why.c_str());  // and the nodes stay float32: nothing claims bfloat16
    } else {
      use_bf16(g);
      int convs = 0, linears = 0;
      for (const Node& n : g.nodes)
        if (n.s("precision", "") == "bf16") ++(n.op == "Linear" ? linears : convs);
      note("wxe: precision bf16: %d Linear and %d Conv nodes multiply in bfloat16 (float32 accumulation, forward and "
           "backward); parameters, gradients, AdamW state and the other ops float32\n", linears, convs);
    }
  }
  WXE_CHECK(cfg.activation_checkpoint == "none" || cfg.activation_checkpoint == "blocks",
            "--activation-checkpoint must be none or blocks, not '", cfg.activation_checkpoint, "'");
  if (cfg.activation_checkpoint == "blocks") {  // of the collectives only the gathers are recomputed (each rank
                                                 // reaches it at the same node)
    r.segments = checkpoint_segments(g, [](const Node& n) {
      return n.op == "AllReduceTP" || n.op == "CopyToTP" || n.op == "ReduceScatterTP" || n.op == "ScatterTP";
    });
    int blocks = 0;
    for (int s : r.segments) blocks = std::max(blocks, s + 1);
    note("wxe: activation checkpointing: %d blocks recomputed in the backward\n", blocks);
  }
  // sequence parallelism: the whole activation a gather makes for the column-parallel layers, and
  // a convolution's band with its halo (domain parallelism too, on the cpu), are made again in
  // the backward rather than kept
  if (r.sp.gathers || r.sp.halos || (r.domain.halos && cfg.device == "cpu"))
    add_recompute_segments(g, r.segments);
  if (cfg.device == "cpu") add_recompute_segments(g, r.segments, [](const Node& n) { return n.op == "Gelu"; });
  return r;
}

Trainer::Trainer(const FinetuneConfig& cfg, std::unique_ptr<SampleSource> data, Mesh* mesh)
    : cfg_(cfg), data_(std::move(data)), mesh_(mesh), adam_(cfg.adam) {
  if (mesh_) {
    dp_ = mesh_->dp;
    dp_rank_ = mesh_->dp_rank;
    tp_ = mesh_->tp;
    tp_rank_ = mesh_->tp_rank;
    domain_ = mesh_->domain;
    domain_rank_ = mesh_->domain_rank;
  }
  WXE_CHECK(cfg.accum >= 1, "--accum must be at least 1");
  // an ensemble's dp ranks read the same samples (CREDIT's ensemble mode): `accum` counts each
  // rank's micro-batches, dp times as many in all
  if (cfg.ensemble_size > 1) cfg_.accum = cfg.accum * dp_;
  WXE_CHECK(cfg_.accum % dp_ == 0, "--accum ", cfg_.accum, " micro-batches cannot be divided over ", dp_,
            " data-parallel groups; make it a multiple of ", dp_);
  WXE_CHECK(cfg.forecast_len >= 1, "--forecast-len must be at least 1");
  WXE_CHECK(!cfg.shard_weights || cfg.device == "cpu", "--shard-weights: parameters are sharded on the cpu only for "
            "now; drop --shard-weights for --device ", cfg.device, " (ZeRO-1 still shares the optimizer state)");
  WXE_CHECK(data_ && data_->size() > 0, "no training samples");
  graph_ = import_onnx(cfg.model);
  WXE_CHECK(graph_.inputs.size() == 1, cfg.model, ": fine-tuning needs a model with one input, it has ",
            graph_.inputs.size());
  input_name_ = graph_.values[graph_.inputs[0]].name;
  Sample first = data_->get(0);
  if (cfg.prefetch > 0) {  // samples read ahead on a background thread while the steps run
    auto p = std::make_unique<PrefetchSource>(std::move(data_), cfg.prefetch);
    prefetch_ = p.get();
    data_ = std::move(p);
  }
  if (mesh_ && mesh_->world > 1) {  // what the data is, for the ranks to compare (paths may differ, contents may not)
    data_fp_ = fingerprint(str(data_->size(), "|"));
    for (const Tensor* t : {&first.input, &first.targets[0]}) data_fp_ = fingerprint(t->raw(), t->nbytes(), data_fp_);
  }
  // ensemble training: each sample's members are rows of the model's batch (ring-crps: one per rank)
  const bool ring = cfg.use_crps && cfg.crps.kind == CrpsKind::Ring;
  WXE_CHECK(cfg.ensemble_size >= 1, "ensemble_size ", cfg.ensemble_size, " must be at least 1");
  WXE_CHECK(!cfg.use_crps || cfg.ensemble_size > 1, "loss ", crps_name(cfg.crps.kind),
            " is an ensemble CRPS loss and needs ensemble_size > 1");
  WXE_CHECK(cfg.ensemble_size == 1 || cfg.forecast_len == 1, "ensemble training (ensemble_size ", cfg.ensemble_size,
            ") with forecast_len ", cfg.forecast_len, ": ensemble rollouts are not implemented");
  WXE_CHECK(!ring || cfg.ensemble_size == dp_, "ring-crps holds one ensemble member per data-parallel rank: "
            "ensemble_size ", cfg.ensemble_size, " must equal the data-parallel size ", dp_);
  WXE_CHECK(cfg.ensemble_size == 1 || std::any_of(graph_.nodes.begin(), graph_.nodes.end(),
                                                   [](const Node& n) { return op_is_random(n.op); }),
            cfg.model, ": ensemble_size ", cfg.ensemble_size, ": the model has no random nodes (RandomNormal, "
            "RandomNormalLike), so its members would be identical; train a noise model (CREDIT's crossformer-ensemble) "
            "or set ensemble_size 1");
  members_ = ring ? 1 : cfg.ensemble_size;
  Shape in_shape = first.input.shape;
  in_shape[0] *= members_;
  const Shape& declared = graph_.values[graph_.inputs[0]].shape;
  WXE_CHECK(members_ == 1 || declared.empty() || declared[0] < 0 || declared[0] == in_shape[0], cfg.model,
            ": input '", input_name_, "' has a fixed batch of ", declared[0], "; ensemble_size ", members_,
            " runs the members as rows of the batch (", in_shape[0], "): export the model with a dynamic batch axis");
  LoadOptions lo;
  lo.weights = cfg.weights;
  lo.training = true;
  prepare_model(graph_, {{input_name_, {first.input.dtype, in_shape}}}, lo);
  check_training_parameters(graph_, nullptr, cfg.model);
  WXE_CHECK(graph_.outputs.size() >= 1, cfg.model, ": the model has no output");
  const Shape out_shape = graph_.values[graph_.outputs[0]].shape;
  WXE_CHECK(first.targets.size() == (size_t)cfg.forecast_len, cfg.data, ": a sample has ", first.targets.size(),
            " target steps, the rollout has forecast_len ", cfg.forecast_len);
  Shape target_rows = first.targets[0].shape;
  target_rows[0] *= members_;
  WXE_CHECK(target_rows == out_shape, cfg.data, ": targets are ", shape_str(first.targets[0].shape),
            members_ > 1 ? str(" (x ", members_, " members)") : std::string(), ", the model's output is ",
            shape_str(out_shape));
  RankGraph rg = rank_training_graph(graph_, cfg, mesh_);
  slices_ = std::move(rg.slices);
  tp_stats_ = rg.tp;
  sp_stats_ = rg.sp;
  if (tp_ > 1) set_tp_communicator(mesh_->tp_comm.get());
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
  // ZeRO over dp x domain (on a device with --domain the blocks move through the host)
  zparts_ = dp_ * domain_;
  zrank_ = dp_rank_ * domain_ + domain_rank_;
  for (int v : trainable_) {
    const int64_t n = graph_.values[v].constant->numel(), c = (n + zparts_ - 1) / zparts_;
    zn_.push_back(n);
    zc_.push_back(c);
    zoff_.push_back(zS_);
    zall_.params.push_back(zall_.params.size());
    zS_ += c;
  }
  zall_.off = zoff_;
  zall_.S = zS_;
  if (zparts_ > 1) zcomm_ = mesh_->world_comm->split(tp_rank_, zrank_);
  // the AdamW state from the start (zeros: the first update is the same), so step 1 holds what
  // every later step holds and its memory line is the steady state's (on a device it lives there)
  if (cfg.device == "cpu") adam_.set_state(0, {Tensor::zeros(DType::F32, {zS_})}, {Tensor::zeros(DType::F32, {zS_})});
  if (mesh_ && mesh_->world > 1) check_same_plan();
  ExecOptions opt;
  opt.threads = cfg.threads;
  opt.kernels = cfg.reference ? KernelKind::Reference : KernelKind::Fast;
  opt.optimize = false;
  opt.device = cfg.device;
  opt.profile = cfg.device == "cpu";  // on a device, timing per op would wait for every kernel
  opt.segments = rg.segments;
  for (size_t k = 0; k < graph_.nodes.size(); ++k)
    if (op_is_random(graph_.nodes[k].op)) random_nodes_.push_back((int)k);
  WXE_CHECK(cfg.ensemble_size == 1 || (tp_ == 1 && domain_ == 1), "ensemble training with --tp or --domain is not "
            "implemented (each shard would draw its own noise); use data parallelism only");
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
    WXE_CHECK((int64_t)info.lat.size() == h, cfg.data, cfg.lat.empty() ? "/lat.npy: " : ": the data's latitude coordinate: ",
              info.lat.size(), " latitudes, the output has ", h, " rows");
    loss_w_.lat_weights = latitude_weights(info.lat);
    loss_w_.channel_weights = info.channel_weights;
  }
  if (cfg.ema) {
    std::vector<const Tensor*> ps;
    for (int v : trainable_) ps.push_back(graph_.values[v].constant.get());
    ema_ = std::make_unique<Ema>(cfg.ema_decay, ps);
  }
  if (cfg.resume && !cfg.save.empty()) {
    const std::string latest = latest_checkpoint(cfg.save);
    if (!latest.empty()) {
      load_checkpoint(latest);
    } else {
      note("wxe: --resume: no checkpoint in %s yet; starting at step 0\n", cfg.save.c_str());
    }
  }
  if (cfg.shard_weights) setup_zero3();
}

// Every rank must have built the same plan (same parameters, shapes and shards), or the
// collectives would pair up unrelated tensors: a hash, gathered and compared before the first one.
void Trainer::check_same_plan() {
  std::string text = str("tp", tp_, "dp", dp_, "domain", domain_);
  for (int v : trainable_) {
    const Value& x = graph_.values[v];
    text += x.name + shape_str(x.shape);
    auto it = slices_.find(x.name);
    if (it != slices_.end()) text += str("/", it->second.axis, "/", it->second.parts, "/", it->second.groups);
  }
  check_same_on_all_ranks(*mesh_, fingerprint(text), "training plan");  // parallel/mesh.h
  // The options every rank must be given alike: different --steps or --save-every hang a
  // collective, a different --lr, --data or --accum trains something else on each rank.
  auto num = [](double d) { return str(std::hexfloat, d); };
  const Schedule& s = cfg_.schedule;
  const AdamWConfig& a = cfg_.adam;
  std::string freeze;
  for (const std::string& f : cfg_.freeze) freeze += f + '\n';
  const std::vector<std::pair<std::string, std::string>> options = {
      {"--steps", str(cfg_.steps)}, {"--save-every", str(cfg_.save_every)}, {"--save", cfg_.save},
      {"--resume", str(cfg_.resume)}, {"--accum", str(cfg_.accum)}, {"--forecast-len", str(cfg_.forecast_len)},
      {"--prognostic", str(cfg_.prognostic)}, {"--data (its samples)", str(data_fp_)},
      {"--lr / --schedule / --warmup-steps / --total-steps / --min-lr",
       str((int)s.kind, num(s.lr), num(s.min_lr), s.warmup_steps, "/", s.total_steps, "/", s.accum_batches, "/",
           s.epoch_batches, "/", s.t_max, num(s.eta_min), s.first_cycle_steps, num(s.cycle_mult), num(s.max_lr),
           num(s.gamma), s.plateau_max, s.plateau_abs, num(s.factor), num(s.threshold), s.patience, "/", s.cooldown)},
      {"AdamW's betas, eps or --weight-decay", str(num(a.beta1), num(a.beta2), num(a.eps), num(a.weight_decay))},
      {"--grad-max-norm", str(num(cfg_.grad_max_norm), cfg_.grad_clip_dynamic)}, {"--ema / --ema-decay", str(cfg_.ema, num(cfg_.ema_decay))},
      {"--shuffle / --seed", str(cfg_.shuffle, "/", cfg_.seed)}, {"--loss", str(cfg_.plain_mse, (int)cfg_.loss.kind, num(cfg_.loss.delta), cfg_.channel_losses.size(), (bool)cfg_.to_physical)},
      {"the ensemble (ensemble_size, CRPS loss)", str(cfg_.ensemble_size, "/", cfg_.use_crps, "/", (int)cfg_.crps.kind,
                                                       cfg_.crps.biased, num(cfg_.crps.alpha))},
      {"--freeze", freeze}, {"--reference", str(cfg_.reference)}, {"--device", cfg_.device},
      {"the training fusions (FinetuneConfig::fuse)", str(cfg_.fuse)}, {"--precision", cfg_.precision},
      {"--sequence-parallel", str(cfg_.sequence_parallel)}, {"--shard-weights", str(cfg_.shard_weights)}};
  std::vector<uint64_t> fps;
  for (auto& o : options) fps.push_back(fingerprint(o.second));
  const std::vector<uint64_t> all = gather_on_all_ranks(*mesh_, fps);  // every rank finds the same
  for (int r = 1; r < mesh_->world; ++r)
    for (size_t i = 0; i < options.size(); ++i)
      WXE_CHECK(all[r * options.size() + i] == all[i], "rank ", r, " was started with another ", options[i].first,
                " than rank 0: every rank must be given the same options");
}

int64_t Trainer::trainable_count() const {
  int64_t n = 0;
  for (int v : trainable_) n += graph_.values[v].constant->numel();
  return n;
}

size_t Trainer::optimizer_bytes() const { return 2 * (size_t)zS_ * sizeof(float); }  // exp_avg, exp_avg_sq

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

void Trainer::set_random_streams(const std::string& key) {
  for (size_t q = 0; q < random_nodes_.size(); ++q)
    graph_.nodes[random_nodes_[q]].attrs["stream"] = attr_i((int64_t)fingerprint(str(cfg_.seed, "/", key, "/", q)));
}

double Trainer::score(const Tensor& pred, const Tensor& target, Tensor* grad, double scale) {
  if (cfg_.whole_loss) return cfg_.whole_loss(pred, members_ > 1 ? repeat_members(target, members_) : target, grad, scale);
  if (cfg_.use_crps && cfg_.crps.kind == CrpsKind::Ring)
    return ring_crps(pred, target, loss_w_, dp_ > 1 ? mesh_->dp_comm.get() : nullptr, grad, scale);
  if (cfg_.use_crps) return ensemble_crps(pred, target, loss_w_, cfg_.crps, grad, scale);
  // each member scored against the target (CREDIT: the target broadcast over the members)
  return weighted_loss(pred, members_ > 1 ? repeat_members(target, members_) : target, loss_w_, cfg_.loss, grad, scale,
                       cfg_.channel_losses);
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
  // an ensemble's members from one sample's input, their noise keyed by the step and the call
  const bool repeat = members_ > 1 && x.rank() >= 1 && x.dim(0) * members_ == graph_.values[graph_.inputs[0]].shape[0];
  if (!random_nodes_.empty()) set_random_streams(str("predict/", step_, "/", predict_calls_++));
  Tensor y = exec_->forward({{input_name_, repeat ? repeat_members(x, members_) : x}}).at(0).clone();
  exec_->evict_params();  // ZeRO-3: no backward follows
  if (z3_) drop_module_gather();
  for (auto& [a, iters] : saved) *a = attr_i(iters);
  return y;
}

StepLog Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  HostArena::Step arena_step(cfg_.step_arena && !dev_ ? &arena_ : nullptr);
  StepLog log;
  log.lr = cfg_.schedule.lr_at(step_);
  const int64_t channels_in = graph_.values[graph_.inputs[0]].shape[1];
  const int64_t channels_out = graph_.values[graph_.outputs[0]].shape[1];
  const int64_t prognostic = cfg_.prognostic >= 0 ? cfg_.prognostic : std::min(channels_in, channels_out);
  WXE_CHECK(prognostic <= std::min(channels_in, channels_out), "--prognostic ", prognostic, " exceeds the ",
            std::min(channels_in, channels_out), " channels input and output share");
  // this dp group's micro-batches: j = dp_rank, dp_rank + dp, ... of the step's `accum`
  double loss_sum = 0;
  predict_calls_ = 0;
  // an ensemble's dp ranks read the same samples (CREDIT: shared batches), each its own members
  auto micro_of = [&](int64_t step, int j) {
    return cfg_.ensemble_size > 1 ? step * (cfg_.accum / dp_) + j / dp_ : step * cfg_.accum + j;
  };
  if (prefetch_) {  // this step's samples and the next step's, read ahead in order
    std::vector<int64_t> next;
    for (int64_t st : {step_, step_ + 1})
      for (int j = dp_rank_; j < cfg_.accum; j += dp_) next.push_back(sample_index(micro_of(st, j)));
    prefetch_->want(next);
  }
  const double waited0 = prefetch_ ? prefetch_->waited_seconds() : 0;
  double own_wait = 0;
  for (int j = dp_rank_; j < cfg_.accum; j += dp_) {
    const int64_t micro = micro_of(step_, j);
    const auto r0 = std::chrono::steady_clock::now();
    Sample s = data_->get(sample_index(micro));
    if (!prefetch_) own_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    Tensor x = std::move(s.input), pred;
    if (!s.forcing.empty()) s.forcing[0] = Tensor();  // x itself (the window slides in forcing[1..])
    log.samples += (int)x.shape[0];
    if (members_ > 1) x = repeat_members(x, members_);
    for (int k = 0; k < cfg_.forecast_len; ++k) {
      if (k > 0) {  // step k's input slid into the window, its prognostic channels the prediction (detached)
        const Tensor produced = x;  // the input that made pred (the physics postblocks read it)
        x = slide_window(x, s.forcing[k]);
        if (!cfg_.feedback_map.empty())
          feed_back(x, cfg_.to_input ? cfg_.to_input(pred, produced) : pred, cfg_.feedback_map);
        else
          feed_back(x, cfg_.to_input ? cfg_.to_input(pred, produced) : pred, prognostic);
      }
      if (!random_nodes_.empty()) set_random_streams(str("train/", step_, "/", j, "/", k));
      // the last step's input goes to the executor, which frees it after its last use
      std::map<std::string, Tensor> in{{input_name_, k + 1 < cfg_.forecast_len ? x : std::move(x)}};
      std::vector<Tensor> outs = exec_->forward(std::move(in));
      std::vector<Tensor> gout(outs.size());
      // the loss gradient over the prediction where nothing needs it after the loss (the last
      // rollout step, no backward kernel reading the output), else a tensor of its own
      const bool over = k + 1 == cfg_.forecast_len && !exec_->backward_reads_output(0);
      gout[0] = over ? outs[0] : Tensor(DType::F32, outs[0].shape);
      if (cfg_.to_physical) {  // scored in physical units, the gradient back through the postblocks
        Tensor p = outs[0].clone(), dp, g;
        cfg_.to_physical(p, &dp);
        cfg_.to_physical(s.targets[k], nullptr);
        loss_sum += score(p, s.targets[k], &g, 1.0 / cfg_.accum);
        if (cfg_.extra_loss) loss_sum += cfg_.extra_loss(p, s.targets[k], &g, 1.0 / cfg_.accum);
        float* go = gout[0].data<float>();
        const float *a = g.data<float>(), *b = dp.data<float>();
        for (int64_t i = 0; i < g.numel(); ++i) go[i] = a[i] * b[i];
      } else {
        Tensor gx;  // the extra terms' gradient, before score may write its own over the prediction
        if (cfg_.extra_loss) loss_sum += cfg_.extra_loss(outs[0], s.targets[k], &gx, 1.0 / cfg_.accum);
        loss_sum += score(outs[0], s.targets[k], &gout[0], 1.0 / cfg_.accum);
        if (gx.defined()) {
          float* go = gout[0].data<float>();
          const float* a = gx.data<float>();
          for (int64_t i = 0; i < gx.numel(); ++i) go[i] += a[i];
        }
      }
      // The backward needs none of the whole-grid tensors the loss read: the target goes, the
      // prediction stays only as the next rollout step's input, and the loss gradient is the
      // executor's (not copied). On every rank each is as large as the model's output.
      s.targets[k] = Tensor();
      pred = k + 1 < cfg_.forecast_len ? outs[0] : Tensor();
      outs.clear();
      exec_->backward(std::move(gout));
    }
  }
  // ZeRO-1: the gradient summed over dp, each rank keeping its own block of every parameter.
  // On the host with one block (no dp, no domain) the optimizer works on the executor's
  // gradients and the parameters where they are: nothing packed or unpacked.
  const bool in_place = !dev_ && zparts_ == 1;
  std::vector<Tensor>& grads = exec_->grads();
  Tensor gshard;
  if (dev_) {
    if (!dev_state_.ready) to_device();
    device_gradient_shard();
  } else if (z3_) {
    drop_module_gather();  // none should be left; one gathered before the update would be stale
    gshard = zgrad_;       // reduce-scattered module by module in the backward
  } else if (!in_place) {
    std::vector<const Tensor*> gp;
    for (const Tensor& g : grads) gp.push_back(&g);
    gshard = reduce_scatter_grads(zall_, gp);
  }
  const TrainKernels& k = dev_ ? *dev_->train_kernels() : cpu_train_kernels();
  float* gflat = dev_ ? dev_state_.g.data<float>() : in_place ? nullptr : gshard.data<float>();
  // loss over every micro-batch and rollout step; global gradient norm with each parameter
  // counted once: tp-sharded ones summed over tp, replicated ones from tp rank 0
  std::vector<double> sq(trainable_.size());
  if (in_place) {
    for (size_t p = 0; p < trainable_.size(); ++p) k.segment_sum_squares(grads[p].data<float>(), {0, zn_[p]}, &sq[p]);
  } else {
    std::vector<int64_t> bounds = zoff_;  // parameter p's block: [zoff_[p], zoff_[p] + zc_[p])
    bounds.push_back(zS_);
    k.segment_sum_squares(gflat, bounds, sq.data());
  }
  double sq_sharded = 0, sq_replicated = 0;
  for (size_t p = 0; p < trainable_.size(); ++p)
    (slices_.count(graph_.values[trainable_[p]].name) ? sq_sharded : sq_replicated) += sq[p];
  double total_sq = sq_sharded + sq_replicated;
  if (mesh_ && mesh_->world > 1) {
    Tensor v(DType::F64, {3});
    // each rank's ZeRO blocks are its own (dp x domain); the tp ranks and the domain ranks
    // computed the same loss
    v.data<double>()[0] = sq_sharded;
    v.data<double>()[1] = tp_rank_ == 0 ? sq_replicated : 0.0;
    v.data<double>()[2] = tp_rank_ == 0 && domain_rank_ == 0 ? loss_sum : 0.0;
    mesh_->world_comm->all_reduce_sum(v);
    total_sq = v.data<double>()[0] + v.data<double>()[1];
    loss_sum = v.data<double>()[2];
  }
  log.loss = loss_sum / (cfg_.accum * cfg_.forecast_len);
  log.grad_norm = std::sqrt(total_sq);
  if (!std::isfinite(log.loss) || !std::isfinite(log.grad_norm)) {
    exec_->zero_grad();
    if (z3_) std::memset(zgrad_.raw(), 0, zgrad_.nbytes());
    throw NonFiniteLoss(str("step ", step_ + 1, ": the loss is ", log.loss, " and the gradient norm ", log.grad_norm,
                            "; stopped before updating the parameters"));
  }
  if (cfg_.grad_max_norm > 0 || cfg_.grad_clip_dynamic) {  // torch.nn.utils.clip_grad_norm_
    const double max_norm = cfg_.grad_clip_dynamic ? log.grad_norm : cfg_.grad_max_norm;
    const float factor = (float)max_norm / (float)(log.grad_norm + 1e-6);
    if (factor < 1.f && !in_place) k.scale(gflat, zS_, factor);
    for (size_t p = 0; factor < 1.f && in_place && p < trainable_.size(); ++p)
      k.scale(grads[p].data<float>(), zn_[p], factor);
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
    if (in_place) {
      std::vector<float*> pp;
      std::vector<const float*> gp;
      for (size_t p = 0; p < params.size(); ++p) {
        pp.push_back(params[p]->data<float>());
        gp.push_back(grads[p].data<float>());
      }
      adam_.step_flat(pp, gp, zn_, zoff_, zS_, log.lr);
    } else if (z3_) {  // the blocks are the parameters: nothing gathered until the next forward reads them
      adam_.step({&zparam_}, {&gshard}, log.lr);
    } else {
      Tensor pshard = pack_block(zall_, cparams, zrank_);
      adam_.step({&pshard}, {&gshard}, log.lr);
      gather_blocks(zall_, pshard, params, false);
    }
    if (ema_) ema_->update(z3_ ? std::vector<const Tensor*>{&zparam_} : cparams);
  }
  exec_->zero_grad();
  if (z3_) std::memset(zgrad_.raw(), 0, zgrad_.nbytes());
  if (dev_) dev_->synchronize();  // the step's time includes its queued kernels
  log.samples *= dp_;  // every dp group did as many
  log.step = ++step_;
  log.seconds = seconds_since(t0);
  log.data_wait = prefetch_ ? prefetch_->waited_seconds() - waited0 : own_wait;
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
    auto [a, e] = block_range(p, zrank_);
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
  return dp_ > 1 && domain_ == 1 && (mesh_->dp_comm->takes_device_buffers() || dev_->device() == DeviceKind::CPU);
}

void Trainer::device_gradient_shard() {
  float* g = dev_state_.g.data<float>();
  if (zparts_ == 1) {
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
  Tensor shard = reduce_scatter_grads(zall_, grads);
  dev_->copy_to_device(g, shard.raw(), shard.nbytes());
}

void Trainer::device_update(double lr) {
  const TrainKernels& k = *dev_->train_kernels();
  DeviceState& d = dev_state_;
  k.adamw(adam_.next_step(lr), d.p.data<float>(), d.g.data<float>(), d.m.data<float>(), d.v.data<float>(), zS_);
  if (zparts_ == 1) {
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
    gather_blocks(zall_, dev_->download(d.p), params, false);
    for (size_t p = 0; p < trainable_.size(); ++p)
      dev_->copy_to_device(exec_->device_param(p).raw(), params[p]->raw(), params[p]->nbytes());
  }
  if (ema_) {
    const double e = ema_->next_decay();
    const float decay = (float)e, w = (float)(1 - e);
    for (size_t p = 0; p < trainable_.size(); ++p)
      k.ema(d.ema[p].data<float>(), exec_->device_param(p).data<float>(), zn_[p], decay, w);
  }
}

NamedTensors Trainer::parameters() {
  sync_to_host();
  whole_parameters(true);
  NamedTensors r = host_parameters();  // ZeRO-3: the whole copies stay with the caller alone
  whole_parameters(false);
  return r;
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

}  // namespace wxe
