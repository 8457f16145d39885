// ZeRO over the dp x domain ranks (train/trainer.h): every trainable parameter cut into blocks,
// this rank's blocks packed into one flat tensor the optimizer updates; the gradient
// reduce-scatter and the parameter and moment all-gathers (ZeRO-1). With --shard-weights
// (ZeRO-3) the same blocks are the parameters themselves between steps: modules are gathered
// for the nodes that read them and their gradients reduce-scattered as they complete.
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "load/model.h"
#include "train/trainer.h"

namespace wxe {

std::pair<int64_t, int64_t> Trainer::block_range(size_t p, int block) const {
  const int64_t a = std::min(zn_[p], block * zc_[p]);
  return {a, std::min(zn_[p], a + zc_[p])};
}

void Trainer::pack_block_into(const ZLayout& l, const std::vector<const Tensor*>& per_param, int block,
                              float* flat) const {
  std::memset(flat, 0, l.S * sizeof(float));
  for (size_t i = 0; i < l.params.size(); ++i) {
    if (!per_param[i] || !per_param[i]->defined()) continue;  // a zero gradient
    auto [a, b] = block_range(l.params[i], block);
    std::memcpy(flat + l.off[i], per_param[i]->data<float>() + a, (b - a) * sizeof(float));
  }
}

Tensor Trainer::pack_block(const ZLayout& l, const std::vector<const Tensor*>& per_param, int block) const {
  Tensor flat(DType::F32, {l.S});
  pack_block_into(l, per_param, block, flat.data<float>());
  return flat;
}

void Trainer::unpack_block(const ZLayout& l, const float* flat, int block, const std::vector<Tensor*>& per_param) const {
  for (size_t i = 0; i < l.params.size(); ++i) {
    auto [a, b] = block_range(l.params[i], block);
    std::memcpy(per_param[i]->data<float>() + a, flat + l.off[i], (b - a) * sizeof(float));
  }
}

Tensor Trainer::reduce_scatter_grads(const ZLayout& l, const std::vector<const Tensor*>& grads) const {
  if (dp_ == 1) return pack_block(l, grads, zrank_);  // nothing to sum: the domain rank's block
  // blocks in zrank order: dp group d's domain blocks d x domain .. d x domain + domain - 1 in a row
  Tensor all(DType::F32, {zparts_ * l.S}), group(DType::F32, {domain_ * l.S}), shard(DType::F32, {l.S});
  for (int b = 0; b < zparts_; ++b) pack_block_into(l, grads, b, all.data<float>() + b * l.S);
  mesh_->dp_comm->reduce_scatter_sum(all, group);
  std::memcpy(shard.raw(), group.data<float>() + domain_rank_ * l.S, l.S * sizeof(float));
  return shard;
}

bool Trainer::gather_blocks(const ZLayout& l, const Tensor& shard, const std::vector<Tensor*>& per_param,
                            bool lead_only) const {
  if (zparts_ == 1) {
    unpack_block(l, shard.data<float>(), 0, per_param);
    return true;
  }
  Tensor all(DType::F32, {zparts_ * l.S});
  zcomm_->all_gather(shard, all);
  if (lead_only && zrank_ != 0) return false;
  unpack_blocks(l, all, per_param);
  return true;
}

void Trainer::unpack_blocks(const ZLayout& l, const Tensor& all, const std::vector<Tensor*>& per_param) const {
  for (int b = 0; b < zparts_; ++b) unpack_block(l, all.data<float>() + b * l.S, b, per_param);
}

std::vector<Tensor> Trainer::gather_moments(const Tensor& shard) {
  std::vector<Tensor> whole;
  std::vector<Tensor*> ptrs;
  for (int v : trainable_) whole.push_back(Tensor::zeros(DType::F32, graph_.values[v].shape));
  for (Tensor& t : whole) ptrs.push_back(&t);
  if (!gather_blocks(zall_, shard, ptrs, true)) return {};  // dp rank 0 writes the moments (save_checkpoint)
  return whole;
}

// ---------------------------------------------------------------- ZeRO-3

namespace {

constexpr int kModules = 32;                // modules per model, about equal in bytes
constexpr int64_t kMinModuleBytes = 1 << 20;  // but none smaller (a collective costs about as much for 1 KB as for 1 MB)

}  // namespace

int64_t zero3_module_bytes(int64_t total) { return std::max(kMinModuleBytes, total / kModules); }

void Trainer::setup_zero3() {
  if (zparts_ == 1) {
    note("wxe: --shard-weights: dp x domain is 1, one ZeRO block: nothing to shard; trained as without it\n");
    return;
  }
  z3_ = true;
  std::vector<const Tensor*> whole;
  for (int v : trainable_) whole.push_back(graph_.values[v].constant.get());
  zparam_ = pack_block(zall_, whole, zrank_);
  zgrad_ = Tensor::zeros(DType::F32, {zS_});
  if (ema_) {  // the EMA of this rank's blocks (the same update, element by element)
    std::vector<const Tensor*> shadows;
    for (const Tensor& t : ema_->shadow()) shadows.push_back(&t);
    Tensor block = pack_block(zall_, shadows, zrank_);
    ema_->shadow().assign(1, block);
  }
  // modules: parameters in the order nodes first read them, cut into runs of about total / kModules bytes
  std::vector<int> first(graph_.values.size(), (int)graph_.nodes.size());
  for (size_t k = graph_.nodes.size(); k-- > 0;)
    for (int v : graph_.nodes[k].inputs)
      if (v >= 0) first[v] = (int)k;
  std::vector<size_t> order(trainable_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return first[trainable_[a]] < first[trainable_[b]]; });
  const int64_t total = std::accumulate(zn_.begin(), zn_.end(), int64_t(0)) * 4;
  const int64_t target = zero3_module_bytes(total);
  zmod_of_.assign(trainable_.size(), -1);
  zpos_.assign(trainable_.size(), -1);
  int64_t bytes = target;
  for (size_t p : order) {
    if (bytes >= target) {
      zmod_.emplace_back();
      bytes = 0;
    }
    ZLayout& l = zmod_.back();
    zmod_of_[p] = (int)zmod_.size() - 1;
    zpos_[p] = (int)l.params.size();
    l.params.push_back(p);
    l.off.push_back(l.S);
    l.S += zc_[p];
    bytes += zn_[p] * 4;
  }
  zpending_.assign(zmod_.size(), {});
  zdone_.assign(zmod_.size(), 0);
  int64_t largest = 0;
  for (const ZLayout& l : zmod_) {
    int64_t b = 0;
    for (size_t p : l.params) b += zn_[p] * 4;
    largest = std::max(largest, b);
  }
  note("wxe: --shard-weights: ZeRO-3 over dp x domain = %d ranks: %zu modules of %.2f MB on average (the largest "
       "%.2f MB), gathered before the nodes that read them\n",
       zparts_, zmod_.size(), total / 1e6 / zmod_.size(), largest / 1e6);
  whole_parameters(false);
  ParamResidency r;
  for (const ZLayout& l : zmod_) r.modules.push_back(l.params);
  r.fetch = [this](int m) { fetch_module(m); };
  // WXE_SHARD_PREFETCH=1: the next module's gather started while this one computes (off: Open
  // MPI's non-blocking collectives progress only inside MPI calls, and it gained nothing here:
  // docs/internals/memory-plan.md#zero-3---shard-weights)
  const char* pre = std::getenv("WXE_SHARD_PREFETCH");
  if (pre && std::string(pre) == "1")
    r.prefetch = [this](int m) {
      if (zflight_.m < 0) start_module_gather(m);
    };
  r.evict = [this](int m) { evict_module(m); };
  r.grad_done = [this](size_t p, Tensor g) { module_grad(p, std::move(g)); };
  exec_->set_param_residency(std::move(r));  // which frees the executor's whole gradients
  malloc_trim(0);  // the whole parameters and gradients freed above leave the heap's pages
}

