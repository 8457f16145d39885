#include "load/model.h"

#include <algorithm>
#include <cstring>
#include <cstdarg>
#include <cstdio>
#include <set>

#include "engine/ir/module_roles.h"
#include "load/checkpoint.h"
#include "parallel/collective_ops.h"

namespace wxe {

bool g_quiet = false;

void note(const char* fmt, ...) {
  if (g_quiet) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
}

void check_training_parameters(const Graph& g, const NamedTensors* weights, const std::string& source) {
  const std::vector<int> params = trainable_parameters(g);
  std::map<std::string, int> by_name;
  for (int v : params) {
    auto [it, fresh] = by_name.insert({g.values[v].name, v});
    WXE_CHECK(fresh, source, ": the training graph has two parameters named '", g.values[v].name, "' ",
              shape_str(g.values[it->second].shape), " and ", shape_str(g.values[v].shape),
              ": they would train apart and cannot both be saved");
  }
  if (!weights) return;
  // every parameter loads one checkpoint tensor, and no tensor loads two parameters
  const WeightMatch m = match_weights(g, *weights);
  std::map<int, std::string> from;
  for (auto& [v, name] : m.matched) from[v] = name;
  std::map<std::string, std::string> loaded_by;
  int64_t graph_count = 0, checkpoint_count = 0;
  for (int v : params) {
    graph_count += g.values[v].constant->numel();
    auto it = from.find(v);
    if (it == from.end()) continue;
    auto [at, fresh] = loaded_by.insert({it->second, g.values[v].name});
    WXE_CHECK(fresh, source, ": checkpoint tensor '", it->second, "' would train as two parameters of the model, '",
              at->second, "' and '", g.values[v].name, "', that the run would update apart and save twice");
  }
  if (!m.missing.empty() || !m.mismatched.empty() || !m.ambiguous.empty()) return;  // load_weights names them
  for (auto& [name, t] : *weights)
    if (m.used.count(name) && t.dtype == DType::F32 && !ends_with(name, ".weight_u") && !ends_with(name, ".weight_v"))
      checkpoint_count += t.numel();
  WXE_CHECK(graph_count == checkpoint_count, source, ": the training graph has ", graph_count,
            " parameters, the checkpoint tensors it reads hold ", checkpoint_count);
}

void prepare_model(Graph& g, const std::map<std::string, InputSpec>& inputs, const LoadOptions& opt) {
  if (opt.training)
    prepare_training_graph(g, inputs);
  else
    prepare_graph(g, inputs);
  if (!opt.weights.empty()) {
    std::map<std::string, TensorSlice> slices;
    if (opt.slices_of) slices = opt.slices_of(g);
    // a training graph that kept spectral norm reads weight_orig/u/v; one exported without it
    // (or inference) reads the folded weights
    bool keep_sn = opt.training && std::any_of(g.nodes.begin(), g.nodes.end(),
                                               [](const Node& n) { return n.op == "SpectralNorm"; });
    const NamedTensors raw = read_checkpoint(opt.weights, slices.empty() ? nullptr : &slices);
    NamedTensors w = to_linear_layout(raw, opt.weights, nullptr, keep_sn);
    if (keep_sn) {
      // layers whose spectral norm the exporter baked into a constant (dynamo folds small ones)
      // are plain weights in this graph: they read the checkpoint's folded weight, and train
      // without spectral norm
      std::set<std::string> have, wanted;
      for (auto& kv : w) have.insert(kv.first);
      for (auto& kv : graph_parameters(g))
        if (!have.count(kv.first)) wanted.insert(kv.first);
      std::set<std::string> baked;  // their modules' weight_orig/u/v, which nothing reads
      if (!wanted.empty())
        for (auto& kv : to_linear_layout(raw, opt.weights, nullptr, false)) {
          if (!wanted.count(kv.first)) continue;
          w.push_back(kv);
          std::string m = layout::module_of(kv.first);
          const Role r = module_role(m);
          if (r == Role::Q || r == Role::K || r == Role::V) m = sibling_module(m, Role::Qkv);  // the checkpoint's fused module
          baked.insert(m);
        }
      w.erase(std::remove_if(w.begin(), w.end(), [&](const auto& kv) {
                const std::string m = layout::module_of(kv.first), leaf = kv.first.substr(m.size() + 1);
                return baked.count(m) && (leaf == "weight_orig" || leaf == "weight_u" || leaf == "weight_v");
              }), w.end());
    }
    if (opt.training) check_training_parameters(g, &w, opt.weights);
    int by_structure = 0;
    std::vector<std::string> unused = load_weights(g, w, opt.weights, &by_structure);
    note("wxe: loaded %zu tensors from %s", w.size() - unused.size(), opt.weights.c_str());
    if (by_structure)  // names the export lost (folded spectral norm, shared or renamed initializers)
      note(" (%d parameters matched by graph structure)", by_structure);
    note("\n");
    if (!unused.empty())
      note("wxe: warning: %zu tensors of %s are not used by the model (first: %s)\n", unused.size(),
           opt.weights.c_str(), unused[0].c_str());
  }
  if (!opt.training) finalize_graph(g);
}

TpPlan plan_for(const Graph& g, const std::string& plan_file, int tp, bool training) {
  TpPlan plan = discover_plan(g);
  if (!plan_file.empty()) apply_plan_file(plan, g, plan_file);
  std::vector<std::string> replicated;
  plan = fit_plan(g, plan, tp, training, &replicated);
  if (!replicated.empty()) {
    std::string list;
    for (const std::string& b : replicated) list += (list.empty() ? "" : ", ") + b;
    note("wxe: tp %d: %zu blocks replicated (fewer heads or a width not divisible by %d): %s\n", tp,
         replicated.size(), tp, list.c_str());
  }
  bool any = std::any_of(plan.by_weight.begin(), plan.by_weight.end(),
                         [](const auto& e) { return e.second != TpSplit::Replicate; });
  WXE_CHECK(tp == 1 || any || !plan_file.empty(), g.source, ": --tp ", tp,
            " would shard nothing: no attention or feed-forward layer of this model (with or without spectral norm) "
            "can be split over ", tp, " ranks (fewer heads than ", tp, ", or widths it does not divide); run with a "
            "smaller --tp or without it, or give a --plan file that replicates on purpose");
  return plan;
}

SlicesOf TpSharding::slices_of(const std::string& weights) {
  if (tp() == 1 || !ends_with(weights, ".safetensors")) return nullptr;
  return [this](const Graph& g) { return parameter_slices(plan(g), g, mesh_->tp, mesh_->tp_rank); };
}

const TpPlan& TpSharding::plan(const Graph& g) {
  if (!have_plan_) plan_ = plan_for(g, plan_file_, tp());
  have_plan_ = true;
  return plan_;
}

ShardStats TpSharding::shard(Graph& g) {
  if (tp() == 1) return {};
  const TpPlan& p = plan(g);
  // all ranks must agree on the plan before the first all-reduce (parallel/mesh.h)
  std::string text = str("tp", mesh_->tp, "dp", mesh_->dp);
  for (auto& [w, split] : p.by_weight) text += w + split_name(split) + ";";
  for (auto& [name, t] : graph_parameters(g)) text += name + shape_str(t.shape) + ";";
  check_same_on_all_ranks(*mesh_, fingerprint(text), "tensor-parallel plan");
  ShardStats st = shard_graph(g, p, mesh_->tp, mesh_->tp_rank);
  set_tp_communicator(mesh_->tp_comm.get());
  return st;
}

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB"};
  int k = 0;
  while (b >= 1024 && k < 3) {
    b /= 1024;
    ++k;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, u[k]);
  return buf;
}

