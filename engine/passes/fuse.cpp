#include "engine/passes/fuse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "engine/ir/ops.h"
#include "engine/math/conv_phases.h"
#include "engine/math/fft_conv_plan.h"
#include "engine/passes/passes.h"

namespace wxe {

namespace {

// Readers and producers of every value, rebuilt by each pass before it looks at the graph.
struct Uses {
  std::vector<int> producer;            // node index or -1
  std::vector<std::vector<int>> readers;  // node indices (a node reading a value twice is listed twice)
  std::vector<bool> is_output;
  explicit Uses(const Graph& g)
      : producer(g.producers()), readers(g.values.size()), is_output(g.values.size(), false) {
    for (size_t k = 0; k < g.nodes.size(); ++k)
      for (int i : g.nodes[k].inputs)
        if (i >= 0) readers[i].push_back((int)k);
    for (int o : g.outputs) is_output[o] = true;
  }
  // The node producing v, if v is an intermediate only that many reads use.
  int only_for(int v, size_t reads) const {
    if (v < 0 || is_output[v] || readers[v].size() != reads) return -1;
    return producer[v];
  }
};

bool const_f32_scalar(const Graph& g, int v, float* out) {
  if (v < 0 || !g.values[v].is_const()) return false;
  const Tensor& t = *g.values[v].constant;
  if (t.dtype != DType::F32 || t.numel() != 1) return false;
  *out = t.data<float>()[0];
  return true;
}

bool near(float a, double b, double rel = 1e-6) { return std::fabs(a - b) <= rel * std::fabs(b); }

// A new intermediate value whose shape the shape rule of its producer sets (set_shapes).
int add_value(Graph& g, const std::string& name) {
  Value v;
  v.name = name;
  return g.add_value(std::move(v));
}

void set_shapes(Graph& g, const Node& n) {
  std::vector<const Value*> in;
  for (int i : n.inputs) in.push_back(i < 0 ? nullptr : &g.values[i]);
  std::vector<TypeShape> ts = shape_rule(n.op)(n, in);
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    Value& v = g.values[n.outputs[k]];
    WXE_ASSERT(!v.shape_known || (v.shape == ts[k].shape && v.dtype == ts[k].dtype));
    v.dtype = ts[k].dtype;
    v.shape = ts[k].shape;
    v.shape_known = true;
  }
}

// Axes of a Reduce* node (attribute up to opset 17, input from 18), normalised; empty if not
// known.
std::vector<int64_t> reduce_axes(const Graph& g, const Node& n, int64_t rank) {
  std::vector<int64_t> axes = n.ints("axes");
  if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
    if (!g.values[n.inputs[1]].is_const()) return {};
    axes = g.values[n.inputs[1]].constant->to_i64();
  }
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  return axes;
}

// Node n computes the mean over axis 1 of a rank >= 2 value x, shaped (N, 1, ...):
// ReduceMean(x, axes [1], keepdims 1), or a Reshape of ReduceMean(x, axes [1], keepdims 0)
// (the dynamo exporter) to that shape. Returns x or -1.
int channel_mean_of(const Graph& g, const Uses& u, const Node& n) {
  const Node* r = &n;
  if (n.op == "Reshape") {
    const int k = u.only_for(n.inputs.empty() ? -1 : n.inputs[0], 1);
    if (k < 0 || g.nodes[k].op != "ReduceMean" || g.nodes[k].i("keepdims", 1) != 0) return -1;
    r = &g.nodes[k];
  }
  if (r->op != "ReduceMean" || r->inputs.empty() || r->inputs[0] < 0) return -1;
  const Value& x = g.values[r->inputs[0]];
  if (x.shape.size() < 2 || r->i("noop_with_empty_axes", 0) != 0) return -1;
  Shape kept = x.shape;
  kept[1] = 1;
  if (g.values[n.outputs[0]].shape != kept) return -1;
  return reduce_axes(g, *r, (int64_t)x.shape.size()) == std::vector<int64_t>{1} ? r->inputs[0] : -1;
}

// For a commutative binary node reading `v`: the other input, or -1.
int other_input(const Node& n, int v) {
  if (n.inputs.size() != 2) return -1;
  if (n.inputs[0] == v) return n.inputs[1];
  if (n.inputs[1] == v) return n.inputs[0];
  return -1;
}

// Per-channel parameter of a (N, C, ...) tensor: a float32 constant with C elements that
// broadcasts along axis 1 only ((C, 1, 1), (1, C, 1, 1), ...).
// (a constant, or in a training graph a value made from one: a CopyToTP of the parameter)
bool channel_param(const Graph& g, int v, const Shape& x) {
  if (v < 0 || g.values[v].dtype != DType::F32) return false;
  const Shape& p = g.values[v].shape;
  if (p.size() > x.size() || numel(p) != x[1]) return false;
  // the one non-1 dim (if C > 1) must line up with axis 1
  const size_t off = x.size() - p.size();
  for (size_t d = 0; d < p.size(); ++d)
    if (p[d] != 1 && off + d != 1) return false;
  return true;
}

}  // namespace

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

namespace {

// A node fuse_plane_gathers takes: float32 data movement on the last two dims, or a change of the
// leading dims only (the last two dims and the element count the same).
bool plane_movement(const Graph& g, const Node& n) {
  if (n.inputs.empty() || n.inputs[0] < 0 || n.outputs.size() != 1) return false;
  const Shape& xs = g.values[n.inputs[0]].shape;
  const Shape& ys = g.values[n.outputs[0]].shape;
  const int64_t r = (int64_t)xs.size();
  if (g.values[n.outputs[0]].dtype != DType::F32 || r < 2 || ys.size() < 2) return false;
  auto inner = [&](int64_t a) { return (a < 0 ? a + r : a) >= r - 2; };
  if (n.op == "Slice") {  // constant starts, ends, axes (given) and steps
    if (n.inputs.size() < 4 || n.inputs[3] < 0) return false;
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (n.inputs[i] >= 0 && !g.values[n.inputs[i]].is_const()) return false;
    for (int64_t a : g.values[n.inputs[3]].constant->to_i64())
      if (!inner(a)) return false;
    return true;
  }
  if (n.op == "Concat") {
    for (int v : n.inputs)
      if (v < 0 || g.values[v].is_const()) return false;
    return n.inputs.size() == 1 || inner(n.i("axis", 0));  // one input: a copy
  }
  if (n.op == "Pad") {  // reflect, edge or wrap (no constant fill) of the last two dims, pads given
    if (n.s("mode", "constant") == "constant" || n.inputs.size() < 2 || n.inputs[1] < 0 ||
        !g.values[n.inputs[1]].is_const() || (n.inputs.size() > 3 && n.inputs[3] >= 0))
      return false;
    const std::vector<int64_t> pads = g.values[n.inputs[1]].constant->to_i64();
    if ((int64_t)pads.size() != 2 * r) return false;
    for (int64_t a = 0; a < r - 2; ++a)
      if (pads[a] != 0 || pads[r + a] != 0) return false;
    return true;
  }
  if (n.op == "Squeeze" || n.op == "Unsqueeze" || n.op == "Reshape" || n.op == "Identity")
    return xs[r - 2] == ys[ys.size() - 2] && xs[r - 1] == ys.back() && numel(xs) == numel(ys);
  return false;
}

// The inputs of a plane_movement node that carry data (Slice's and Pad's others are constants).
std::vector<int> movement_data(const Node& n) {
  if (n.op == "Concat") return n.inputs;
  return {n.inputs[0]};
}

// s with every dim before the last two set to 1: one plane.
Shape one_plane(const Shape& s) {
  Shape r(s.size(), 1);
  r[s.size() - 2] = s[s.size() - 2];
  r.back() = s.back();
  return r;
}

}  // namespace

