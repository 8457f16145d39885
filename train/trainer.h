// Layer: library (train/), over load/, parallel/ and engine/.
// Fine-tuning on one process: the training graph (engine/passes/passes.h prepare_training_graph),
// autograd (engine/exec/autograd.h), CREDIT's latitude-weighted MSE, AdamW with a schedule,
// gradient clipping and accumulation, optional EMA, multi-step rollouts, checkpoints that
// resume bit for bit.
//
// One optimizer step: for each of `accum` micro-batches, for each of `forecast_len` rollout
// steps: forward, loss against that step's target, backward of loss / accum (gradients sum
// over rollout steps and average over micro-batches); the prediction's first `prognostic`
// channels are fed back (detached) into the next step's input, the other input channels
// (forcing, static) come from the data. Then clip by global norm, AdamW at the schedule's lr,
// EMA. The logged loss is the mean over micro-batches and rollout steps.
// Micro-batch j of step s reads sample (s * accum + j) of an endless sequence over the data:
// in order, or with `shuffle` a permutation per epoch seeded by (seed, epoch), so a resumed
// run reads what the uninterrupted one would have.
//
// Checkpoints: SAVE/step_NNNNNN/ holds model.safetensors (trained parameters and
// spectral-norm buffers, loadable by safetensors.torch.load_file), optimizer.safetensors
// (exp_avg.NAME, exp_avg_sq.NAME; metadata: step and hyper-parameters), ema.safetensors
// when EMA is on, and trainer_state.json; SAVE/latest names the newest complete one and is
// replaced last (atomic rename), so a killed save leaves the previous checkpoint in force.
#pragma once
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "engine/exec/autograd.h"
#include "engine/io/glob.h"  // glob_match, for --freeze
#include "engine/io/samples.h"
#include "engine/io/safetensors.h"
#include "engine/passes/layout_rules.h"
#include "load/checkpoint.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/bands.h"
#include "parallel/shard.h"
#include "train/ensemble_loss.h"
#include "train/loss.h"
#include "train/optim.h"

