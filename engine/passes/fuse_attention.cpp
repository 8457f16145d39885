#include "engine/passes/fuse.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "engine/passes/fuse_util.h"
#include "engine/passes/passes.h"

namespace wxe {

using namespace fuse_util;

namespace {

// For a commutative binary node reading `v`: the other input, or -1.
int other_input(const Node& n, int v) {
  if (n.inputs.size() != 2) return -1;
  if (n.inputs[0] == v) return n.inputs[1];
  if (n.inputs[1] == v) return n.inputs[0];
  return -1;
}

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

}  // namespace wxe