void fuse_plane_gathers(Graph& g) {
  Uses u(g);
  std::vector<bool> taken(g.nodes.size(), false), drop(g.nodes.size(), false);
  bool changed = false;
  for (size_t k = g.nodes.size(); k-- > 0;) {
    if (taken[k] || !plane_movement(g, g.nodes[k])) continue;
    taken[k] = true;
    // the chain ending at k: producers of data inputs whose every reader is in it already
    std::vector<int> members = {(int)k};
    auto member = [&](int p) { return std::find(members.begin(), members.end(), p) != members.end(); };
    for (bool grew = true; grew;) {
      grew = false;
      for (size_t m = 0; m < members.size(); ++m)
        for (int v : movement_data(g.nodes[members[m]])) {
          const int p = u.producer[v];
          if (p < 0 || member(p) || taken[p] || u.is_output[v] || !plane_movement(g, g.nodes[p])) continue;
          if (!std::all_of(u.readers[v].begin(), u.readers[v].end(), member)) continue;
          members.push_back(p);
          grew = true;
        }
    }
    if (members.size() < 2) continue;
    int src = -1;
    bool one_source = true;
    for (int m : members)
      for (int v : movement_data(g.nodes[m]))
        if (!member(u.producer[v])) {
          one_source = one_source && (src < 0 || src == v) && !g.values[v].is_const();
          src = v;
        }
    if (!one_source) continue;
    // run the chain on one plane of element numbers
    std::sort(members.begin(), members.end());
    std::map<int, Tensor> val;
    Tensor iota(DType::I32, one_plane(g.values[src].shape));
    for (int64_t i = 0; i < iota.numel(); ++i) iota.data<int32_t>()[i] = (int32_t)i;
    val[src] = iota;
    for (int m : members) {
      const Node& n = g.nodes[m];
      const Shape os = one_plane(g.values[n.outputs[0]].shape);
      if (n.op != "Slice" && n.op != "Concat" && n.op != "Pad") {
        val[n.outputs[0]] = val.at(n.inputs[0]).reshaped(os);
        continue;
      }
      std::vector<const Tensor*> in;
      for (int v : n.inputs) in.push_back(v < 0 ? nullptr : val.count(v) ? &val.at(v) : g.values[v].constant.get());
      Tensor out(DType::I32, os);
      std::vector<Tensor*> outs = {&out};
      kernel_for(n.op, KernelKind::Reference)(n, in, outs);
      val[n.outputs[0]] = out;
    }
    for (int m : members) taken[m] = true;
    Node& sink = g.nodes[k];
    const Shape ys = g.values[sink.outputs[0]].shape;  // a copy: add_constant below grows g.values
    Tensor map = val.at(sink.outputs[0]).reshaped({ys[ys.size() - 2], ys.back()});
    Node pg;
    pg.op = "PlaneGather";
    pg.name = sink.name;
    pg.inputs = {src, g.add_constant(sink.name + "/plane_map", map)};
    pg.outputs = sink.outputs;
    pg.attrs["lead"] = attr_ints(std::vector<int64_t>(ys.begin(), ys.end() - 2));
    for (int m : members) drop[m] = m != (int)k;
    sink = pg;
    changed = true;
  }
  if (!changed) return;
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
  compact_values(g);
}