namespace wxe {

struct FinetuneConfig {
  std::string model, weights, data, save;
  bool resume = false;
  int64_t steps = 100;             // optimizer steps in total (a resumed run continues to it)
  int accum = 1;                   // micro-batches per optimizer step, over all dp groups together
  int prefetch = 2;                // samples read ahead on a background thread (0: read in the step)
  int forecast_len = 1;            // rollout steps per sample
  int prognostic = -1;             // channels fed back in rollouts; -1: min(C_in, C_out)
  // With several data sources: per output channel the input channel it feeds in rollouts (-1:
  // none), instead of the leading `prognostic` channels (data/era5.h feedback_map)
  std::vector<int64_t> feedback_map;
  // the prediction as the next rollout step's input takes it (unset: as is); from a CREDIT config
  // it re-normalises where the target and input scalers differ (Era5Data::prediction_to_input),
  // and with physics postblocks feeds back their output (Era5Data::postprocess, which reads the
  // input x that produced pred)
  std::function<Tensor(const Tensor& pred, const Tensor& x)> to_input;
  AdamWConfig adam;
  Schedule schedule;               // its lr is the base lr
  double grad_max_norm = 1.0;      // <= 0: no clipping
  // CREDIT's grad_max_norm: dynamic: clip_grad_norm_ to the gradient's own global norm each step
  // (a factor norm / (norm + 1e-6)); grad_max_norm is then not used
  bool grad_clip_dynamic = false;
  LossFunction loss;               // the elementwise loss (train/loss.h), weighted as plain_mse says
  // Ensemble training (CREDIT's trainer.ensemble_size > 1; forecast_len 1): each micro-batch's
  // input repeated ensemble_size times over the batch (repeat_interleave), the members differing
  // only by the model's random nodes, scored by `crps` (train/ensemble_loss.h) where use_crps, else
  // each member by `loss` against the target. ring-crps instead: one member per dp rank
  // (ensemble_size = dp), the input not repeated. Either way every dp rank reads the same samples,
  // `accum` of them per step (each rank's micro-batches, not all dp groups' together).
  // Random nodes draw from streams keyed by (seed, step, micro-batch, node), so a resumed run
  // draws what the uninterrupted one did.
  int ensemble_size = 1;
  bool use_crps = false;
  CrpsLoss crps;
  std::vector<LossFunction> channel_losses;  // per output channel (empty: `loss` for all)
  // Set: the loss scores physical values (CREDIT's loss.type base): prediction and target go
  // through it (normalised -> physical in place; with the second argument also d physical /
  // d normalised per element) before the loss, and the gradient comes back through it.
  std::function<void(Tensor&, Tensor*)> to_physical;
  // Terms added to the loss of each step's prediction p against its target t (with to_physical,
  // in physical units: BaseLoss's computed diagnostics, postblocks geopotential_diagnostic; else
  // the model's values: VariableTotalLoss2D's spectral and power terms); with g, adds the term's
  // gradient by p (scaled by `scale`) into *g. Unset: none.
  std::function<double(const Tensor& p, const Tensor& t, Tensor* g, double scale)> extra_loss;
  // Set: the loss over the whole prediction in place of the elementwise one (CREDIT's spectral,
  // power, covmse: train/spectral_loss.h); with g, writes its gradient by p (scaled) into *g.
  std::function<double(const Tensor& p, const Tensor& t, Tensor* g, double scale)> whole_loss;
  bool ema = false;
  // ZeRO-3 over dp x domain (--shard-weights; CREDIT's trainer.mode fsdp): every trainable
  // parameter lives between steps only as this rank's ZeRO block; modules of parameters are
  // all-gathered just before the nodes that read them and freed after, gradients reduce-scattered
  // as soon as they are complete (train/zero.cpp). The same steps as without it. CPU only.
  bool shard_weights = false;
  // "blocks": each attention and feed-forward block's inner activations are recomputed in the
  // backward instead of kept (engine/passes/passes.h checkpoint_segments; on the CPU and devices);
  // "none": keep them. Gradients are bit-identical either way.
  std::string activation_checkpoint = "none";
  // The training graph's channel LayerNorms and GELUs fused as for inference (engine/passes/fuse.h
  // fuse_for_training; on the CPU each Gelu's output is made again in the backward, not kept):
  // less kept for the backward, fewer kernels. On the CPU and host-memory
  // backends; on a GPU the fusions its backend has backward kernels for (Backend::prepare_training:
  // CUDA's all but the window attention); not with `reference` (the oracle runs the graph as
  // exported). false: the exported graph (tests compare the two).
  bool fuse = true;
  // With tp > 1 on the CPU: the regions tensor parallelism leaves replicated (residual stream,
  // norms) hold bands of latitudes per rank (parallel/bands.h). false: whole.
  bool sequence_parallel = true;
  // On the CPU: each step's host tensors from one block planned from the first step
  // (engine/ir/host_arena.h). false: every tensor from malloc.
  bool step_arena = true;
  // "bf16": Conv and Linear multiply in bfloat16 with float32 accumulation, forward and backward
  // (data and weight gradients; engine/passes/fuse.h use_bf16, kernels/cpu/dnnl.cpp and
  // backward_conv.cpp / backward_linalg.cpp); parameters, gradients, AdamW state and every other
  // op stay float32. CPU (and host-memory backends) only, not with `reference`. "fp32": float32.
  std::string precision = "fp32";
  double ema_decay = 0.999;
  bool shuffle = false;
  uint64_t seed = 0;
  bool plain_mse = false;          // no latitude / channel weights
  std::vector<std::string> freeze; // parameter-name globs
  std::string plan;                // tensor-parallel plan file (parallel/shard.h), with tp > 1
  int threads = 0;
  bool reference = false;          // reference kernels only
  std::string device = "cpu";      // a backend (engine/exec/backend.h): "cpu" or "cuda"
  int64_t save_every = 0;          // 0: only at the end
  int keep = 2;                    // checkpoints kept
  bool progress = true;            // progress bar / log lines on stderr
  // Bytes each rank may use (--memory GB); 0: the machine's MemAvailable or cgroup limit over the
  // ranks on this node. A run whose planned peak (train/plan.h) exceeds it stops before step 1.
  double memory = 0;
  // A sample source other than the .npy directory `data` (CREDIT configs, data/era5.h), with
  // the latitudes (degrees) and per-output-channel loss weights that go with it (empty: the
  // .npy directory's, or a regular grid and 1).
  std::function<std::unique_ptr<SampleSource>()> open_data;
  std::vector<double> lat, channel_weights;
  // Validation: every `validate_every` optimizer steps and after the last, validate(predict)
  // returns one value per `validate_columns` entry, appended to that step's row of
  // training_log.csv (other rows leave them empty). Every rank calls it.
  int64_t validate_every = 0;
  std::vector<std::string> validate_columns;
  std::function<std::vector<double>(const std::function<Tensor(const Tensor&)>&)> validate;
  // Draws SAVE/loss_curve.png (path, title, steps, losses); the command line passes PLplot's.
  std::function<void(const std::string&, const std::string&, const std::vector<double>&,
                     const std::vector<double>&)>
      plot;
};

// The training graph one rank of a dp x tp x domain mesh runs, from the prepared graph
// (load/model.h prepare_model, training): its tp shard (rank mesh->tp_rank; Megatron style,
// sequence parallel on the CPU), the domain's bands, the training fusions and --precision; and
// the executor's segments (ExecOptions::segments: --activation-checkpoint blocks and the
// recomputed gathers, halos and GELUs). The Trainer's own, and `wxe plan`'s (train/plan.h) for a
// mesh it does not run: then mesh holds the sizes alone (no communicators; none is set).
// mesh null: a world of one.
struct RankGraph {
  ShardStats tp;
  SequenceParallelStats sp;
  BandStats domain;
  std::map<std::string, TensorSlice> slices;  // tp-sharded parameters: this rank's block of each
  std::vector<int> segments;
};
RankGraph rank_training_graph(Graph& g, const FinetuneConfig& cfg, const Mesh* mesh);

// ZeRO-3's module size for a model of `total` trainable bytes (train/zero.cpp; a module may be
// larger: a parameter is never split)
int64_t zero3_module_bytes(int64_t total);

struct StepLog {
  int64_t step = 0;                // 1-based: optimizer steps done
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  double data_wait = 0;  // seconds of `seconds` the step waited for its samples
  int samples = 0;
};

class Trainer {
 public:
  // Loads the model (training graph) and weights; with cfg.resume and a checkpoint in
  // cfg.save, continues from it. With a mesh (null: a world of one) the micro-batches are
  // divided over the dp groups, gradients summed over them, and the optimizer state sharded
  // over them and the domain ranks (ZeRO-1). With tp > 1 each tp group holds one copy of the model sharded
  // Megatron style (parallel/shard.h shard_training_graph): attention heads and feed-forward
  // columns split over the tp ranks, replicated parameters' gradients equal on all of them.
  Trainer(const FinetuneConfig& cfg, std::unique_ptr<SampleSource> data, Mesh* mesh = nullptr);
  // One optimizer step. Fails with a message (and leaves parameters as they were before the
  // step's update) if the loss or the gradient norm is not finite.
  StepLog step();
  // The model being trained, forward on one input (validation): outputs[0], as PyTorch's eval
  // mode computes it (spectral norm from the stored u and v, which stay as they were; no power
  // iteration). Gradients are untouched.
  Tensor predict(const Tensor& x);
  // Writes SAVE/step_NNNNNN atomically and points SAVE/latest at it; returns its path.
  // One process: model/optimizer/ema.safetensors. Under a mesh of more than one rank: a
  // sharded checkpoint (parallel/sharded_checkpoint.h; every tensor under the names of
  // open_train_checkpoint, tp shards as pieces, AdamW moments gathered over dp first), which
  // any mesh (one process too) resumes from. Collective under a mesh.
  std::string save_checkpoint();
  int64_t steps_done() const { return step_; }
  const Schedule& schedule() const { return cfg_.schedule; }
  // A plateau schedule's metric of the epoch that just ended (kept in checkpoints).
  void record_epoch_metric(double m) { cfg_.schedule.epoch_metrics.push_back(m); }
  const HostArena& arena() const { return arena_; }
  // Trained parameters by name (training names: SN layers legacy, others Linear layout), as
  // this rank holds them (tensor-parallel shards). On a device, the device's values are copied
  // into the graph first. Under --shard-weights they are gathered for the caller: collective
  // over the dp x domain ranks, as predict() and save_checkpoint() are.
  NamedTensors parameters();
  // Bytes of optimizer state (AdamW moments) this rank holds.
  size_t optimizer_bytes() const;
  // --shard-weights: whether parameters are sharded (ZeRO-3); the bytes of this rank's blocks
  // of the parameters, and of whole parameters gathered at once at the peak since the start
  bool shards_weights() const { return z3_; }
  size_t sharded_param_bytes() const { return (size_t)zS_ * sizeof(float); }
  size_t gathered_peak_bytes() const { return zgathered_peak_; }
  int shard_modules() const { return (int)zmod_.size(); }
  const Graph& graph() const { return graph_; }
  const GradExecutor& executor() const { return *exec_; }
  void set_profile(bool on) { exec_->set_profile(on); }  // per-op timing (GradExecutor::profile)
  int64_t trainable_count() const;
  // What tensor parallelism did (zero without it) and which parameters are sharded how.
  const ShardStats& tp_stats() const { return tp_stats_; }
  const SequenceParallelStats& sp_stats() const { return sp_stats_; }
  const std::map<std::string, TensorSlice>& tp_slices() const { return slices_; }

