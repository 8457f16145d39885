#include "parallel/shard.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "engine/io/glob.h"
#include "engine/io/json.h"
#include "engine/passes/layout_rules.h"
#include "engine/ir/module_roles.h"
#include "engine/passes/passes.h"
#include "parallel/collective_ops.h"

namespace wxe {

const char* split_name(TpSplit s) {
  switch (s) {
    case TpSplit::Column: return "colwise";
    case TpSplit::Row: return "rowwise";
    default: return "replicate";
  }
}

namespace {

std::string weight_of(const Graph& g, const Node& n) {
  return n.op == "Linear" && n.inputs.size() >= 2 && n.inputs[1] >= 0 ? g.values[n.inputs[1]].name : "";
}

// A CREDIT layer with spectral norm in the training graph: a 1x1 Conv(x, SpectralNorm(X.weight_orig,
// u, v)), weight_orig (O, I, 1, 1), no groups, strides, pads or dilations, or a Linear(x,
// SpectralNorm(X.weight_orig, u, v)), weight_orig (O, I) (nn.Linear traced by the TorchScript
// exporter). Value id of each such SpectralNorm output -> its weight_orig name (the plan's key
// for the layer).
std::map<int, std::string> sn_conv_weights(const Graph& g) {
  std::map<int, std::string> sn_out;  // SpectralNorm (dim 0) output -> weight_orig
  for (const Node& n : g.nodes) {
    if (n.op != "SpectralNorm" || n.i("dim", 0) != 0 || n.inputs.size() != 3 || n.inputs[0] < 0) continue;
    const Shape& w = g.values[n.inputs[0]].shape;
    if (w.size() == 2 || (w.size() == 4 && w[2] == 1 && w[3] == 1)) sn_out[n.outputs[0]] = g.values[n.inputs[0]].name;
  }
  std::map<int, std::string> r;
  std::set<int> other_use;
  auto ones = [](const std::vector<int64_t>& v, int64_t x) {
    return std::all_of(v.begin(), v.end(), [&](int64_t e) { return e == x; });
  };
  for (const Node& n : g.nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int i = n.inputs[k];
      if (!sn_out.count(i)) continue;
      const size_t rank = g.values[i].shape.size();
      bool conv = n.op == "Conv" && k == 1 && rank == 4 && n.i("group", 1) == 1 && ones(n.ints("strides"), 1) &&
                  ones(n.ints("pads"), 0) && ones(n.ints("dilations"), 1) && n.s("auto_pad", "NOTSET") == "NOTSET";
      bool linear = n.op == "Linear" && k == 1 && rank == 2;
      if (conv || linear) r[i] = sn_out[i];
      else other_use.insert(i);
    }
  for (int i : other_use) r.erase(i);  // read by anything else: left whole
  return r;
}

// The weight a Linear node, or a spectral-norm 1x1 Conv or Linear (`sn`: sn_conv_weights),
// reads: the plan's key.
std::string layer_weight(const Graph& g, const Node& n, const std::map<int, std::string>& sn) {
  if ((n.op == "Conv" || n.op == "Linear") && n.inputs.size() >= 2) {
    auto it = sn.find(n.inputs[1]);
    if (it != sn.end()) return it->second;
    if (n.op == "Conv") return "";
  }
  return weight_of(g, n);
}

// A fused to_qkv weight is three blocks [q | k | v] along its rows: sharded by heads, a rank
// keeps its block of each (TensorSlice::groups).
int groups_of(const std::string& weight) { return layout::is_qkv_module(layout::module_of(weight)) ? 3 : 1; }

// Rows [r*n/T, (r+1)*n/T) of dim `axis` of t; with groups G, those rows of each of the G equal
// groups of the axis (the view (G, n/G) sliced along its second dim).
Tensor slice_dim(const Tensor& t, int axis, int tp, int r, int groups = 1) {
  Shape s = t.shape;
  int64_t n = s[axis] / groups, part = n / tp;
  s[axis] = part * groups;
  Tensor out(t.dtype, s);
  int64_t outer = groups, inner = (int64_t)dtype_size(t.dtype);
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  const uint8_t* src = (const uint8_t*)t.raw();
  uint8_t* dst = (uint8_t*)out.raw();
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + o * part * inner, src + (o * n + r * part) * inner, part * inner);
  return out;
}

int new_const(Graph& g, const Value& like, Tensor t, const std::string& suffix) {
  Value v;
  v.name = like.name + suffix;
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.shape_known = true;
  v.is_param = like.is_param;
  v.constant = std::make_shared<Tensor>(std::move(t));
  return g.add_value(std::move(v));
}

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) p *= s[i];
  return p;
}

}  // namespace