void remove_identity_ops(Graph& g) {
  bool changed = false;
  for (Node& n : g.nodes) {
    if (n.inputs.empty() || n.inputs[0] < 0) continue;
    bool identity = n.op == "Concat" && n.inputs.size() == 1;
    if (n.op == "Resize") {
      const std::string mode = n.s("mode", "nearest");
      identity = (mode == "nearest" || mode == "linear") &&
                 n.s("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize" &&
                 g.values[n.inputs[0]].shape == g.values[n.outputs[0]].shape;
    }
    if (!identity) continue;
    n.op = "Identity";
    n.inputs.resize(1);
    n.attrs.clear();
    changed = true;
  }
  if (changed) remove_identities(g);
}

namespace {

// The x of Add(Erf(Div(x, sqrt 2) or Mul(x, 1/sqrt 2)), 1) in value v (nothing else reading
// its parts), or -1.
int gelu_erf_branch(const Graph& g, const Uses& u, int v) {
  const int ak = u.only_for(v, 1);
  if (ak < 0 || g.nodes[ak].op != "Add" || g.nodes[ak].inputs.size() != 2) return -1;
  const Node& a = g.nodes[ak];
  float one = 0;
  int e = -1;
  for (int side = 0; side < 2; ++side)
    if (const_f32_scalar(g, a.inputs[1 - side], &one) && one == 1.f) e = a.inputs[side];
  const int ek = u.only_for(e, 1);
  if (ek < 0 || g.nodes[ek].op != "Erf") return -1;
  const int dk = u.only_for(g.nodes[ek].inputs[0], 1);
  if (dk < 0 || g.nodes[dk].inputs.size() != 2) return -1;
  const Node& d = g.nodes[dk];
  float c = 0;
  if (!const_f32_scalar(g, d.inputs[1], &c)) return -1;
  if ((d.op == "Div" && near(c, std::sqrt(2.0))) || (d.op == "Mul" && near(c, std::sqrt(0.5)))) return d.inputs[0];
  return -1;
}

// For Mul node n with a scalar 0.5 operand: the other operand, else -1.
int half_of(const Graph& g, const Node& n) {
  float c = 0;
  if (n.op != "Mul" || n.inputs.size() != 2) return -1;
  for (int side = 0; side < 2; ++side)
    if (const_f32_scalar(g, n.inputs[1 - side], &c) && c == 0.5f) return n.inputs[side];
  return -1;
}

}  // namespace

void fuse_gelu(Graph& g) {
  Uses u(g);
  bool changed = false;
  for (Node& n : g.nodes) {
    if (n.op != "Mul" || n.inputs.size() != 2) continue;
    int x = -1;
    // Mul(Mul(x, E), 0.5) (torch.onnx.export) with E = Add(Erf(x / sqrt 2), 1)
    const int mk = u.only_for(half_of(g, n), 1);
    if (mk >= 0 && g.nodes[mk].op == "Mul" && g.nodes[mk].inputs.size() == 2)
      for (int side = 0; side < 2 && x < 0; ++side)
        if (gelu_erf_branch(g, u, g.nodes[mk].inputs[1 - side]) == g.nodes[mk].inputs[side])
          x = g.nodes[mk].inputs[side];
    // Mul(x, Mul(0.5, E)) (the dynamo exporter)
    for (int side = 0; side < 2 && x < 0; ++side) {
      const int hk = u.only_for(n.inputs[1 - side], 1);
      if (hk >= 0 && gelu_erf_branch(g, u, half_of(g, g.nodes[hk])) == n.inputs[side]) x = n.inputs[side];
    }
    if (x < 0 || g.values[x].dtype != DType::F32) continue;
    n.op = "Gelu";
    n.inputs = {x};
    n.attrs.clear();
    changed = true;
  }
  if (changed) eliminate_dead_nodes(g);
}

void fuse_channel_layernorm(Graph& g) {
  Uses u(g);
  bool changed = false;
  // match from the final Add(Mul(Div(...), g), b)
  for (Node& n : g.nodes) {
    if (n.op != "Add" || n.inputs.size() != 2) continue;
    int mk = -1, b = -1;
    for (int side = 0; side < 2 && mk < 0; ++side) {
      const int k = u.only_for(n.inputs[side], 1);
      if (k >= 0 && g.nodes[k].op == "Mul") {
        mk = k;
        b = n.inputs[1 - side];
      }
    }
    if (mk < 0) continue;
    const Node& mul = g.nodes[mk];
    int dk = -1, gain = -1;
    for (int side = 0; side < 2 && dk < 0; ++side) {
      const int k = u.only_for(mul.inputs[side], 1);
      if (k >= 0 && g.nodes[k].op == "Div") {
        dk = k;
        gain = mul.inputs[1 - side];
      }
    }
    if (dk < 0) continue;
    const Node& div = g.nodes[dk];
    // numerator: Sub(x, ReduceMean(x)); denominator: Sqrt(Add(ReduceMean(Sub^2), eps))
    const int sk = u.producer[div.inputs[0]];
    const int qk = u.only_for(div.inputs[1], 1);
    if (sk < 0 || qk < 0 || g.nodes[sk].op != "Sub" || g.nodes[qk].op != "Sqrt") continue;
    const Node& sub = g.nodes[sk];
    const int x = sub.inputs[0];
    if (x < 0 || sub.inputs[1] < 0 || u.producer[sub.inputs[1]] < 0 ||
        channel_mean_of(g, u, g.nodes[u.producer[sub.inputs[1]]]) != x)
      continue;
    const Shape& xs = g.values[x].shape;
    if (g.values[x].dtype != DType::F32 || !channel_param(g, gain, xs) || !channel_param(g, b, xs)) continue;
    const int ak = u.only_for(g.nodes[qk].inputs[0], 1);
    if (ak < 0 || g.nodes[ak].op != "Add") continue;
    const Node& add = g.nodes[ak];
    int vk = -1;
    float eps = 0;
    for (int side = 0; side < 2 && vk < 0; ++side)
      if (const_f32_scalar(g, add.inputs[1 - side], &eps) && add.inputs[side] >= 0 &&
          u.producer[add.inputs[side]] >= 0)
        vk = u.producer[add.inputs[side]];
    const int sq = vk < 0 ? -1 : channel_mean_of(g, u, g.nodes[vk]);
    const int sqk = sq < 0 ? -1 : u.producer[sq];
    if (sqk < 0) continue;
    const Node& square = g.nodes[sqk];
    int d = -1;  // the centred value that is squared
    float two = 0;
    if (square.op == "Mul" && square.inputs.size() == 2 && square.inputs[0] == square.inputs[1]) d = square.inputs[0];
    if (square.op == "Pow" && square.inputs.size() == 2 && const_f32_scalar(g, square.inputs[1], &two) && two == 2.f)
      d = square.inputs[0];
    if (d < 0 || u.producer[d] < 0) continue;
    const Node& sub2 = g.nodes[u.producer[d]];
    if (sub2.op != "Sub" || sub2.inputs[0] != x || sub2.inputs[1] < 0 || u.producer[sub2.inputs[1]] < 0 ||
        channel_mean_of(g, u, g.nodes[u.producer[sub2.inputs[1]]]) != x)
      continue;
    n.op = "ChannelLayerNorm";
    n.inputs = {x, gain, b};
    n.attrs.clear();
    n.attrs["epsilon"] = attr_f(eps);
    changed = true;
  }
  if (changed) eliminate_dead_nodes(g);
}

void fuse_linear_gelu(Graph& g) {
  Uses u(g);
  std::vector<bool> drop(g.nodes.size(), false);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    if (n.op != "Gelu" || n.s("approximate", "none") != "none" || n.inputs.empty()) continue;
    const int lk = u.only_for(n.inputs[0], 1);
    if (lk < 0 || g.nodes[lk].op != "Linear" || g.nodes[lk].has("activation")) continue;
    Node& l = g.nodes[lk];
    l.attrs["activation"] = attr_s("gelu");
    l.outputs[0] = n.outputs[0];  // the Linear comes first, so the order stays topological
    drop[k] = true;
  }
  if (std::none_of(drop.begin(), drop.end(), [](bool d) { return d; })) return;
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
  compact_values(g);
}

