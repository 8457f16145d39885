// ZeRO-1 over the dp x domain ranks (train/trainer.h): every trainable parameter cut into blocks,
// this rank's blocks packed into one flat tensor the optimizer updates; the gradient
// reduce-scatter and the parameter and moment all-gathers.
#include <algorithm>
#include <cstring>

#include "train/trainer.h"

namespace wxe {

std::pair<int64_t, int64_t> Trainer::block_range(size_t p, int block) const {
  const int64_t a = std::min(zn_[p], block * zc_[p]);
  return {a, std::min(zn_[p], a + zc_[p])};
}

void Trainer::pack_block_into(const std::vector<const Tensor*>& per_param, int block, float* flat) const {
  std::memset(flat, 0, zS_ * sizeof(float));
  for (size_t p = 0; p < per_param.size(); ++p) {
    auto [a, b] = block_range(p, block);
    std::memcpy(flat + zoff_[p], per_param[p]->data<float>() + a, (b - a) * sizeof(float));
  }
}

Tensor Trainer::pack_block(const std::vector<const Tensor*>& per_param, int block) const {
  Tensor flat(DType::F32, {zS_});
  pack_block_into(per_param, block, flat.data<float>());
  return flat;
}

void Trainer::unpack_block(const float* flat, int block, const std::vector<Tensor*>& per_param) const {
  for (size_t p = 0; p < per_param.size(); ++p) {
    auto [a, b] = block_range(p, block);
    std::memcpy(per_param[p]->data<float>() + a, flat + zoff_[p], (b - a) * sizeof(float));
  }
}

Tensor Trainer::reduce_scatter_grads(const std::vector<const Tensor*>& grads) const {
  if (dp_ == 1) return pack_block(grads, zrank_);  // nothing to sum: the domain rank's block
  // blocks in zrank order: dp group d's domain blocks d x domain .. d x domain + domain - 1 in a row
  Tensor all(DType::F32, {zparts_ * zS_}), group(DType::F32, {domain_ * zS_}), shard(DType::F32, {zS_});
  for (int b = 0; b < zparts_; ++b) pack_block_into(grads, b, all.data<float>() + b * zS_);
  mesh_->dp_comm->reduce_scatter_sum(all, group);
  std::memcpy(shard.raw(), group.data<float>() + domain_rank_ * zS_, zS_ * sizeof(float));
  return shard;
}

bool Trainer::gather_blocks(const Tensor& shard, const std::vector<Tensor*>& per_param, bool lead_only) const {
  if (zparts_ == 1) {
    unpack_block(shard.data<float>(), 0, per_param);
    return true;
  }
  Tensor group = shard, all;
  if (domain_ > 1) {
    group = Tensor(DType::F32, {domain_ * zS_});
    mesh_->domain_comm->all_gather(shard, group);
  }
  if (dp_ > 1) {
    all = Tensor(DType::F32, {zparts_ * zS_});
    mesh_->dp_comm->all_gather(group, all);
  } else {
    all = group;
  }
  if (lead_only && zrank_ != 0) return false;
  for (int b = 0; b < zparts_; ++b) unpack_block(all.data<float>() + b * zS_, b, per_param);
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

}  // namespace wxe