std::string domain_summary(const BandStats& st, int domain, bool training) {
  std::string gathered;
  for (auto& [op, n] : st.gathered_for) gathered += str(gathered.empty() ? "" : ", ", op, " x", n);
  return str("domain ", domain, ": latitude bands; ", st.halos, " convolutions exchange halo rows (",
             human_bytes((double)st.halo_bytes), " per forward into a middle band",
             training ? ", as much again in the backward for their gradients and, on the cpu, to make them again "
                        "rather than keep them" : "", "), ", st.group_norms,
             " GroupNorms sum their statistics over the domain group; gathered whole for: ",
             gathered.empty() ? "nothing" : gathered);
}

BandStats shard_domain(Graph& g, const Mesh* mesh, bool training) {
  if (!mesh || mesh->domain <= 1) return {};
  const int d = mesh->domain;
  const std::string source = g.source;
  BandStats st = domain_parallel(g, d, training);
  WXE_CHECK(st.scatters > 0, source, ": --domain ", d, " splits nothing: no convolution of this model has rows that ",
            "divide into ", d, " bands with halos no taller than a band; run with a --domain that divides the grid's "
            "rows at the first convolution, or without it");
  if (mesh->domain_comm) set_domain_communicator(mesh->domain_comm.get());  // none: a plan (train/plan.h)
  note("wxe: %s\n", domain_summary(st, d, training).c_str());
  return st;
}