namespace {

// An einsum equation with its letters renamed in order of first appearance and spaces dropped:
// "b h i d, b h j d -> b h i j" -> "abcd,abed->abce".
std::string canonical_einsum(const std::string& eq) {
  std::string r;
  std::map<char, char> name;
  for (char c : eq) {
    if (c == ' ') continue;
    if (std::isalpha((unsigned char)c)) {
      if (!name.count(c)) name[c] = (char)('a' + name.size());
      r.push_back(name[c]);
    } else {
      r.push_back(c);
    }
  }
  return r;
}

// The window-attention match, value ids of the pattern (see fuse_window_attention).
struct AttnMatch {
  int x = -1, wq = -1, wk = -1, wv = -1, wo = -1, bo = -1, residual = -1;
  int out_node = -1;  // the node whose output the fused node writes
  int64_t heads = 0, th = 0, tw = 0;
  bool strided = false;
  float scale = 1;
  Tensor bias;  // (heads, T, T)
};

const std::vector<int64_t> kLocalPerm{0, 2, 4, 1, 3, 5};    // (B, A, C, D, a, c): windows (A, C)
const std::vector<int64_t> kStridedPerm{0, 3, 5, 1, 2, 4};  // (B, a, c, D, A, C): windows (a, c)

bool node_is(const Graph& g, int k, const char* op) { return k >= 0 && g.nodes[k].op == op; }

// CREDIT's window partition: x3 (nW, D, th, tw) = Reshape(Transpose(Reshape(x (B, D, H, W),
// (B, D, A, a, C, c)), perm)), perm kLocalPerm (windows (A, C)) or kStridedPerm (windows (a, c)).
// Sets x, strided, th, tw and the three nodes (x3's producer first); false if x3 is not made so.
struct WindowPartition {
  int x = -1;
  bool strided = false;
  int64_t th = 0, tw = 0;
  int nodes[3] = {-1, -1, -1};
};

bool window_partition(const Graph& g, const Uses& u, int x3, WindowPartition& w) {
  const int xt = u.producer[x3];
  if (!node_is(g, xt, "Reshape")) return false;
  const int tr = u.only_for(g.nodes[xt].inputs[0], 1);
  if (!node_is(g, tr, "Transpose")) return false;
  const std::vector<int64_t> perm = g.nodes[tr].ints("perm");
  w.strided = perm == kStridedPerm;
  if (perm != kLocalPerm && !w.strided) return false;
  const int r6 = u.only_for(g.nodes[tr].inputs[0], 1);
  if (!node_is(g, r6, "Reshape")) return false;
  w.nodes[0] = xt;
  w.nodes[1] = tr;
  w.nodes[2] = r6;
  w.x = g.nodes[r6].inputs[0];
  const Shape& xs = g.values[w.x].shape;                     // (B, D, H, W)
  const Shape& s6 = g.values[g.nodes[r6].outputs[0]].shape;  // (B, D, A, a, C, c)
  if (xs.size() != 4 || s6.size() != 6 || s6[0] != xs[0] || s6[1] != xs[1] || s6[2] * s6[3] != xs[2] ||
      s6[4] * s6[5] != xs[3] || g.values[w.x].dtype != DType::F32)
    return false;
  w.th = w.strided ? s6[2] : s6[3];
  w.tw = w.strided ? s6[4] : s6[5];
  return g.values[x3].shape == Shape{xs[0] * xs[2] * xs[3] / (w.th * w.tw), xs[1], w.th, w.tw};
}

// The node reading node k's output alone (and no graph output), else -1.
int sole_reader_of(const Graph& g, const Uses& u, int k) {
  const int v = g.nodes[k].outputs[0];
  return u.is_output[v] || u.readers[v].size() != 1 ? -1 : u.readers[v][0];
}

// The partition's inverse after node k, each node its input's one reader: Reshape to the
// transposed 6-D shape, the inverse Transpose, Reshape to x's (B, D, H, W). Sets its three nodes
// and returns the last, else -1.
int window_merge(const Graph& g, const Uses& u, int k, const WindowPartition& w, int nodes[3]) {
  const Node& tr = g.nodes[w.nodes[1]];
  const int y6 = sole_reader_of(g, u, k);
  if (!node_is(g, y6, "Reshape") || g.values[g.nodes[y6].outputs[0]].shape != g.values[tr.outputs[0]].shape)
    return -1;
  const int yt = sole_reader_of(g, u, y6);
  const std::vector<int64_t> perm = tr.ints("perm");
  std::vector<int64_t> inv(6);
  for (int i = 0; i < 6; ++i) inv[perm[i]] = i;
  if (!node_is(g, yt, "Transpose") || g.nodes[yt].ints("perm") != inv) return -1;
  const int yr = sole_reader_of(g, u, yt);
  if (!node_is(g, yr, "Reshape") || g.values[g.nodes[yr].outputs[0]].shape != g.values[w.x].shape) return -1;
  nodes[0] = y6;
  nodes[1] = yt;
  nodes[2] = yr;
  return yr;
}

// q, k or v as the attention reads it: Reshape(Transpose(Reshape(src, (nW, heads, dh, th, tw)),
// (0, 1, 3, 4, 2)), (nW, heads, T, dh)). Returns src ((nW, I, th, tw)) or -1; adds the three
// nodes to `nodes`.
int head_split_source(const Graph& g, const Uses& u, int v, std::vector<int>& nodes) {
  const int r2 = u.only_for(v, 1);
  if (!node_is(g, r2, "Reshape")) return -1;
  const int tr = u.only_for(g.nodes[r2].inputs[0], 1);
  if (!node_is(g, tr, "Transpose") || g.nodes[tr].ints("perm") != std::vector<int64_t>{0, 1, 3, 4, 2}) return -1;
  const int r1 = u.only_for(g.nodes[tr].inputs[0], 1);
  if (!node_is(g, r1, "Reshape")) return -1;
  const int src = g.nodes[r1].inputs[0];
  const Shape& ls = g.values[src].shape;                     // (nW, I, th, tw)
  const Shape& s1 = g.values[g.nodes[r1].outputs[0]].shape;  // (nW, heads, dh, th, tw)
  const Shape& s3 = g.values[v].shape;                       // (nW, heads, T, dh)
  if (ls.size() != 4 || s1.size() != 5 || s3.size() != 4 || s1[1] < 1 || ls[1] % s1[1] != 0) return -1;
  if (s1 != Shape{ls[0], s1[1], ls[1] / s1[1], ls[2], ls[3]} || s3 != Shape{ls[0], s1[1], ls[2] * ls[3], s1[2]})
    return -1;
  nodes.insert(nodes.end(), {r2, tr, r1});
  return src;
}

// q, k or v as the attention reads it: head_split_source of Linear(x3, W) (axis 1, no bias, no
// activation, constant W). Returns the Linear's node or -1.
int head_split_linear(const Graph& g, const Uses& u, int v) {
  std::vector<int> nodes;
  const int src = head_split_source(g, u, v, nodes);
  const int lin = src < 0 ? -1 : u.only_for(src, 1);
  if (!node_is(g, lin, "Linear")) return -1;
  const Node& l = g.nodes[lin];
  if (l.i("axis", -1) != 1 || l.has("activation") || (l.inputs.size() > 2 && l.inputs[2] >= 0) ||
      !g.values[l.inputs[1]].is_const())
    return -1;
  return lin;
}

bool match_window_attention(const Graph& g, const Uses& u, int softmax, AttnMatch& m) {
  const Node& sm = g.nodes[softmax];
  const Shape& ps = g.values[sm.outputs[0]].shape;  // (nW, heads, T, T)
  if (ps.size() != 4 || (sm.i("axis", -1) != -1 && sm.i("axis", -1) != 3)) return false;
  // scores + bias
  const int add = u.only_for(sm.inputs[0], 1);
  if (!node_is(g, add, "Add")) return false;
  int e1 = -1, bias = -1;
  for (int side = 0; side < 2 && e1 < 0; ++side) {
    const int k = u.only_for(g.nodes[add].inputs[side], 1);
    if (node_is(g, k, "Einsum") && g.values[g.nodes[add].inputs[1 - side]].is_const()) {
      e1 = k;
      bias = g.nodes[add].inputs[1 - side];
    }
  }
  if (e1 < 0 || canonical_einsum(g.nodes[e1].s("equation", "")) != "abcd,abed->abce") return false;
  const int mul = u.only_for(g.nodes[e1].inputs[0], 1);
  if (!node_is(g, mul, "Mul") || !const_f32_scalar(g, g.nodes[mul].inputs[1], &m.scale)) return false;
  // P v
  if (u.is_output[sm.outputs[0]] || u.readers[sm.outputs[0]].size() != 1) return false;
  const int e2 = u.readers[sm.outputs[0]][0];
  if (!node_is(g, e2, "Einsum") || g.nodes[e2].inputs[0] != sm.outputs[0] ||
      canonical_einsum(g.nodes[e2].s("equation", "")) != "abcd,abde->abce")
    return false;
  const int lq = head_split_linear(g, u, g.nodes[mul].inputs[0]);
  const int lk = head_split_linear(g, u, g.nodes[e1].inputs[1]);
  const int lv = head_split_linear(g, u, g.nodes[e2].inputs[1]);
  if (lq < 0 || lk < 0 || lv < 0) return false;
  const int x3 = g.nodes[lq].inputs[0];
  if (g.nodes[lk].inputs[0] != x3 || g.nodes[lv].inputs[0] != x3 || u.is_output[x3] || u.readers[x3].size() != 3)
    return false;
  m.wq = g.nodes[lq].inputs[1];
  m.wk = g.nodes[lk].inputs[1];
  m.wv = g.nodes[lv].inputs[1];
  const Shape& s3 = g.values[g.nodes[e1].inputs[1]].shape;  // (nW, heads, T, dh)
  m.heads = s3[1];
  const int64_t T = s3[2];
  WindowPartition wp;
  if (!window_partition(g, u, x3, wp) || wp.th * wp.tw != T) return false;
  m.x = wp.x;
  m.strided = wp.strided;
  m.th = wp.th;
  m.tw = wp.tw;
  // back: Reshape(Transpose(Reshape(o, (nW, heads, th, tw, dh)), (0, 1, 4, 2, 3)), (nW, I, th, tw))
  const int o1 = u.only_for(g.nodes[e2].outputs[0], 1) < 0 ? -1 : u.readers[g.nodes[e2].outputs[0]][0];
  if (!node_is(g, o1, "Reshape")) return false;
  const int o2 = u.readers[g.nodes[o1].outputs[0]].size() == 1 ? u.readers[g.nodes[o1].outputs[0]][0] : -1;
  if (!node_is(g, o2, "Transpose") || g.nodes[o2].ints("perm") != std::vector<int64_t>{0, 1, 4, 2, 3}) return false;
  const int o3 = u.readers[g.nodes[o2].outputs[0]].size() == 1 ? u.readers[g.nodes[o2].outputs[0]][0] : -1;
  if (!node_is(g, o3, "Reshape")) return false;
  const int lo = u.readers[g.nodes[o3].outputs[0]].size() == 1 ? u.readers[g.nodes[o3].outputs[0]][0] : -1;
  if (!node_is(g, lo, "Linear") || g.nodes[lo].i("axis", -1) != 1 || g.nodes[lo].has("activation") ||
      g.nodes[lo].inputs[0] != g.nodes[o3].outputs[0] || !g.values[g.nodes[lo].inputs[1]].is_const())
    return false;
  const int64_t I = g.values[m.wq].shape[0];
  if (g.values[g.nodes[o1].outputs[0]].shape != Shape{s3[0], m.heads, m.th, m.tw, I / m.heads} ||
      g.values[g.nodes[o3].outputs[0]].shape != Shape{s3[0], I, m.th, m.tw})
    return false;
  m.wo = g.nodes[lo].inputs[1];
  m.bo = g.nodes[lo].inputs.size() > 2 ? g.nodes[lo].inputs[2] : -1;
  if (m.bo >= 0 && !g.values[m.bo].is_const()) return false;
  // and back to the image: Reshape(Transpose(Reshape(y, 6-D), inverse perm), (B, D, H, W))
  for (int k : {o1, o2, o3, lo})
    if (u.is_output[g.nodes[k].outputs[0]] || u.readers[g.nodes[k].outputs[0]].size() != 1) return false;
  int merge[3];
  const int yr = window_merge(g, u, lo, wp, merge);
  if (yr < 0) return false;
  m.out_node = yr;
  const Shape& xs = g.values[m.x].shape;
  // an Add of the residual folds in
  const int yv = g.nodes[yr].outputs[0];
  if (!u.is_output[yv] && u.readers[yv].size() == 1 && node_is(g, u.readers[yv][0], "Add")) {
    const Node& ra = g.nodes[u.readers[yv][0]];
    const int r = other_input(ra, yv);
    if (r >= 0 && r != yv && g.values[r].shape == xs && g.values[r].dtype == DType::F32) {
      m.residual = r;
      m.out_node = u.readers[yv][0];
    }
  }
  // the bias as (heads, T, T)
  const Value& bv = g.values[bias];
  Shape bs = bv.shape;
  if (bv.dtype != DType::F32 || bs.size() > 4) return false;
  bs.insert(bs.begin(), 4 - bs.size(), 1);
  if (bs[0] != 1 || (bs[1] != 1 && bs[1] != m.heads) || (bs[2] != 1 && bs[2] != T) || (bs[3] != 1 && bs[3] != T))
    return false;
  m.bias = Tensor(DType::F32, {m.heads, T, T});
  const float* src = bv.constant->data<float>();
  for (int64_t h = 0; h < m.heads; ++h)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j)
        m.bias.data<float>()[(h * T + i) * T + j] =
            src[((bs[1] == 1 ? 0 : h) * bs[2] + (bs[2] == 1 ? 0 : i)) * bs[3] + (bs[3] == 1 ? 0 : j)];
  return true;
}

}  // namespace

