// CPU fusion passes: Graph -> Graph rewrites that leave the numbers the same (up to float
// rounding) and let the CPU fast kernels do less work. Each pass runs and is tested alone;
// optimize_for_cpu() runs them all. They run on a simplified graph (static shapes) and after
// the tensor-parallel sharding (the executor applies them to its own copy of the graph, so
// `wxe infer --tp` shards the plain graph), and they leave alone what they do not recognise.
//
// The fused ops are CPU ops (kernels/cpu) with a shape rule, a plain reference kernel and a
// fast kernel, like every other op:
//   ChannelLayerNorm(x, g, b; epsilon)  LayerNorm over axis 1 of (N, C, ...): CREDIT's
//                                        channel LayerNorm, g and b with C elements
//   Gelu(x)                              the ONNX op (approximate "none")
//   Linear(..., activation="gelu")       Linear followed by Gelu
//   WindowAttention(x, Wq, Wk, Wv, Wo, bo, bias, residual; ...)  see fuse_window_attention
//   ConvChannelsLast(x, W, b)            Conv of a channels-last (N, H, W, C) input (and output)
//   DepthToSpaceChannelsLast(x)          DepthToSpace of a channels-last tensor
//
// The passes live by concern: fuse_conv.cpp (convolutions: pads, output phases, channels-last),
// fuse_layout.cpp (data movement: identity ops, plane gathers, needed rows), fuse_norm.cpp
// (GELU, channel LayerNorm, Linear + GELU), fuse_attention.cpp (window attention, inference and
// training), fuse.cpp (weight and precision marks, the two pipelines); fuse_util.h holds the
// helpers they share.
#pragma once
#include "engine/ir/graph.h"

