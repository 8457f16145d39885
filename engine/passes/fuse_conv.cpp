#include "engine/passes/fuse.h"

#include <algorithm>
#include <map>

#include "engine/math/conv_phases.h"
#include "engine/math/fft_conv_plan.h"
#include "engine/passes/fuse_util.h"
#include "engine/passes/passes.h"

namespace wxe {

using namespace fuse_util;

void fold_pad_into_conv(Graph& g) {
  std::vector<int> prod = g.producers();
  bool changed = false;
  for (Node& n : g.nodes) {
    if (n.op != "Conv" || n.inputs.empty() || n.inputs[0] < 0 || prod[n.inputs[0]] < 0) continue;
    const Node& p = g.nodes[prod[n.inputs[0]]];
    if (p.op != "Pad" || p.s("mode", "constant") != "constant" || p.inputs.size() < 2) continue;
    if (p.inputs.size() > 3 && p.inputs[3] >= 0) continue;  // axes: not in these models
    float cv = 0;
    if (p.inputs.size() > 2 && p.inputs[2] >= 0 && !(const_f32_scalar(g, p.inputs[2], &cv) && cv == 0.f))
      continue;
    if (p.inputs[1] < 0 || !g.values[p.inputs[1]].is_const()) continue;
    const std::vector<int64_t> pads = g.values[p.inputs[1]].constant->to_i64();
    const size_t r = g.values[p.inputs[0]].shape.size();
    if (r < 3 || pads.size() != 2 * r || pads[0] || pads[1] || pads[r] || pads[r + 1]) continue;
    if (std::any_of(pads.begin(), pads.end(), [](int64_t v) { return v < 0; })) continue;
    const std::string ap = n.s("auto_pad", "NOTSET");
    if (ap != "NOTSET" && !ap.empty()) continue;
    const size_t ns = r - 2;
    std::vector<int64_t> cp = n.ints("pads", std::vector<int64_t>(2 * ns, 0));
    if (cp.size() != 2 * ns) continue;
    for (size_t i = 0; i < ns; ++i) {
      cp[i] += pads[2 + i];
      cp[ns + i] += pads[r + 2 + i];
    }
    n.attrs["pads"] = attr_ints(cp);
    n.inputs[0] = p.inputs[0];
    changed = true;
  }
  if (changed) eliminate_dead_nodes(g);
}

namespace {

// A Conv with constant weights that the CPU kernel runs by FFT (engine/math/fft_conv_plan.h):
// the passes below leave it as it is.
bool by_fft(const Graph& g, const Node& n) {
  if (n.op != "Conv" || n.inputs.size() < 2 || n.inputs[0] < 0 || n.inputs[1] < 0) return false;
  const Value& x = g.values[n.inputs[0]];
  const Value& w = g.values[n.inputs[1]];
  const Value& y = g.values[n.outputs[0]];
  const std::vector<int64_t> st = n.ints("strides", {1, 1});
  const std::string ap = n.s("auto_pad", "NOTSET");
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4 || x.dtype != DType::F32 || !w.is_const() ||
      n.i("group", 1) != 1 || n.ints("dilations", {1, 1}) != std::vector<int64_t>{1, 1} || st.size() != 2 ||
      st[0] != st[1] || (ap != "NOTSET" && !ap.empty()))
    return false;
  return plan_fft_conv(x.shape[0], w.shape[1], w.shape[0], y.shape[2], y.shape[3], w.shape[2], w.shape[3], st[0], true)
             .F > 0;
}

}  // namespace

void split_conv_output_phases(Graph& g, bool fft) {
  std::vector<Node> out;
  bool changed = false;
  for (Node& n : g.nodes) {
    auto keep = [&] { out.push_back(std::move(n)); };
    if (n.op != "Conv" || n.inputs.size() < 2 || n.inputs[0] < 0 || n.inputs[1] < 0) {
      keep();
      continue;
    }
    const Value& x = g.values[n.inputs[0]];
    const Value& w = g.values[n.inputs[1]];
    const int bias = n.inputs.size() > 2 ? n.inputs[2] : -1;
    const Value& y = g.values[n.outputs[0]];
    const std::string ap = n.s("auto_pad", "NOTSET");
    const std::vector<int64_t> pads = n.ints("pads", {0, 0, 0, 0});
    const bool ok = x.shape.size() == 4 && x.dtype == DType::F32 && w.is_const() && w.dtype == DType::F32 &&
                    (bias < 0 || g.values[bias].is_const()) && n.i("group", 1) == 1 &&
                    (ap == "NOTSET" || ap.empty()) && n.ints("strides") == std::vector<int64_t>{2, 2} &&
                    n.ints("dilations", {1, 1}) == std::vector<int64_t>{1, 1} && pads.size() == 4 &&
                    w.shape[0] <= 4 && w.shape[2] >= 8 && w.shape[3] >= 8 && y.shape[2] % 2 == 0 &&
                    y.shape[3] % 2 == 0;
    if (!ok) {
      keep();
      continue;
    }
    const int64_t OC = w.shape[0], IC = w.shape[1], KH = w.shape[2], KW = w.shape[3];
    const int64_t H = x.shape[2], W = x.shape[3], OH = y.shape[2], OW = y.shape[3];
    if (fft && by_fft(g, n)) {  // cheaper by FFT as it is
      keep();
      continue;
    }
    const int64_t pe_h = phase_conv_end_pad(H, OH, KH, pads[0]), pe_w = phase_conv_end_pad(W, OW, KW, pads[1]);
    if (pe_h < 0 || pe_w < 0) {
      keep();
      continue;
    }
    Tensor w2 = Tensor::zeros(DType::F32, {4 * OC, IC, KH + 2, KW + 2});
    expand_phase_weights(w.constant->data<float>(), OC, IC, KH, KW, w2.data<float>());
    Node conv;
    conv.op = "Conv";
    conv.name = n.name + "/phases";
    conv.attrs["strides"] = attr_ints({4, 4});
    conv.attrs["pads"] = attr_ints({pads[0], pads[1], pe_h, pe_w});
    conv.inputs = {n.inputs[0], g.add_constant(w.name + ".phases", std::move(w2))};
    if (bias >= 0) {
      const Tensor& bt = *g.values[bias].constant;
      Tensor b2(DType::F32, {4 * OC});
      for (int64_t o = 0; o < 4 * OC; ++o) b2.data<float>()[o] = bt.data<float>()[o / 4];
      conv.inputs.push_back(g.add_constant(g.values[bias].name + ".phases", std::move(b2)));
    }
    conv.outputs = {add_value(g, conv.name + "_output_0")};
    set_shapes(g, conv);
    Node d2s;
    d2s.op = "DepthToSpace";
    d2s.name = n.name + "/phases_to_space";
    d2s.attrs["blocksize"] = attr_i(2);
    d2s.attrs["mode"] = attr_s("CRD");
    d2s.inputs = conv.outputs;
    d2s.outputs = n.outputs;
    out.push_back(std::move(conv));
    out.push_back(std::move(d2s));
    changed = true;
  }
  g.nodes = std::move(out);
  if (changed) compact_values(g);
}

