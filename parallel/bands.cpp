#include "parallel/bands.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "engine/passes/fuse.h"
#include "engine/passes/passes.h"
#include "parallel/collective_ops.h"
#include "parallel/shard.h"

namespace wxe {

namespace {

constexpr int kRows = 2;  // the band axis of (N, C, H, W) activations

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= s[i];
  return p;
}

// Where axis a of a rank-`rank` input goes through Transpose n.
int transposed_axis(const Node& n, size_t rank, int a) {
  std::vector<int64_t> perm = n.ints("perm");
  if (perm.empty())
    for (int64_t k = (int64_t)rank - 1; k >= 0; --k) perm.push_back(k);
  auto it = std::find(perm.begin(), perm.end(), a);
  return it == perm.end() ? -1 : (int)(it - perm.begin());
}

// Where axis a of `in` goes through a Reshape or Transpose to `out`: -1 if it does not stay one
// whole axis.
int follow_axis(const Node& n, const Shape& in, int a, const Shape& out) {
  if (n.op == "Transpose") return transposed_axis(n, in.size(), a);
  const int64_t before = prod(in, 0, a);
  for (size_t b = 0; b < out.size(); ++b)
    if (prod(out, 0, b) == before && out[b] == in[a]) return (int)b;
  return -1;
}

// Where a band along axis a of `in` goes through Reshape or Transpose n to `out`, over `parts`
// ranks: Transpose moves it; Reshape keeps it when it stays the outer part of one axis, that
// axis divisible by parts (Megatron's heads rule); -1 otherwise.
int band_through_layout(const Graph& g, const Node& n, const Shape& in, int a, const Shape& out, int parts) {
  if (n.op == "Transpose") return transposed_axis(n, in.size(), a);
  if (n.op != "Reshape" || n.inputs.size() < 2 || !g.values[n.inputs[1]].is_const()) return -1;
  const std::vector<int64_t> target = g.values[n.inputs[1]].constant->to_i64();
  const int64_t before = prod(in, 0, a);
  for (int b = 0; b < (int)out.size(); ++b) {
    if (prod(out, 0, b) != before || out[b] == 1) continue;
    const int64_t x0 = in[a], y0 = out[b];
    if ((x0 % y0 && y0 % x0) || y0 % parts || b >= (int)target.size() || target[b] == 0) return -1;
    return b;
  }
  return -1;
}

// The band pass over `tp` ranks (parallel/bands.h): sequence parallelism, or with `domain`
// domain parallelism (collectives over the domain group).
// Slice n of an (N, C, H, W) tensor that cuts only rows and columns (steps 1, constant
// bounds): *crop = {first row, end row, first column, end column}.
bool crop_of_slice(const Graph& g, const Node& n, std::vector<int64_t>* crop) {
  const Shape& xs = g.values[n.inputs[0]].shape;
  auto ints = [&](size_t i, std::vector<int64_t>* v) {
    if (i >= n.inputs.size() || n.inputs[i] < 0) return true;
    if (!g.values[n.inputs[i]].is_const()) return false;
    *v = g.values[n.inputs[i]].constant->to_i64();
    return true;
  };
  std::vector<int64_t> starts, ends, axes, steps;
  if (n.inputs.size() < 3 || !ints(1, &starts) || !ints(2, &ends) || !ints(3, &axes) || !ints(4, &steps)) return false;
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k) axes.push_back((int64_t)k);
  if (starts.size() != ends.size() || axes.size() != starts.size() || (!steps.empty() && steps.size() != starts.size()))
    return false;
  *crop = {0, xs[kRows], 0, xs[kRows + 1]};
  for (size_t k = 0; k < axes.size(); ++k) {
    const int64_t a = axes[k] < 0 ? axes[k] + 4 : axes[k], dim = a >= 0 && a < 4 ? xs[a] : 0;
    if ((!steps.empty() && steps[k] != 1) || (a != kRows && a != kRows + 1)) return false;
    auto clamp = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + dim : v, 0, dim); };
    (*crop)[2 * (a - kRows)] = clamp(starts[k]);
    (*crop)[2 * (a - kRows) + 1] = std::max(clamp(starts[k]), clamp(ends[k]));
  }
  return true;
}