void fuse_window_attention(Graph& g) {
  Uses u(g);
  std::vector<std::pair<int, Node>> fused;  // node index to replace, fused node
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    AttnMatch m;
    if (g.nodes[k].op != "Softmax" || !match_window_attention(g, u, (int)k, m)) continue;
    Node n;
    n.op = "WindowAttention";
    n.name = g.nodes[m.out_node].name + "/WindowAttention";
    n.inputs = {m.x, m.wq, m.wk, m.wv, m.wo, m.bo,
                g.add_constant(g.nodes[k].name + "/position_bias", std::move(m.bias)), m.residual};
    n.outputs = g.nodes[m.out_node].outputs;
    n.attrs["heads"] = attr_i(m.heads);
    n.attrs["scale"] = attr_f(m.scale);
    n.attrs["window"] = attr_ints({m.th, m.tw});
    n.attrs["strided"] = attr_i(m.strided ? 1 : 0);
    fused.push_back({m.out_node, std::move(n)});
  }
  if (fused.empty()) return;
  for (auto& [k, n] : fused) g.nodes[k] = std::move(n);
  eliminate_dead_nodes(g);
}

namespace {

// A projection without bias over axis 1 of a windowed tensor: Linear (axis 1, no activation)
// or a 1x1 Conv (stride 1, no pads, dilations or groups), the training graph's form of a
// spectral-norm layer. Sets its input and weight (any value: the training graph's weights
// are parameters or SpectralNorm outputs).
bool plain_projection(const Graph& g, int k, bool bias_ok, int* in, int* w, int* b) {
  if (k < 0) return false;
  const Node& n = g.nodes[k];
  if (n.inputs.size() < 2 || n.inputs[0] < 0 || n.inputs[1] < 0) return false;
  *b = n.inputs.size() > 2 ? n.inputs[2] : -1;
  if (*b >= 0 && !bias_ok) return false;
  const Shape& ws = g.values[n.inputs[1]].shape;
  if (n.op == "Linear") {
    if (n.i("axis", -1) != 1 || n.has("activation") || ws.size() != 2) return false;
  } else if (n.op == "Conv") {
    const std::string ap = n.s("auto_pad", "NOTSET");
    const std::vector<int64_t> pads = n.ints("pads", {0, 0, 0, 0});
    if (ws.size() != 4 || ws[2] != 1 || ws[3] != 1 || n.i("group", 1) != 1 || (ap != "NOTSET" && !ap.empty()) ||
        n.ints("strides", {1, 1}) != std::vector<int64_t>{1, 1} ||
        n.ints("dilations", {1, 1}) != std::vector<int64_t>{1, 1} ||
        std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; }))
      return false;
  } else {
    return false;
  }
  if (g.values[n.inputs[0]].shape.size() != 4 || g.values[n.inputs[1]].dtype != DType::F32) return false;
  if (*b >= 0 && (g.values[*b].dtype != DType::F32 || numel(g.values[*b].shape) != ws[0])) return false;
  *in = n.inputs[0];
  *w = n.inputs[1];
  return true;
}