 private:
  FinetuneConfig cfg_;
  std::unique_ptr<SampleSource> data_;
  PrefetchSource* prefetch_ = nullptr;  // data_ itself when it reads ahead (FinetuneConfig::prefetch)
  Mesh* mesh_ = nullptr;
  int dp_ = 1, dp_rank_ = 0, tp_ = 1, tp_rank_ = 0, domain_ = 1, domain_rank_ = 0;
  std::map<std::string, TensorSlice> slices_;  // tp-sharded parameters: this rank's block of each
  ShardStats tp_stats_;
  SequenceParallelStats sp_stats_;
  Graph graph_;
  std::unique_ptr<GradExecutor> exec_;
  HostArena arena_;                  // the steps' host tensors (FinetuneConfig::step_arena)
  std::vector<int> trainable_;       // value ids
  uint64_t data_fp_ = 0;             // the data's fingerprint (size, first sample), compared over ranks
  std::vector<int> buffers_;         // spectral-norm u/v value ids (saved, not trained)
  AdamW adam_;
  std::unique_ptr<Ema> ema_;
  LossWeights loss_w_;
  int64_t step_ = 0;
  std::string input_name_;
  std::vector<int64_t> perm_;        // shuffle permutation of the current epoch
  int64_t perm_epoch_ = -1;
  // ZeRO-1 over dp x domain: every trainable parameter (n[p] elements here) is cut into
  // Z = dp x domain blocks of c[p] = ceil(n[p] / Z); this rank owns block
  // zrank = dp_rank x domain + domain_rank of each (the domain ranks of a dp group hold the same
  // gradients, so they share out the optimizer state rather than keep it each). The optimizer
  // runs on one flat tensor of S = sum c[p] elements (block p at off[p], zero padded).
  std::vector<int64_t> zn_, zc_, zoff_;
  int64_t zS_ = 0;
  int zparts_ = 1, zrank_ = 0;
  // Parameters packed together: their trainable indices and each one's block at off[i] of a
  // flat (S). zall_: every trainable parameter (ZeRO-1's flat block: zoff_, zS_); under
  // ZeRO-3 also each module. per_param arguments follow `params` (null or undefined: zeros).
  struct ZLayout {
    std::vector<size_t> params;
    std::vector<int64_t> off;
    int64_t S = 0;
  };
  ZLayout zall_;
  // The dp x domain ranks of this tp column in zrank order: all-gathers of blocks (null: one block)
  std::unique_ptr<Communicator> zcomm_;
  std::pair<int64_t, int64_t> block_range(size_t p, int block) const;  // [a, b) of parameter p in `block`
  Tensor pack_block(const ZLayout& l, const std::vector<const Tensor*>& per_param, int block) const;  // (S)
  void pack_block_into(const ZLayout& l, const std::vector<const Tensor*>& per_param, int block, float* flat) const;
  void unpack_block(const ZLayout& l, const float* flat, int block, const std::vector<Tensor*>& per_param) const;
  // This rank's block (S) of the gradients summed over dp (a reduce-scatter over dp of each dp
  // group's domain blocks, then this domain rank's).
  Tensor reduce_scatter_grads(const ZLayout& l, const std::vector<const Tensor*>& grads) const;
  // Every rank's block (shard: this rank's) into the whole tensors per_param (all-gathers over
  // domain, then dp); with lead_only, only zrank 0 unpacks (the others return false).
  bool gather_blocks(const ZLayout& l, const Tensor& shard, const std::vector<Tensor*>& per_param,
                     bool lead_only) const;
  void unpack_blocks(const ZLayout& l, const Tensor& all, const std::vector<Tensor*>& per_param) const;
  // ZeRO-3 (cfg.shard_weights, train/zero.cpp): zparam_ is this rank's block of every trainable
  // parameter (the parameters between steps: the graph's constants are shapes only), zgrad_ its
  // block of the step's gradient, summed over dp and the step's backwards. Modules: the
  // trainable parameters in the order the graph first reads them, cut into runs of about
  // 1/kModules of their bytes (a parameter is never split); the executor fetches and evicts
  // them (GradExecutor::set_param_residency).
  bool z3_ = false;
  Tensor zparam_, zgrad_;                    // (S) each
  std::vector<ZLayout> zmod_;
  std::vector<int> zmod_of_, zpos_;          // per trainable: its module and its index there
  std::vector<std::vector<Tensor>> zpending_;  // per module: the gradients handed over so far
  std::vector<size_t> zdone_;
  size_t zgathered_ = 0, zgathered_peak_ = 0;  // bytes of whole parameters gathered
  // the module whose gather is in flight (GradExecutor's prefetch: the next one, started once
  // the current one is whole); every rank starts them in the same order
  struct ModuleGather {
    int m = -1;
    Tensor shard, all;  // (S) this rank's blocks, kept until the wait; (Z x S) every rank's
    std::unique_ptr<PendingCollective> req;
  } zflight_;
  void setup_zero3();
  void start_module_gather(int m);
  void drop_module_gather();  // waits for the gather in flight, if any, and drops it
  void fetch_module(int m);
  void evict_module(int m);
  void module_grad(size_t p, Tensor&& g);  // the executor's grad_done
  void whole_parameters(bool whole);       // ZeRO-3: every trainable parameter whole (checkpoints), or not
  // Per parameter, whole (gather_blocks), on zrank 0; the other ranks get none (they own no
  // moment in a checkpoint) and keep no whole copies.
  std::vector<Tensor> gather_moments(const Tensor& shard);
  void load_checkpoint(const std::string& dir);
  void check_same_plan();
  NamedTensors host_parameters() const;  // the graph's copies (parameters() without the sync)
  // On a device (cfg.device other than "cpu"): this rank's flat blocks of parameters,
  // gradient and AdamW moments, and the EMA shadows, live in the device's memory between
  // steps and are updated there by its train_kernels(); the host copies (graph constants,
  // adam_, ema_) are refreshed by sync_to_host() (checkpoints, parameters()). Under dp > 1 the
  // gradient reduce-scatter and the parameter all-gather run on the device's buffers when the
  // dp communicator takes them (NCCL; or the device's memory is the host's), else through
  // host copies.
  Backend* dev_ = nullptr;
  struct DeviceState {
    Tensor p, g, m, v;        // (S) each
    std::vector<Tensor> ema;  // per trainable parameter
    bool ready = false;       // false: the host's state is newer (start, checkpoint load)
  } dev_state_;
  void to_device();
  bool dp_on_device() const;
  Tensor device_zeros(int64_t n) const;  // (n) float32 zeros in the device's memory
  void sync_to_host();
  void device_gradient_shard();   // dev_state_.g = this rank's block of the dp-summed gradient
  void device_update(double lr);  // AdamW, the parameters back into the executor, EMA
  int64_t sample_index(int64_t micro);
  // Ensemble training: rows of the model's input per sample (ensemble_size; ring-crps and no
  // ensemble: 1), the random nodes (RandomNormal/Like) whose streams set_random_streams keys
  int64_t members_ = 1;
  std::vector<int> random_nodes_;
  int64_t predict_calls_ = 0;  // since the last step (validation's streams)
  void set_random_streams(const std::string& key);
  // The loss of pred against target (train/loss.h, train/ensemble_loss.h as cfg_ says), its
  // gradient into *grad scaled by `scale`
  double score(const Tensor& pred, const Tensor& target, Tensor* grad, double scale);
};
// A non-finite loss or gradient norm (the same on every rank: both are all-reduced).
struct NonFiniteLoss : Error {
  using Error::Error;
};
}  // namespace wxe