int64_t traced_batch(const Graph& g, const std::map<std::string, Tensor>& inputs) {
  int64_t traced = 0, given = 0;
  for (int id : g.inputs) {
    const Value& v = g.values[id];
    auto it = inputs.find(v.name);
    if (it == inputs.end()) continue;
    const Shape& s = it->second.shape;
    if (s.size() != v.shape.size() || s.empty() || v.shape[0] < 0 || v.shape[0] == s[0]) return 0;
    for (size_t d = 1; d < s.size(); ++d)
      if (v.shape[d] >= 0 && v.shape[d] != s[d]) return 0;  // another mismatch: bind_inputs names it
    if (traced && (traced != v.shape[0] || given != s[0])) return 0;
    traced = v.shape[0];
    given = s[0];
  }
  return traced;
}

std::map<std::string, InputSpec> specs_at_batch(const std::map<std::string, Tensor>& inputs, int64_t batch) {
  std::map<std::string, InputSpec> r;
  for (auto& [name, t] : inputs) {
    r[name] = {t.dtype, t.shape};
    if (batch > 0) r[name].shape[0] = batch;
  }
  return r;
}

std::vector<Tensor> run_any_batch(Executor& ex, const std::map<std::string, Tensor>& inputs, int64_t batch) {
  if (batch <= 0) return ex.run(inputs);
  const int64_t rows = inputs.begin()->second.shape[0];
  std::vector<Tensor> joined;
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t n = std::min(batch, rows - r0);
    std::map<std::string, Tensor> piece;
    for (auto& [name, t] : inputs) {
      Shape s = t.shape;
      s[0] = batch;
      Tensor p = Tensor::zeros(t.dtype, s);
      const size_t row = t.nbytes() / (size_t)t.shape[0];
      std::memcpy(p.raw(), (const uint8_t*)t.raw() + r0 * row, n * row);
      piece[name] = std::move(p);
    }
    std::vector<Tensor> outs = ex.run(piece);
    for (size_t k = 0; k < outs.size(); ++k) {
      const Tensor& o = outs[k];
      WXE_CHECK(o.rank() >= 1 && o.shape[0] == batch, "output ", k, " is ", shape_str(o.shape),
                ": not batch-major, so the model cannot run another batch than the ", batch, " it was exported with");
      if (joined.size() <= k) {
        Shape s = o.shape;
        s[0] = rows;
        joined.push_back(Tensor(o.dtype, s));
      }
      const size_t row = o.nbytes() / (size_t)batch;
      std::memcpy((uint8_t*)joined[k].raw() + r0 * row, o.raw(), n * row);
    }
  }
  return joined;
}

}  // namespace wxe
