#include "engine/passes/fuse.h"

#include <algorithm>
#include <cmath>

#include "engine/passes/fuse_util.h"
#include "engine/passes/passes.h"

namespace wxe {

using namespace fuse_util;

namespace {

bool near(float a, double b, double rel = 1e-6) { return std::fabs(a - b) <= rel * std::fabs(b); }

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
  remove_nodes(g, drop);
}

}  // namespace wxe