BandStats shard_bands(Graph& g, int tp, bool domain, bool training) {
  BandStats st;
  if (tp <= 1) return st;
  register_collective_ops();
  fold_pad_into_conv(g);  // a cross-embedding's explicit Pad becomes its Conv's pads: a halo below
  const size_t nodes = g.nodes.size();
  const std::vector<int> uses = g.use_counts();
  std::vector<std::vector<int>> readers(g.values.size());
  for (size_t k = 0; k < nodes; ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0 && (readers[i].empty() || readers[i].back() != (int)k)) readers[i].push_back((int)k);
  const std::vector<int> producer = g.producers();
  // the node that alone reads v (and v is no graph output), else -1
  auto sole = [&](int v) { return uses[v] == 1 && readers[v].size() == 1 ? readers[v][0] : -1; };
  // The CopyToTP that node k leads to through Reshape/Transpose nodes, each its input's one
  // reader (k itself when it is one), else -1.
  auto copy_after = [&](int k) {
    while (k >= 0) {
      const Node& m = g.nodes[k];
      if (m.op == "CopyToTP") return k;
      if (m.op != "Reshape" && m.op != "Transpose") return -1;
      k = sole(m.outputs[0]);
    }
    return -1;
  };

  // the axis along which a value holds this rank's band (-1: whole)
  std::vector<int> band(g.values.size(), -1);
  auto axis_of = [&](int v) { return v >= 0 && v < (int)band.size() ? band[v] : -1; };
  auto is_band = [&](int v) { return axis_of(v) >= 0; };
  auto set_band = [&](int v, int a) {
    if ((size_t)v >= band.size()) band.resize(v + 1, -1);
    band[v] = a;
  };
  auto new_value = [&](int like, const std::string& suffix) {
    Value v = g.values[like];
    v.name += suffix;
    v.constant.reset();
    v.is_param = false;
    return g.add_value(std::move(v));
  };
  std::vector<Node> out;
  auto collective = [&](const std::string& op, const std::string& name, int in, int o, int axis) {
    Node c;
    c.op = op;
    c.name = name;
    c.inputs = {in};
    c.outputs = {o};
    c.attrs["axis"] = attr_i(axis);
    c.attrs["parts"] = attr_i(tp);
    if (domain) c.attrs["group"] = attr_s("domain");
    return c;
  };
  std::map<int, int> copied;                           // value -> its CopyToTP output
  std::map<std::pair<int, int>, int> scattered;        // (value, axis) -> its ScatterTP output
  std::map<std::tuple<int, int64_t, int64_t>, int> scattered_with_halo;  // (value, top, bottom) -> its band
  int first_band_input = -1;  // sequence parallelism: the whole input its bands start from
  std::map<std::pair<int, bool>, int> gathered;        // (band value, grad "sum") -> its AllGatherTP output
  auto copy_of = [&](int v, const std::string& reader) {
    auto it = copied.find(v);
    if (it != copied.end()) return it->second;
    ++st.copies;
    copied[v] = add_copy_to_tp(g, out, v, reader);
    if (domain) out.back().attrs["group"] = attr_s("domain");
    return copied[v];
  };
  auto scatter_of = [&](int v, int axis, const std::string& reader) {
    auto it = scattered.find({v, axis});
    if (it != scattered.end()) return it->second;
    const int s = new_value(v, "_band");
    out.push_back(collective("ScatterTP", reader + "/ScatterTP", v, s, axis));
    set_band(s, axis);
    ++st.scatters;
    return scattered[{v, axis}] = s;
  };
  auto gather_of = [&](int v, bool sum, const std::string& reader) {
    auto it = gathered.find({v, sum});
    if (it != gathered.end()) return it->second;
    const int w = new_value(v, sum ? "_gathered" : "_gathered_replicated");
    Node n = collective("AllGatherTP", reader + "/AllGatherTP", v, w, axis_of(v));
    n.attrs["grad"] = attr_s(sum ? "sum" : "slice");
    out.push_back(std::move(n));
    ++(sum ? st.gathers : st.replicated_gathers);
    return gathered[{v, sum}] = w;
  };
  // A replicated float operand of a band op whose gradient is each rank's part: summed over tp.
  auto copy_if_trained = [&](int& v, const std::string& reader) {
    if (training && v >= 0 && !is_band(v) && g.values[v].dtype == DType::F32 && (!g.values[v].is_const() || g.values[v].is_param))
      v = copy_of(v, reader);
  };
  // Where node n, reading bands, writes a band along the same axis of its output (-1: not so):
  // per-token ops (elementwise, reductions, norms and softmax over other axes, Linear over
  // features, Slices, a convolution's batch), Reshape and Transpose that keep the band one axis,
  // and Einsum along one shared letter.
  auto passes_band = [&](const Node& n) -> int {
    const int x = *std::find_if(n.inputs.begin(), n.inputs.end(), is_band);
    const int a = axis_of(x);
    const Shape& xs = g.values[x].shape;
    const Shape& os = g.values[n.outputs[0]].shape;
    const int rank = (int)xs.size(), orank = (int)os.size();
    auto norm = [&](int64_t ax, int r) { return (int)(ax < 0 ? ax + r : ax); };
    if (n.outputs.size() != 1) return -1;
    // the tp group's collectives act row by row on the domain's band
    if (domain && (n.op == "AllReduceTP" || n.op == "CopyToTP") && n.inputs.size() == 1) return a;
    if (elementwise_op(n.op) || n.op == "Concat") {
      const int oa = a + orank - rank;
      if (n.op == "Concat" && norm(n.i("axis", 0), orank) == oa) return -1;
      for (int v : n.inputs) {
        if (v < 0) continue;
        const int d = oa - (orank - (int)g.values[v].shape.size());
        if (is_band(v) && axis_of(v) != d) return -1;
        if (is_band(v) || d < 0 || g.values[v].shape[d] == 1) continue;  // broadcast along the band
        const Value& val = g.values[v];  // whole along the band: a replicated activation is cut
        if (val.is_const() || val.dtype != DType::F32 || val.shape[d] != os[oa]) return -1;
      }
      return oa;
    }
    if (n.op == "Einsum") {
      std::vector<std::string> t;
      try {
        t = einsum_terms(n);
      } catch (const Error&) {
        return -1;
      }
      const std::string outs = t.back();
      t.pop_back();
      const size_t xi = std::find(n.inputs.begin(), n.inputs.end(), x) - n.inputs.begin();
      if (t.size() != n.inputs.size() || t[xi].size() != xs.size()) return -1;
      const char letter = t[xi][a];
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const size_t pos = t[k].find(letter);
        if (axis_of(n.inputs[k]) != (pos == std::string::npos ? -1 : (int)pos)) return -1;
      }
      const size_t o = outs.find(letter);
      return o == std::string::npos ? -1 : (int)o;
    }
    if (n.inputs[0] != x || std::any_of(n.inputs.begin() + 1, n.inputs.end(), is_band)) return -1;
    if (n.op == "ReduceMean" || n.op == "ReduceSum" || n.op == "ReduceMax") {
      std::vector<int64_t> axes = n.ints("axes");
      if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
        if (!g.values[n.inputs[1]].is_const()) return -1;
        axes = g.values[n.inputs[1]].constant->to_i64();
      }
      if (axes.empty()) return -1;
      int before = 0;  // reduced axes ahead of the band: gone from the output without keepdims
      for (int64_t ax : axes) {
        if (norm(ax, rank) == a) return -1;
        before += norm(ax, rank) < a;
      }
      return n.i("keepdims", 1) ? a : a - before;
    }
    // a Resize to the same size samples every pixel where it is (any mode but cropping)
    if (n.op == "Resize" && os == xs && n.s("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize")
      return a;
    if (n.op == "Softmax" || n.op == "LogSoftmax") return norm(n.i("axis", -1), rank) == a ? -1 : a;
    if (n.op == "LayerNormalization") return norm(n.i("axis", -1), rank) > a ? a : -1;
    if (n.op == "Linear") return norm(n.i("axis", -1), rank) == a ? -1 : a;
    if (n.op == "Conv") return a == 0 ? 0 : -1;  // per sample; rows: the halo rule below
    if (n.op == "ConvTranspose" && a == kRows && rank == 4) {  // kernel rows = stride: no overlap between bands
      const std::vector<int64_t> st = n.ints("strides", {1, 1}), pads = n.ints("pads", {0, 0, 0, 0}),
                                 op = n.ints("output_padding", {0, 0}), dil = n.ints("dilations", {1, 1});
      const Shape& ws = g.values[n.inputs[1]].shape;
      const bool local = ws.size() == 4 && st.size() == 2 && ws[2] == st[0] && pads.size() == 4 && pads[0] == 0 &&
                         pads[2] == 0 && op.size() == 2 && op[0] == 0 && dil.size() == 2 && dil[0] == 1 &&
                         !n.has("output_shape") && n.s("auto_pad", "NOTSET") == "NOTSET";
      return local ? a : -1;
    }
    if (n.op == "ConvTranspose") return a == 0 ? 0 : -1;
    if (n.op == "DepthToSpace") return rank == 4 && a == kRows ? a : -1;  // each row becomes blocksize rows
    if (n.op == "Slice") {
      if (n.inputs.size() < 3) return -1;
      std::vector<int64_t> axes;
      if (n.inputs.size() > 3 && n.inputs[3] >= 0) {
        if (!g.values[n.inputs[3]].is_const()) return -1;
        axes = g.values[n.inputs[3]].constant->to_i64();
      } else {
        if (!g.values[n.inputs[1]].is_const()) return -1;
        for (int64_t k = 0; k < g.values[n.inputs[1]].constant->numel(); ++k) axes.push_back(k);
      }
      for (int64_t ax : axes)
        if (norm(ax, rank) == a) return -1;
      return a;
    }
    if (n.op == "Transpose" || n.op == "Reshape") return band_through_layout(g, n, xs, a, os, tp);
    return -1;
  };

  // Whether Conv n can run on row bands of its input, and the halo rows it needs above and
  // below: every band's output rows come from its own rows and the halo (H = OH x stride), the
  // halo no taller than a band, the padding rows at the grid's edges (zeros past the first and
  // last band).
  auto conv_on_bands = [&](const Node& n, int64_t& top, int64_t& bottom) {
    if (n.op != "Conv" || n.inputs.size() < 2 || std::any_of(n.inputs.begin() + 1, n.inputs.end(), is_band))
      return false;
    const Shape& xs = g.values[n.inputs[0]].shape;
    const Shape& ys = g.values[n.outputs[0]].shape;
    const Shape& ws = g.values[n.inputs[1]].shape;
    const std::vector<int64_t> pads = n.ints("pads", {0, 0, 0, 0}), strides = n.ints("strides", {1, 1}),
                               dil = n.ints("dilations", {1, 1});
    const std::string ap = n.s("auto_pad", "NOTSET");
    if (xs.size() != 4 || ys.size() != 4 || ws.size() != 4 || pads.size() != 4 || strides.size() != 2 ||
        dil.size() != 2 || dil[0] != 1 || !(ap == "NOTSET" || ap.empty()) || xs[kRows] % tp || n.i("group", 1) < 1)
      return false;
    const int64_t s0 = strides[0], rows = xs[kRows] / tp;
    top = pads[0];
    bottom = ws[2] - s0 - pads[0];
    return ys[kRows] % tp == 0 && ys[kRows] * s0 == xs[kRows] && top >= 0 && bottom >= 0 && top <= rows &&
           bottom <= rows && pads[2] == bottom;
  };
  // GroupNorm as exported (torch.nn.GroupNorm: Reshape to (N, G, -1), InstanceNormalization,
  // Reshape back to the input's shape) from node k, reading a band along rows: the
  // InstanceNormalization and the last Reshape, else {-1, -1}.
  auto group_norm_at = [&](int k) -> std::pair<int, int> {
    const Node& r1 = g.nodes[k];
    if (r1.op != "Reshape" || axis_of(r1.inputs[0]) != kRows || g.values[r1.inputs[0]].shape.size() != 4 ||
        r1.inputs.size() < 2 || !g.values[r1.inputs[1]].is_const())
      return {-1, -1};
    const int in = sole(r1.outputs[0]);
    if (in < 0 || g.nodes[in].op != "InstanceNormalization" || g.nodes[in].inputs[0] != r1.outputs[0]) return {-1, -1};
    const int r2 = sole(g.nodes[in].outputs[0]);
    if (r2 < 0 || g.nodes[r2].op != "Reshape" || g.nodes[r2].inputs.size() < 2 ||
        !g.values[g.nodes[r2].inputs[1]].is_const() ||
        g.values[g.nodes[r2].outputs[0]].shape != g.values[r1.inputs[0]].shape)
      return {-1, -1};
    const Shape& xs = g.values[r1.inputs[0]].shape;
    const Shape& gs = g.values[r1.outputs[0]].shape;  // (N, G, C/G x H x W)
    if (gs.size() != 3 || gs[0] != xs[0] || xs[1] % gs[1] || xs[kRows] % tp) return {-1, -1};
    for (size_t i = 1; i < 3; ++i)
      if (g.nodes[in].inputs.size() <= i || g.nodes[in].inputs[i] < 0 || is_band(g.nodes[in].inputs[i])) return {-1, -1};
    return {in, r2};
  };
  // a node of `out` (its one output like value `like`)
  auto emit = [&](const std::string& op, const std::string& name, std::vector<int> inputs, int like,
                  const std::string& suffix) {
    Node m;
    m.op = op;
    m.name = name;
    m.inputs = std::move(inputs);
    m.outputs = {new_value(like, suffix)};
    out.push_back(m);
    return m.outputs[0];
  };

  // Reshape(from) to `to`, a node of `out` named scope/what
  auto reshape = [&](const std::string& scope, int from, const Shape& to, const std::string& what) {
    return emit("Reshape", scope + "/" + what, {from, g.add_constant(scope + "/" + what + "_shape", Tensor::from_i64(to))},
                from, "_" + what);
  };

  std::vector<bool> done(nodes, false);  // moved earlier (a row-parallel layer's layout and bias)
  std::map<int, int> rename;             // a dropped CopyToTP's output -> its input (or a value -> its band)
  std::map<int, int> cut_after;          // node -> the axis of its whole output to share out
  for (size_t k = 0; k < nodes; ++k) {
    if (done[k]) continue;
    Node n = g.nodes[k];
    for (int& i : n.inputs) {
      auto r = rename.find(i);
      if (i >= 0 && r != rename.end()) i = r->second;
    }
    if (n.op == "AllReduceTP" && !domain) {
      // [bias Add] -> Reshape/Transpose ... -> (N, C, H, W): the layout on the partial sums, then
      // the reduce-scatter, then the bias on the band
      const int partial = n.inputs[0];
      int cur = n.outputs[0], bias = -1, bias_node = -1, axis = -1;
      int j = sole(cur);
      if (j >= 0 && g.nodes[j].op == "Add" && g.nodes[j].inputs.size() == 2) {
        const Node& add = g.nodes[j];
        const int b = add.inputs[0] == cur ? add.inputs[1] : add.inputs[0];
        const Shape& bs = g.values[b].shape;
        const Shape& s = g.values[cur].shape;
        int wide = -1, count = 0;  // the bias's one axis longer than 1
        for (size_t d = 0; d < bs.size(); ++d)
          if (bs[d] != 1) wide = (int)d, ++count;
        if (b >= 0 && count <= 1 && bs.size() <= s.size() && (producer[b] < (int)k) &&
            g.values[b].dtype == DType::F32) {
          bias = b;
          bias_node = j;
          axis = wide < 0 ? -1 : wide + (int)(s.size() - bs.size());
          cur = add.outputs[0];
        }
      }
      std::vector<int> chain;
      bool ok = true;
      while ((j = sole(cur)) >= 0 && (g.nodes[j].op == "Reshape" || g.nodes[j].op == "Transpose")) {
        const Node& m = g.nodes[j];
        if (m.op == "Reshape" && (m.inputs.size() < 2 || !g.values[m.inputs[1]].is_const())) break;
        if (axis >= 0) axis = follow_axis(m, g.values[cur].shape, axis, g.values[m.outputs[0]].shape);
        if (bias >= 0 && axis < 0 && g.values[bias].constant == nullptr && numel(g.values[bias].shape) > 1) ok = false;
        chain.push_back(j);
        cur = m.outputs[0];
      }
      const Shape vs = g.values[cur].shape;
      ok = ok && vs.size() == 4 && vs[kRows] % tp == 0 && uses[cur] > 0;
      if (ok && bias >= 0 && numel(g.values[bias].shape) > 1) {
        // the bias must broadcast on the result exactly as it did on the layer's output
        const Shape& bs = g.values[bias].shape;
        ok = axis >= 0 && (int)bs.size() <= 4 && axis - (4 - (int)bs.size()) >= 0 &&
             bs[axis - (4 - (int)bs.size())] == vs[axis];
      }
      if (ok) {
        int x = partial;
        for (int c : chain) {
          Node m = g.nodes[c];
          m.inputs[0] = x;
          if (m.outputs[0] == cur) m.outputs[0] = new_value(cur, "_partial");  // cur: the band, below
          x = m.outputs[0];
          out.push_back(std::move(m));
          done[c] = true;
        }
        const int summed = bias >= 0 ? new_value(cur, "_band_summed") : cur;
        out.push_back(collective("ReduceScatterTP", n.name + "/ReduceScatterTP", x, summed, kRows));
        set_band(summed, kRows);
        if (bias >= 0) {
          Node add = g.nodes[bias_node];
          done[bias_node] = true;
          const int b = g.values[bias].is_const() && !g.values[bias].is_param ? bias : copy_of(bias, add.name);
          add.inputs = {summed, b};
          add.outputs = {cur};
          out.push_back(std::move(add));
        }
        set_band(cur, kRows);
        ++st.reduce_scatters;
        continue;
      }
    }
    int64_t top = 0, bottom = 0;
    // domain parallelism starts bands at every convolution that finds its input whole; sequence
    // parallelism at the first (the stage-0 cross-embedding: every convolution reading its input)
    const bool starts_bands = !n.inputs.empty() && n.inputs[0] >= 0 && !is_band(n.inputs[0]) &&
                              g.values[n.inputs[0]].dtype == DType::F32 && !g.values[n.inputs[0]].is_const() &&
                              (domain || first_band_input < 0 || first_band_input == n.inputs[0]) &&
                              conv_on_bands(n, top, bottom);
    if (starts_bands && !domain) first_band_input = n.inputs[0];
    if (starts_bands) {
      // bands start at a convolution: each rank takes its band of the whole input with the halo
      // rows around it (no exchange: every rank has the whole input). Training takes the band
      // alone, and each convolution its halo by HaloTP, which the backward can make again
      // (add_recompute_segments): the band is kept once for the weight gradients, not a band with
      // a halo for each kernel height (CREDIT's four cross-embeddings read the same input).
      auto key = std::make_tuple(n.inputs[0], training ? 0 : top, training ? 0 : bottom);
      auto it = scattered_with_halo.find(key);
      if (it == scattered_with_halo.end()) {
        const int h = new_value(n.inputs[0], training ? "_band" : "_band_halo");
        Node sc = collective("ScatterTP", n.name + "/ScatterTP", n.inputs[0], h, kRows);
        sc.attrs["top"] = attr_i(std::get<1>(key));
        sc.attrs["bottom"] = attr_i(std::get<2>(key));
        out.push_back(std::move(sc));
        ++st.scatters;
        it = scattered_with_halo.emplace(key, h).first;
        if (training) set_band(h, kRows);
      }
      n.inputs[0] = it->second;
      if (!training) top = bottom = 0;
    }
    if (!starts_bands && !std::any_of(n.inputs.begin(), n.inputs.end(), is_band)) {
      const int o = n.outputs.empty() ? -1 : n.outputs[0];
      out.push_back(std::move(n));
      auto c = cut_after.find((int)k);
      if (c != cut_after.end()) rename[o] = scatter_of(o, c->second, g.nodes[k].name);  // the windows shared out
      continue;
    }
    {
      auto [in, r2] = group_norm_at((int)k);
      if (in >= 0) {
        // GroupNorm on bands: each group's mean, then its variance about the mean, summed over
        // the group (the count: the whole group's elements)
        const Node& inorm = g.nodes[in];
        const Node& back = g.nodes[r2];
        const std::string name = inorm.name;
        const Shape gs = g.values[n.outputs[0]].shape;
        std::vector<int64_t> t1 = g.values[n.inputs[1]].constant->to_i64();
        if (t1.size() == 3 && t1[2] > 0) t1[2] /= tp;
        n.inputs[1] = g.add_constant(g.values[n.inputs[1]].name + "_band", Tensor::from_i64(t1));
        const int x = n.outputs[0];
        out.push_back(n);  // (N, G, band elements of each group)
        const int axes = g.add_constant(name + "/axes", Tensor::from_i64({2}));
        const int inv_count = g.add_constant(name + "/inv_count", Tensor::from_f32({1}, {1.f / (float)gs[2]}));
        const int eps = g.add_constant(name + "/epsilon", Tensor::from_f32({1}, {inorm.f("epsilon", 1e-5f)}));
        auto group_sum = [&](int v, const std::string& what) {
          Node rs;
          rs.op = "ReduceSum";
          rs.name = name + "/" + what + "/ReduceSum";
          rs.inputs = {v, axes};
          rs.outputs = {new_value(x, "_" + what + "_part")};
          rs.attrs["keepdims"] = attr_i(1);
          out.push_back(rs);
          Node ar = collective("AllReduceTP", name + "/" + what + "/AllReduceTP", rs.outputs[0],
                               new_value(x, "_" + what + "_sum"), 0);
          ar.attrs.erase("axis");
          ar.attrs.erase("parts");
          ar.attrs["grad"] = attr_s("sum");
          out.push_back(ar);
          return emit("Mul", name + "/" + what + "/Mul", {ar.outputs[0], inv_count}, x, "_" + what);
        };
        const int mean = group_sum(x, "mean");
        const int d = emit("Sub", name + "/Sub", {x, mean}, x, "_centred");
        const int var = group_sum(emit("Mul", name + "/Square", {d, d}, x, "_square"), "variance");
        const int sd = emit("Sqrt", name + "/Sqrt", {emit("Add", name + "/AddEpsilon", {var, eps}, x, "_var_eps")},
                            x, "_sd");
        int y = emit("Div", name + "/Div", {d, sd}, x, "_normalized");
        // scale and bias per group: (G) as (G, 1)
        for (size_t i = 1; i < 3; ++i) {
          int p = inorm.inputs[i];
          copy_if_trained(p, name);
          const int64_t groups = g.values[p].shape.empty() ? 1 : g.values[p].shape[0];
          p = emit("Reshape", name + (i == 1 ? "/scale" : "/bias") + "/Reshape",
                   {p, g.add_constant(name + "/per_group", Tensor::from_i64({groups, 1}))}, p, "_per_group");
          y = emit(i == 1 ? "Mul" : "Add", name + (i == 1 ? "/Scale" : "/Shift"), {y, p}, x, i == 1 ? "_scaled" : "_shifted");
        }
        Node m = back;
        std::vector<int64_t> t2 = g.values[m.inputs[1]].constant->to_i64();
        if (t2.size() == 4 && t2[kRows] > 0) t2[kRows] /= tp;
        m.inputs = {y, g.add_constant(g.values[m.inputs[1]].name + "_band", Tensor::from_i64(t2))};
        set_band(m.outputs[0], kRows);
        out.push_back(std::move(m));
        done[in] = done[r2] = true;
        ++st.group_norms;
        continue;
      }
    }
    if ((n.op == "Reshape" || n.op == "Transpose") && axis_of(n.inputs[0]) == kRows &&
        g.values[n.inputs[0]].shape.size() == 4 && (domain || copy_after((int)k) < 0)) {
      // A window layout whose windows take rows from every band (CrossFormer's long-distance
      // attention; local windows taller than a band; attention along columns): the image is
      // gathered and the windows (the layout's leading axis) shared out instead, cut at the
      // first step of the layout where they are one axis, so the rest of it runs on the share.
      std::vector<int> chain;
      int a = kRows;
      bool reshaped = false, transposed = false;
      for (int cur = (int)k; cur >= 0 && (g.nodes[cur].op == "Reshape" || g.nodes[cur].op == "Transpose");
           cur = sole(g.nodes[cur].outputs[0])) {
        const Node& m = g.nodes[cur];
        if (a >= 0) a = band_through_layout(g, m, g.values[m.inputs[0]].shape, a, g.values[m.outputs[0]].shape, tp);
        (m.op == "Reshape" ? reshaped : transposed) = true;
        chain.push_back(cur);
      }
      const Shape& es = g.values[g.nodes[chain.back()].outputs[0]].shape;
      if (a != 0 && reshaped && transposed && es.size() >= 3 && es[0] >= tp && es[0] % tp == 0) {
        // the windows axis traced back through the layout: at[j], the axis of chain node j's
        // output that becomes the leading part of the windows (-1: not one axis there)
        std::vector<int> at(chain.size(), -1);
        at.back() = 0;
        for (size_t j = chain.size() - 1; j > 0; --j) {
          const Node& m = g.nodes[chain[j]];
          const Shape& xs = g.values[m.inputs[0]].shape;
          const Shape& os = g.values[m.outputs[0]].shape;
          for (int i = 0; i < (int)xs.size() && at[j] >= 0; ++i)
            if (xs[i] % tp == 0 && band_through_layout(g, m, xs, i, os, tp) == at[j]) {
              at[j - 1] = i;
              break;
            }
          if (at[j - 1] < 0) break;
        }
        size_t cut = chain.size() - 1;
        while (cut > 0 && at[cut - 1] >= 0) --cut;
        ++st.gathered_for["windows across bands"];
        const Shape xs = g.values[n.inputs[0]].shape;
        const Shape s6 = g.values[n.outputs[0]].shape;
        if (cut == 0 && chain.size() == 3 && n.op == "Reshape" && s6.size() == 6 && at[0] == kRows + 1 &&
            s6[2] * s6[3] == xs[kRows] && s6[4] * s6[5] == xs[3]) {
          // CrossFormer's long-distance layout (B, D, A, a, C, c), windows (a, c): the rank's
          // share of a is a sub-image of rows {i a + j: j in the share}, whose own long-distance
          // layout is the rank's windows; the layout runs on it as exported, so the fused
          // attention (engine/passes/fuse.h) still matches
          const int whole = gather_of(n.inputs[0], false, n.name);
          const int64_t share = s6[3] / tp;
          const int rows = reshape(n.name, whole, {xs[0], xs[1], s6[2], s6[3], xs[3]}, "rows");
          Node sc = collective("ScatterTP", n.name + "/ScatterTP", rows, new_value(rows, "_share"), kRows + 1);
          const int mine = sc.outputs[0];
          out.push_back(std::move(sc));
          ++st.scatters;
          const int sub = reshape(n.name, mine, {xs[0], xs[1], s6[2] * share, xs[3]}, "sub_image");
          std::vector<int64_t> t6(s6.begin(), s6.end());
          t6[3] = share;
          n.inputs = {sub, g.add_constant(n.name + "_share_shape", Tensor::from_i64(t6))};
          const int o = n.outputs[0];
          out.push_back(std::move(n));
          set_band(o, -1);
          // the rest of the layout: the Transpose as it is, the windows' Reshape to the share
          Node tr = g.nodes[chain[1]];
          tr.inputs[0] = o;
          out.push_back(tr);
          Node wr = g.nodes[chain[2]];
          const Shape& ws = g.values[wr.outputs[0]].shape;
          std::vector<int64_t> tw(ws.begin(), ws.end());
          tw[0] /= tp;
          wr.inputs = {tr.outputs[0], g.add_constant(g.values[wr.inputs[1]].name + "_share", Tensor::from_i64(tw))};
          set_band(wr.outputs[0], 0);
          out.push_back(std::move(wr));
          done[chain[1]] = done[chain[2]] = true;
          continue;
        }
        n.inputs[0] = gather_of(n.inputs[0], false, n.name);
        const int o = n.outputs[0];
        out.push_back(std::move(n));
        cut_after[chain[cut]] = at[cut];
        if (cut == 0) rename[o] = scatter_of(o, at[0], g.nodes[k].name);
        continue;
      }
    }
    if (n.op == "Reshape" && axis_of(n.inputs[0]) == kRows + 1 && g.values[n.inputs[0]].shape.size() == 6 &&
        g.values[n.outputs[0]].shape.size() == 4) {
      const Shape s6 = g.values[n.inputs[0]].shape;
      const Shape os = g.values[n.outputs[0]].shape;
      if (os == Shape{s6[0], s6[1], s6[2] * s6[3], s6[4] * s6[5]}) {
        // the long-distance layout's inverse on the rank's share of windows: the sub-image (the
        // fused attention's output), then its rows gathered back into the image
        const int64_t share = s6[3] / tp;
        const int sub = reshape(n.name, n.inputs[0], {s6[0], s6[1], s6[2] * share, os[3]}, "sub_image");
        const int rows = reshape(n.name, sub, {s6[0], s6[1], s6[2], share, os[3]}, "rows");
        Node ag = collective("AllGatherTP", n.name + "/AllGatherTP", rows, new_value(rows, "_gathered"), kRows + 1);
        ag.attrs["grad"] = attr_s("slice");
        const int whole = ag.outputs[0];
        out.push_back(std::move(ag));
        ++st.replicated_gathers;
        ++st.gathered_for["windows across bands"];
        n.inputs = {whole, g.add_constant(n.name + "_whole_shape", Tensor::from_i64(std::vector<int64_t>(os.begin(), os.end())))};
        out.push_back(std::move(n));
        continue;
      }
    }
    if (elementwise_op(n.op) && n.outputs.size() == 1) {
      // bands along different axes meet (the inverse of a layout that shared out columns):
      // each is brought to the rows of the output's image
      const Shape& os = g.values[n.outputs[0]].shape;
      const int rows = (int)os.size() - 4 + kRows;
      auto rows_of = [&](int v) { return rows - ((int)os.size() - (int)g.values[v].shape.size()); };
      const bool on_rows = rows >= 0 && std::any_of(n.inputs.begin(), n.inputs.end(), [&](int v) {
        return is_band(v) && axis_of(v) == rows_of(v);
      });
      for (int& v : n.inputs) {
        if (!on_rows || !is_band(v) || axis_of(v) == rows_of(v) || rows_of(v) < 0 ||
            g.values[v].shape[rows_of(v)] != os[rows])
          continue;
        v = scatter_of(gather_of(v, false, n.name), rows_of(v), n.name);
      }
    }
    // windows for column-parallel layers are made from the whole image (gathered before the
    // layout, as the fused attention expects: engine/passes/fuse.h), not from bands of windows
    const bool to_layers = !domain && (n.op == "Reshape" || n.op == "Transpose") && copy_after((int)k) >= 0;
    const int oa = to_layers || starts_bands ? -1 : passes_band(n);
    if (oa >= 0) {
      const Shape os = g.values[n.outputs[0]].shape;
      const bool data_ops = elementwise_op(n.op) || n.op == "Concat";
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        int& v = n.inputs[i];
        if (v < 0 || is_band(v)) continue;
        const int d = oa - ((int)os.size() - (int)g.values[v].shape.size());
        if (data_ops && d >= 0 && g.values[v].shape[d] != 1)
          v = scatter_of(v, d, n.name);  // a whole replicated activation meets a band
        else
          copy_if_trained(v, n.name);  // its gradient: the sum of every rank's band's
      }
      if (n.op == "Resize") {  // to the same size: the identity (its sizes would be the whole grid's)
        n.op = "Identity";
        n.inputs.resize(1);
        n.attrs.clear();
      }
      if (n.op == "Reshape") {  // the band's part of the target
        std::vector<int64_t> target = g.values[n.inputs[1]].constant->to_i64();
        if (target[oa] > 0) target[oa] /= tp;
        n.inputs[1] = g.add_constant(g.values[n.inputs[1]].name + "_band", Tensor::from_i64(target));
      }
      set_band(n.outputs[0], oa);
      out.push_back(std::move(n));
      continue;
    }
    // a convolution on a band: halo rows from the neighbouring bands, its output a band
    if (starts_bands || (axis_of(n.inputs[0]) == kRows && conv_on_bands(n, top, bottom))) {
      int x = n.inputs[0];
      if (top || bottom) {
        const int h = new_value(x, "_halo");
        Node halo = collective("HaloTP", n.name + "/HaloTP", x, h, kRows);
        halo.attrs["top"] = attr_i(top);
        halo.attrs["bottom"] = attr_i(bottom);
        out.push_back(std::move(halo));
        ++st.halos;
        const Shape& xs = g.values[x].shape;
        st.halo_bytes += (top + bottom) * prod(xs, 0, kRows) * prod(xs, kRows + 1, xs.size()) * (int64_t)sizeof(float);
        x = h;
      }
      n.inputs[0] = x;
      std::vector<int64_t> pads = n.ints("pads", {0, 0, 0, 0});
      pads[0] = pads[2] = 0;
      n.attrs["pads"] = attr_ints(pads);
      // the weights' and bias's gradients: the sum of every band's
      for (size_t i = 1; i < n.inputs.size(); ++i) copy_if_trained(n.inputs[i], n.name);
      set_band(n.outputs[0], kRows);
      out.push_back(std::move(n));
      continue;
    }
    // a crop of the grid (CREDIT's, of its padded image) on a band of (N, C, H, W): the gather
    // takes the crop's place and makes only the cropped tensor (never the whole padded one)
    if (n.op == "Slice" && axis_of(n.inputs[0]) == kRows && g.values[n.inputs[0]].shape.size() == 4) {
      std::vector<int64_t> crop, next;
      if (crop_of_slice(g, n, &crop)) {
        int o = n.outputs[0];
        // a crop of rows, then one of columns (a Slice each, as exported): one gather
        for (int m = sole(o); m >= 0 && g.nodes[m].op == "Slice" && g.nodes[m].inputs[0] == o &&
                              crop_of_slice(g, g.nodes[m], &next);
             m = sole(o)) {
          crop = {crop[0] + next[0], crop[0] + next[1], crop[2] + next[2], crop[2] + next[3]};
          done[m] = true;
          o = g.nodes[m].outputs[0];
        }
        Node ag = collective("AllGatherTP", n.name + "/AllGatherTP", n.inputs[0], o, kRows);
        ag.attrs["grad"] = attr_s("slice");
        ag.attrs["crop"] = attr_ints(crop);
        out.push_back(std::move(ag));
        ++st.replicated_gathers;
        continue;
      }
    }
    // anything else reads whole tensors
    const int c = domain ? -1 : copy_after((int)k);
    if (c == (int)k) {  // the column-parallel layers' CopyToTP: the gather takes its place
      const int w = n.inputs[0];
      const std::string scope = ends_with(n.name, "/CopyToTP") ? n.name.substr(0, n.name.size() - 9) : n.name;
      Node ag = collective("AllGatherTP", scope + "/AllGatherTP", w, n.outputs[0], axis_of(w));
      ag.attrs["grad"] = attr_s("sum");
      out.push_back(std::move(ag));
      ++st.gathers;
      continue;
    }
    if (c >= 0) {
      done[c] = true;  // the gather's backward sums the partial gradients instead
      rename[g.nodes[c].outputs[0]] = g.nodes[c].inputs[0];
    }
    for (int& v : n.inputs)
      if (is_band(v)) v = gather_of(v, c >= 0, n.name);
    if (c < 0) ++st.gathered_for[n.op];
    out.push_back(std::move(n));
  }
  // graph outputs are whole
  for (int& o : g.outputs) {
    if (!is_band(o)) continue;
    const int b = new_value(o, "_band");
    for (Node& m : out) {
      for (int& i : m.inputs)
        if (i == o) i = b;
      for (int& x : m.outputs)
        if (x == o) x = b;
    }
    Node ag = collective("AllGatherTP", g.values[o].name + "/AllGatherTP", b, o, axis_of(o));
    ag.attrs["grad"] = attr_s("slice");
    out.push_back(std::move(ag));
    ++st.replicated_gathers;
  }
  g.nodes = std::move(out);
  eliminate_dead_nodes(g);
  infer_shapes(g);
  for (const Node& n : g.nodes)  // nothing a parameter feeds is frozen into a constant
    for (int o : n.outputs) g.values[o].constant.reset();
  return st;
}

}  // namespace

BandStats sequence_parallel(Graph& g, int tp) { return shard_bands(g, tp, false, true); }

BandStats domain_parallel(Graph& g, int domain, bool training) { return shard_bands(g, domain, true, training); }

void add_recompute_segments(const Graph& g, std::vector<int>& seg) {
  add_recompute_segments(g, seg, [](const Node& n) {
    return (n.op == "AllGatherTP" && n.s("grad", "sum") == "sum") || n.op == "HaloTP";
  });
}

}  // namespace wxe