bool elementwise_op(const std::string& op) {
  static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Pow", "Erf", "Sqrt", "Relu", "Sigmoid",
                                            "Tanh", "Exp", "Log", "Neg", "Abs", "Gelu", "Cast", "Where", "Max",
                                            "Min", "Reciprocal", "Softplus", "LeakyRelu", "Clip"};
  return ops.count(op) != 0;
}

// letters of each Einsum operand and of the output (spaces dropped; explicit "->" required)
std::vector<std::string> einsum_terms(const Node& n) {
  std::string eq;
  for (char c : n.s("equation", ""))
    if (c != ' ') eq += c;
  size_t arrow = eq.find("->");
  WXE_CHECK(arrow != std::string::npos, "node ", n.name, ": cannot shard an Einsum without '->'");
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow);
  size_t p = 0;
  while (true) {
    size_t c = lhs.find(',', p);
    terms.push_back(lhs.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  terms.push_back(eq.substr(arrow + 2));
  return terms;
}

namespace {


// value id -> the node that reads it when exactly one node does, else -1
std::vector<int> sole_readers(const Graph& g) {
  std::vector<int> uses = g.use_counts(), r(g.values.size(), -1);
  for (size_t k = 0; k < g.nodes.size(); ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0 && uses[i] == 1) r[i] = (int)k;
  return r;
}

// The parameter holding the bias of Linear node n, and the axis of that parameter along the
// layer's output features: the Linear's own bias, or the parameter of an Add that alone reads
// the Linear's output and reads that parameter alone (the exporter's MatMul + Add). False when
// it has none.
bool linear_bias(const Graph& g, const Node& n, const std::vector<int>& sole, std::string* name, int* axis) {
  if (n.inputs.size() > 2 && n.inputs[2] >= 0) {
    const Value& b = g.values[n.inputs[2]];
    *name = b.name;
    *axis = 0;
    return b.is_param && b.is_const();
  }
  const Value& y = g.values[n.outputs[0]];
  int k = sole[n.outputs[0]];
  if (k < 0 || g.nodes[k].op != "Add" || g.nodes[k].inputs.size() != 2 || !y.shape_known) return false;
  const Node& add = g.nodes[k];
  int other = add.inputs[0] == n.outputs[0] ? add.inputs[1] : add.inputs[0];
  // read by nothing else: a rank may hold only its block of it
  if (other < 0 || sole[other] != k || !g.values[other].is_param || !g.values[other].is_const()) return false;
  const Shape& bs = g.values[other].shape;
  int64_t feat = n.i("axis", -1);
  if (feat < 0) feat += (int64_t)y.shape.size();
  int va = (int)feat - (int)(y.shape.size() - bs.size());  // broadcasting aligns from the right
  if (va < 0 || bs[va] != y.shape[feat]) return false;     // not one value per output feature
  *name = g.values[other].name;
  *axis = va;
  return true;
}

}  // namespace

int add_copy_to_tp(Graph& g, std::vector<Node>& out, int v, const std::string& reader) {
  Value c = g.values[v];
  c.name += "_copy_to_tp";
  c.constant.reset();
  c.is_param = false;
  const int cv = g.add_value(std::move(c));
  Node cp;
  cp.op = "CopyToTP";
  cp.name = reader + "/CopyToTP";
  cp.inputs = {v};
  cp.outputs = {cv};
  out.push_back(std::move(cp));
  return cv;
}

TpPlan discover_plan(const Graph& g) {
  TpPlan plan;
  const std::map<int, std::string> sn = sn_conv_weights(g);
  for (const Node& n : g.nodes) {
    std::string w = layer_weight(g, n, sn);
    if (w.empty()) continue;
    switch (module_role(layout::module_of(w))) {
      case Role::Q: case Role::K: case Role::V: case Role::Qkv: case Role::FfnUp:
        plan.by_weight[w] = TpSplit::Column;
        break;
      case Role::Out: case Role::FfnDown:
        plan.by_weight[w] = TpSplit::Row;
        break;
      case Role::None: break;
    }
  }
  return plan;
}

void apply_plan_file(TpPlan& plan, const Graph& g, const std::string& path) {
  std::ifstream f(path);
  WXE_CHECK(f.good(), path, ": cannot open plan file");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Json j = parse_json(text, path);
  WXE_CHECK(j.type == Json::Obj, path, ": a plan file is a JSON object {\"pattern\": \"colwise\"|\"rowwise\"|\"replicate\"}");
  std::vector<std::string> weights;
  const std::map<int, std::string> sn = sn_conv_weights(g);
  for (const Node& n : g.nodes)
    if (!layer_weight(g, n, sn).empty()) weights.push_back(layer_weight(g, n, sn));
  for (size_t i = 0; i < j.keys.size(); ++i) {
    const std::string& pattern = j.keys[i];
    const Json& v = j.items[i];
    WXE_CHECK(v.type == Json::Str, path, ": value of '", pattern, "' must be a string");
    TpSplit s;
    if (v.s == "colwise") s = TpSplit::Column;
    else if (v.s == "rowwise") s = TpSplit::Row;
    else if (v.s == "replicate") s = TpSplit::Replicate;
    else fail(path, ": '", pattern, "': unknown split '", v.s, "' (colwise, rowwise, replicate)");
    int hits = 0;
    for (auto& w : weights)
      if (glob_match(pattern, w)) {
        plan.by_weight[w] = s;
        ++hits;
      }
    WXE_CHECK(hits > 0, path, ": pattern '", pattern, "' matches no Linear weight of the model");
  }
}

size_t param_bytes(const Graph& g) {
  size_t b = 0;
  std::vector<int> uses = g.use_counts();
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].is_param && g.values[v].is_const() && uses[v]) b += g.values[v].constant->nbytes();
  return b;
}