// A projection weight as a matrix (rows, cols): 2-D, or a 1x1 conv's (rows, cols, 1, 1).
bool weight_matrix_of(const Shape& w, int64_t* rows, int64_t* cols) {
  if (w.size() != 2 && !(w.size() == 4 && w[2] == 1 && w[3] == 1)) return false;
  *rows = w[0];
  *cols = w[1];
  return true;
}


// Slice node k takes rows [part I, (part + 1) I) of axis 1 of a (nW, 3I, th, tw) value.
bool slice_of_part(const Graph& g, int k, int part) {
  const Node& n = g.nodes[k];
  const Shape& s = g.values[n.inputs[0]].shape;
  if (n.inputs.size() < 4 || n.inputs.size() > 5 || s.size() != 4 || s[1] % 3 != 0) return false;
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if ((i < 4 || n.inputs[i] >= 0) && (n.inputs[i] < 0 || !g.values[n.inputs[i]].is_const())) return false;
  const std::vector<int64_t> st = g.values[n.inputs[1]].constant->to_i64(), en = g.values[n.inputs[2]].constant->to_i64(),
                             ax = g.values[n.inputs[3]].constant->to_i64();
  std::vector<int64_t> steps{1};
  if (n.inputs.size() > 4 && n.inputs[4] >= 0) steps = g.values[n.inputs[4]].constant->to_i64();
  const int64_t I = s[1] / 3;
  return st.size() == 1 && en.size() == 1 && ax.size() == 1 && steps == std::vector<int64_t>{1} &&
         (ax[0] == 1 || ax[0] == -3) && st[0] == part * I && std::min(en[0], 3 * I) == (part + 1) * I;
}

// The training graph's window attention (fuse_window_attention_training).
struct TrainAttnMatch {
  int x = -1;                       // (B, D, H, W)
  int copy = -1;                    // tp: the CopyToTP node between the windows and the projections
  int wq = -1, wk = -1, wv = -1;    // wk, wv -1: wq is the fused [q | k | v]
  int wo = -1, bo = -1, bias = -1;  // bias: the position bias value the scores add
  int64_t heads = 0, th = 0, tw = 0;
  bool strided = false;
  float scale = 1;
  int last = -1;                    // the node writing the attention's image (B, D, H, W)
  int all_reduce = -1, bias_add = -1;  // tp (row-parallel to_out): AllReduceTP, then the Add of bo
  std::vector<int> nodes;           // the nodes the fused op replaces (the last one included)
};

// A value shaped to broadcast along axis 1 of a (B, D, H, W) tensor and of a (nW, D, th, tw)
// one alike: (D, 1, 1), (1, D, 1, 1), ...
bool channel_broadcast(const Shape& s, int64_t D) {
  if (s.size() > 4) return false;
  Shape p = s;
  p.insert(p.begin(), 4 - p.size(), 1);
  return p[0] == 1 && p[2] == 1 && p[3] == 1 && (p[1] == 1 || p[1] == D);
}

