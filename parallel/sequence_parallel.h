// Layer: parallel/. Sequence parallelism (Megatron-LM's, along latitudes) for a training graph
// that shard_training_graph (parallel/shard.h) has split over tp ranks.
//
// Tensor parallelism leaves the regions between a row-parallel layer and the next
// column-parallel one replicated: the residual stream and the channel LayerNorms hold whole
// (N, C, H, W) activations on every rank, and the backward keeps them. Here those regions hold
// bands of rows instead: rank r keeps rows [r H/T, (r+1) H/T) of each (axis 2).
//   - A row-parallel layer's AllReduceTP, with the window layout that follows it back to
//     (N, C, H, W) (Reshape/Transpose) and its bias, becomes: the layout on the partial sums,
//     ReduceScatterTP (each rank the sum of its band), then the bias on the band.
//   - Per-pixel ops on bands (elementwise ops, reductions over channels) stay on bands; a
//     replicated operand that broadcasts along the rows (a norm's gain, a bias) gets a CopyToTP
//     (its gradient is the sum of the ranks' bands); a whole replicated activation meeting a band
//     (the residual entering a stage) is cut to the rank's band by ScatterTP.
//   - A convolution reading a band (a stage's cross-embedding, the decoder's convs) runs on it:
//     HaloTP brings the rows its kernel reaches in the bands above and below (zeros past the
//     grid's edges: its zero padding), and its output is a band. Its weights get a CopyToTP.
//     It needs the output rows to split as the input's (H = output rows x stride) and a halo no
//     taller than a band; explicit zero Pads in front fold into the Conv first.
//   - A band read by anything else is gathered (AllGatherTP) first. Where the reader leads, through
//     Reshape/Transpose only, to the CopyToTP of column-parallel layers (the norm's output going
//     into q/k/v or the feed-forward), that CopyToTP goes: the gather's backward reduce-scatters
//     the ranks' partial gradients (grad "sum"). Before replicated ops the backward keeps the rank's
//     band of the whole gradient (grad "slice").
// Only activations of rank 4 whose rows tp divides are cut; the rest stay replicated. The
// answer is tp 1's up to the order of float sums. Collectives: parallel/collective_ops.h.
#pragma once
#include <vector>

#include "engine/ir/graph.h"

namespace wxe {

struct SequenceParallelStats {
  int reduce_scatters = 0;     // AllReduceTP nodes that became ReduceScatterTP
  int gathers = 0;             // AllGatherTP before column-parallel layers (each replaces a CopyToTP)
  int replicated_gathers = 0;  // AllGatherTP before replicated ops
  int scatters = 0;            // ScatterTP nodes: replicated activations cut to bands
  int copies = 0;              // CopyToTP nodes on replicated operands of band ops
  int halos = 0;               // HaloTP nodes: convolutions taller than a row on bands
};

// Rewrites a graph sharded by shard_training_graph for tp ranks; nothing for tp 1.
SequenceParallelStats sequence_parallel(Graph& g, int tp);

// Activation checkpointing's segments (ExecOptions::segments, engine/passes/passes.h
// checkpoint_segments) plus, for each AllGatherTP with grad "sum" outside any segment, one
// segment of the gather, the Reshape/Transpose nodes after it and the layers reading their
// result: the backward gathers the band again rather than keeping the whole activation the
// layers read. `segments` empty: none yet.
void add_gather_segments(const Graph& g, std::vector<int>& segments);

}  // namespace wxe