void conv_channels_last(Graph& g, bool fft) {
  // spatial convs the oneDNN path runs channels-last (kernels/cpu/dnnl.cpp, make_conv); not those by
  // FFT, whose transforms read planes
  auto eligible = [&](const Node& n) {
    if (n.op != "Conv" || n.inputs.size() < 2 || n.inputs[0] < 0 || n.inputs[1] < 0 || (fft && by_fft(g, n)))
      return false;
    const Value& x = g.values[n.inputs[0]];
    const Value& w = g.values[n.inputs[1]];
    if (x.shape.size() != 4 || x.dtype != DType::F32 || x.is_const() || !w.is_const() || n.i("group", 1) != 1)
      return false;
    const std::string ap = n.s("auto_pad", "NOTSET");
    const std::vector<int64_t> pads = n.ints("pads", {0, 0, 0, 0});
    const bool stride1 = n.ints("strides", {1, 1}) == std::vector<int64_t>{1, 1};
    const bool pointwise = w.shape[2] == 1 && w.shape[3] == 1 && stride1 &&
                           std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
    const bool winograd = w.shape[2] == 3 && w.shape[3] == 3 && stride1 &&
                          n.ints("dilations", {1, 1}) == std::vector<int64_t>{1, 1};
    return (ap == "NOTSET" || ap.empty()) && !pointwise && !winograd;
  };
  std::map<int, int> nhwc_of;  // value -> its channels-last Transpose's output
  std::vector<Node> out;
  for (Node& n : g.nodes) {
    if (!eligible(n)) {
      out.push_back(std::move(n));
      continue;
    }
    const int x = n.inputs[0];
    if (!nhwc_of.count(x)) {
      Node t;
      t.op = "Transpose";
      t.name = n.name + "/to_channels_last";
      t.attrs["perm"] = attr_ints({0, 2, 3, 1});
      t.inputs = {x};
      t.outputs = {add_value(g, g.values[x].name + "/channels_last")};
      set_shapes(g, t);
      nhwc_of[x] = t.outputs[0];
      out.push_back(std::move(t));
    }
    Node back;
    back.op = "Transpose";
    back.name = n.name + "/to_channels_first";
    back.attrs["perm"] = attr_ints({0, 3, 1, 2});
    back.outputs = n.outputs;
    n.op = "ConvChannelsLast";
    n.attrs["channels_last_output"] = attr_i(1);
    n.inputs[0] = nhwc_of[x];
    n.outputs = {add_value(g, n.name + "_output_channels_last")};
    set_shapes(g, n);
    back.inputs = n.outputs;
    out.push_back(std::move(n));
    out.push_back(std::move(back));
  }
  g.nodes = std::move(out);
}

void depth_to_space_channels_last(Graph& g) {
  Uses u(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& d2s = g.nodes[k];
    if (d2s.op != "DepthToSpace" || d2s.inputs.empty()) continue;
    const int first = u.only_for(d2s.inputs[0], 1);
    const int o = d2s.outputs[0];
    if (!node_is(g, first, "Transpose") || g.nodes[first].ints("perm") != std::vector<int64_t>{0, 3, 1, 2} ||
        u.is_output[o] || u.readers[o].size() != 1)
      continue;
    const int last = u.readers[o][0];
    if (!node_is(g, last, "Transpose") || g.nodes[last].ints("perm") != std::vector<int64_t>{0, 2, 3, 1}) continue;
    d2s.op = "DepthToSpaceChannelsLast";
    d2s.inputs = g.nodes[first].inputs;
    d2s.outputs = g.nodes[last].outputs;  // comes before the readers of the Transpose's output
    drop[first] = drop[last] = true;
  }
  if (std::none_of(drop.begin(), drop.end(), [](bool d) { return d; })) return;
  remove_nodes(g, drop);
}

}  // namespace wxe