bool match_train_attention(const Graph& g, const Uses& u, int softmax, TrainAttnMatch& m) {
  const Node& sm = g.nodes[softmax];
  const Shape& ps = g.values[sm.outputs[0]].shape;  // (nW, heads, T, T)
  if (ps.size() != 4 || (sm.i("axis", -1) != -1 && sm.i("axis", -1) != 3)) return false;
  std::vector<int>& nodes = m.nodes;
  nodes.push_back(softmax);
  // scores + bias
  const int add = u.only_for(sm.inputs[0], 1);
  if (!node_is(g, add, "Add") || g.nodes[add].inputs.size() != 2) return false;
  int e1 = -1;
  for (int side = 0; side < 2 && e1 < 0; ++side) {
    const int k = u.only_for(g.nodes[add].inputs[side], 1);
    if (node_is(g, k, "Einsum")) {
      e1 = k;
      m.bias = g.nodes[add].inputs[1 - side];
    }
  }
  if (e1 < 0 || canonical_einsum(g.nodes[e1].s("equation", "")) != "abcd,abed->abce") return false;
  if (g.values[sm.inputs[0]].shape != ps || g.values[g.nodes[e1].outputs[0]].shape != ps) return false;
  const int mul = u.only_for(g.nodes[e1].inputs[0], 1);
  if (!node_is(g, mul, "Mul") || g.nodes[mul].inputs.size() != 2) return false;
  int qh = -1;
  for (int side = 0; side < 2 && qh < 0; ++side)
    if (const_f32_scalar(g, g.nodes[mul].inputs[1 - side], &m.scale)) qh = g.nodes[mul].inputs[side];
  if (qh < 0) return false;
  nodes.insert(nodes.end(), {add, e1, mul});
  // P v
  if (u.is_output[sm.outputs[0]] || u.readers[sm.outputs[0]].size() != 1) return false;
  const int e2 = u.readers[sm.outputs[0]][0];
  if (!node_is(g, e2, "Einsum") || g.nodes[e2].inputs[0] != sm.outputs[0] ||
      canonical_einsum(g.nodes[e2].s("equation", "")) != "abcd,abde->abce")
    return false;
  nodes.push_back(e2);
  const int sq = head_split_source(g, u, qh, nodes);
  const int sk = head_split_source(g, u, g.nodes[e1].inputs[1], nodes);
  const int sv = head_split_source(g, u, g.nodes[e2].inputs[1], nodes);
  if (sq < 0 || sk < 0 || sv < 0) return false;
  const Shape& s3 = g.values[g.nodes[e1].inputs[1]].shape;  // (nW, heads, T, dh)
  m.heads = s3[1];
  const int64_t T = s3[2], I = s3[1] * s3[3];
  if (ps != Shape{s3[0], m.heads, T, T}) return false;
  // the projections: three (Linear or 1x1 Conv), or one fused and three Slices (or a Split) of its
  // output
  int pin = -1, b = -1;
  const int pq = u.only_for(sq, 1), pk = u.only_for(sk, 1), pv = u.only_for(sv, 1);
  if (node_is(g, pq, "Split") && pk == pq && pv == pq) {  // the dynamo exporter's chunk(3, dim=1)
    const Node& sp = g.nodes[pq];
    const int qkv = sp.inputs[0];
    const int64_t ax = sp.i("axis", 0);
    if (sp.outputs != std::vector<int>{sq, sk, sv} || (ax != 1 && ax != -3) ||
        g.values[qkv].shape.size() != 4 || g.values[qkv].shape[1] != 3 * g.values[sq].shape[1] ||
        g.values[sk].shape != g.values[sq].shape || g.values[sv].shape != g.values[sq].shape)
      return false;
    const int pk1 = u.only_for(qkv, 1);
    if (!plain_projection(g, pk1, false, &pin, &m.wq, &b)) return false;
    nodes.insert(nodes.end(), {pq, pk1});
  } else if (node_is(g, pq, "Slice") && node_is(g, pk, "Slice") && node_is(g, pv, "Slice")) {
    const int qkv = g.nodes[pq].inputs[0];
    if (g.nodes[pk].inputs[0] != qkv || g.nodes[pv].inputs[0] != qkv || !slice_of_part(g, pq, 0) ||
        !slice_of_part(g, pk, 1) || !slice_of_part(g, pv, 2))
      return false;
    const int pk3 = u.only_for(qkv, 3);
    if (!plain_projection(g, pk3, false, &pin, &m.wq, &b)) return false;
    nodes.insert(nodes.end(), {pq, pk, pv, pk3});
  } else {
    int in2 = -1, in3 = -1;
    if (!plain_projection(g, pq, false, &pin, &m.wq, &b) || !plain_projection(g, pk, false, &in2, &m.wk, &b) ||
        !plain_projection(g, pv, false, &in3, &m.wv, &b) || in2 != pin || in3 != pin)
      return false;
    nodes.insert(nodes.end(), {pq, pk, pv});
  }
  const size_t nproj = m.wk < 0 ? 1 : 3;
  if (u.is_output[pin] || u.readers[pin].size() != nproj) return false;
  // tp: CopyToTP between the windows and the column-parallel projections
  int x3 = pin;
  const int ck = u.producer[pin];
  if (node_is(g, ck, "CopyToTP")) {
    m.copy = ck;
    x3 = g.nodes[ck].inputs[0];
    if (u.is_output[x3] || u.readers[x3].size() != 1) return false;
    nodes.push_back(ck);
  }
  WindowPartition wp;
  if (!window_partition(g, u, x3, wp)) return false;
  nodes.insert(nodes.end(), std::begin(wp.nodes), std::end(wp.nodes));
  m.x = wp.x;
  m.strided = wp.strided;
  m.th = wp.th;
  m.tw = wp.tw;
  const Shape& s3x = g.values[x3].shape;  // (nW, D, th, tw)
  const int64_t D = s3x[1];
  if (m.th * m.tw != T || s3[0] != s3x[0]) return false;
  int64_t r = 0, c = 0;
  if (m.wk < 0) {
    if (!weight_matrix_of(g.values[m.wq].shape, &r, &c) || r != 3 * I || c != D) return false;
  } else {
    for (int w : {m.wq, m.wk, m.wv})
      if (!weight_matrix_of(g.values[w].shape, &r, &c) || r != I || c != D) return false;
  }
  // back: Reshape(Transpose(Reshape(o, (nW, heads, th, tw, dh)), (0, 1, 4, 2, 3)), (nW, I, th, tw))
  auto sole_reader = [&](int k) { return sole_reader_of(g, u, k); };
  const int o1 = sole_reader(e2);
  if (!node_is(g, o1, "Reshape")) return false;
  const int o2 = sole_reader(o1);
  if (!node_is(g, o2, "Transpose") || g.nodes[o2].ints("perm") != std::vector<int64_t>{0, 1, 4, 2, 3}) return false;
  const int o3 = sole_reader(o2);
  if (!node_is(g, o3, "Reshape")) return false;
  if (g.values[g.nodes[o1].outputs[0]].shape != Shape{s3[0], m.heads, m.th, m.tw, I / m.heads} ||
      g.values[g.nodes[o3].outputs[0]].shape != Shape{s3[0], I, m.th, m.tw})
    return false;
  const int lo = sole_reader(o3);
  int oin = -1;
  if (!plain_projection(g, lo, true, &oin, &m.wo, &m.bo) || oin != g.nodes[o3].outputs[0]) return false;
  if (!weight_matrix_of(g.values[m.wo].shape, &r, &c) || r != D || c != I) return false;
  nodes.insert(nodes.end(), {o1, o2, o3, lo});
  // tp: the row-parallel to_out's partial sums all-reduced, then its bias added
  int y = lo;
  const int ar = sole_reader(lo);
  if (node_is(g, ar, "AllReduceTP")) {
    if (m.bo >= 0) return false;
    m.all_reduce = ar;
    y = ar;
    const int ba = sole_reader(ar);
    if (node_is(g, ba, "Add") && other_input(g.nodes[ba], g.nodes[ar].outputs[0]) >= 0 &&
        channel_broadcast(g.values[other_input(g.nodes[ba], g.nodes[ar].outputs[0])].shape, D) &&
        g.values[g.nodes[ba].outputs[0]].shape == s3x) {
      m.bias_add = ba;
      y = ba;
    }
  }
  // and back to the image: Reshape(Transpose(Reshape(y, 6-D), inverse perm), (B, D, H, W))
  int merge[3];
  const int yr = window_merge(g, u, y, wp, merge);
  if (yr < 0) return false;
  nodes.insert(nodes.end(), std::begin(merge), std::end(merge));
  m.last = yr;
  // the position bias: (T, T) every head adds, or one per head
  const Value& bv = g.values[m.bias];
  Shape bs = bv.shape;
  while (!bs.empty() && bs[0] == 1 && bs.size() > 2) bs.erase(bs.begin());
  return bv.dtype == DType::F32 && (bs == Shape{T, T} || bs == Shape{m.heads, T, T});
}

}  // namespace

