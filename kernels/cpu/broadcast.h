// Fast broadcasting between a tensor of shape `small` and one of shape `full` (numpy rules:
// small aligned to the right, each of its dims 1 or equal to full's): the forward copy
// (expand) and its transpose (the sum over the broadcast dims), which the gradients of every
// broadcasting op need (backward_pointwise.cpp, backward_layers.cpp).
//
// Adjacent dims that broadcast the same way are merged first, so the loops see a few dims and
// a contiguous innermost run: (B, C, H, W) against (1, C, 1, 1) becomes [B: broadcast]
// [C: kept] [H*W: broadcast]; against (C, 1, 1) the same; against a scalar one broadcast dim.
// Index arithmetic happens once per run, never per element.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/ir/tensor.h"

namespace wxe::cpu {

struct BroadcastPlan {
  std::vector<int64_t> size;  // merged dims of full, outermost first (at least one)
  std::vector<char> bcast;    // 1 where small is broadcast along the dim (its stride is 0)
  int64_t full = 1, small = 1;  // element counts
};

// Fails (always-on assert) unless small broadcasts to full.
BroadcastPlan broadcast_plan(const Shape& small, const Shape& full);

// dst (full) = src (small) broadcast, times scale (in double, then rounded to float).
void broadcast_expand(const BroadcastPlan& p, const float* src, float* dst, double scale = 1.0);

// dst (small) = scale * the sum of src (full) over the broadcast dims. Double accumulators;
// the summation order does not depend on the thread count. Parallel over dst's elements
// (or over fixed chunks of the sum when dst has very few).
void broadcast_sum(const BroadcastPlan& p, const float* src, float* dst, double scale = 1.0);

}  // namespace wxe::cpu
