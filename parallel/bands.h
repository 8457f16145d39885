// Layer: parallel/. Activations split into bands of latitude rows over a group of ranks, two ways:
//   - sequence_parallel: Megatron-LM's sequence parallelism over the tp group, for a training
//     graph that shard_training_graph (parallel/shard.h) has split over tp ranks;
//   - domain_parallel: CREDIT's domain parallelism (credit/domain_parallel) over the domain
//     group (parallel/mesh.h), for inference and training graphs, tp-sharded or not.
// Both follow one band through the graph with the rules below; they differ in where bands
// start and which group the collectives use.
//
// Sequence parallelism.
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
//   - Bands also start at the first convolution (the stage-0 cross-embedding): the whole input
//     is cut to the rank's band by ScatterTP, and each convolution reading it takes its halo by
//     HaloTP, below, which the backward exchanges again (add_recompute_segments) rather than
//     keeping a band with a halo for each kernel: the input is kept once, as a band.
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
//   - The band follows the window layout (Reshape/Transpose that keep it one axis, batch 1):
//     blocks tp cannot shard (too few heads) attend within each rank's windows; per-token
//     Linear, Softmax, Einsum along the band's letter, Slices on other axes, ConvTranspose with
//     kernel rows = stride and DepthToSpace keep it too.
//   - A window layout whose windows take rows from several bands (CrossFormer's long-distance
//     attention, windows taller than a band, attention along columns) in a block tp does not
//     shard: the image is gathered and the windows (the layout's leading axis) shared out
//     instead (ScatterTP at the first step of the layout where they are one axis), each rank
//     attending its share, exactly as one process does.
//   - GroupNorm (exported as Reshape to (N, G, -1), InstanceNormalization, Reshape back): the
//     statistics of each group are sums over the group (AllReduceTP with grad "sum"): the
//     mean, then the variance about it.
//   - Bands along different axes meeting at an elementwise op are brought back to the rows.
//   - A crop of the grid (a Slice of rows and columns of an (N, C, H, W) band: CREDIT's crop of
//     its padded image) is the gather itself: AllGatherTP with attribute crop makes only the
//     cropped tensor, the whole padded one never exists on a rank; its backward takes the
//     rank's band of the gradient, zeros outside the crop.
// Still whole (gathered): anything not listed (a Resize of the grid, a layout whose windows
// cannot be shared evenly). Only axes tp divides are cut; the rest stay replicated.
// The answer is tp 1's up to the order of float sums. Collectives: parallel/collective_ops.h.
//
// Domain parallelism. Domain rank d of D holds rows [d H/D, (d+1) H/D) of every activation
// that can be split so. Bands start at the first convolution that can run on them (the
// stage-0 cross-embedding: its input, whole on every rank, is cut by ScatterTP to the band
// with the convolution's halo rows, no exchange; so are the inputs of later convolutions that
// find their input whole; in training, to the band alone, each convolution's halo by HaloTP,
// as sequence parallelism does). The rules above carry them through the encoder, the decoder and
// the skip connections, all attention blocks as the unsharded ones above; and the tp
// collectives (AllReduceTP, CopyToTP) act on bands row by row: dp x tp x domain. Boundary
// padding (CREDIT's earth / mirror) and a final Resize read the whole grid: the input side
// runs on the whole input before the first convolution, the output side after the last band is
// gathered (a final crop is the gather, above). Every replicated parameter a band op reads
// gets a CopyToTP over the domain group (training): its gradient is the sum of every band's.
// The loss is computed on the gathered output, so its latitude weights and mean are the whole
// grid's. All collectives the pass adds carry attribute group "domain". Domain 1: nothing.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace wxe {

struct BandStats {
  int reduce_scatters = 0;     // AllReduceTP nodes that became ReduceScatterTP
  int gathers = 0;             // AllGatherTP before column-parallel layers (each replaces a CopyToTP)
  int replicated_gathers = 0;  // AllGatherTP before replicated ops
  int scatters = 0;            // ScatterTP nodes: replicated activations cut to bands
  int copies = 0;              // CopyToTP nodes on replicated operands of band ops
  int halos = 0;               // HaloTP nodes: convolutions taller than a row on bands
  int group_norms = 0;         // GroupNorms with statistics summed over the group (domain)
  int64_t halo_bytes = 0;      // bytes of halo rows a band between two others receives per forward
  std::map<std::string, int> gathered_for;  // op type -> nodes that read a gathered band (replicated_gathers)
};
using SequenceParallelStats = BandStats;

// Rewrites a graph sharded by shard_training_graph for tp ranks; nothing for tp 1.
BandStats sequence_parallel(Graph& g, int tp);

// Rewrites an inference (training: `training`) graph, tp-sharded or not, for domain ranks;
// nothing for domain 1.
BandStats domain_parallel(Graph& g, int domain, bool training);

// engine/passes/passes.h add_recompute_segments seeded with each AllGatherTP with grad "sum" and
// each HaloTP: the backward gathers the band again (exchanges the halo rows again) rather than
// keeping the whole activation (the band with its halo) the layers read.
void add_recompute_segments(const Graph& g, std::vector<int>& segments);

}  // namespace wxe