namespace wxe {

// Pad (mode constant, value 0, spatial axes only) feeding a Conv: the pads move into the
// Conv's pads; the Pad goes when nothing else reads it.
void fold_pad_into_conv(Graph& g);

// A 2-D Conv with stride 2, at most 4 output channels, a kernel of at least 8 and an even
// output size becomes a stride-4 Conv with 4x the output channels (one per output phase
// (y % 2, x % 2); the kernel grows by 2 and is zero where the phase shifts it) followed by
// DepthToSpace(CRD, 2). Same sums in the same order; oneDNN pads output channels to 16, so
// the narrow conv wasted 3/4 of its work. With `fft`, not a conv the float32 CPU kernel runs by
// FFT (engine/math/fft_conv_plan.h: cheaper as it is); Precision::BF16 splits those too (the
// bfloat16 direct kernel is the faster there).
void split_conv_output_phases(Graph& g, bool fft = true);

// Ops that copy their input unchanged go (their readers read the input): Resize to the
// input's own size (nearest or linear, any coordinate mode but tf_crop_and_resize) and
// Concat of one input.
void remove_identity_ops(Graph& g);

// A chain of Slice, Concat and Pad (reflect, edge, wrap) nodes on the last two dims of one
// float32 value (Squeeze, Unsqueeze, Reshape and Identity of its leading dims in between), whose
// intermediates nothing else reads, becomes one PlaneGather(x, map): every output element of a
// plane copied from the element of x's plane the chain takes it from (the map, int32, made by
// running the chain on the plane's element numbers). CREDIT's earth padding (11 Slice and
// Concat nodes, five full copies of the input), its mirror padding (longitude wrap, reflect Pad)
// and the crop after the last layer each become one pass over memory.
void fuse_plane_gathers(Graph& g);

// Conv nodes (nchw, 2-D) of which the graph reads only some output rows (a crop after the
// last layers: PlaneGather; through DepthToSpace and other such convs) get the attribute
// rows = (lo, hi): rows [lo, hi) are exact, the others zero (the kernel may skip them; one
// that does not computes them, as without the attribute). CREDIT's v2026 decoder: the last two
// convolutions compute 71 % of their rows.
void mark_needed_rows(Graph& g);

// Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5 (as torch exports nn.GELU) becomes Gelu(x).
void fuse_gelu(Graph& g);

// CREDIT's channel LayerNorm as exported, (x - mean) / sqrt(var + eps) * g + b over axis 1
// (ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, Mul, Add), becomes ChannelLayerNorm.
void fuse_channel_layernorm(Graph& g);

// Linear whose only reader is a Gelu becomes Linear with activation "gelu".
void fuse_linear_gelu(Graph& g);

// CREDIT's window attention (short: contiguous windows; long: strided tokens) as exported,
// from the image to the image:
//   x (B, D, H, W) -> Reshape (B, D, A, a, C, c) -> Transpose -> Reshape (windows, D, th, tw)
//   -> Linear q, k, v (axis 1, no bias) -> per head: Reshape, Transpose, Reshape (windows,
//   heads, T, dh) -> q * scale -> Einsum q k^T + bias -> Softmax -> Einsum with v -> Reshape,
//   Transpose, Reshape -> Linear out (axis 1) -> Reshape, Transpose, Reshape (B, D, H, W)
//   [-> Add residual]
// becomes WindowAttention(x, Wq, Wk, Wv, Wo, bo, bias, residual) (kernels/cpu/window_attention.h).
void fuse_window_attention(Graph& g);

// The same attention in the training graph (prepare_training_graph, after tp sharding), where
// the projections are Linear nodes or, with spectral norm, 1x1 Conv nodes reading SpectralNorm
// outputs (a fused to_qkv: one Conv and three Slices, or a Split, of its output), the position
// bias is computed (the DynamicPositionBias MLP stays live: (T, T), every head adding it) and,
// under --tp, the windows reach the projections through a CopyToTP and the row-parallel to_out
// ends in AllReduceTP and the Add of its bias:
//   becomes WindowAttention(x, Wq, Wk, Wv, Wo, bo, bias) (Wk, Wv omitted for a fused to_qkv),
//   or under tp CopyToTP(x) -> WindowAttention(.., no bo) -> AllReduceTP -> Add bo, on the
//   image (all-reducing and adding a per-channel bias commute with the window layout).
// With sequence parallelism (parallel/bands.h) a tp-sharded block's windows are
// made from the gathered image (AllGatherTP before the windows, ReduceScatterTP after the
// image): it fuses with its collectives outside. A block tp cannot shard runs on bands of
// windows (batch 1), fused the same way on the rank's windows.
// The residual Add stays. The fused node is named after the block's scope
// ("/<block>/WindowAttention"), so checkpoint_segments puts it in the attention block. Its
// backward (kernels/cpu/backward_attention.cpp) reads x, the weights and the bias, and
// recomputes the rest.
void fuse_window_attention_training(Graph& g);

// Every spatial Conv (not 1x1) becomes Transpose(0, 2, 3, 1) -> ConvChannelsLast with a
// channels-last output -> Transpose(0, 3, 1, 2): oneDNN runs these convs channels-last
// anyway, and as graph nodes the layout changes are planned activations rather than scratch
// the conv kernel keeps, and convs reading one tensor share its Transpose (CREDIT's
// cross-embedding layers read one input with 2 to 4 kernel sizes). Not 3x3 stride-1 convs:
// their CPU kernel (Winograd, kernels/cpu/conv_winograd.h) reorders bands of rows into its own
// blocked layout from NCHW as from NHWC, so Transposes around them would be pure cost
// (wxformer_v2026's up-blocks: 0.3 to 5.5 ms each, and 32 MB less peak RSS). With `fft`, not
// convs by FFT either (their transforms read planes).
void conv_channels_last(Graph& g, bool fft = true);

// Transpose(0, 3, 1, 2) -> DepthToSpace -> Transpose(0, 2, 3, 1), with nothing else reading
// the intermediates (a pixel-shuffle between two channels-last convs), becomes one
// DepthToSpaceChannelsLast.
void depth_to_space_channels_last(Graph& g);

// Conv, ConvTranspose, ConvChannelsLast and Linear nodes whose weights are constants get the
// attribute constant_weights = 1: their fast kernel may keep the weights reordered for oneDNN
// (or converted to bf16) between runs (kernels/cpu/dnnl.cpp). Only for graphs whose constants nothing writes while they run
// (inference; not an optimizer updating weights in place).
void mark_constant_weights(Graph& g);

enum class Precision { F32, BF16 };

// Conv, ConvChannelsLast and Linear nodes get the attribute precision = "bf16": their oneDNN
// kernel multiplies bfloat16 activations and weights, accumulating in float32 (about 3
// significant digits per product instead of 7; twice as fast where the CPU has avx512_bf16).
// The attention scores and everything else stay float32.
void use_bf16(Graph& g);

// All of the above, in order (use_bf16 only for Precision::BF16).
void optimize_for_cpu(Graph& g, Precision precision = Precision::F32);

// The fusions a training graph takes (their ops have CPU backward kernels): remove_identity_ops
// (a Resize to the grid's own size copies nothing), fold_pad_into_conv (the padded copy is then
// not kept for the weight gradient), fuse_gelu, fuse_channel_layernorm and
// fuse_window_attention_training. Their backward reads x where the exported chains kept
// several intermediates for it (engine/ir/ops.h BackwardReads), and runs one kernel instead of
// 5 or 9. The Linear before a Gelu stays apart from it: the Gelu's input is kept for its backward
// and its output made again there (the trainer's add_recompute_segments on the CPU, passes.h),
// which is cheaper than a Linear with activation "gelu" that recomputes its pre-activation by a
// GEMM (wxformer_v2026's step: Linear and GELU 271 -> 237 ms, the same memory). A fused node keeps the name of the node whose output it writes, so its
// module scope (checkpoint_segments) is the chain's; parameters keep their names and storage
// (value ids change: compact_values). Run after tp sharding (the plan matches the exported
// chains); the trainer runs it on host-memory backends (a GPU backend picks its own:
// Backend::prepare_training).
void fuse_for_training(Graph& g);

}  // namespace wxe
