#include "engine/passes/fuse.h"

namespace wxe {

void mark_constant_weights(Graph& g) {
  for (Node& n : g.nodes)
    if ((n.op == "Conv" || n.op == "ConvTranspose" || n.op == "ConvChannelsLast" || n.op == "Linear") &&
        n.inputs.size() > 1 &&
        n.inputs[1] >= 0 &&
        g.values[n.inputs[1]].is_const())
      n.attrs["constant_weights"] = attr_i(1);
}

void use_bf16(Graph& g) {
  for (Node& n : g.nodes)
    if (n.op == "Conv" || n.op == "ConvChannelsLast" || n.op == "Linear") n.attrs["precision"] = attr_s("bf16");
}

void optimize_for_cpu(Graph& g, Precision precision) {
  const bool fft = precision == Precision::F32;  // the bfloat16 convs run direct (kernels/cpu/dnnl.cpp)
  remove_identity_ops(g);
  fold_pad_into_conv(g);
  split_conv_output_phases(g, fft);
  fuse_gelu(g);
  fuse_channel_layernorm(g);
  fuse_linear_gelu(g);
  fuse_window_attention(g);
  fuse_plane_gathers(g);  // after the attention patterns, which may hold such chains
  conv_channels_last(g, fft);
  depth_to_space_channels_last(g);
  mark_constant_weights(g);
  mark_needed_rows(g);
  if (precision == Precision::BF16) use_bf16(g);
}

void fuse_for_training(Graph& g) {
  remove_identity_ops(g);  // CREDIT's interpolation to the grid's own size: no copy, no backward
  fold_pad_into_conv(g);
  fuse_gelu(g);
  fuse_channel_layernorm(g);
  fuse_window_attention_training(g);
  fuse_plane_gathers(g);
  mark_needed_rows(g);
}

}  // namespace wxe