void fuse_window_attention_training(Graph& g) {
  Uses u(g);
  std::vector<TrainAttnMatch> found;
  std::vector<bool> taken(g.nodes.size(), false);
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    TrainAttnMatch m;
    if (g.nodes[k].op != "Softmax" || !match_train_attention(g, u, (int)k, m)) continue;
    if (std::any_of(m.nodes.begin(), m.nodes.end(), [&](int n) { return taken[n]; })) continue;
    for (int n : m.nodes) taken[n] = true;
    found.push_back(std::move(m));
  }
  if (found.empty()) return;
  std::map<int, std::vector<Node>> at;  // node index -> the nodes that replace it
  for (TrainAttnMatch& m : found) {
    const Node& sm = g.nodes[m.nodes[0]];
    // the block's scope (checkpoint_segments): the Softmax's name with the op's
    const std::string scope = sm.name.substr(0, sm.name.rfind('/') + 1);
    std::vector<Node>& out = at[m.last];
    int x = m.x;
    if (m.copy >= 0) {  // tp: the CopyToTP moves from the windows to the image
      Node cp = g.nodes[m.copy];
      cp.inputs = {m.x};
      Value cv = g.values[m.x];
      cv.name += "_copy_to_tp";
      cv.constant.reset();
      cv.is_param = false;
      cp.outputs = {g.add_value(std::move(cv))};
      x = cp.outputs[0];
      out.push_back(std::move(cp));
    }
    Node n;
    n.op = "WindowAttention";
    n.name = scope + "WindowAttention";
    n.inputs = {x, m.wq, m.wk, m.wv, m.wo, m.bo, m.bias, -1};
    n.outputs = g.nodes[m.last].outputs;
    n.attrs["heads"] = attr_i(m.heads);
    n.attrs["scale"] = attr_f(m.scale);
    n.attrs["window"] = attr_ints({m.th, m.tw});
    n.attrs["strided"] = attr_i(m.strided ? 1 : 0);
    if (m.all_reduce >= 0) {  // tp: y = AllReduceTP(partial) (+ bo), on the image
      Value pv = g.values[m.x];
      pv.name = g.values[n.outputs[0]].name + "_partial";
      pv.constant.reset();
      pv.is_param = false;
      n.outputs = {g.add_value(pv)};
      Node ar = g.nodes[m.all_reduce];
      ar.inputs = n.outputs;
      ar.outputs = g.nodes[m.last].outputs;
      out.push_back(std::move(n));
      if (m.bias_add >= 0) {
        Node ba = g.nodes[m.bias_add];
        const int b = other_input(ba, g.nodes[m.all_reduce].outputs[0]);
        pv.name = g.values[ar.outputs[0]].name + "_summed";
        ar.outputs = {g.add_value(pv)};
        ba.inputs = {ar.outputs[0], b};
        ba.outputs = g.nodes[m.last].outputs;
        out.push_back(std::move(ar));
        out.push_back(std::move(ba));
      } else {
        out.push_back(std::move(ar));
      }
    } else {
      out.push_back(std::move(n));
    }
  }
  std::vector<Node> nodes;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    auto it = at.find((int)k);
    if (it != at.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
    else if (!taken[k])
      nodes.push_back(std::move(g.nodes[k]));
  }
  g.nodes = std::move(nodes);
  eliminate_dead_nodes(g);
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
  std::vector<Node> kept;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    if (!drop[k]) kept.push_back(std::move(g.nodes[k]));
  g.nodes = std::move(kept);
  compact_values(g);
}

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

void mark_needed_rows(Graph& g) {
  // need[v]: the rows [lo, hi) of a rank-4 value's dim 2 that its readers read (whole: -1)
  std::vector<std::pair<int64_t, int64_t>> need(g.values.size(), {-1, -1});
  auto rows_of = [&](int v) { return g.values[v].shape.size() == 4 ? g.values[v].shape[2] : -1; };
  // what reader k reads of its input v (false: all of it, or not known)
  auto read_rows = [&](const Node& k, int v, int64_t* lo, int64_t* hi) {
    const int64_t H = rows_of(v);
    if (H < 0 || k.inputs.empty() || k.inputs[0] != v || k.outputs.empty()) return false;
    const int o = k.outputs[0];
    if (k.op == "PlaneGather") {
      const Value& m = g.values[k.inputs[1]];
      if (!m.is_const() || g.values[v].shape.back() <= 0) return false;
      const int64_t W = g.values[v].shape.back();
      *lo = H;
      *hi = 0;
      for (int64_t i : m.constant->to_i64()) {
        *lo = std::min(*lo, i / W);
        *hi = std::max(*hi, i / W + 1);
      }
      return *lo < *hi;
    }
    if (need[o].first < 0) return false;
    const auto [a, b] = need[o];
    if (k.op == "DepthToSpace") {
      const int64_t bs = k.i("blocksize", 0);
      if (bs <= 0) return false;
      *lo = a / bs;
      *hi = (b + bs - 1) / bs;
      return true;
    }
    if (k.op == "Conv" && k.inputs.size() >= 2 && k.inputs[1] >= 0 && g.values[k.inputs[1]].shape.size() == 4 &&
        k.i("group", 1) == 1) {
      const std::vector<int64_t> st = k.ints("strides", {1, 1}), dil = k.ints("dilations", {1, 1}),
                                 pads = k.ints("pads", {0, 0, 0, 0});
      if (st.size() != 2 || dil.size() != 2 || pads.size() != 4 || k.s("auto_pad", "NOTSET") != "NOTSET") return false;
      const int64_t KH = g.values[k.inputs[1]].shape[2];
      *lo = std::max<int64_t>(a * st[0] - pads[0], 0);
      *hi = std::min<int64_t>((b - 1) * st[0] - pads[0] + (KH - 1) * dil[0] + 1, H);
      return *lo < *hi;
    }
    return false;
  };
  const Uses u(g);
  for (size_t k = g.nodes.size(); k-- > 0;) {  // readers come after their producer: theirs are known
    for (int v : g.nodes[k].outputs) {
      if (v < 0 || u.is_output[v] || u.readers[v].empty() || rows_of(v) < 0) continue;
      int64_t lo = rows_of(v), hi = 0;
      bool known = true;
      for (int r : u.readers[v]) {
        int64_t a = 0, b = 0;
        if (!read_rows(g.nodes[r], v, &a, &b)) {
          known = false;
          break;
        }
        lo = std::min(lo, a);
        hi = std::max(hi, b);
      }
      if (known && lo < hi && (lo > 0 || hi < rows_of(v))) need[v] = {lo, hi};
    }
  }
  for (Node& n : g.nodes)
    if (n.op == "Conv" && !n.outputs.empty() && n.outputs[0] >= 0 && need[n.outputs[0]].first >= 0)
      n.attrs["rows"] = attr_ints({need[n.outputs[0]].first, need[n.outputs[0]].second});
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