// Module m's blocks packed and their all-gather over the dp x domain ranks started.
void Trainer::start_module_gather(int m) {
  const ZLayout& l = zmod_[m];
  Tensor shard(DType::F32, {l.S});
  for (size_t i = 0; i < l.params.size(); ++i)
    std::memcpy(shard.data<float>() + l.off[i], zparam_.data<float>() + zoff_[l.params[i]],
                zc_[l.params[i]] * sizeof(float));
  zflight_.m = m;
  zflight_.all = Tensor(DType::F32, {zparts_ * l.S});
  zflight_.req = zcomm_->start_all_gather(shard, zflight_.all);
  zflight_.shard = std::move(shard);
  zgathered_ += zflight_.all.nbytes();  // counted as gathered from now on
  zgathered_peak_ = std::max(zgathered_peak_, zgathered_);
}

void Trainer::fetch_module(int m) {
  if (zflight_.m != m) {  // none or another module was prefetched (every rank did the same): finished, unused
    drop_module_gather();
    start_module_gather(m);
  }
  zflight_.req->wait();
  zgathered_ -= zflight_.all.nbytes();
  const ZLayout& l = zmod_[m];
  std::vector<Tensor*> whole;
  for (size_t p : l.params) {
    Tensor& c = *graph_.values[trainable_[p]].constant;
    c = Tensor(DType::F32, c.shape);
    whole.push_back(&c);
    zgathered_ += c.nbytes();
  }
  unpack_blocks(l, zflight_.all, whole);
  zflight_ = ModuleGather{};
  zgathered_peak_ = std::max(zgathered_peak_, zgathered_);
}

void Trainer::drop_module_gather() {
  if (zflight_.req) {
    zflight_.req->wait();
    zgathered_ -= zflight_.all.nbytes();
  }
  zflight_ = ModuleGather{};
}

void Trainer::evict_module(int m) {
  for (size_t p : zmod_[m].params) {
    Tensor& c = *graph_.values[trainable_[p]].constant;
    if (c.defined()) zgathered_ -= c.nbytes();
    c = c.shape_only();
  }
}

void Trainer::module_grad(size_t p, Tensor&& g) {
  const int m = zmod_of_[p];
  std::vector<Tensor>& pending = zpending_[m];
  const ZLayout& l = zmod_[m];
  pending.resize(l.params.size());
  pending[zpos_[p]] = std::move(g);
  if (++zdone_[m] < l.params.size()) return;
  // every gradient of the module is complete: this rank's blocks of their dp sums, added to the step's
  std::vector<const Tensor*> grads;
  for (const Tensor& t : pending) grads.push_back(&t);
  Tensor shard = reduce_scatter_grads(l, grads);
  pending.clear();
  zdone_[m] = 0;
  for (size_t i = 0; i < l.params.size(); ++i) {
    float* dst = zgrad_.data<float>() + zoff_[l.params[i]];
    const float* src = shard.data<float>() + l.off[i];
    for (int64_t j = 0; j < zc_[l.params[i]]; ++j) dst[j] += src[j];
  }
}

void Trainer::whole_parameters(bool whole) {
  if (!z3_) return;
  std::vector<Tensor*> params;
  for (int v : trainable_) {
    Tensor& c = *graph_.values[v].constant;
    c = whole ? Tensor(DType::F32, c.shape) : c.shape_only();
    params.push_back(&c);
  }
  if (whole) gather_blocks(zall_, zparam_, params, false);
}

}  // namespace wxe