std::map<std::string, TensorSlice> parameter_slices(const TpPlan& plan, const Graph& g, int tp, int r) {
  std::map<std::string, TensorSlice> slices;
  if (tp == 1) return slices;
  std::vector<int> sole = sole_readers(g);
  const std::map<int, std::string> sn = sn_conv_weights(g);
  for (const Node& n : g.nodes) {
    auto it = plan.by_weight.find(layer_weight(g, n, sn));
    if (it == plan.by_weight.end() || it->second == TpSplit::Replicate) continue;
    bool column = it->second == TpSplit::Column;
    const int groups = column ? groups_of(it->first) : 1;
    slices[it->first] = {column ? 0 : 1, tp, r, groups};
    std::string bias;
    int axis = 0;
    // a row-parallel layer's bias is added after the sum, whole
    if (column && n.op == "Conv" && n.inputs.size() > 2 && n.inputs[2] >= 0)
      slices[g.values[n.inputs[2]].name] = {0, tp, r, groups};
    else if (column && linear_bias(g, n, sole, &bias, &axis))
      slices[bias] = {axis, tp, r};
  }
  return slices;
}

namespace {

// shard_graph and, with `training`, shard_training_graph.
// failing_block (fit_plan's trial): the CREDIT block of the node being rewritten ("" outside the
// node loop), so a caller can tell which block an error belongs to. A trial only decides whether
// the plan shards: the sliced parameters it makes are shape-only (no weight is copied) and it
// stops after the node walk, before the shape inference and the checks a real shard runs.
ShardStats shard(Graph& g, const TpPlan& plan, int tp, int r, bool training, std::string* failing_block = nullptr) {
  const bool trial = failing_block != nullptr;
  auto cut = [&](const Tensor& t, int axis, int groups = 1) {
    if (!trial) return slice_dim(t, axis, tp, r, groups);
    Tensor s = t.shape_only();
    s.shape[axis] /= tp;
    return s;
  };
  ShardStats st;
  st.param_bytes_full = param_bytes(g);
  if (tp == 1) {
    st.param_bytes_rank = st.param_bytes_full;
    return st;
  }
  register_collective_ops();  // the AllReduceTP and CopyToTP nodes it inserts
  // training: the parameters that may be sliced, and their full shapes (checked at the end)
  std::map<std::string, TensorSlice> expected;
  std::map<std::string, Shape> full_shape;
  if (training) {
    expected = parameter_slices(plan, g, tp, r);
    for (const Value& v : g.values)
      if (v.is_param && v.is_const() && expected.count(v.name)) full_shape[v.name] = v.shape;
  }
  // spectral-norm 1x1 convs: SpectralNorm output -> weight_orig, and the SpectralNorm nodes of
  // the sharded ones (by output) with their split
  const std::map<int, std::string> sn = sn_conv_weights(g);
  std::vector<int> axis(g.values.size(), -1);  // sharded axis of each value, -1: replicated
  std::map<int, int> grouped;  // sharded value -> groups along its sharded axis (a fused qkv output: 3)
  auto sharded = [&](int v) { return v >= 0 && v < (int)axis.size() && axis[v] >= 0; };
  auto set_axis = [&](int v, int a) {
    if ((size_t)v >= axis.size()) axis.resize(v + 1, -1);
    axis[v] = a;
  };
  std::vector<Node> out;
  // training: replicated value -> its CopyToTP output (one per value, however many readers)
  std::map<int, int> copied;
  auto copy_to_tp = [&](int v, const std::string& reader) {
    auto it = copied.find(v);
    if (it != copied.end()) return it->second;
    ++st.copies;
    return copied[v] = add_copy_to_tp(g, out, v, reader);
  };
  // training: gradients of replicated float tensors entering the sharded region are summed over
  // tp on the way back; constants that are not parameters need no gradient
  auto copy_replicated_inputs = [&](Node& n) {
    if (!training) return;
    for (int& i : n.inputs) {
      if (i < 0 || sharded(i) || g.values[i].dtype != DType::F32) continue;
      if (g.values[i].is_const() && !g.values[i].is_param) continue;
      i = copy_to_tp(i, n.name);
    }
  };
  for (Node& n : g.nodes) {
    const std::string block = scope_module(n.name);
    if (failing_block) *failing_block = block;
    const std::string where = "node " + n.name + " (" + n.op + ")" + (block.empty() ? "" : " in block " + block);
    const std::string replicate_hint =
        block.empty() ? "" : "; to replicate the block, --plan a file with {\"" + block + ".*\": \"replicate\"}";
    if (n.op == "SpectralNorm" && sn.count(n.outputs[0])) {
      // the weight of a sharded 1x1 conv: this rank's block of weight_orig, sigma of the whole
      const std::string& w = sn.at(n.outputs[0]);
      auto pit = plan.by_weight.find(w);
      if (pit != plan.by_weight.end() && pit->second != TpSplit::Replicate) {
        const int a = pit->second == TpSplit::Column ? 0 : 1, groups = a == 0 ? groups_of(w) : 1;
        const Tensor& W = *g.values[n.inputs[0]].constant;  // (O, I, 1, 1)
        WXE_CHECK(W.shape[a] % (tp * groups) == 0, where, ": width ", W.shape[a] / groups, " of ", w,
                  " is not divisible by --tp ", tp, replicate_hint);
        n.inputs[0] = new_const(g, g.values[n.inputs[0]], cut(W, a, groups), "");
        n.op = "SpectralNormTP";
        n.attrs["axis"] = attr_i(a);
        n.attrs["parts"] = attr_i(tp);
        n.attrs["index"] = attr_i(r);
        n.attrs["groups"] = attr_i(groups);
        ++st.spectral_norms;
      }
      out.push_back(std::move(n));
      continue;
    }
    // a spectral-norm layer: its SpectralNormTP (above) slices the weight
    const bool sn_layer = (n.op == "Conv" || n.op == "Linear") && n.inputs.size() >= 2 && sn.count(n.inputs[1]);
    const bool sn_conv = sn_layer && n.op == "Conv";
    std::string w = layer_weight(g, n, sn);
    auto pit = plan.by_weight.find(w);
    TpSplit split = w.empty() || pit == plan.by_weight.end() ? TpSplit::Replicate : pit->second;
    if ((n.op == "Linear" || sn_conv) && split != TpSplit::Replicate) {
      const Value& x = g.values[n.inputs[0]];
      int rank = (int)x.shape.size();
      int64_t feat = sn_conv ? 1 : n.i("axis", -1);
      if (feat < 0) feat += rank;
      // a Linear's weight (N, K) is sliced here; a spectral-norm conv's by its SpectralNormTP
      const Tensor* W = sn_layer ? nullptr : g.values[n.inputs[1]].constant.get();
      int bias = n.inputs.size() > 2 ? n.inputs[2] : -1;
      if (split == TpSplit::Column) {
        const int groups = sn_conv ? groups_of(w) : 1;
        WXE_CHECK(!sharded(n.inputs[0]), where, ": column-parallel layer reads a sharded input");
        if (W) {
          WXE_CHECK(W->shape[0] % tp == 0, where, ": width ", W->shape[0], " of ", w, " is not divisible by --tp ", tp);
          n.inputs[1] = new_const(g, g.values[n.inputs[1]], cut(*W, 0), "");
        }
        if (bias >= 0)
          n.inputs[2] = new_const(g, g.values[bias], cut(*g.values[bias].constant, 0, groups), "");
        if (training) n.inputs[0] = copy_to_tp(n.inputs[0], n.name);
        set_axis(n.outputs[0], (int)feat);
        if (groups > 1) grouped[n.outputs[0]] = groups;
        ++st.column;
        out.push_back(std::move(n));
        continue;
      }
      // row-parallel: this rank's columns, a partial sum, all-reduce, then the bias
      WXE_CHECK(sharded(n.inputs[0]) && axis[n.inputs[0]] == feat, where,
                ": row-parallel layer's input is not sharded along its features");
      if (W) {
        WXE_CHECK(W->shape[1] % tp == 0, where, ": width ", W->shape[1], " of ", w, " is not divisible by --tp ", tp);
        n.inputs[1] = new_const(g, g.values[n.inputs[1]], cut(*W, 1), "");
      }
      int final_out = n.outputs[0];
      Value partial = g.values[final_out];
      partial.name += "_partial";
      int pv = g.add_value(partial);
      n.outputs = {pv};
      if (bias >= 0) n.inputs.resize(2);
      Node ar;
      ar.op = "AllReduceTP";
      ar.name = n.name + "/AllReduceTP";
      ar.inputs = {pv};
      out.push_back(std::move(n));
      if (bias >= 0) {
        Value summed = partial;
        summed.name = g.values[final_out].name + "_summed";
        int sv = g.add_value(summed);
        ar.outputs = {sv};
        Shape bshape(rank - feat, 1);  // (N, 1, ..., 1) broadcasts along the feature axis
        bshape[0] = g.values[bias].shape[0];
        int b2;
        if (!training) {
          b2 = new_const(g, g.values[bias], g.values[bias].constant->reshaped(bshape), "");
        } else {  // the parameter stays the (N,) leaf an optimizer and a checkpoint know
          int target = g.add_constant(g.values[bias].name + "_shape", Tensor::from_i64(bshape));
          Value rb = g.values[bias];
          rb.name += "_bcast";
          rb.shape = bshape;
          rb.constant.reset();
          rb.is_param = false;
          b2 = g.add_value(std::move(rb));
          Node reshape;
          reshape.op = "Reshape";
          reshape.name = ar.name + "/bias_shape";
          reshape.inputs = {bias, target};
          reshape.outputs = {b2};
          out.push_back(std::move(reshape));
        }
        Node add;
        add.op = "Add";
        add.name = ar.name + "/bias";
        add.inputs = {sv, b2};
        add.outputs = {final_out};
        out.push_back(std::move(ar));
        out.push_back(std::move(add));
      } else {
        ar.outputs = {final_out};
        out.push_back(std::move(ar));
      }
      ++st.row;
      ++st.all_reduces;
      continue;
    }
    bool any = std::any_of(n.inputs.begin(), n.inputs.end(), sharded);
    if (!any) {
      out.push_back(std::move(n));
      continue;
    }
    int src = *std::find_if(n.inputs.begin(), n.inputs.end(), sharded);
    int a = axis[src];
    const Shape in_shape = g.values[src].shape;  // full (unsharded) shapes until infer_shapes; a copy: new_const moves g.values
    if (n.op == "Reshape" || n.op == "Squeeze" || n.op == "Unsqueeze" || n.op == "Flatten") {
      WXE_CHECK(n.op == "Reshape", where, ": cannot shard through ", n.op);
      const Shape os = g.values[n.outputs[0]].shape;
      int64_t P = prod(in_shape, 0, a);
      int b = -1;
      for (size_t k = 0; k < os.size(); ++k)
        if (prod(os, 0, k) == P && os[k] != 1) {
          b = (int)k;
          break;
        }
      WXE_CHECK(b >= 0, where, ": the sharded axis does not survive this reshape");
      int64_t x = in_shape[a], y = os[b];
      WXE_CHECK(x % y == 0 || y % x == 0, where, ": the sharded axis does not survive this reshape");
      WXE_CHECK(y % tp == 0, where, ": ", y, " heads are not divisible by --tp ", tp, replicate_hint);
      std::vector<int64_t> target = g.values[n.inputs[1]].constant->to_i64();
      WXE_CHECK(b < (int)target.size() && target[b] != 0, where, ": reshape target ", shape_str(target),
                " copies the sharded axis");
      if (target[b] > 0) target[b] /= tp;
      n.inputs[1] = new_const(g, g.values[n.inputs[1]], Tensor::from_i64(target), "_tp");
      set_axis(n.outputs[0], b);
    } else if (n.op == "Transpose") {
      std::vector<int64_t> perm = n.ints("perm");
      if (perm.empty())
        for (int64_t k = (int64_t)in_shape.size() - 1; k >= 0; --k) perm.push_back(k);
      int b = (int)(std::find(perm.begin(), perm.end(), a) - perm.begin());
      set_axis(n.outputs[0], b);
    } else if (n.op == "Slice") {
      // along another axis: the sharding passes through; along the sharded one: only a whole
      // group of a grouped value (q, k or v of a fused qkv output), which becomes this rank's
      // block of that group
      auto ints = [&](size_t i) {
        WXE_CHECK(i < n.inputs.size() && n.inputs[i] >= 0 && g.values[n.inputs[i]].is_const(), where,
                  ": a Slice of a sharded tensor needs constant starts, ends and axes");
        return g.values[n.inputs[i]].constant->to_i64();
      };
      WXE_CHECK(n.inputs[0] == src, where, ": slices a sharded tensor by sharded bounds");
      std::vector<int64_t> starts = ints(1), ends = ints(2), axes;
      if (n.inputs.size() > 3 && n.inputs[3] >= 0) axes = ints(3);
      else for (size_t k = 0; k < starts.size(); ++k) axes.push_back((int64_t)k);
      std::vector<int64_t> steps(starts.size(), 1);
      if (n.inputs.size() > 4 && n.inputs[4] >= 0) steps = ints(4);
      const int64_t rank = (int64_t)in_shape.size();
      for (size_t k = 0; k < axes.size(); ++k) {
        if ((axes[k] < 0 ? axes[k] + rank : axes[k]) != a) continue;
        auto gi = grouped.find(src);
        const int64_t G = gi == grouped.end() ? 1 : gi->second, len = in_shape[a] / G;
        const int64_t st0 = starts[k] < 0 ? starts[k] + in_shape[a] : starts[k];
        const int64_t en0 = std::min(ends[k] < 0 ? ends[k] + in_shape[a] : ends[k], in_shape[a]);
        WXE_CHECK(G > 1 && steps[k] == 1 && st0 % len == 0 && en0 == st0 + len, where,
                  ": slices the sharded axis other than by whole q/k/v blocks", replicate_hint);
        starts[k] = st0 / tp;
        ends[k] = (st0 + len) / tp;
        n.inputs[1] = new_const(g, g.values[n.inputs[1]], Tensor::from_i64(starts), "_tp");
        n.inputs[2] = new_const(g, g.values[n.inputs[2]], Tensor::from_i64(ends), "_tp");
      }
      set_axis(n.outputs[0], a);
    } else if (n.op == "Softmax" || n.op == "LayerNormalization") {
      int64_t ax = n.i("axis", -1);
      if (ax < 0) ax += (int64_t)in_shape.size();
      WXE_CHECK(ax != a && (n.op == "Softmax" || ax > a), where, ": normalizes over the sharded axis");
      WXE_CHECK(n.inputs.size() == 1 || n.op == "Softmax", where, ": cannot shard through LayerNormalization with parameters");
      set_axis(n.outputs[0], a);
    } else if (n.op == "Einsum") {
      std::vector<std::string> t = einsum_terms(n);
      WXE_CHECK(t.size() == n.inputs.size() + 1, where, ": malformed equation");
      size_t k0 = std::find(n.inputs.begin(), n.inputs.end(), src) - n.inputs.begin();
      char letter = t[k0][a];
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        size_t pos = t[k].find(letter);
        if (pos == std::string::npos) continue;
        WXE_CHECK(sharded(n.inputs[k]) && axis[n.inputs[k]] == (int)pos, where, ": operand ", k,
                  " is not sharded along '", letter, "'");
      }
      size_t opos = t.back().find(letter);
      WXE_CHECK(opos != std::string::npos, where, ": sums over the sharded axis '", letter,
                "' (fewer heads than --tp ", tp, "?)", replicate_hint);
      set_axis(n.outputs[0], (int)opos);
    } else if (elementwise_op(n.op)) {
      const Shape os = g.values[n.outputs[0]].shape;
      int oa = a + (int)(os.size() - in_shape.size());  // broadcasting aligns from the right
      for (int& i : n.inputs) {
        if (i < 0) continue;
        const Value& v = g.values[i];
        int va = oa - (int)(os.size() - v.shape.size());
        if (sharded(i)) {
          WXE_CHECK(va == axis[i], where, ": inputs sharded along different axes");
          continue;
        }
        if (va < 0 || v.shape[va] == 1) continue;  // broadcasts along the sharded axis
        WXE_CHECK(v.is_const(), where, ": mixes a sharded and a replicated runtime tensor '", v.name, "'",
                  training ? " (a per-head tensor computed from parameters: not supported in training)" : "");
        WXE_CHECK(v.shape[va] == os[oa], where, ": cannot slice '", v.name, "'");
        if (training && v.is_param) {  // a sharded parameter: the one parameter_slices() names
          auto e = expected.find(v.name);
          WXE_CHECK(e != expected.end() && e->second.axis == va, where, ": parameter '", v.name,
                    "' would be sharded along its axis ", va, " but is not a column-parallel layer's bias");
          i = new_const(g, v, cut(*v.constant, va), "");
        } else {
          i = new_const(g, v, cut(*v.constant, va), "_tp");  // per head (position bias)
        }
        set_axis(i, va);
      }
      set_axis(n.outputs[0], oa);
    } else {
      fail(where, ": cannot shard through this op (add it to the plan as replicate, or extend parallel/shard.cpp)");
    }
    copy_replicated_inputs(n);
    out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
  if (failing_block) failing_block->clear();
  for (int o : g.outputs)
    WXE_CHECK(!sharded(o), g.source, ": graph output '", g.values[o].name, "' would be sharded");
  if (trial) return st;
  eliminate_dead_nodes(g);  // drops the full-size weights no node reads any more
  infer_shapes(g);
  st.param_bytes_rank = param_bytes(g);
  if (!training) return st;
  // infer_shapes evaluates what parameters feed (the position-bias MLP); it must stay live
  for (const Node& n : g.nodes)
    for (int o : n.outputs) g.values[o].constant.reset();
  std::vector<int> uses = g.use_counts();
  std::map<std::string, int> held;  // sharded parameter -> how many values of that name the graph reads
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& x = g.values[v];
    auto e = expected.find(x.name);
    if (!x.is_param || !x.is_const() || !uses[v] || e == expected.end()) continue;
    ++held[x.name];
    const Shape& f = full_shape[x.name];
    int a = e->second.axis;
    WXE_CHECK(x.shape.size() == f.size() && x.shape[a] * tp == f[a], g.source, ": parameter '", x.name, "' is ",
              shape_str(x.shape), " after sharding ", shape_str(f), " along axis ", a, " over tp ", tp);
  }
  for (auto& [name, slice] : expected)
    WXE_CHECK(held[name] == 1, g.source, ": sharded parameter '", name, "' is read ",
              held[name] == 0 ? "nowhere" : "both sharded and whole", " after sharding");
  return st;
}

}  // namespace

ShardStats shard_graph(Graph& g, const TpPlan& plan, int tp, int tp_rank) {
  return shard(g, plan, tp, tp_rank, false);
}

ShardStats shard_training_graph(Graph& g, const TpPlan& plan, int tp, int tp_rank) {
  return shard(g, plan, tp, tp_rank, true);
}

TpPlan fit_plan(const Graph& g, TpPlan plan, int tp, bool training, std::vector<std::string>* replicated) {
  if (tp == 1) return plan;
  for (;;) {
    Graph trial = g;
    std::string block;
    try {
      shard(trial, plan, tp, 0, training, &block);  // every rank's shapes are rank 0's
      return plan;
    } catch (const Error&) {
      bool changed = false;
      if (!block.empty())
        for (auto& [w, split] : plan.by_weight)
          if (split != TpSplit::Replicate && w.rfind(block + ".", 0) == 0) {
            split = TpSplit::Replicate;
            changed = true;
          }
      if (!changed) throw;
      if (replicated) replicated->push_back(block);
    }
  }
}

}  // namespace wxe
