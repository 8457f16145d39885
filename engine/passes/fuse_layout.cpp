#include "engine/passes/fuse.h"

#include <algorithm>
#include <map>

#include "engine/passes/fuse_util.h"
#include "engine/passes/passes.h"

namespace wxe {

using namespace fuse_util;

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
  remove_nodes(g, drop);
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

}  // namespace wxe
